"""Celery tasks: side effects on runs that take time. All are idempotent: a repeated
or late delivery finds the run's status and does nothing harmful, saying why."""
from __future__ import annotations

import json
import logging
import os
import signal
from datetime import timedelta
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from pipelines import actions, launch
from pipelines.models import ACTIVE_STATUSES, EventKind, Run, RunStatus
from pipelines.runtime import bus as busmod
from pipelines.runtime.bus import RECONFIGURATIONS

WORKER = "celery"
log = logging.getLogger(__name__)


@shared_task
def start_run(run_id: int, actor: str = "system") -> str:
    run = Run.objects.select_related("pipeline_version", "policy").get(pk=run_id)
    if run.status != RunStatus.PENDING or not actions.transition(
            run, RunStatus.STARTING, actor, "launching the runner"):
        message = (f"start ignored: run {run.pk} is already {run.status}"
                   + ("" if run.is_active else "; create a new run to start again"))
        actions.record_event(run, EventKind.START_IGNORED, actor, message)
        return message
    # Per run, not per id: a reused id must never resume another run's checkpoint.
    checkpoint_dir = Path(settings.CHECKPOINT_ROOT) / f"run-{run.bus_key}"
    try:
        policy = run.policy
        config = {
            "run_id": run.pk,
            "bus_key": run.bus_key,
            "redis_url": settings.REDIS_URL,
            "master_url": launch.master_url(),
            "checkpoint_dir": str(checkpoint_dir),
            "definition": run.pipeline_version.definition,
            "initial_workers": policy.initial_workers,
            "max_workers": policy.max_workers,
            "executor_memory": settings.EXECUTOR_MEMORY,
        }
        bus = launch.run_bus(run)
        bus.reset()
        bus.mark_live()
        offer = launch.claim_standby(config, checkpoint_dir)
        pid = offer.pid if offer else launch.launch_runner(config, checkpoint_dir)
    except Exception as exc:
        actions.transition(run, RunStatus.FAILED, WORKER, f"could not launch the runner: {exc}")
        return f"failed: {exc}"
    actions.update_config(run, runner_pid=pid, checkpoint_dir=str(checkpoint_dir),
                          launched_at=timezone.now())
    how = (f"warm standby {offer.standby_id} (Spark app {offer.app_id})" if offer
           else "a new runner")
    actions.record_event(run, EventKind.RUNNER_LAUNCHED, WORKER, f"runner pid {pid}: {how}",
                         {"pid": pid, "master_url": config["master_url"],
                          "standby": offer.standby_id if offer else None,
                          "log": str(checkpoint_dir / "runner.log")})
    return f"launched runner pid {pid} ({how})"


@shared_task
def stop_run(run_id: int, actor: str = "system") -> str:
    run = Run.objects.get(pk=run_id)
    if run.status == RunStatus.PENDING:
        actions.transition(run, RunStatus.STOPPED, actor, "stopped before it started")
        return "stopped"
    if run.is_terminal:
        message = f"stop ignored: run {run.pk} is already {run.status}"
        actions.record_event(run, EventKind.STOP_IGNORED, actor, message)
        return message
    if run.status != RunStatus.STOPPING:
        actions.transition(run, RunStatus.STOPPING, actor, "stop requested")
    # Re-sending is harmless: the runner stops once and acknowledges each command.
    launch.run_bus(run).send_command("stop", reason=f"stop requested by {actor}")
    return "stopping"


@shared_task
def reconfigure_run(run_id: int, changes: dict, actor: str = "system") -> str:
    """Send one reconfiguration to the run's runner and record its acknowledgement.

    ``changes`` is ``{"command": name, "args": {...}}`` (or the older ``{"workers": n}``).
    The policy's worker range is checked here, the rest by the runner, which answers
    with the migration's per-step report when state moved."""
    run = Run.objects.select_related("policy").get(pk=run_id)
    if "command" not in changes:
        changes = {"command": "set_workers", "args": changes}
    command, args = changes["command"], dict(changes.get("args") or {})
    if run.status != RunStatus.RUNNING:
        message = f"reconfigure ignored: run {run.pk} is {run.status}, not running"
        actions.record_event(run, EventKind.RECONFIGURE_IGNORED, actor, message, changes)
        return message
    if command not in RECONFIGURATIONS:
        message = f"reconfigure refused: unknown command {command!r}"
        actions.record_event(run, EventKind.RECONFIGURE_REFUSED, actor, message, changes)
        return message
    policy = run.policy
    workers = args.get("workers")
    if command == "set_workers" and (
            not isinstance(workers, int) or isinstance(workers, bool)
            or not policy.min_workers <= workers <= policy.max_workers):
        message = (f"reconfigure refused: workers must be in {policy.min_workers}.."
                   f"{policy.max_workers} (policy {policy.name}), got {workers!r}")
        actions.record_event(run, EventKind.RECONFIGURE_REFUSED, actor, message, changes)
        return message
    return send_and_wait(run, command, args, actor)[1]


