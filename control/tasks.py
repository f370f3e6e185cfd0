"""Celery tasks of the control app."""
from __future__ import annotations

import logging

from celery import shared_task

from control import lab

log = logging.getLogger(__name__)


@shared_task
def run_lab(lab_id: int) -> str:
    """A Strategy Lab comparison (idempotent: only a pending lab is run)."""
    return lab.execute(lab_id)


@shared_task
def control_tick_all() -> dict[str, int]:
    """Celery beat, every second: one tick for each run whose control step is due."""
    from control import loop

    decided = 0
    for run in loop.due_runs():
        try:
            decided += loop.tick(run) is not None
        except Exception:  # one run's bad tick must not starve the others
            log.exception("control tick of run %s failed", run.pk)
    return {"decided": decided}


@shared_task
def apply_decision(decision_id: int) -> str:
    """Send a decision's reconfiguration (workers first, then frequency, or its
    key-group moves), each acknowledged by the runner, and record when it took effect."""
    from control import live, loop
    from control.models import Decision
    from pipelines.models import RunStatus
    from pipelines.tasks import send_and_wait

    decision = Decision.objects.select_related("run").get(pk=decision_id)
    run = decision.run
    if run.status != RunStatus.RUNNING:
        loop.finish(decision_id, False, f"run is {run.status}")
        return "not running"
    messages, ok = [], True
    actor = f"controller (decision {decision.step})"
    if decision.chosen_workers != decision.current_workers:
        done, msg = send_and_wait(run, "set_workers", {"workers": decision.chosen_workers},
                                  actor)
        ok, messages = ok and done, messages + [msg]
    if ok and abs(decision.chosen_freq_ghz - decision.current_freq_ghz) > 1e-9:
        done, msg = send_and_wait(run, "set_frequency", {"ghz": decision.chosen_freq_ghz},
                                  actor)
        ok, messages = ok and done, messages + [msg]
    plan = (decision.inputs or {}).get("rebalance")
    if ok and decision.action == "rebalance" and plan:
        # Exactly the moves the decision shows (the runner would re-plan on its own,
        # slightly different load window); paced one batch of groups per step.
        done, msg = send_and_wait(run, "move_groups",
                                  {"moves": plan["moves"], "schedule": live.REBALANCE_SCHEDULE}, actor)
        ok, messages = ok and done, messages + [msg]
    loop.finish(decision_id, ok, "; ".join(messages))
    return "; ".join(messages)


@shared_task
def send_webhook(url: str, payload: dict) -> str:
    """POST an alert as JSON; a receiver that fails is logged, never retried forever."""
    import json
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return f"{resp.status}"
    except OSError as exc:
        log.warning("alert webhook %s failed: %s", url, exc)
        return f"failed: {exc}"
