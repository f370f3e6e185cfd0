"""Strategy Lab domain actions: start a comparison, run it (from the Celery task), turn a
result into a downloadable bundle, and create a Policy from one compared strategy."""
from __future__ import annotations

import csv
import io
import json
import math
import re
import time
import zipfile
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from audit import log as audit
from control import live, policies, sim
from control.sim import engine, from_run
from control.sim import fleet as fleetsim
from control.models import MAX_WORKERS_LIMIT, LabRun, LabStatus, Policy
from pipelines.queue import Task, enqueue
from pipelines.runtime.host.power import NOMINAL_GHZ, modelled_power

# The presets offered in the form: the thesis' grid (Table 7.2 strategies, NoSw and
# Sw h = 1..3) and the baselines.
PRESETS: dict[str, dict[str, Any]] = {}
for _name in ("lat-node", "lat-power", "th-node", "th-power"):
    PRESETS[f"{_name} NoSw"] = {"name": _name, "switching": False}
    for _h in (1, 2, 3):
        PRESETS[f"{_name} Sw h={_h}"] = {"name": _name, "horizon": _h}
for _name in sim.RULES:
    PRESETS[_name] = {"name": _name}
DEFAULT_PRESETS = ("lat-node Sw h=1", "lat-node NoSw", "lat-power Sw h=1", "th-rule",
                   "lat-rule", "peak-load")
PROGRESS_EVERY_S = 0.2
# The bound of a policy made from an uncalibrated comparison: a micro-batch run's p95 is
# seconds (the batch overhead alone is ~1 s here), never the thesis' 1.5 ms.
DEFAULT_LIVE_BOUND_MS = 10_000.0
SERIES_FIELDS = list(engine.StepRecord.__dataclass_fields__)
SUMMARY_FIELDS = list(engine.SUMMARY_FIELDS)


# A comparison's cost is measured before it is queued: each strategy runs a few steps
# on its share of PROBE_BUDGET_S (the whole probe stops past twice it; a step already
# started always finishes). A run's first steps cost several times its later
# ones (3-7x here: the forecasters' short history, the start of the trace), so the
# probe's mean would refuse comparisons that fit; the cheapest step of each strategy
# extrapolates to a lower bound instead, and the time limit stops what it missed.
# Costs are this thread's CPU time, the budget wall time: a simulation runs on one
# thread, so its wall time is at least its CPU time under any load, while a wall-clock
# probe on a loaded machine (another process's batches, a CI lane beside) counted the
# other processes' share as the comparison's own.
PROBE_STEPS = 5
PROBE_BUDGET_S = 2.0


class LabTimeLimit(Exception):
    """A comparison ran past ``settings.LAB_TIME_LIMIT_S``."""


def active_labs(user: Any) -> int:
    """The user's comparisons queued or running: ``settings.LAB_MAX_ACTIVE_PER_USER``
    caps them, so that one user cannot hold the Lab queue."""
    return LabRun.objects.filter(created_by=user, status__in=(
        LabStatus.PENDING, LabStatus.RUNNING)).count()


def estimate_seconds(scenario: dict[str, Any], stop_above: float = math.inf) -> float:
    """At least how long ``scenario`` takes to simulate here, in seconds: its set-up
    (parsing, building each strategy: measured) plus, for each strategy, its cheapest
    probed step times its steps, in CPU seconds of this thread on this machine.

    Each strategy is probed on its own share of ``PROBE_BUDGET_S``, so that a cheap
    first strategy cannot stand for an expensive one; one that does not finish two
    steps within the budget is counted at its mean step so far. The probe ends as soon
    as the bound passes ``stop_above``, and past twice the budget the strategies not
    yet probed are counted at the cheapest step seen: the form's answer stays quick."""
    steps = int(scenario["steps"])
    specs = scenario["strategies"]
    share = PROBE_BUDGET_S / max(len(specs), 1)
    started, cpu_started = time.perf_counter(), time.thread_time()
    scn = sim.parse_scenario({**scenario, "steps": min(steps, PROBE_STEPS)})
    total = time.thread_time() - cpu_started
    cheapest = math.inf
    for i, spec in enumerate(specs):
        if total > stop_above:
            break
        if time.perf_counter() - started > 2 * PROBE_BUDGET_S:
            total += cheapest * steps * (len(specs) - i)
            break
        per_step, set_up = _probe_strategy(scn, spec, i, share)
        cheapest = min(cheapest, per_step)
        total += set_up + per_step * steps
    return total