def send_and_wait(run: Run, command: str, args: dict, actor: str) -> tuple[bool, str]:
    """Send one command to the run's runner, wait for its acknowledgement, audit it and
    update the run's configuration. Returns (ok, message)."""
    bus = launch.run_bus(run)
    changes = {"command": command, "args": args}
    command_id = bus.send_command(command, **args)
    ack = bus.wait_ack(command_id, settings.COMMAND_ACK_TIMEOUT_S)
    if ack is None:
        message = (f"no acknowledgement for {command} {args} within "
                   f"{settings.COMMAND_ACK_TIMEOUT_S:.0f}s")
        actions.record_event(run, EventKind.RECONFIGURE_TIMEOUT, WORKER, message, changes)
        return False, message
    # The new configuration first, then its audit event: whoever sees "reconfigured"
    # (the page, a test, the controller) must find the run already changed.
    if ack["ok"] and command == "set_workers":
        actions.update_config(run, workers=ack.get("workers", args.get("workers")))
    elif ack["ok"] and command == "set_frequency":
        actions.update_config(run, frequency_ghz=ack["ghz"], frequency_source=ack["source"])
    kind = EventKind.RECONFIGURED if ack["ok"] else EventKind.RECONFIGURE_FAILED
    actions.record_event(run, kind, "runner", ack["message"], {**ack, "requested_by": actor})
    return bool(ack["ok"]), ack["message"]


def _last_runner_outcome(bus: busmod.RunBus) -> dict | None:
    """The runner's final word (``stopped``/``failed``) if it said one."""
    for _entry_id, fields in bus.r.xrevrange(busmod.events_key(bus.key), count=5):
        event = json.loads(fields["e"])
        if event.get("type") in ("stopped", "failed"):
            return event
    return None


@shared_task
def reconcile_runs() -> dict[str, int]:
    """Mark runs whose runner stopped heartbeating: never show a dead run as running."""
    checked = changed = 0
    now = timezone.now()
    for run in Run.objects.filter(status__in=ACTIVE_STATUSES):
        checked += 1
        bus = launch.run_bus(run)
        heartbeat = bus.read_heartbeat()
        if heartbeat is not None:
            continue
        # A runner that never reached "running" may still be importing PySpark or
        # starting its session (slow on a loaded machine): it gets a grace period from
        # its launch, whether or not a stop was requested meanwhile.
        since = run.launched_at or run.created_at
        if (run.started_at is None
                and (now - since).total_seconds() < settings.RUNNER_START_GRACE_S):
            continue
        outcome = _last_runner_outcome(bus)
        if outcome and outcome["type"] == "stopped":
            ok = actions.transition(run, RunStatus.STOPPED, "reconciler",
                                    outcome.get("reason", "runner stopped"))
        elif outcome:
            ok = actions.transition(run, RunStatus.FAILED, "reconciler",
                                    outcome.get("reason", "runner failed"))
        else:
            state = launch.process_state(run.runner_pid)
            if state == "alive":
                # Hung (no heartbeat yet alive): end it; we started it, we know its pid.
                os.kill(run.runner_pid, signal.SIGKILL)
            log_tail = launch.tail(Path(run.checkpoint_dir) / "runner.log", 3)
            reason = (f"runner heartbeat missing for more than {busmod.HEARTBEAT_TTL_S}s; "
                      f"runner pid {run.runner_pid} "
                      + ("was hung and has been killed" if state == "alive" else "is gone")
                      + (f". Last log lines: {log_tail}" if log_tail else ""))
            ok = actions.transition(run, RunStatus.LOST, "reconciler", reason)
        bus.mark_done()
        changed += int(ok)
    try:
        # Runs starting or in their first batches: a standby's warm-up would slow them.
        settling = Run.objects.filter(
            Q(status=RunStatus.STARTING) | Q(status=RunStatus.RUNNING, started_at__gte=(
                now - timedelta(seconds=settings.STANDBY_QUIET_S)))).count()
        launch.maintain_standbys(settling)
    except Exception:  # a standby is an optimisation: never fail the reconciler for it
        log.exception("could not start a standby runner")
    return {"checked": checked, "changed": changed}
