"""What the fleet page shows (``control.views.fleet_page``): every active run at a
glance and the cluster's cores in use, read in a few queries."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from control import ticks
from control.models import Decision, FleetSettings
from pipelines.models import ACTIVE_STATUSES, EventKind, MetricSample, Run, RunEvent

SPARK_POINTS = 60  # the sparkline's batches
SPARK_W, SPARK_H = 160, 28
ALERT_WINDOW = dt.timedelta(minutes=10)  # an alert this recent is "open"


@dataclass(frozen=True)
class Sparkline:
    """The p95 of the last batches as an SVG polyline, with the bound as a line; the
    y axis runs from 0 to the larger of the bound and the highest p95 (times 1.1)."""

    points: str
    bound_y: float
    latest_ms: float | None
    over: bool
    width: int = SPARK_W
    height: int = SPARK_H


def sparkline(values: list[float | None], bound_ms: float) -> Sparkline:
    known = [v for v in values if v is not None]
    top = max([bound_ms, *known]) * 1.1 or 1.0

    def y(v: float) -> float:
        return round(SPARK_H - v / top * SPARK_H, 1)

    step = SPARK_W / max(len(values) - 1, 1)
    points = " ".join(f"{round(i * step, 1)},{y(v)}" for i, v in enumerate(values)
                      if v is not None)
    latest = known[-1] if known else None
    return Sparkline(points, y(bound_ms), latest, latest is not None and latest > bound_ms)


def update_fleet_settings(data: dict[str, Any], user: Any) -> tuple[bool, Any]:
    """Change the fleet settings (arbiter, cores shared, cluster-wide excluded periods;
    admins only, checked by the caller) from ``data``; fields left out keep their value.
    The Cluster page and the API both call it; the save is audited
    (``audit.tracking``). Returns (saved, the form: its errors when not saved)."""
    from control.forms import FleetSettingsForm

    shared = FleetSettings.current()
    merged = {"arbiter": shared.arbiter, "cores_limit": shared.cores_limit or "",
              "excluded_periods": shared.excluded_periods,
              **{k: ("" if v is None else v) for k, v in data.items()}}
    form = FleetSettingsForm(merged, instance=shared)
    if not form.is_valid():
        return False, form
    saved = form.save(commit=False)
    saved.updated_by = user if getattr(user, "pk", None) else None
    saved.save()
    return True, form


def overview() -> dict[str, Any]:
    shared = FleetSettings.current()
    cores, source = ticks.fleet_capacity(shared)
    runs = list(Run.objects.filter(status__in=ACTIVE_STATUSES)
                .select_related("policy", "pipeline_version__pipeline").order_by("pk"))
    since = timezone.now() - ALERT_WINDOW
    rows = []
    for run in runs:
        policy = run.policy_in_force
        samples = list(MetricSample.objects.filter(run=run).order_by("-t", "-batch_id")
                       .values_list("latency_p95_ms", "output_rate", "input_rate")
                       [:SPARK_POINTS])[::-1]
        last = Decision.objects.filter(run=run).order_by("-step").first()
        alerts = RunEvent.objects.filter(run=run, kind=EventKind.ALERT, at__gte=since)
        rows.append({
            "run": run, "policy": policy,
            "spark": sparkline([s[0] for s in samples], policy.latency_bound_ms),
            "rate": samples[-1][1] if samples else None,
            "arrivals": samples[-1][2] if samples else None,
            "asked": last.chosen_workers if last else run.workers,
            "last": last, "alerts": alerts.count(),
            "alert": alerts.order_by("-at").values_list("message", flat=True).first()})
    in_use = sum(r.workers or 0 for r in runs)
    return {"rows": rows, "cores": cores, "cores_source": source, "in_use": in_use,
            "fleet": shared}