def _probe_strategy(scn: Any, spec: dict, index: int, share_s: float) -> tuple[float, float]:
    """One strategy's cheapest step and set-up time, in CPU seconds, on the probe (its
    share of the budget in wall seconds)."""
    begun = time.thread_time()
    label, controller = sim.build_controller(spec, scn, index)
    stamps = [time.thread_time()]
    wall_start = time.perf_counter()

    def step_done(_t: int) -> None:
        stamps.append(time.thread_time())
        spent = time.perf_counter() - wall_start
        if (len(stamps) > 2 and spent > share_s) or spent > PROBE_BUDGET_S:
            raise LabTimeLimit

    try:
        engine.run(scn, label, controller, on_step=step_done)
    except LabTimeLimit:
        pass
    set_up = stamps[0] - begun
    gaps = [later - earlier for earlier, later in zip(stamps[1:], stamps[2:])]
    if gaps:  # the first step also holds the run's set-up: not one step's cost
        return min(gaps), set_up
    return (time.thread_time() - stamps[0]) / max(len(stamps) - 1, 1), set_up


def start_lab(user: Any, name: str, scenario: dict) -> LabRun:
    """Store the comparison and queue it; the page follows its progress."""
    runs = len(scenario.get("arbiters") or ["priority", "fcfs"]) if fleetsim.is_fleet(
        scenario) else len(scenario["strategies"])
    lab = LabRun.objects.create(name=name, scenario=scenario, created_by=user,
                                total=runs * int(scenario.get("steps", 120)))
    transaction.on_commit(lambda: enqueue(Task.RUN_LAB, lab.pk))
    return lab


def execute(lab_id: int, time_limit_s: float | None = None) -> str:
    """Run a pending lab (idempotent: a repeated delivery finds it started and leaves).
    Past ``time_limit_s`` (default ``settings.LAB_TIME_LIMIT_S``) it stops and is
    marked failed, before Celery's hard limit would kill the worker under it."""
    from django.conf import settings
    from django.utils import timezone

    limit = settings.LAB_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    claimed = LabRun.objects.filter(pk=lab_id, status=LabStatus.PENDING).update(
        status=LabStatus.RUNNING, started_at=timezone.now())
    if not claimed:
        return f"lab {lab_id} is not pending: ignored"
    lab = LabRun.objects.get(pk=lab_id)
    _status_changed(lab, LabStatus.PENDING, LabStatus.RUNNING)
    started = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - started > limit:
            raise LabTimeLimit(f"stopped at the Lab's time limit of {limit:g} s after "
                               f"{done:,} of {total:,} steps; compare fewer strategies "
                               "or steps")
        if now - last[0] >= PROGRESS_EVERY_S or done == total:
            last[0] = now
            LabRun.objects.filter(pk=lab_id).update(progress=done, total=total)

    try:
        simulate = fleetsim.simulate_fleet if fleetsim.is_fleet(lab.scenario) else \
            sim.simulate
        result = simulate(lab.scenario, progress=progress)
    except (sim.ScenarioError, LabTimeLimit) as exc:
        LabRun.objects.filter(pk=lab_id).update(status=LabStatus.FAILED, error=str(exc))
        _status_changed(lab, LabStatus.RUNNING, LabStatus.FAILED, str(exc))
        return f"lab {lab_id} failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - stored for the operator, then re-raised
        LabRun.objects.filter(pk=lab_id).update(status=LabStatus.FAILED,
                                                error=f"{type(exc).__name__}: {exc}")
        _status_changed(lab, LabStatus.RUNNING, LabStatus.FAILED,
                        f"{type(exc).__name__}: {exc}")
        raise
    LabRun.objects.filter(pk=lab_id).update(
        status=LabStatus.DONE, result=result, progress=lab.total,
        duration_s=time.perf_counter() - started)
    _status_changed(lab, LabStatus.RUNNING, LabStatus.DONE)
    return f"lab {lab_id} done"


