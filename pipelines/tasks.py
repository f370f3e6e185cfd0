"""Celery tasks: side effects on runs that take time. All are idempotent: a repeated
or late delivery finds the run's status and does nothing harmful, saying why."""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pipelines import actions, launch
from pipelines.models import ACTIVE_STATUSES, EventKind, Run, RunStatus
from pipelines.queue import Task, enqueue
from pipelines.runtime import bus as busmod
from pipelines.runtime.bus import RECONFIGURATIONS

WORKER = "celery"
log = logging.getLogger(__name__)
# A runner ends cleanly within this long of SIGTERM (after its current micro-batch);
# a hung one that has not is SIGKILLed by a later reconciler pass.
RUNNER_TERM_GRACE_S = 10.0


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
        policy = run.policy_in_force
        from pipelines import connections

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
            # (runner.json is private: 0600, launch.write_runner_config)
            "connections": connections.resolve(run.pipeline_version.definition),
        }
        t0_file = checkpoint_dir / "t0"
        if t0_file.exists():  # a restart from checkpoint: its records' clock
            config["t0"] = float(json.loads(t0_file.read_text())["t0"])
        bus = launch.run_bus(run)
        bus.reset()
        bus.mark_live()
        offer = launch.claim_standby(config, checkpoint_dir)
        pid = offer.pid if offer else launch.launch_runner(config, checkpoint_dir)
    except Exception as exc:
        actions.transition(run, RunStatus.FAILED, WORKER, f"could not launch the runner: {exc}")
        return f"failed: {exc}"
    how = (f"warm standby {offer.standby_id} (Spark app {offer.app_id})" if offer
           else "a new runner")
    # One transaction: whoever sees the runner's pid (a Stop pressed at once) also sees
    # that it was launched, and its own events come after this one.
    with transaction.atomic():
        actions.update_config(run, runner_pid=pid, checkpoint_dir=str(checkpoint_dir),
                              max_workers_cap=policy.max_workers,
                              launched_at=timezone.now())
        actions.record_event(run, EventKind.RUNNER_LAUNCHED, WORKER,
                             f"runner pid {pid}: {how}",
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


# Tasks that wait for a runner's acknowledgement outlive the default time limit: a
# migration may take COMMAND_ACK_TIMEOUT_S, and a task killed mid-wait would leave its
# command running unrecorded.
ACK_WAIT_LIMITS = {"time_limit": settings.COMMAND_ACK_TIMEOUT_S + 120,
                   "soft_time_limit": settings.COMMAND_ACK_TIMEOUT_S + 60}


@shared_task(bind=True, **ACK_WAIT_LIMITS)
def reconfigure_run(self: Any, run_id: int, changes: dict, actor: str = "system",
                    deadline: float | None = None) -> str:
    """Send one reconfiguration to the run's runner and record its acknowledgement.

    ``changes`` is ``{"command": name, "args": {...}}`` (or the older ``{"workers": n}``).
    The policy's worker range is checked here, the rest by the runner, which answers
    with the migration's per-step report when state moved. ``deadline`` (epoch s) is
    when the request expires: a task redelivered after it (a worker crashed) sends
    nothing; one redelivered before it sends the same command id, which the runner
    does not apply twice."""
    run = Run.objects.select_related("policy").get(pk=run_id)
    if "command" not in changes:
        changes = {"command": "set_workers", "args": changes}
    command, args = changes["command"], dict(changes.get("args") or {})
    task_id = self.request.id  # None when called in-process rather than by a worker
    command_id = f"task-{task_id}" if task_id else None
    earlier = launch.run_bus(run).find_ack(command_id) if command_id else None
    if earlier is not None:  # sent and applied before this task's worker died
        return record_ack(run, command, args, actor, earlier)[1]
    late = busmod.expired({"name": command, "deadline": deadline})
    if late is not None:
        message = (f"reconfigure ignored: the request expired {late:.0f} s before it could "
                   "be sent (queued too long, or redelivered after a worker crash)")
        actions.record_event(run, EventKind.RECONFIGURE_IGNORED, actor, message, changes)
        return message
    if run.status != RunStatus.RUNNING:
        message = f"reconfigure ignored: run {run.pk} is {run.status}, not running"
        actions.record_event(run, EventKind.RECONFIGURE_IGNORED, actor, message, changes)
        return message
    if command not in RECONFIGURATIONS:
        message = f"reconfigure refused: unknown command {command!r}"
        actions.record_event(run, EventKind.RECONFIGURE_REFUSED, actor, message, changes)
        return message
    policy = run.policy_in_force
    workers = args.get("workers")
    if command == "set_workers" and (
            not isinstance(workers, int) or isinstance(workers, bool)
            or not policy.min_workers <= workers <= policy.max_workers):
        message = (f"reconfigure refused: workers must be in {policy.min_workers}.."
                   f"{policy.max_workers} (policy {policy.name}), got {workers!r}")
        actions.record_event(run, EventKind.RECONFIGURE_REFUSED, actor, message, changes)
        return message
    return send_and_wait(run, command, args, actor, command_id=command_id,
                         deadline=deadline)[1]


def send_and_wait(run: Run, command: str, args: dict, actor: str,
                  command_id: str | None = None,
                  deadline: float | None = None) -> tuple[bool, str]:
    """Send one command to the run's runner, wait for its acknowledgement, audit it and
    update the run's configuration. Returns (ok, message)."""
    bus = launch.run_bus(run)
    command_id = bus.send_command(command, command_id=command_id, deadline=deadline, **args)
    ack = bus.wait_ack(command_id, settings.COMMAND_ACK_TIMEOUT_S)
    if ack is None:
        message = (f"no acknowledgement for {command} {args} within "
                   f"{settings.COMMAND_ACK_TIMEOUT_S:.0f}s")
        actions.record_event(run, EventKind.RECONFIGURE_TIMEOUT, WORKER, message,
                             {"command": command, "args": args})
        return False, message
    return record_ack(run, command, args, actor, ack)


def record_ack(run: Run, command: str, args: dict, actor: str,
               ack: dict[str, Any]) -> tuple[bool, str]:
    """Audit the runner's acknowledgement of one command and update the run's
    configuration. Returns (ok, message)."""
    # The new configuration first, then its audit event: whoever sees "reconfigured"
    # (the page, a test, the controller) must find the run already changed.
    if ack["ok"] and command == "set_workers":
        actions.update_config(run, workers=ack.get("workers", args.get("workers")))
    elif ack["ok"] and command == "set_frequency":
        actions.update_config(run, frequency_ghz=ack["ghz"], frequency_source=ack["source"])
    elif ack["ok"] and command == "replan":
        actions.update_config(run, key_groups=ack.get("to_groups", run.key_groups))
    kind = EventKind.RECONFIGURED if ack["ok"] else EventKind.RECONFIGURE_FAILED
    actions.record_event(run, kind, "runner", ack["message"],
                         {**ack, "command": command, "requested_by": actor})
    return bool(ack["ok"]), ack["message"]


def _last_runner_outcome(bus: busmod.ControlBus) -> dict | None:
    """The runner's final word (``stopped``/``failed``) if it said one."""
    for _entry_id, fields in bus.r.xrevrange(busmod.events_key(bus.key), count=5):
        event = json.loads(fields["e"])
        if event.get("type") in ("stopped", "failed"):
            return event
    return None


def redis_restarted_recently(r: Any) -> bool:
    """Whether Redis has been up for less than a heartbeat's TTL: a restart wiped the
    heartbeats and the runners have not all written theirs again, so a missing one
    says nothing about its runner."""
    return int(r.info("server")["uptime_in_seconds"]) < busmod.HEARTBEAT_TTL_S


def _terminate(bus: busmod.ControlBus, pid: int) -> bool:
    """SIGTERM a hung runner, and SIGKILL it if it is still there a grace period later
    (on a later pass: the reconciler never waits). True once it has been SIGKILLed."""
    key = f"run:{bus.key}:sigterm_at"
    sent = bus.r.get(key)
    if sent is None:
        os.kill(pid, signal.SIGTERM)
        bus.r.set(key, time.time(), ex=3600)
        return False
    if time.time() - float(sent) < RUNNER_TERM_GRACE_S:
        return False
    os.kill(pid, signal.SIGKILL)
    return True


def _end_a_hung_stop(run: Run, bus: busmod.ControlBus, now: datetime) -> int:
    """A run stopping for longer than STOP_TIMEOUT_S whose runner still heartbeats is hung
    in its stop: SIGTERM, SIGKILL a grace period later, and the run is stopped, saying
    so. Returns 1 when the run changed."""
    requested = run.events.filter(kind=EventKind.status(RunStatus.STOPPING)).order_by(
        "-id").values_list("at", flat=True).first()
    if requested is None or (now - requested).total_seconds() < settings.STOP_TIMEOUT_S:
        return 0
    if launch.runner_state(run) == "alive" and not _terminate(bus, run.runner_pid):
        return 0
    bus.clear_heartbeat()
    bus.mark_done()
    waited = (now - requested).total_seconds()
    return int(actions.transition(
        run, RunStatus.STOPPED, "reconciler",
        f"the runner did not stop within {waited:.0f} s of the stop request "
        f"(limit {settings.STOP_TIMEOUT_S:g} s): SIGTERM, then SIGKILL after "
        f"{RUNNER_TERM_GRACE_S:g} s"))


def stall_limit_s(expected_batch_s: float, control_step_s: float) -> float:
    """How long a query with input waiting may go without a committed batch: with the
    reconciler's pass every second, a stall is called within three control steps
    whenever STALL_FACTOR batches fit in two."""
    return max(settings.STALL_FACTOR * expected_batch_s, 2 * control_step_s,
               settings.STALL_MIN_S)


def judge_progress(run: Run, heartbeat: dict[str, Any], age_s: float = 0.0) -> int:
    """``running`` -> ``stalled`` (with an alert, and the policy's webhook) when the
    runner's heartbeat says input waits but no batch has committed for
    :func:`stall_limit_s`; back to ``running`` when batches resume. The runner's
    heartbeat thread lives on when its query hangs: this is what catches that. The quiet
    time is the runner's own (its clock may be another host's) plus the heartbeat's age
    by Redis' clock (``age_s``). A query applying a reconfiguration is not judged: its
    batches may wait for moving state, and the command's own timeout bounds that.
    Returns 1 when the run changed."""
    last, expected = heartbeat.get("last_batch_at"), heartbeat.get("expected_batch_s")
    if last is None or expected is None:
        return 0  # before the first batch: the start grace covers a hung start
    quiet = float(heartbeat["t"]) - float(last) + age_s
    limit = stall_limit_s(float(expected), run.policy_in_force.control_step_s)
    if (run.status == RunStatus.RUNNING and heartbeat.get("input_waiting")
            and not heartbeat.get("reconfiguring") and quiet > limit):
        message = (f"stalled: no batch for {quiet:.0f} s while input waits (limit "
                   f"{limit:.0f} s: {settings.STALL_FACTOR:g} x the median batch time of "
                   f"{expected:.1f} s, at least two control steps)")
        if not actions.transition(run, RunStatus.STALLED, "reconciler", message):
            return 0
        actions.raise_alert(run, "reconciler", message, {"stalled_s": round(quiet, 1)})
        return 1
    if run.status == RunStatus.STALLED and quiet <= limit:
        return int(actions.transition(run, RunStatus.RUNNING, "reconciler",
                                      "batches resumed"))
    return 0


def runner_died(run: Run, heartbeat: dict[str, Any]) -> bool:
    """Whether the runner that wrote ``heartbeat`` is known gone before its heartbeat
    expires: it ran on this host (a pid means nothing elsewhere) as the run's recorded
    runner, and that process is no longer the run's runner. A runner on another host is
    judged by its heartbeat's expiry alone."""
    return (heartbeat.get("host") == busmod.HOSTNAME
            and heartbeat.get("pid") == run.runner_pid
            and launch.runner_state(run) != "alive")


def _reconcile_pending(now: datetime) -> int:
    """Runs pending past PENDING_REQUEUE_S have their start queued again (at most once
    per that period); past PENDING_GIVE_UP_S they have failed. Returns the runs failed."""
    failed = 0
    cutoff = now - timedelta(seconds=settings.PENDING_REQUEUE_S)
    for run in Run.objects.filter(status=RunStatus.PENDING, created_at__lt=cutoff):
        age = (now - run.created_at).total_seconds()
        if age > settings.PENDING_GIVE_UP_S:
            failed += int(actions.transition(
                run, RunStatus.FAILED, "reconciler",
                f"never started: no worker took its start within {age:.0f} s"))
            continue
        if run.events.filter(kind=EventKind.START_REQUEUED, at__gte=cutoff).exists():
            continue
        actions.record_event(run, EventKind.START_REQUEUED, "reconciler",
                             f"still pending after {age:.0f} s: its start is queued again "
                             "(a queued start is lost if Redis restarts)")
        enqueue(Task.START_RUN, run.pk, "reconciler")
    return failed


# The beat's periodic tasks store no result: at two a second their results (kept a day
# by default) filled Redis with ~170,000 keys a day that nothing reads.
@shared_task(ignore_result=True)
def reconcile_runs() -> dict[str, int]:
    """Mark runs whose runner stopped heartbeating: never show a dead run as running.

    A heartbeat is judged against Redis' own availability: while Redis is down this task
    cannot run at all, and for a heartbeat TTL after Redis comes back nobody is judged.
    A hung runner (alive, no heartbeat) gets SIGTERM first and SIGKILL only after
    :data:`RUNNER_TERM_GRACE_S`; a pid is signalled only while it is this run's runner."""
    r = busmod.connect(settings.REDIS_URL)
    if redis_restarted_recently(r):
        return {"checked": 0, "changed": 0, "redis_restarted": 1}
    # One pass at a time: a slow pass (a loaded database) must not meet the next one.
    lock = r.lock("reconcile-runs:lock", timeout=120, blocking=False)
    if not lock.acquire():
        return {"checked": 0, "changed": 0, "busy": 1}
    try:
        started = time.monotonic()
        result = _reconcile_pass()
        r.hset(busmod.HEALTH_KEY, mapping={
            "reconcile_pass_s": round(time.monotonic() - started, 4),
            "reconcile_at": round(time.time(), 3)})
        return result
    finally:
        lock.release()


def _reconcile_pass() -> dict[str, int]:
    checked = changed = 0
    now = timezone.now()
    for run in Run.objects.filter(status__in=ACTIVE_STATUSES).select_related("policy"):
        checked += 1
        bus = launch.run_bus(run)
        heartbeat = bus.read_heartbeat()
        if heartbeat is not None and not runner_died(run, heartbeat):
            if run.status == RunStatus.STOPPING:
                changed += _end_a_hung_stop(run, bus, now)
            elif run.status in (RunStatus.RUNNING, RunStatus.STALLED):
                changed += judge_progress(run, heartbeat, bus.heartbeat_age_s())
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
            state = launch.runner_state(run)
            if state == "alive" and not _terminate(bus, run.runner_pid):
                continue  # asked to end; judged again on a later pass
            log_tail = launch.tail(Path(run.checkpoint_dir) / "runner.log", 3)
            reason = ((f"runner heartbeat missing for more than {busmod.HEARTBEAT_TTL_S}s; "
                       if heartbeat is None else "the runner died; ")
                      + f"runner pid {run.runner_pid} "
                      + (f"was hung: SIGTERM, then SIGKILL after {RUNNER_TERM_GRACE_S:g} s"
                         if state == "alive" else "is gone")
                      + (f". Last log lines: {log_tail}" if log_tail else ""))
            ok = actions.transition(run, RunStatus.LOST, "reconciler", reason)
        bus.mark_done()
        changed += int(ok)
    changed += _reconcile_pending(now)
    try:
        # Runs starting or in their first batches: a standby's warm-up would slow them.
        settling = Run.objects.filter(
            Q(status=RunStatus.STARTING) | Q(status=RunStatus.RUNNING, started_at__gte=(
                now - timedelta(seconds=settings.STANDBY_QUIET_S)))).count()
        launch.maintain_standbys(settling)
    except Exception:  # a standby is an optimisation: never fail the reconciler for it
        log.exception("could not start a standby runner")
    return {"checked": checked, "changed": changed}


@shared_task(ignore_result=True)
def prune_old_data() -> dict[str, Any]:
    """Celery beat, hourly: apply the retention policy (``pipelines.retention``)."""
    from pipelines import retention

    return retention.prune(timezone.now()).as_dict()


# How often a running check stores and pushes its progress.
VERIFY_PROGRESS_EVERY_S = 1.0


@shared_task(time_limit=3600, soft_time_limit=3540)
def verify_run(run_id: int, actor: str = "system") -> str:
    """The exactly-once check of a run's kept output (``pipelines.runtime.verify``), with
    its progress on the run page; the verdict is stored on the run and in its log."""
    from pipelines.runtime.verify import verifier as verify

    run = Run.objects.get(pk=run_id)
    last_push = 0.0

    def store(state: dict[str, Any]) -> None:
        state["at"] = time.time()  # a check silent for longer is stale (a dead worker)
        Run.objects.filter(pk=run_id).update(verification=state)
        run.verification = state
        actions.push(run_id, {"type": "run.status", "run": actions.run_state(run)})

    def progress(done: int, of: int) -> None:
        nonlocal last_push
        if time.monotonic() - last_push >= VERIFY_PROGRESS_EVERY_S or done == of:
            last_push = time.monotonic()
            store({"state": "running", "ok": None, "done": done, "of": of,
                   "line": f"checking batch {done} of {of}"})

    store({"state": "running", "ok": None, "done": 0, "of": 0, "line": "reading the run"})
    try:
        report = verify.verify_run_dir(run.checkpoint_dir, progress)
    except verify.RunDirError as exc:
        # The verdict and its event in one transaction: whoever sees the one sees the other.
        with transaction.atomic():
            store({"state": "error", "ok": None, "done": 0, "of": 0, "line": str(exc)})
            actions.record_event(run, EventKind.VERIFIED, WORKER, f"not verified: {exc}")
        return f"error: {exc}"
    line = report.line().removeprefix("verifier: ")
    with transaction.atomic():
        store({"state": "done", "ok": report.ok, "done": report.batches,
               "of": report.batches, "line": line, "report": report.as_dict()})
        actions.record_event(run, EventKind.VERIFIED, WORKER, line,
                             {k: v for k, v in report.as_dict().items() if k != "problems"}
                             | {"problems": report.problems[:5], "requested_by": actor})
    return line
