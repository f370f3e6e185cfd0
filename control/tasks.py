"""Celery tasks of the control app."""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from control import lab, live, loop, webhooks
from control.models import Decision
from pipelines.models import RunStatus
from pipelines.tasks import send_and_wait

log = logging.getLogger(__name__)


@shared_task
def run_lab(lab_id: int) -> str:
    """A Strategy Lab comparison (idempotent: only a pending lab is run)."""
    return lab.execute(lab_id)


@shared_task
def control_tick_all() -> dict[str, int]:
    """Celery beat, every second: one tick for each run whose control step is due."""
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
    decision = Decision.objects.select_related("run").get(pk=decision_id)
    run = decision.run
    if run.status != RunStatus.RUNNING:
        loop.finish(decision_id, False, f"run is {run.status}")
        return "not running"
    messages, ok = [], True
    actor = f"controller (decision {decision.step})"
    for command, args in live.reconfiguration_commands(
            {"workers": decision.current_workers, "freq_ghz": decision.current_freq_ghz},
            {"workers": decision.chosen_workers, "freq_ghz": decision.chosen_freq_ghz},
            decision.action, (decision.inputs or {}).get("rebalance")):
        done, msg = send_and_wait(run, command, args, actor)
        ok, messages = done, messages + [msg]
        if not ok:  # a later command would act on a configuration that did not happen
            break
    loop.finish(decision_id, ok, "; ".join(messages))
    return "; ".join(messages)


@shared_task
def send_webhook(url: str, payload: dict) -> str:
    """POST an alert as signed JSON to a public address (control/webhooks.py); a
    receiver that fails or is refused is logged, never retried forever."""
    outcome = webhooks.post(url, payload, settings.WEBHOOK_SECRET.encode(),
                            settings.WEBHOOK_ALLOWED_HOSTS, settings.WEBHOOK_DEADLINE_S)
    if not outcome.startswith("2"):
        log.warning("alert webhook %s: %s", url, outcome)
    return outcome