def fail_stale_labs() -> int:
    """Mark failed the labs still "running" well past the time limit: the worker that
    ran each was killed under it (Celery's hard limit, a crash), so nothing else will."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    limit = settings.LAB_TIME_LIMIT_S
    cutoff = timezone.now() - timedelta(seconds=limit + STALE_GRACE_S)
    failed = 0
    for lab in LabRun.objects.filter(status=LabStatus.RUNNING, started_at__lt=cutoff):
        message = (f"its worker stopped: still running {limit + STALE_GRACE_S:g} s after "
                   "it started, past the Lab's time limit")
        if LabRun.objects.filter(pk=lab.pk, status=LabStatus.RUNNING).update(
                status=LabStatus.FAILED, error=message):
            _status_changed(lab, LabStatus.RUNNING, LabStatus.FAILED, message)
            failed += 1
    return failed


# How long past its time limit a running lab is taken for lost.
STALE_GRACE_S = 60.0


def _status_changed(lab: LabRun, was: str, now: str, message: str = "") -> None:
    """Status changes are QuerySet updates (no save signal): audited here."""
    audit.record("changed", lab, before={"status": was}, after={"status": now},
                 message=message, actor="system")


def _ordered(keys: list[str], canonical: list[str]) -> list[str]:
    """PostgreSQL's jsonb does not keep key order: put keys back in the engine's order."""
    return [k for k in canonical if k in keys] + sorted(k for k in keys if k not in canonical)


def summary_rows(lab: LabRun) -> list[dict]:
    if not lab.result:
        return []
    if lab.result.get("kind") == "fleet":
        return fleet_rows(lab)
    rows = []
    for r in lab.result["results"]:
        keys = _ordered(list(r["summary"]), SUMMARY_FIELDS)
        rows.append({"label": r["label"], **{k: r["summary"][k] for k in keys}})
    return rows


FLEET_FIELDS = ("latency_violations", "throughput_violations", "mean_workers",
                "p95_latency_ms", "reconfigurations", "refused", "preempted", "excluded",
                "vetoed")


def fleet_rows(lab: LabRun) -> list[dict]:
    """A fleet comparison's summary: one row per arbiter and run."""
    rows = []
    for r in (lab.result or {}).get("results", []):
        for run in r["runs"]:
            rows.append({"arbiter": r["arbiter"], "run": run["name"],
                         "priority": run["priority"],
                         **{k: run["summary"].get(k) for k in FLEET_FIELDS}})
    return rows


def fleet_totals(lab: LabRun) -> list[dict]:
    """Per arbiter: violations (plain and priority-weighted), cores used, preemptions."""
    return [{"arbiter": r["arbiter"], "label": r["label"], **r["summary"]}
            for r in (lab.result or {}).get("results", [])]


