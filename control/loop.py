"""Domain actions of the closed loop (Django side of ``control/live.py``).

``due_runs`` + ``tick`` are what celery beat runs every second (``control.tasks``):

* every running run whose policy has a strategy (not ``manual``) gets one tick per
  ``control_step_s``; a tick takes a per-run Redis lock, so one tick never overlaps the
  previous one for the same run (a slow tick makes the next one wait, never run twice);
* the tick reads the runner's metrics records since its cursor straight from the run's
  Redis stream (fresher than the database, and with every field), restores the run's
  ``LiveController`` (forecaster, fitted model, feedback, model error) from Redis, decides,
  stores a :class:`Decision`, pushes it to the run page, raises alerts (RunEvent, push,
  optional webhook), and — unless the run is in dry-run or a reconfiguration is still
  pending — queues ``control.tasks.apply_decision``, which sends the commands, waits
  for the runner's acknowledgements and records when the change took effect.
"""
from __future__ import annotations

import logging
import math
import pickle
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from control import live
from control.models import Decision, DecisionOutcome, Policy
from control.strategies.mpc import Config
from pipelines import actions, launch
from pipelines.models import Run, RunStatus
from pipelines.queue import Task, enqueue
from pipelines.runtime import bus as busmod
from pipelines.runtime import power

log = logging.getLogger(__name__)
ACTOR = "controller"
STATE_TTL_S = 24 * 3600


def _key(run: Run, what: str) -> str:
    return f"control:{run.bus_key}:{what}"


def loop_policy(policy: Policy, run: Run) -> live.LoopPolicy:
    freqs = tuple(run.frequencies or ()) or (run.frequency_ghz or power.NOMINAL_GHZ,)
    return live.LoopPolicy(
        strategy=policy.strategy, latency_bound_s=policy.latency_bound_ms / 1000.0,
        min_workers=policy.min_workers,
        max_workers=min(policy.max_workers, run.key_groups or policy.max_workers),
        freqs_ghz=tuple(float(f) for f in freqs), power=power.power_model(),
        power_budget_w=policy.power_budget_w, throughput_floor=policy.throughput_floor_rps,
        control_step_s=policy.control_step_s, params=dict(policy.strategy_params or {}),
        violation_steps=policy.violation_steps)


def due_runs(now: float | None = None) -> list[Run]:
    """Running runs under a controlled policy whose control step has elapsed."""
    now = time.time() if now is None else now
    due = []
    for run in Run.objects.filter(status=RunStatus.RUNNING).exclude(
            policy__strategy="manual").select_related("policy"):
        last = launch.run_bus(run).r.get(_key(run, "last"))
        if last is None or now - float(last) >= run.policy.control_step_s:
            due.append(run)
    return due


def tick(run: Run) -> Decision | None:
    """One control step of ``run``; None when it is not due or has no new batch."""
    run = Run.objects.select_related("policy").get(pk=run.pk)  # fresh policy, dry-run flag
    r = launch.run_bus(run).r
    lock = _key(run, "lock")
    if not r.set(lock, "1", nx=True, ex=max(int(run.policy.control_step_s * 5), 30)):
        return None  # the previous tick of this run is still running
    try:
        r.set(_key(run, "last"), time.time(), ex=STATE_TTL_S)
        return _tick(run, r)
    finally:
        r.delete(lock)


