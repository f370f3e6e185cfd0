"""Celery tasks of the control app."""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from control import lab, live, planwatch, ticks, webhooks
from control.models import Decision
from pipelines.models import RunStatus
from pipelines.runtime.bus import COMMAND_TTL_S
from pipelines.tasks import ACK_WAIT_LIMITS, send_and_wait

log = logging.getLogger(__name__)


@shared_task
def run_lab(lab_id: int) -> str:
    """A Strategy Lab comparison (idempotent: only a pending lab is run)."""
    return lab.execute(lab_id)


@shared_task(ignore_result=True)  # periodic (webapp.settings.CELERY_BEAT_SCHEDULE)
def fail_stale_labs() -> int:
    """Celery beat: Lab comparisons whose worker died under them are marked failed."""
    return lab.fail_stale_labs()


@shared_task(ignore_result=True)  # periodic (webapp.settings.CELERY_BEAT_SCHEDULE)
def control_tick_all() -> dict[str, int]:
    """Celery beat, every second: one tick for each run whose control step is due."""
    decided = 0
    for run in ticks.due_runs():
        try:
            decided += ticks.tick(run) is not None
        except Exception:  # one run's bad tick must not starve the others
            log.exception("control tick of run %s failed", run.pk)
    return {"decided": decided}


@shared_task(ignore_result=True)  # periodic (webapp.settings.CELERY_BEAT_SCHEDULE)
def watch_plans() -> dict[str, int]:
    """Celery beat: propose COLA's plan for runs whose processing elements saturate."""
    return {"proposed": planwatch.watch_plans()}


@shared_task(**ACK_WAIT_LIMITS)
def apply_decision(decision_id: int) -> str:
    """Send a decision's reconfiguration (workers first, then frequency, or its
    key-group moves), each acknowledged by the runner, and record when it took effect.

    A decision older than the command TTL is not applied (a redelivery after a worker
    crash: the controller has decided again since), and each command's id is the
    decision's, so a redelivery within the TTL is not applied twice by the runner."""
    decision = Decision.objects.select_related("run").get(pk=decision_id)
    run = decision.run
    # A stalled run (a batch slower than usual, often the overload the decision is
    # about) still takes commands between batches.
    if run.status not in (RunStatus.RUNNING, RunStatus.STALLED):
        ticks.finish(decision_id, False, f"run is {run.status}")
        return "not running"
    age_s = (timezone.now() - decision.at).total_seconds()
    if age_s > COMMAND_TTL_S:
        message = f"expired: decided {age_s:.0f} s ago, not applied"
        ticks.finish(decision_id, False, message)
        return message
    deadline = decision.at.timestamp() + COMMAND_TTL_S
    messages, ok = [], True
    actor = f"controller (decision {decision.step})"
    for index, (command, args) in enumerate(live.reconfiguration_commands(
            {"workers": decision.current_workers, "freq_ghz": decision.current_freq_ghz},
            {"workers": decision.chosen_workers, "freq_ghz": decision.chosen_freq_ghz},
            decision.action, (decision.inputs or {}).get("rebalance"),
            key_groups=run.key_groups if ticks.replannable(run) else None,
            planner=(decision.inputs or {}).get("migration_planner"))):
        # The first command expires with the decision; a later one follows an
        # acknowledged command (a migration may have taken minutes) and gets its own TTL.
        done, msg = send_and_wait(run, command, args, actor,
                                  command_id=f"decision-{decision.pk}-{index}",
                                  deadline=deadline if index == 0 else None)
        ok, messages = done, messages + [msg]
        if not ok:  # a later command would act on a configuration that did not happen
            break
    ticks.finish(decision_id, ok, "; ".join(messages))
    return "; ".join(messages)


@shared_task
def send_webhook(url: str, payload: dict) -> str:
    """POST an alert as signed JSON to a public address (control/webhooks.py); a
    receiver that fails or is refused is logged, never retried forever."""
    outcome = webhooks.post(url, payload, settings.WEBHOOK_SECRET.encode(),
                            settings.WEBHOOK_ALLOWED_HOSTS, settings.WEBHOOK_DEADLINE_S)
    if not outcome.startswith("2"):
        # The path and query often carry the receiver's token: the host is enough.
        log.warning("alert webhook %s: %s", webhooks.redacted(url), outcome)
    return outcome
