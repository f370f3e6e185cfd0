"""Benchmark: the product under load — N concurrent runs and V WebSocket viewers.

Starts the product as ``up`` does (the embedded Spark cluster, daphne, both Celery
workers, beat, the relay) on the configured database (the Makefile points it at
var/bench), starts ``--runs`` runs of a low-rate keyed count through the product (the
Start action, real runners), and opens ``--viewers`` WebSocket connections to the first
run's page, as that many browser tabs would (one operator's session, the page's own
socket URL). For ``--minutes`` it samples every few seconds:

* each run's status against its runner: a status is *stale* when the run shows
  ``running`` but its heartbeat is gone, or its chart is behind the runner (the
  runner's latest committed batch is more than ``STALE_S`` newer than the latest
  stored sample: a frozen chart under a live status);
* a run that ended (``lost``, ``failed``, …) during the window;
* each viewer's push latency: the runner wrote the record (``written_at``) -> the viewer
  received it, on this machine's clock, and whether every viewer got every batch.

The baseline, measured in the same run before the load, is one viewer on one run (the
other runs not started yet): the ratio says what the load costs a push. Prints medians,
p95 and the ratios, and exits non-zero when a run was lost or a status was stale.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from control.models import Policy
from pipelines import actions, launch
from pipelines.management.benchkit import (Viewers, bench_operator, percentile,
                                           session_headers, start_product, wait_ended)
from pipelines.models import MetricSample, Pipeline, Run

# A keyed count at a low constant rate, one micro-batch every 5 s: the load is the runs'
# number, not their rate (back to back, six runs' per-batch overhead alone took 20 load
# average on two cores, and batches took 30 s).
LOAD_DEFINITION: dict[str, Any] = {
    "source": {"type": "generator", "seed": 11, "partitions": 2,
               "rate": {"kind": "constant", "records_per_s": 200},
               "keys": {"kind": "zipf", "n": 1000, "s": 1.0}},
    "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count"}],
    "sink": {"type": "latency"},
    "key_groups": 4,
    "trigger_ms": 5000,
}
STALE_S = 30.0  # a chart this far behind its runner is frozen
SAMPLE_EVERY_S = 5.0


class Command(BaseCommand):
    help = ("N concurrent runs and V WebSocket viewers for M minutes: stale statuses, lost "
            "runs, push latency against one viewer of one run.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=6)
        parser.add_argument("--viewers", type=int, default=50)
        parser.add_argument("--minutes", type=float, default=10.0)
        parser.add_argument("--baseline-s", type=float, default=60.0)

    def handle(self, *args: Any, **options: Any) -> None:
        runs_n, viewers_n = options["runs"], options["viewers"]
        minutes, baseline_s = options["minutes"], options["baseline_s"]
        if not 1 <= runs_n <= settings.CLUSTER_CORES - 1:
            raise CommandError(f"--runs must be in 1..{settings.CLUSTER_CORES - 1} (one "
                               "executor core each, one left for a standby)")
        if not 1 <= viewers_n <= 500 or not 0.5 <= minutes <= 120 or baseline_s < 10:
            raise CommandError("--viewers in 1..500, --minutes in 0.5..120, "
                               "--baseline-s at least 10")
        user = bench_operator()
        pipeline = (Pipeline.objects.filter(name="bench-load").first()
                    or Pipeline(name="bench-load"))
        if pipeline.definition != LOAD_DEFINITION:  # a new version when this file changed
            pipeline.definition = LOAD_DEFINITION
            pipeline = actions.save_pipeline(pipeline, user)
        policy, _ = Policy.objects.get_or_create(name="bench-load", defaults={
            "latency_bound_ms": 10000, "power_budget_w": 40, "min_workers": 1,
            "initial_workers": 1, "max_workers": 1, "strategy": "manual"})
        product = start_product(self.stdout)
        port = product.port
        runs: list[Run] = []
        try:
            headers = session_headers(user, port)
            runs.append(self._start(pipeline, policy, user))
            self._wait_running(runs)
            url = f"ws://127.0.0.1:{port}/ws/runs/{runs[0].pk}/"
            self.stdout.write(f"baseline: 1 viewer of run {runs[0].pk}, the only run, "
                              f"{baseline_s:.0f} s")
            with Viewers(url, headers, 1) as alone:
                time.sleep(baseline_s)
            base = alone.latencies()
            if len(base) < 5:
                raise CommandError(f"the baseline viewer received {len(base)} samples; "
                                   f"see {product.logs}")
            runs += [self._start(pipeline, policy, user) for _ in range(runs_n - 1)]
            self._wait_running(runs)
            self.stdout.write(f"load: {runs_n} runs, {viewers_n} viewers of run "
                              f"{runs[0].pk}, {minutes:g} min")
            stale, ended = self._under_load(runs, url, headers, viewers_n, minutes)
        finally:
            for run in Run.objects.filter(pk__in=[r.pk for r in runs]):
                if not run.is_terminal:
                    actions.request_stop(run, user)
            wait_ended(Run.objects.filter(pk__in=[r.pk for r in runs]), 120)
            product.stop()
        self._report(base, stale, ended)

    # ------------------------------------------------------------------ stages
    def _start(self, pipeline: Pipeline, policy: Policy, user: Any) -> Run:
        return actions.create_run(pipeline, policy, user)

    def _wait_running(self, runs: list[Run], timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = dict(Run.objects.filter(pk__in=[r.pk for r in runs])
                            .values_list("pk", "status"))
            if all(s == "running" for s in statuses.values()):
                return
            bad = {pk: s for pk, s in statuses.items() if s in ("failed", "lost", "stopped")}
            if bad or time.monotonic() > deadline:
                raise CommandError(f"runs did not all reach running: {statuses}")
            time.sleep(1)

    def _under_load(self, runs: list[Run], url: str, headers: dict[str, str],
                    viewers_n: int, minutes: float) -> tuple[list[str], list[str]]:
        stale: list[str] = []
        started = time.monotonic()
        end = started + minutes * 60
        next_note = started + 60
        with Viewers(url, headers, viewers_n) as load:
            while time.monotonic() < end:
                stale += self._stale(runs)
                if time.monotonic() >= next_note:
                    next_note += 60
                    got = load.latencies()
                    self.stdout.write(
                        f"  {(time.monotonic() - started) / 60:.0f}/{minutes:g} min: "
                        f"{len(got)} pushes received, median "
                        f"{statistics.median(got) if got else float('nan'):.0f} ms; "
                        f"stale so far {len(stale)}")
                time.sleep(SAMPLE_EVERY_S)
        self.viewers = load
        ended = [f"run {pk}: {status}" for pk, status in Run.objects.filter(
            pk__in=[r.pk for r in runs]).exclude(status="running").values_list("pk", "status")]
        return stale, ended

    @staticmethod
    def _stale(runs: list[Run]) -> list[str]:
        """What the page of each run would show wrongly now: ``running`` while its runner
        has no heartbeat (dead), or a chart behind the runner (its latest committed batch
        more than STALE_S newer than the latest stored sample). A first batch that is
        slow under load is neither: the query does run."""
        out = []
        for run in Run.objects.filter(pk__in=[r.pk for r in runs]):
            if run.status != "running":
                continue
            beat = launch.run_bus(run).read_heartbeat()
            if beat is None:
                out.append(f"run {run.pk}: running without a heartbeat")
                continue
            committed = beat.get("last_batch_at")
            last = (MetricSample.objects.filter(run=run).order_by("-batch_id")
                    .values_list("t", flat=True).first())
            behind = committed - last.timestamp() if committed and last else (
                committed and time.time() - committed)
            if behind and behind > STALE_S:
                out.append(f"run {run.pk}: the chart is {behind:.0f} s behind the runner")
        return out

    def _report(self, base: list[float], stale: list[str], ended: list[str]) -> None:
        viewers = self.viewers.viewers
        loaded = self.viewers.latencies()
        errors = [e for v in viewers for e in v.errors]
        # From the first batch every viewer was connected for: each must have them all.
        common = max((min(v.batches) for v in viewers if v.batches), default=0)
        every = {b for v in viewers for b in v.batches if b >= common}
        short = [i for i, v in enumerate(viewers) if not every <= v.batches]
        if not loaded:
            raise CommandError(f"no viewer received a sample ({errors[:3]})")
        med, p95 = statistics.median(loaded), percentile(loaded, 0.95)
        bmed, bp95 = statistics.median(base), percentile(base, 0.95)
        self.stdout.write(
            f"push latency runner -> viewer under load, {len(viewers)} viewers, "
            f"{len(loaded)} pushes: median {med:.1f} ms, p95 {p95:.1f} ms, "
            f"max {max(loaded):.1f} ms\n"
            f"baseline 1 viewer of the only run, {len(base)} pushes: median {bmed:.1f} ms, "
            f"p95 {bp95:.1f} ms\n"
            f"ratio load/baseline: median {med / bmed:.2f}x, p95 {p95 / bp95:.2f}x\n"
            f"batches pushed to the watched run: {len(every)}; viewers missing some: "
            f"{len(short)}; viewer errors: {len(errors)} {errors[:3]}\n"
            f"stale statuses: {len(stale)} {stale[:5]}\n"
            f"runs not running at the end of the window: {len(ended)} {ended}")
        if stale or ended or errors:
            raise CommandError("the product did not hold under this load (see above)")
