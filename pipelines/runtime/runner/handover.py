"""A live re-plan of a running runner (Gloss, Rajadurai et al., ASPLOS 2018): the new
query generation is started beside the current one, its state built (a snapshot
transferred in a process of its own, or the records its state depends on replayed),
and the output handed over at an epoch boundary by the arbiter (``replan.gloss``),
so that each input range's output is forwarded once; the stop-and-restart baseline
too (Gloss §4.1). :meth:`ReplanHandover.replan` is where a re-plan switches queries.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.runtime import connectors
from pipelines.runtime.elastic import migration as elastic
from pipelines.runtime.elastic import placement
from pipelines.runtime.host import secretfile
from pipelines.runtime.bus import RunnerEvent
from pipelines.runtime.query.session import PROJECT_ROOT
from pipelines.runtime.replan import gloss as replan
from pipelines.runtime.spec import definition

class _TransferFailed(replan.ReplanError):
    """A seamless re-plan's state-transfer process ended with an error."""


# Heads each attempt's part of reseed.log: a failure is read from its own attempt's lines.
TRANSFER_LOG_MARK = "--- state transfer at"
# How long a generation about to be stopped may take to report its last forwarded batch
# (Spark's progress event comes ~0.1 s after the sink returns).
REPORT_WAIT_S = 5.0


