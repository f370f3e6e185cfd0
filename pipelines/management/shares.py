"""Three runs of different priorities on an over-committed cluster, on the real stack:
the scenario of ``manage.py bench shares`` and of ``tests/spark/test_shares_spark.py``.

The fleet settings share 4 cores (the Spark worker offers more: the limit is the
arbiter's, as when cores are kept for other applications). The runs hold all four:

* ``shares-high`` (priority 3): Lat-Node MPC on 1-2 workers; its rate steps from
  ``LOW_RPS`` to ``HIGH_RPS`` at ``STEP_AT_S``, when one worker no longer keeps up;
* ``shares-low`` (priority 1): 2 workers, a low rate, under ``static-min`` (it always
  proposes 1 worker) with the example decision plug-in ``quiet-hour-end``, which vetoes
  every scale-down while ``QUIET_HOUR_END_MINUTES`` is 60 (the tests' and this bench's
  processes set it): a veto recorded on a live run, and the run keeps its 2 workers;
* ``shares-mid`` (priority 2): manual, 1 worker, a low rate.

Every record waits ``WAIT_US`` in the ``external_wait`` operator (a call to an external
service: a known cost per record on any machine, no CPU), so one worker carries at most
~1/WAIT_US records/s less its batches' fixed cost, and two carry twice that. After the
step the high run's controller asks for a second worker; the arbiter takes one back from
the low-priority run by a planned scale-down (its key groups move first) and grants it.
Each run's output is checked by the verifier afterwards.

Before that, an excluded period holds: the fleet settings exclude every minute until the
high run's controller, past the step, has a scale-up held as ``excluded``; the period
then ends (the settings are cleared) and the next control step scales.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control.models import Decision, FleetSettings, Policy
from control.policies import save_policy
from pipelines import actions
from pipelines.models import MetricSample, Pipeline, Run, RunStatus

WAIT_US = 1000
LOW_RPS = 100
HIGH_RPS = 900
# The high run starts once the other two carry batches; its step comes after its first
# batch (3-5 s after the schedule's origin with a warm standby, ~20 s cold) and its
# warm-up batches (WARMUP_BATCHES, ~1-1.5 s each here), so that its controller has seen
# the low rate first. Later than that only delays the scenario: a controller whose
# warm-up ends after the step decides on the overload when it ends.
STEP_AT_S = 30
WARMUP_BATCHES = 6
SHARED_CORES = 4
# The low and mid runs are batch-like: a loose bound, so that their own models see no
# violation on one worker, however loaded the machine (a tight one made the low run's
# loss weigh as much as the high run's gain on a busy machine, and the arbiter kept it).
LOOSE_BOUND_MS = 60_000
CONTROL_STEP_S = 1.0
TRIGGER_MS = 500
BOUND_MS = 5000


@dataclass(frozen=True)
class ShareRun:
    name: str
    priority: int
    strategy: str
    initial_workers: int
    max_workers: int
    rate: dict[str, Any]
    plugins: tuple[str, ...] = ()


RUNS = (
    ShareRun("shares-high", 3, "lat-node", 1, 2,
             {"kind": "step", "steps": [[0, LOW_RPS], [STEP_AT_S, HIGH_RPS]]}),
    ShareRun("shares-low", 1, "static-min", 2, 2,
             {"kind": "constant", "records_per_s": LOW_RPS}, ("quiet-hour-end",)),
    ShareRun("shares-mid", 2, "manual", 1, 1, {"kind": "constant", "records_per_s": LOW_RPS}),
)


def definition(rate: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"nodes": [
        {"id": "orders", "type": "generator", "seed": seed, "partitions": 2, "rate": rate,
         "keys": {"kind": "zipf", "n": 200, "s": 1.1}},
        {"id": "lookup", "type": "python", "input": "orders", "function": "external_wait",
         "params": {"us_per_record": WAIT_US}},
        {"id": "totals", "type": "keyed_aggregate", "input": "lookup", "key": ["key"],
         "aggregates": {"orders": ["count", "value"], "amount": ["sum", "value"]}},
        {"id": "out", "type": "sink", "input": "totals", "keep_output": True}],
        # Two groups: a scale-up or -down moves one (each move waits for a batch, and
        # the high run's batches are long once it is overloaded).
        "key_groups": 2, "trigger_ms": TRIGGER_MS}


def prepare(user: Any) -> list[tuple[ShareRun, Pipeline, Policy]]:
    """The three pipelines and policies (new versions where this file changed)."""
    made = []
    for i, spec in enumerate(RUNS):
        pipeline = Pipeline.objects.filter(name=spec.name).first() or Pipeline(name=spec.name)
        doc = definition(spec.rate, seed=20 + i)
        if pipeline.definition != doc:
            pipeline.definition = doc
            pipeline.description = f"{__name__}: {spec.name}"
            pipeline = actions.save_pipeline(pipeline, user)
        policy = Policy.objects.filter(name=spec.name).first() or Policy(name=spec.name)
        values = {"latency_bound_ms": BOUND_MS if spec.priority == 3 else LOOSE_BOUND_MS,
                  "power_budget_w": 40,
                  "control_step_s": CONTROL_STEP_S, "min_workers": 1,
                  "initial_workers": spec.initial_workers, "max_workers": spec.max_workers,
                  "strategy": spec.strategy, "priority": spec.priority,
                  "guaranteed_workers": 1, "decision_plugins": list(spec.plugins),
                  "strategy_params": {"horizon": 2, "transition_weight": 0,
                                      "warmup_batches": WARMUP_BATCHES}
                  if spec.strategy == "lat-node" else
                  {"warmup_batches": WARMUP_BATCHES} if spec.strategy != "manual" else {}}
        for key, value in values.items():
            setattr(policy, key, value)
        policy.full_clean()
        made.append((spec, pipeline, save_policy(policy, user)))
    return made


@dataclass
class Outcome:
    runs: dict[str, Run]
    started: float
    excluded_step: int | None = None  # its first scale-up held by the excluded period
    asked_step: int | None = None  # the high run's first decision asking for more
    granted_step: int | None = None  # its first decision granted (pending/applied) at 2
    preempted: Decision | None = None
    carried_at: float | None = None  # its first batch on 2 workers (s after start)
    log: list[str] = field(default_factory=list)


EVERY_MINUTE = "* * * * *"


def run_scenario(user: Any, timeout_s: float = 420.0,
                 say: Callable[[str], None] = print, excluded_first: bool = True) -> Outcome:
    """Start the three runs, wait until the high run carries a batch on its second
    worker (or ``timeout_s``), stop them. FleetSettings are restored afterwards."""
    shared = FleetSettings.current()
    before = (shared.cores_limit, shared.arbiter, shared.excluded_periods)
    FleetSettings.objects.filter(pk=shared.pk).update(
        cores_limit=SHARED_CORES, arbiter="priority",
        excluded_periods=[EVERY_MINUTE] if excluded_first else [])
    made = prepare(user)
    runs: dict[str, Run] = {}
    try:
        # The others first: the high run's step must find them holding their cores.
        started = time.time()
        for spec, pipeline, policy in made[1:]:
            runs[spec.name] = actions.create_run(pipeline, policy, user)
        _wait(lambda: all(MetricSample.objects.filter(run=r).exists() for r in runs.values()),
              300, "the low and mid runs' first batches", runs)
        spec, pipeline, policy = made[0]
        runs = {spec.name: actions.create_run(pipeline, policy, user), **runs}
        outcome = Outcome(runs, started)
        say(f"started runs {', '.join(f'{n} #{r.pk}' for n, r in runs.items())}")
        _wait(lambda: all(Run.objects.get(pk=r.pk).status == RunStatus.RUNNING
                          for r in runs.values()), 300, "the three runs to be running", runs)
        high = runs["shares-high"]
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            _check_alive(runs)
            decisions = list(Decision.objects.filter(run=high).order_by("step"))
            held = next((d for d in decisions if d.outcome == "excluded"), None)
            if held is not None and outcome.excluded_step is None:
                outcome.excluded_step = held.step
                FleetSettings.objects.filter(pk=shared.pk).update(excluded_periods=[])
                say(f"step {held.step}: {held.current_workers} -> {held.chosen_workers} "
                    f"held ({held.outcome_message}); the excluded period ends now")
            for d in decisions:
                if d.outcome == "excluded":
                    continue
                if outcome.asked_step is None and d.chosen_workers > d.current_workers:
                    outcome.asked_step = d.step
                    say(f"high run asks {d.current_workers} -> {d.chosen_workers} at step "
                        f"{d.step}, {d.at.timestamp() - started:.0f} s after the start "
                        f"({d.outcome}: {d.outcome_message})")
                if outcome.granted_step is None and d.chosen_workers == 2 and \
                        d.outcome in ("pending", "applied"):
                    outcome.granted_step = d.step
            outcome.preempted = Decision.objects.filter(
                run=runs["shares-low"], strategy="arbiter").first()
            grant = next((d for d in decisions if d.step == outcome.granted_step), None)
            if grant is not None and grant.outcome == "failed":
                raise RuntimeError(f"the high run's scale-up failed: {grant.outcome_message}")
            if grant is not None and grant.applied_at is not None:
                # Its first batch after the scale-up took effect (key groups moved).
                two = MetricSample.objects.filter(run=high, workers=2,
                                                  t__gt=grant.applied_at).order_by("t").first()
                if two is not None and outcome.carried_at is None:
                    outcome.carried_at = two.t.timestamp() - started
                    say(f"high run carried a batch on 2 workers {outcome.carried_at:.0f} s "
                        "after the start")
            # Done when the high run carries its second worker and the low run's
            # scale-down has ended.
            if outcome.carried_at is not None and (
                    outcome.preempted is None or outcome.preempted.outcome != "pending"):
                break
            time.sleep(1)
        return outcome
    finally:
        for run in runs.values():
            run.refresh_from_db()
            if not run.is_terminal:
                actions.request_stop(run, user)
        _wait(lambda: all(Run.objects.get(pk=r.pk).is_terminal for r in runs.values()),
              180, "the runs to stop", runs)
        FleetSettings.objects.filter(pk=shared.pk).update(
            cores_limit=before[0], arbiter=before[1], excluded_periods=before[2])


def _check_alive(runs: dict[str, Run]) -> None:
    for name, run in runs.items():
        status = Run.objects.get(pk=run.pk).status
        if status in (RunStatus.FAILED, RunStatus.LOST, RunStatus.STOPPED):
            raise RuntimeError(f"{name} (run {run.pk}) is {status}")


def _wait(ready: Callable[[], bool], timeout_s: float, what: str,
          runs: dict[str, Run]) -> None:
    deadline = time.time() + timeout_s
    while not ready():
        if time.time() > deadline:
            states = {n: Run.objects.get(pk=r.pk).status for n, r in runs.items()}
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s ({states})")
        time.sleep(1)


def verify(run: Run) -> Any:
    from pipelines.runtime.verify import verifier

    run.refresh_from_db()
    return verifier.verify_run_dir(Path(run.checkpoint_dir))


def _timeline(run: Run, started: float) -> list[str]:
    """The run's decisions to reconfigure, a streak of the same one (a veto repeated
    every step) as one line with its count."""
    lines: list[str] = []
    last_key, count = None, 0
    for d in Decision.objects.filter(run=run).order_by("step"):
        if d.action == "hold" and d.strategy != "arbiter":
            continue
        key = (d.strategy, d.current_workers, d.chosen_workers, d.outcome)
        if key == last_key:
            count += 1
            lines[-1] = lines[-1].split(" [x")[0] + f" [x{count}]"
            continue
        last_key, count = key, 1
        lines.append(f"{d.at.timestamp() - started:5.0f}s step {d.step} {d.strategy}: "
                     f"{d.current_workers}->{d.chosen_workers} {d.outcome}"
                     + (f" ({d.outcome_message[:120]})" if d.outcome != "hold" else ""))
    return lines


def report(outcome: Outcome) -> list[dict[str, Any]]:
    """Per run: priority, the cores it asked for and held over time (its decisions and
    batches), its batches over the bound, and the verifier's verdict."""
    rows = []
    for name, run in outcome.runs.items():
        run.refresh_from_db()
        policy = run.policy_in_force
        timeline = _timeline(run, outcome.started)
        samples = MetricSample.objects.filter(run=run)
        held = sorted({s.workers for s in samples})
        over = samples.filter(latency_p95_ms__gt=policy.latency_bound_ms).count()
        checked = verify(run)
        rows.append({"run": name, "id": run.pk, "priority": policy.priority,
                     "workers_held": held, "batches": samples.count(),
                     "violations": over, "timeline": timeline,
                     "verifier": checked.line(), "verified": checked.ok,
                     "problems": checked.problems[:5]})
    return rows