def bundle(lab: LabRun) -> bytes:
    """One zip: the scenario and full result as JSON, the summary and the per-step
    series as CSV."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("scenario.json", json.dumps(lab.scenario, indent=1))
        z.writestr("result.json", json.dumps(lab.result, allow_nan=False))
        rows = summary_rows(lab)
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        z.writestr("summary.csv", out.getvalue())
        out = io.StringIO()
        results = (lab.result or {}).get("results", [])
        if results and lab.result.get("kind") == "fleet":
            writer = csv.writer(out)
            writer.writerow(["arbiter", "run", "step", "asked", "workers", "latency_ms",
                             "rate", "cores_used"])
            for r in results:
                for run in r["runs"]:
                    series = run["series"]
                    for i, workers in enumerate(series["workers"]):
                        writer.writerow([r["arbiter"], run["name"], i, series["asked"][i],
                                         workers, series["latency_ms"][i],
                                         series["rate"][i], r["cores_used"][i]])
        elif results:
            fields = _ordered(list(results[0]["series"]), SERIES_FIELDS)
            writer = csv.writer(out)
            writer.writerow(["strategy", *fields])
            for r in results:
                for i in range(len(r["series"][fields[0]])):
                    writer.writerow([r["label"], *(r["series"][f][i] for f in fields)])
        z.writestr("series.csv", out.getvalue())
    return buf.getvalue()


def _spec_for(lab: LabRun, label: str) -> dict | None:
    for spec in lab.scenario.get("strategies", []):
        if (spec.get("label") or sim.strategy_label(spec)) == label:
            return spec
    return None


def runs_to_calibrate_from(limit: int = 30) -> list[tuple[int, str]]:
    """The newest runs with enough batches to calibrate a comparison, as form choices."""
    from django.db.models import Count

    from pipelines.models import Run

    runs = (Run.objects.filter(started_at__isnull=False)
            .select_related("pipeline_version__pipeline").annotate(batches=Count("samples"))
            .filter(batches__gte=from_run.MIN_BATCHES + live.WARMUP_BATCHES)
            .order_by("-pk")[:limit])
    return [(r.pk, f"#{r.pk} {r.pipeline_version.pipeline.name} ({r.status}, "
                   f"{r.batches} batches)") for r in runs]


def calibrated_scenario(scenario: dict[str, Any], run_id: int) -> dict[str, Any]:
    """``scenario`` calibrated from run ``run_id``: its batches fit the micro-batch model,
    its arrival rate is the trace, its policy version gives the bound, the worker range
    and the control step. ``sim.ScenarioError`` says why a run cannot calibrate."""
    from pipelines.models import Run

    run = Run.objects.filter(pk=run_id).select_related("policy").first()
    if run is None:
        raise sim.ScenarioError(f"run {run_id} does not exist")
    policy = run.policy_in_force
    rows = run.samples.order_by("batch_id").values(
        "t", "batch_id", "input_rows", "batch_duration_ms", "workers", "frequency_ghz",
        "failed_tasks", "migration", "scheduled_rate", "input_rate")
    batches = [{**r, "t": r["t"].timestamp()} for r in rows]
    fit = from_run.fit_run(run.pk, batches, float(policy.control_step_s),
                           [float(f) for f in run.frequencies or []])
    return from_run.apply_fit(scenario, fit, float(policy.latency_bound_ms),
                              int(policy.min_workers), int(policy.max_workers),
                              int(policy.initial_workers))


def _peak_config(row: dict[str, Any]) -> tuple[int, float] | None:
    """The most powerful (workers, GHz) a compared strategy used."""
    series = row.get("series", {})
    pairs = [(int(n), float(f)) for n, f in zip(series.get("workers", []),
                                                series.get("freq_ghz", []), strict=False)
             if n is not None and f is not None]
    return max(pairs, key=lambda c: modelled_power(*c)) if pairs else None


def policy_from_lab(lab: LabRun, label: str, user: Any) -> tuple[Policy | None, str]:
    """A Policy with the strategy and parameters of one compared strategy that a live run
    can use, checked as the policy form checks (the cluster's cores, the strategy's
    parameters): no setting a live run cannot meet.

    A comparison calibrated from a run is in that run's units: the policy takes its
    bound, worker range and control step, and a power budget 10 % above the live power
    model's watts (Eq. 6.11, modelled) at the most powerful configuration the strategy
    chose. An uncalibrated comparison is in the thesis' units (a 1.5 ms bound, the
    simulator's watts): the policy takes the strategy and its parameters, and the
    bound, budget and worker range a new policy starts with, said in the message."""
    from pipelines.cluster_status import cluster_cores

    spec = _spec_for(lab, label)
    row = next((r for r in (lab.result or {}).get("results", []) if r["label"] == label), None)
    if spec is None or row is None:
        return None, f"lab {lab.pk} has no result for {label!r}"
    # Only what the closed loop takes (the simulator's Kingman-only knobs stay in the lab).
    allowed = live.PARAMS.get(spec["name"], ())
    params = {k: v for k, v in spec.items() if k in allowed}
    base = re.sub(r"[^a-z0-9]+", "-", f"lab{lab.pk}-{label}".lower()).strip("-")[:90]
    name, n = base, 1
    while Policy.objects.filter(name=name).exists():
        n += 1
        name = f"{base}-{n}"
    cores = min(cluster_cores()[0], MAX_WORKERS_LIMIT)
    calibrated = lab.scenario.get("calibrated_from")
    if calibrated:
        system, qos = lab.scenario.get("system", {}), lab.scenario.get("qos", {})
        max_workers = max(1, min(int(system.get("max_workers", 1)), cores))
        min_workers = min(int(system.get("min_workers", 1)), max_workers)
        peak = _peak_config(row) or (max_workers, max(system.get("freqs_ghz") or [NOMINAL_GHZ]))
        values = {
            "latency_bound_ms": float(qos["latency_bound_ms"]),
            "power_budget_w": round(1.1 * modelled_power(min(peak[0], max_workers), peak[1]),
                                    1),
            "control_step_s": float(lab.scenario.get("step_s", 2.0)),
            "min_workers": min_workers, "max_workers": max_workers,
            "initial_workers": min(max(min_workers, int(system.get("initial_workers", 1))),
                                   max_workers)}
        said = (f"calibrated from run {calibrated['run']}: its bound, worker range and "
                "control step; power budget 10 % above the modelled watts of the strategy's "
                "most powerful configuration")
    else:
        defaults = {f: Policy._meta.get_field(f).default for f in
                    ("control_step_s", "min_workers", "max_workers", "initial_workers")}
        max_workers = min(int(defaults["max_workers"]), cores)
        values = {**defaults, "max_workers": max_workers,
                  "min_workers": min(int(defaults["min_workers"]), max_workers),
                  "initial_workers": min(int(defaults["initial_workers"]), max_workers),
                  "latency_bound_ms": DEFAULT_LIVE_BOUND_MS,
                  "power_budget_w": round(1.1 * modelled_power(max_workers, NOMINAL_GHZ), 1)}
        said = ("the comparison ran in the simulator's units, so the bound "
                f"({DEFAULT_LIVE_BOUND_MS:g} ms), budget and worker range are a new "
                "policy's defaults: edit them, or calibrate a comparison from a run")
    policy = Policy(
        name=name, description=f"From Strategy Lab comparison {lab.pk} ({lab.name}): "
                               f"{label}; {said}.",
        strategy=spec["name"], strategy_params=params, **values)
    try:
        # The model checks the strategy's parameters as the closed loop does; the
        # worker range is clamped to the cluster's cores above (the form's own check).
        policy.full_clean()
    except ValidationError as exc:
        return None, f"could not create a policy from {label}: {'; '.join(exc.messages)}"
    policy = policies.save_policy(policy, user)
    return policy, f"Policy {policy.name} created from {label} ({said})."