class ReplanHandover:
    """The re-plan of ``runner``'s query: one at a time, from its command thread."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner  # runner.Runner, which holds this (no import: no cycle)

    def replan(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        """A live re-plan to ``args['key_groups']`` (``replan.py``): ``seamless``
        (Gloss' adaptive hand-over) or ``stop-restart`` (stop-and-copy)."""
        scheme = args.get("scheme") or "seamless"
        if scheme not in replan.SCHEMES:
            return False, f"scheme must be one of {', '.join(replan.SCHEMES)}", {}
        replay_in = args.get("replay_in") or "auto"
        if replay_in not in replan.REPLAY_IN:
            return False, f"replay_in must be one of {', '.join(replan.REPLAY_IN)}", {}
        refusal = replan.replan_refusal(self.runner.spec)
        if refusal:
            return False, refusal, {}
        try:
            groups = int(args.get("key_groups", self.runner.spec.key_groups))
            doc = {**self.runner.spec.raw, "key_groups": groups}
            if args.get("plan") is not None:  # a new grouping of the Python operators
                doc["plan"] = args["plan"]
            new_spec = definition.validate(doc)
        except (TypeError, ValueError) as exc:
            return False, f"{'plan' if args.get('plan') is not None else 'key_groups'}: "\
                f"{exc}", {}
        old = self.runner.generation
        if replan.last_committed(old.checkpoint) is None:
            return False, "the query has not committed a batch yet: nothing to hand over", {}
        number = max(self.runner.arbiter.generations) + 1
        gdir = self.runner.run_dir / f"gen-{number}"
        t_request = time.time()
        self.runner.bus.publish_event(RunnerEvent.REPLAN_STARTED, scheme=scheme, generation=number,
                               from_groups=old.key_groups, to_groups=groups)
        self.runner.replanning = True
        new = replan.Generation(number, groups, gdir / "checkpoint")
        sc = self.runner.spark.sparkContext
        # The snapshot's jobs, and the new query's until its first batch sets its own
        # (its stream thread inherits this thread's local properties), yield the
        # executors to the forwarding query (session.py, fairscheduler.xml).
        sc.setLocalProperty("spark.scheduler.pool", replan.POOL_CATCHING_UP)
        try:
            facts = self._hand_over(old, new, new_spec, scheme, gdir, replay_in)
        except Exception as exc:
            self._abandon(new)
            if scheme == "stop-restart" or not (old.query and old.query.isActive):
                self.runner.replanning = False
                raise  # the old query is gone: the run cannot go on
            old.pause_s = 0.0
            self.runner.replanning = False
            reason = f"{type(exc).__name__}: {exc}"[:500]
            self.runner.bus.publish_event(RunnerEvent.REPLAN_FAILED, generation=number,
                                   reason=reason)
            return False, f"re-plan abandoned, generation {old.number} goes on: {reason}", {}
        finally:
            sc.setLocalProperty("spark.scheduler.pool", None)
        self.runner.replanning = False
        t_switch = facts["switched_at"]
        # Measure the span the way Gloss §9.1 does, SETTLE_S past the switch.
        self.runner.stop_event.wait(max(0.0, t_switch + replan.SETTLE_S - time.time()))
        schedule = connectors.offset_clock(self.runner.spec, self.runner.t0)
        measured = replan.gloss_metrics(list(self.runner.metrics.history), t_request,
                                        t_switch + replan.SETTLE_S,
                                        lambda t: schedule.records_by(t - self.runner.t0),
                                        baseline_from=self.runner.last_replan_end,
                                        trigger_s=self.runner.spec.trigger_ms / 1000.0)
        self.runner.last_replan_end = t_switch + replan.SETTLE_S
        summary = {"scheme": scheme, "generation": number, "from_groups": old.key_groups,
                   "to_groups": groups, "requested_at": t_request, **facts,
                   **measured.as_dict()}
        if new_spec.pe_plan is not None and args.get("plan") is not None:
            summary["plan"] = new_spec.pe_plan.as_dict()
        self.runner.bus.publish_event(RunnerEvent.REPLAN_DONE, **summary)
        what = (f"{len(new_spec.pe_plan.pes)} PE(s)" if "plan" in summary and new_spec.pe_plan
                else f"{old.key_groups} -> {groups} key groups")
        message = (f"re-planned {what} ({scheme}): "
                   f"downtime {measured.downtime_s} s, disrupted {measured.disrupted_s} s, "
                   f"overlap {facts['overlap_s']:.1f} s")
        return True, message, summary

    def _hand_over(self, old: replan.Generation, new: replan.Generation,
                   spec: definition.PipelineSpec, scheme: str, gdir: Path,
                   replay_in: str = "auto") -> dict[str, Any]:
        from pipelines.runtime.query.compiler import Seed

        started = time.time()
        if scheme == "stop-restart":
            # Gloss §4.1: no output from here until the new query's. Its batch in
            # flight, if forwarded, is written first (else its range would be lost).
            self.runner.arbiter.retire(old)
            self._stop_written(old)
        import shutil

        shutil.rmtree(gdir, ignore_errors=True)
        gdir.mkdir(parents=True)
        batch = replan.last_committed(old.checkpoint)
        assert batch is not None
        forwarded = self.runner.arbiter.last_forwarded.get(old.number)
        if scheme == "stop-restart" and forwarded is not None and forwarded < batch:
            # A batch it ran after being retired was discarded but committed: hand over
            # the state at the end of what was forwarded, or that range would be lost.
            batch = forwarded
        start = replan.batch_end(old.checkpoint, batch)
        new.start = start
        snap = time.perf_counter()
        transfer: dict[str, Any] = {}
        if spec.graph is not None:
            # No snapshot: the new generation replays the records its state depends on.
            new.start = replan.replay_start(spec, start, self.runner.t0)
            seed = Seed(new.start, None, None,
                        replan.replay_ends(old.checkpoint, batch,
                                           self.runner.arbiter.forwarded_end, new.start))
            rows = start - new.start
            if scheme == "seamless" and replan.replays_in_process(spec, start, new.start,
                                                                  replay_in):
                transfer = self._reseed(spec, old, batch, seed, new, gdir)
            # Else the new query replays in this application, beside the old one.
        elif scheme == "seamless":
            seed = Seed(start, gdir / "snapshot", None)
            transfer = self._reseed(spec, old, batch, seed, new, gdir)
            rows = transfer["rows"]
        elif spec.stateful.type == "hft_window":
            op = spec.stateful
            rows = replan.write_window_snapshot(self.runner.spark, old.checkpoint, batch, op.key,
                                                gdir / "snapshot")
            seed = Seed(start, gdir / "snapshot", None, self._up_to_forwarded(start))
        else:
            op = spec.stateful
            rows = replan.write_snapshot(self.runner.spark, old.checkpoint, batch, op.key, op.agg,
                                         gdir / "snapshot")
            seed = Seed(start, gdir / "snapshot", gdir / "hold",
                        self._up_to_forwarded(start))
        snapshot_s = transfer.get("snapshot_s", time.perf_counter() - snap)
        # A watermark's output (windows closing) depends on where the batch before began:
        # a dataflow generation takes over only after a batch aligned with the old one's.
        if scheme == "seamless" and spec.trigger_ms:
            # Its batches take turns with the old query's (source.wait_for_forwarded).
            seed = dataclasses.replace(seed, gate=gdir / "gate.json")
        self.runner.arbiter.propose(new, aligned=spec.graph is not None, gate=seed.gate,
                             trigger_s=spec.trigger_ms / 1000.0)
        self.runner.spark.conf.set("spark.sql.shuffle.partitions", str(new.key_groups))
        if seed.gate is not None:
            # Started in the old query's idle time too: a query's start (its analysis
            # and first planning on this driver, its source's Python worker) took CPU
            # from the old query's batch when it fell inside one.
            from pipelines.runtime.query.source import wait_for_forwarded

            wait_for_forwarded(seed.gate, new.start)
        self.runner.start_generation(new, spec, seed)
        new_started = time.time()
        deadline = new_started + replan.CATCH_UP_TIMEOUT_S
        while not self.runner.arbiter.switched.wait(0.2):
            if self.runner.stop_event.is_set():
                raise replan.ReplanError("the run is stopping")
            if not new.query.isActive:
                exc = new.query.exception()
                if self.runner.restart_if_python_failed_to_start(new, exc):
                    continue
                raise replan.ReplanError(f"the new query ended: {exc}")
            if time.time() > deadline:
                raise replan.ReplanError(f"the new query had not caught up after "
                                         f"{replan.CATCH_UP_TIMEOUT_S:.0f} s")
            if scheme == "seamless":
                old.pause_s = replan.throttle_pause(time.time() - new_started, old.batch_s)
        old.pause_s = 0.0
        switched_at = self.runner.arbiter.switched_at or time.time()
        self.runner.bus.publish_event(RunnerEvent.REPLAN_SWITCHED, generation=new.number,
                               key_groups=new.key_groups, epoch=self.runner.arbiter.last_epoch,
                               after_batch=new.first_batch)
        if scheme == "seamless":
            try:
                self._stop_written(old)
            except replan.ReplanError as exc:  # the new query forwards already: go on
                print(f"re-plan: {exc}", file=sys.stderr, flush=True)
                old.query.stop()
        self._adopt(new, spec)
        return {"snapshot_batch": batch, "snapshot_rows": rows,
                "snapshot_s": round(snapshot_s, 2), "start_offset": start,
                "transfer_s": round(new_started - started, 2),
                "replayed": spec.graph is not None,
                # Where the new generation's state was built: a transfer process, or
                # this application (a replay here, or stop-and-restart's snapshot).
                "state_built_in": "process" if transfer else "application",
                "seed_s": transfer.get("seed_s"),
                # The transfer's time stopped while the forwarded query ran its batches.
                "transfer_gated_s": transfer.get("gated_s"),
                # Whether it ran only in the forwarded query's idle time (measured
                # beforehand: ``_gates_transfer``).
                "transfer_gated": "gated_s" in transfer,
                "overlap_from": new_started if scheme == "seamless" else started,
                "overlap_to": switched_at,
                "overlap_s": round(switched_at - new_started, 2)
                if scheme == "seamless" else 0.0,
                "catch_up_s": round(switched_at - new_started, 2),
                "switched_at": switched_at, "discarded_batches": self.runner.arbiter.discarded,
                # Whether the new query computed the hand-over batch alone, the old one
                # waiting for it (replan.Arbiter.begin).
                "handed_over_alone": self.runner.arbiter.yielded > 0}

    def _up_to_forwarded(self, start: int) -> tuple[int, ...]:
        """After a stop whose last forwarded batch was not committed, the new generation
        re-reads that range as one batch (discarded), so that its next begins where the
        forwarded output ends (a batch covering both would be neither forwarded nor
        waited for)."""
        end = self.runner.arbiter.forwarded_end
        return (end,) if end is not None and end > start else ()

    def _reseed(self, spec: definition.PipelineSpec, old: replan.Generation, batch: int,
                seed: Any, new: replan.Generation, gdir: Path) -> dict[str, Any]:
        """Snapshot the old state and seed the new checkpoint with it in a process of its
        own at idle priority (``reseed.py``), while the old query runs on at full pace;
        the new query then resumes that checkpoint here.

        Idle priority can starve on a machine that other work keeps busy: Spark gives a
        Python worker it spawns 10 s to connect back (not configurable), and a transfer
        may make no progress at all. So a transfer that starves (``StarvationWatch``) is
        raised to ``reseed.LOW`` priority, and one that failed at idle priority is tried
        once more at low priority from scratch."""
        import shutil

        from pipelines.runtime.replan import transfer as reseed

        # Gated, it runs only between the run's batches: on every core of this machine.
        # Ungated, on one at idle priority beside the run's query.
        gated = self._gates_transfer(old)
        cores = (os.cpu_count() or 1) if gated else 1
        job = {"spec": spec.raw, "cores": cores, "t0": self.runner.t0,
               "plan_dir": str(self.runner.run_dir / "source-plan"),
               "old_checkpoint": str(old.checkpoint), "batch": batch, "start": seed.start,
               "first_ends": list(seed.first_ends),
               "snapshot": str(seed.snapshot) if seed.snapshot else None,
               "checkpoint": str(new.checkpoint),
               "result": str(gdir / "reseed-result.json")}
        if spec.graph is None:
            job.update(key=spec.stateful.key, agg=spec.stateful.agg,
                       window=spec.stateful.type == "hft_window")
        # The connections the transfer's source reads through (their passwords too):
        # the job file is the runner's own, as runner.json is (0600).
        job["connections"] = dict(connectors.CONNECTIONS)
        secretfile.write_private(gdir / "reseed-job.json", json.dumps(job))
        try:
            return self._reseed_once(gdir, old, reseed.IDLE, gated)
        except _TransferFailed as exc:  # not a timeout: that one had been raised already
            if self.runner.stop_event.is_set() or not (old.query and old.query.isActive):
                raise
            print(f"re-plan: the state transfer at idle priority failed ({exc}); trying "
                  "again at low priority", file=sys.stderr, flush=True)
        shutil.rmtree(new.checkpoint, ignore_errors=True)
        if seed.snapshot:
            shutil.rmtree(seed.snapshot, ignore_errors=True)
        return self._reseed_once(gdir, old, reseed.LOW, gated)

    def _gates_transfer(self, forwarded: replan.Generation) -> bool:
        """Whether a state transfer runs only between the forwarded query's batches
        (``reseed.TransferGate``): on a processing-time trigger whose interval its
        recent batches left partly idle (``replan.GATE_IDLE_MIN``, measured);
        back-to-back batches leave no time to run in."""
        trigger_s = self.runner.spec.trigger_ms / 1000
        return trigger_s > 0 and forwarded.leaves_idle_time(trigger_s)

    def _reseed_once(self, gdir: Path, old: replan.Generation,
                     priority: str, gated: bool) -> dict[str, Any]:
        import subprocess

        from pipelines.runtime.replan import transfer as reseed

        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        with open(gdir / "reseed.log", "ab") as log:
            log.write(f"{TRANSFER_LOG_MARK} {priority} priority\n".encode())
            log.flush()
            # A session of its own: its JVM and Python workers end with it.
            proc = subprocess.Popen([sys.executable, "-m", "pipelines.runtime.replan.transfer",
                                     "--priority", priority, str(gdir / "reseed-job.json")],
                                    cwd=PROJECT_ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + replan.CATCH_UP_TIMEOUT_S
        watch = reseed.StarvationWatch(proc.pid) if priority == reseed.IDLE else None
        # Its own session: the process group is the transfer's (its JVM, Python workers).
        gate = reseed.TransferGate(proc.pid) if gated else None
        self.runner.transfer_gate = gate
        try:
            while proc.poll() is None:
                if self.runner.stop_event.wait(0.2) or time.monotonic() > deadline:
                    raise replan.ReplanError("the run is stopping" if self.runner.stop_event.is_set()
                                             else "the state transfer took longer than "
                                             f"{replan.CATCH_UP_TIMEOUT_S:.0f} s")
                if not (old.query and old.query.isActive):
                    raise replan.ReplanError("the old query ended during the transfer")
                if watch is not None and watch.starved(gate.held_s if gate else 0.0):
                    watch = None
                    raised = reseed.raise_priority(proc.pid)
                    print(f"re-plan: the state transfer got less than "
                          f"{reseed.STARVED_SHARE:.0%} of a core for "
                          f"{reseed.STARVED_WINDOW_S:.0f} s at idle priority; raised "
                          f"{raised} threads to low priority", file=sys.stderr, flush=True)
        finally:
            self.runner.transfer_gate = None
            if gate is not None:
                gate.close()
            # The whole session: a JVM or Python worker left behind would take the CPU
            # the run needs.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if proc.returncode != 0:
            text = (gdir / "reseed.log").read_text(errors="replace")
            tail = text.rsplit(TRANSFER_LOG_MARK, 1)[-1].strip().splitlines()[1:]
            errors = [ln for ln in tail if "Error" in ln or "Exception" in ln] or tail
            raise _TransferFailed(f"the state transfer failed: {errors[-1][:300]}"
                                  if errors else "the state transfer failed")
        result = json.loads((gdir / "reseed-result.json").read_text())
        if gate is not None:
            result.update(gated_s=round(gate.held_s, 1), gate_holds=gate.holds)
        return result

    def _adopt(self, new: replan.Generation, spec: definition.PipelineSpec) -> None:
        """The new generation is the run's query: placement, metrics and commands act
        on it from its next batch."""
        self.runner.write_pe_plan(spec, new)
        self.runner.routing.abort("the query was re-planned")
        routing = elastic.RoutingTable(spec.key_groups)
        self.runner.metrics.adopt(spec, routing, new.checkpoint)
        self.runner.reconfig.spec, self.runner.reconfig.routing = spec, routing
        self.runner.spec, self.runner.routing = spec, routing
        self.runner.coord = placement.StateStoreCoordinatorView(
            self.runner.spark, str(new.query.runId), new.checkpoint, spec.key_groups)
        old, self.runner.query, self.runner.sink, self.runner.generation = (self.runner.generation, new.query,
                                                       new.sink, new)
        old.adopted = False
        new.adopted = True

    def _stop_written(self, gen: replan.Generation) -> None:
        """Stop ``gen``'s query once the output it was forwarding is written."""
        if not self.runner.arbiter.wait_written(gen, replan.CATCH_UP_TIMEOUT_S):
            raise replan.ReplanError(f"generation {gen.number}'s forwarded batch was not "
                                     f"written within {replan.CATCH_UP_TIMEOUT_S:.0f} s")
        # ... and reported: a stopped query's last progress event never comes, and the
        # run's metrics (and the re-plan's own measurement) would miss that batch.
        last = self.runner.arbiter.last_forwarded.get(gen.number)
        deadline = time.monotonic() + REPORT_WAIT_S
        while (last is not None and self.runner.metrics.reported.get(gen.number, -1) < last
               and time.monotonic() < deadline):
            time.sleep(0.05)
        gen.query.stop()

    def _abandon(self, new: replan.Generation) -> None:
        self.runner.arbiter.withdraw(new)
        if new.query is not None:
            try:
                new.query.stop()
            except Exception:  # a failed query can raise on stop; it is gone either way
                pass