def _tick(run: Run, r: Any) -> Decision | None:
    import json

    cursor = r.get(_key(run, "cursor")) or "0-0"
    entries = r.xrange(busmod.metrics_key(run.bus_key), min=f"({cursor}" if cursor != "0-0"
                       else "-")
    if not entries:
        return None
    records = [json.loads(fields["m"]) for _id, fields in entries]
    controller = _load_controller(run)
    if controller is None:
        try:
            controller = live.LiveController(loop_policy(run.policy, run))
        except live.LoopError as exc:
            actions.record_event(run, "controller_refused", ACTOR,
                                 f"policy {run.policy.name}: {exc}")
            r.set(_key(run, "cursor"), entries[-1][0], ex=STATE_TTL_S)
            return None
    current = Config(run.workers or records[-1].get("workers") or 1,
                     float(records[-1].get("frequency_ghz") or controller.policy.f_max))
    d = controller.step(records, current)
    r.set(_key(run, "cursor"), entries[-1][0], ex=STATE_TTL_S)
    _save_controller(run, controller)
    pending = r.get(_key(run, "pending"))
    if d.action == "hold":
        outcome, message = DecisionOutcome.HOLD, ""
    elif run.dry_run:
        outcome, message = DecisionOutcome.DRY_RUN, "dry run: decided, not sent"
    elif pending:
        outcome, message = DecisionOutcome.BUSY, f"decision {pending} is still being applied"
    else:
        outcome, message = DecisionOutcome.PENDING, "sent to the runner"
    first = d.predictions[0]
    decision = Decision.objects.create(
        run=run, t=d.t, step=_next_step(run), strategy=d.strategy, action=d.action,
        outcome=outcome, outcome_message=message, current_workers=d.current["workers"],
        current_freq_ghz=d.current["freq_ghz"], chosen_workers=d.chosen["workers"],
        chosen_freq_ghz=d.chosen["freq_ghz"],
        measured_latency_ms=_ms(d.inputs.get("latency_s")),
        predicted_latency_ms=_ms(first.get("latency_s")), predicted_power_w=first.get("power_w"),
        solve_ms=d.solve_ms, reason=d.reason, alerts=d.alerts,
        inputs=live.json_safe(d.inputs), predictions=live.json_safe(d.predictions),
        cost=live.json_safe(d.cost), model_error=live.json_safe(d.model_error))
    actions.push(run.pk, {"type": "run.decision", "decision": decision.as_dict()})
    for alert in d.alerts:
        raise_alert(run, alert, decision)
    if outcome == DecisionOutcome.PENDING:
        r.set(_key(run, "pending"), decision.pk,
              ex=int(settings.COMMAND_ACK_TIMEOUT_S) * 2 + 30)
        enqueue(Task.APPLY_DECISION, decision.pk)
    return decision


def _ms(seconds: float | None) -> float | None:
    """Milliseconds, or None for no value or a saturated (infinite) prediction."""
    return None if seconds is None or not math.isfinite(seconds) else seconds * 1000.0


def _next_step(run: Run) -> int:
    last = Decision.objects.filter(run=run).order_by("-step").values_list("step", flat=True)
    return (last.first() or 0) + 1


def _binary_redis() -> Any:
    """The controller is pickled: it needs a client that does not decode to text."""
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def _controller_key(run: Run) -> str:
    # An edited policy starts a fresh controller (its strategy or limits changed).
    return _key(run, f"controller:{run.policy.updated_at.timestamp():.6f}")


def _load_controller(run: Run) -> live.LiveController | None:
    raw = _binary_redis().get(_controller_key(run))
    try:
        controller = pickle.loads(raw) if raw else None
    except Exception:  # pickled by older code: start a fresh controller
        return None
    return controller if isinstance(controller, live.LiveController) else None


def _save_controller(run: Run, controller: live.LiveController) -> None:
    _binary_redis().set(_controller_key(run), pickle.dumps(controller), ex=STATE_TTL_S)


def raise_alert(run: Run, message: str, decision: Decision | None = None) -> None:
    """An alert is an audited event, pushed to the run page, and POSTed to the policy's
    webhook if it has one (by a Celery task: a slow receiver never delays a tick)."""
    payload = {"decision": decision.step if decision else None}
    actions.record_event(run, "alert", ACTOR, message, payload)
    if run.policy.alert_webhook:
        enqueue(Task.SEND_WEBHOOK, run.policy.alert_webhook, {
            "run": run.pk, "policy": run.policy.name, "message": message,
            "at": timezone.now().isoformat(), **payload})


def finish(decision_id: int, ok: bool, message: str) -> None:
    """Record how a pending decision ended (called by ``apply_decision``)."""
    decision = Decision.objects.select_related("run").get(pk=decision_id)
    Decision.objects.filter(pk=decision_id).update(
        outcome=DecisionOutcome.APPLIED if ok else DecisionOutcome.FAILED,
        outcome_message=message, applied_at=timezone.now() if ok else None)
    decision.refresh_from_db()
    launch.run_bus(decision.run).r.delete(_key(decision.run, "pending"))
    actions.push(decision.run_id, {"type": "run.decision", "decision": decision.as_dict()})


def set_dry_run(run: Run, on: bool, user: Any) -> None:
    Run.objects.filter(pk=run.pk).update(dry_run=on)
    run.refresh_from_db()
    actions.record_event(run, "dry_run_on" if on else "dry_run_off", actions.actor_for(user),
                         "controller decides and shows, does not act" if on
                         else "controller acts on its decisions")
    actions.push(run.pk, {"type": "run.status", "run": actions.run_state(run)})
