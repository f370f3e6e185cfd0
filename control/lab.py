"""Strategy Lab domain actions: start a comparison, run it (from the Celery task), turn a
result into a downloadable bundle, and create a Policy from one compared strategy."""
from __future__ import annotations

import csv
import io
import json
import re
import time
import zipfile
from typing import Any

from django.db import transaction

from audit import log as audit
from control import live, sim
from control.sim import engine
from control.models import MAX_WORKERS_LIMIT, LabRun, LabStatus, Policy
from pipelines.queue import Task, enqueue

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
SERIES_FIELDS = list(engine.StepRecord.__dataclass_fields__)
SUMMARY_FIELDS = list(engine.SUMMARY_FIELDS)


def start_lab(user: Any, name: str, scenario: dict) -> LabRun:
    """Store the comparison and queue it; the page follows its progress."""
    lab = LabRun.objects.create(name=name, scenario=scenario, created_by=user,
                                total=len(scenario["strategies"]) * scenario["steps"])
    transaction.on_commit(lambda: enqueue(Task.RUN_LAB, lab.pk))
    return lab


def execute(lab_id: int) -> str:
    """Run a pending lab (idempotent: a repeated delivery finds it started and leaves)."""
    claimed = LabRun.objects.filter(pk=lab_id, status=LabStatus.PENDING).update(
        status=LabStatus.RUNNING)
    if not claimed:
        return f"lab {lab_id} is not pending: ignored"
    lab = LabRun.objects.get(pk=lab_id)
    _status_changed(lab, LabStatus.PENDING, LabStatus.RUNNING)
    started = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= PROGRESS_EVERY_S or done == total:
            last[0] = now
            LabRun.objects.filter(pk=lab_id).update(progress=done, total=total)

    try:
        result = sim.simulate(lab.scenario, progress=progress)
    except sim.ScenarioError as exc:
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
    rows = []
    for r in lab.result["results"]:
        keys = _ordered(list(r["summary"]), SUMMARY_FIELDS)
        rows.append({"label": r["label"], **{k: r["summary"][k] for k in keys}})
    return rows


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
        if results:
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


def policy_from_lab(lab: LabRun, label: str, user: Any) -> tuple[Policy | None, str]:
    """A Policy with the strategy and parameters of one compared strategy, the lab's
    bound and worker range, and a power budget 10 % above the modelled peak it drew."""
    spec = _spec_for(lab, label)
    row = next((r for r in (lab.result or {}).get("results", []) if r["label"] == label), None)
    if spec is None or row is None:
        return None, f"lab {lab.pk} has no result for {label!r}"
    system = lab.scenario.get("system", {})
    qos = lab.scenario.get("qos", {})
    max_workers = min(int(system.get("max_workers", 12)), MAX_WORKERS_LIMIT)
    min_workers = min(int(system.get("min_workers", 1)), max_workers)
    power = [p for p in row["series"]["power_w"] if p is not None]
    # Only what the closed loop takes (the simulator's Kingman-only knobs stay in the lab).
    allowed = live.PARAMS.get(spec["name"], ())
    params = {k: v for k, v in spec.items() if k in allowed}
    base = re.sub(r"[^a-z0-9]+", "-", f"lab{lab.pk}-{label}".lower()).strip("-")[:90]
    name, n = base, 1
    while Policy.objects.filter(name=name).exists():
        n += 1
        name = f"{base}-{n}"
    policy = Policy(
        name=name, description=f"From Strategy Lab comparison {lab.pk} ({lab.name}): "
                               f"{label}. Power budget from the modelled peak.",
        latency_bound_ms=max(1.0, float(qos.get("latency_bound_ms", 1.5))),
        power_budget_w=round(1.1 * max(power), 1) if power else 100.0,
        control_step_s=max(0.5, float(lab.scenario.get("step_s", 1.0))),
        min_workers=min_workers, max_workers=max_workers,
        initial_workers=min(max(min_workers, int(system.get("initial_workers", min_workers))),
                            max_workers),
        strategy=spec["name"], strategy_params=params, created_by=user)
    try:
        policy.full_clean()
    except Exception as exc:  # noqa: BLE001 - shown to the operator as a message
        return None, f"could not create the policy: {exc}"
    policy.save()
    policy.current_version(user)
    return policy, f"Policy {policy.name} created from {label}."
