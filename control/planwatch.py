"""The control app's plan watch: when the processing elements of a running pipeline
saturate, propose COLA's plan as an alert that points to the run's "Optimise plan"
page: COLA's profiling loop (Khandekar et al., COLA §4: fuse with the current profile,
re-profile, fuse again) driven by the running query's own profile.

Celery beat runs ``watch_plans`` every 30 s (``PLAN_WATCH_EVERY_S``). A run is looked
at when it runs Python operators (a dataflow pipeline's ``python`` nodes); its
profile and COLA's proposal are the plan page's (``pipelines.plans.plan_page``: the
last 30 s of the current plan; no other algorithm and no drawing). The watch never
applies a plan: an operator confirms it on the page (an audited, live re-plan). A proposal is raised once per run and plan: the
next passes would only repeat it while the operator decides.
"""
from __future__ import annotations

import hashlib
import json
import logging

from control import ticks
from pipelines import actions, launch, plans
from pipelines.models import Run, RunStatus
from pipelines.runtime.query import planopt

log = logging.getLogger(__name__)
# Tasks saturate when their modelled load reaches the share of a core a plan may fill.
SATURATED_LOAD = planopt.HEADROOM
# A proposal worth an operator's attention: modelled to sustain this much more.
MIN_GAIN = 1.1
PROPOSAL_TTL_S = 24 * 3600


def proposal_message(page: plans.PlanPage) -> str | None:
    """The alert's text when the current plan's PEs saturate their tasks and COLA's
    plan is modelled to sustain at least ``MIN_GAIN`` × the current plan's rate; else
    None. (The PEs of a stage share its tasks, one after the other: the tasks saturate
    on their PEs' summed load, which is what ``total_load`` is.)"""
    current, proposed = page.current, page.proposed
    if current is None or proposed is None or not page.changes or not proposed.feasible:
        return None
    if current.total_load < SATURATED_LOAD or proposed.max_rate < MIN_GAIN * current.max_rate:
        return None
    hottest, load = max(zip(current.pes, current.pe_load, strict=True), key=lambda x: x[1])
    return (f"The plan's PEs saturate their tasks ({current.total_load:.0%} of a core "
            f"each at {page.rate:,.0f} records/s; the most, {load:.0%}, in PE "
            f"{'+'.join(hottest)}; modelled on the measured profile): COLA proposes "
            f"{len(proposed.pes)} PE(s) {' | '.join('+'.join(p) for p in proposed.pes)} "
            f"over {proposed.partitions} partition(s), modelled to sustain "
            f"{proposed.max_rate:,.0f}/s against {current.max_rate:,.0f}/s now. "
            f"Review and apply it under Optimise plan.")


def watch_plans() -> int:
    """One pass over the running runs with Python operators; the proposals raised."""
    raised = 0
    for run in Run.objects.filter(status=RunStatus.RUNNING).select_related(
            "pipeline_version", "policy"):
        if not plans.has_python_operators(run):
            continue
        try:
            page = plans.plan_page(run, algorithms=("cola",), draw=False)
            message = None if page.refusal else proposal_message(page)
        except Exception:  # one run's unreadable profile must not stop the others
            log.exception("plan watch of run %s failed", run.pk)
            continue
        if message is None or page.proposed is None:
            continue
        plan = {"pes": [list(p) for p in page.proposed.pes],
                "partitions": page.proposed.partitions}
        digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]
        key = f"control:{run.bus_key}:plan-proposed:{digest}"
        if not launch.run_bus(run).r.set(key, "1", nx=True, ex=PROPOSAL_TTL_S):
            continue
        actions.raise_alert(run, ticks.ACTOR, message, {"proposed_plan": plan})
        raised += 1
    return raised
