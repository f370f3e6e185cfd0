"""Domain actions on pipelines and runs. Views, tasks, the relay and the reconciler
call these; each writes an audit event (RunEvent) and pushes the change to the run's
live clients (Channels group ``run-<id>``)."""
from __future__ import annotations

import logging
import time
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import log as audit
from audit.tracking import recorded_by_caller
from control.models import Policy
from pipelines.models import (
    TRANSITIONS,
    Connection,
    EventKind,
    MetricSample,
    Pipeline,
    PipelineVersion,
    Run,
    RunEvent,
    RunStatus,
    verification_badge,
)
from pipelines.queue import Task, enqueue
from pipelines.runtime.bus import COMMAND_TTL_S

log = logging.getLogger(__name__)

# The wire format of a metric sample (browser and WebSocket tests read these names).
SAMPLE_FIELDS = ("batch_id", "input_rows", "records", "input_rate", "scheduled_rate",
                 "output_rate", "batch_duration_ms", "latency_p50_ms", "latency_p95_ms",
                 "latency_p99_ms", "latency_max_ms", "workers", "frequency_ghz", "power_w",
                 "state_rows", "frequency_source", "drift", "group_moves", "failed_tasks",
                 "dead_letters", "groups", "migration")
# ... and what a sample keeps under a name of its own: a broker source's backlog (the
# runner's ``source_behind_s``).
STORED_FIELDS = (*SAMPLE_FIELDS, "backlog_s")
# Per-group arrays of a runner record, kept together as a sample's ``groups``.
# A queued or running exactly-once check that has not reported for this long is taken
# for dead (its worker died; the task's own limit is an hour) and may be asked again.
VERIFY_STALE_S = 3700.0
GROUP_FIELDS = ("placement", "ran_on", "group_bytes", "group_ms", "group_records",
                "operator_bytes", "executor_hosts")


def group_name(run_id: int) -> str:
    return f"run-{run_id}"


def push(run_id: int, message: dict[str, Any]) -> None:
    """Send to the run's live clients once the current transaction commits (at once
    outside one): a client never sees a change that is rolled back, and a client that
    reloads on a push finds it in the database. A push failure never breaks the action."""
    transaction.on_commit(lambda: _send(run_id, message))


def _send(run_id: int, message: dict[str, Any]) -> None:
    try:
        async_to_sync(get_channel_layer().group_send)(group_name(run_id), message)
    except Exception:  # Redis down: the DB has it, clients catch up on reconnect
        log.warning("push to run %s failed", run_id, exc_info=True)


def actor_for(user: Any) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


# ----------------------------------------------------------------------- pipelines
@transaction.atomic
def save_pipeline(pipeline: Pipeline, user: Any) -> Pipeline:
    """Create or update a pipeline; a changed definition becomes a new version."""
    if pipeline.pk is None:
        pipeline.version = 1
        pipeline.created_by = user
        pipeline.save()
    else:
        current = PipelineVersion.objects.filter(pipeline=pipeline,
                                                 version=pipeline.version).first()
        if current is not None and current.definition != pipeline.definition:
            pipeline.version += 1
        pipeline.save()
    PipelineVersion.objects.get_or_create(
        pipeline=pipeline, version=pipeline.version,
        defaults={"definition": pipeline.definition, "created_by": user})
    return pipeline


@transaction.atomic
def save_connection(connection: Connection, user: Any) -> Connection:
    """Create or update a connection (audited by its save: the password only as
    "(set)", "(old)" → "(new)")."""
    if connection.pk is None:
        connection.created_by = user
    connection.save()
    return connection


# ---------------------------------------------------------------------------- runs
def record_event(run: Run, kind: str, actor: str, message: str = "",
                 payload: dict[str, Any] | None = None, source_id: str = "",
                 before: dict[str, Any] | None = None,
                 after: dict[str, Any] | None = None) -> RunEvent | None:
    """Audit one event of ``run`` and push it to its page. An event relayed from the
    runner carries its stream entry id (``source_id``) and is recorded once, even when two
    relays (e.g. one restarting while the old one drains) deliver it at the same time.
    The event is also an entry of the audit log (``run.<kind>``: ``before`` → ``after``,
    by default the payload)."""
    kind = EventKind.check(kind)  # ValueError for a kind outside the audit vocabulary
    if source_id and RunEvent.objects.filter(run=run, source_id=source_id).exists():
        return None
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction survives
            event = RunEvent.objects.create(run=run, kind=kind, actor=actor,
                                            message=message, payload=payload or {},
                                            source_id=source_id)
            audit.record(f"run.{kind}", run, message=message, before=before,
                         after=after if after is not None else payload or None,
                         actor=actor)
    except IntegrityError:
        if not source_id:
            raise
        return None  # the other relay recorded it between our check and insert
    push(run.pk, {"type": "run.event", "event": event.as_dict()})
    return event


def run_state(run: Run) -> dict[str, Any]:
    return {"id": run.pk, "status": run.status, "reason": run.status_reason,
            "workers": run.workers, "frequency_ghz": run.frequency_ghz,
            "frequency_source": run.frequency_source, "dry_run": run.dry_run,
            "key_groups": run.key_groups, "spark_app_id": run.spark_app_id,
            "verification": verification_wire(run.verification)}


def verification_wire(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The badge's part of a run's stored verification (the report stays in the DB)."""
    if not doc:
        return None
    text, css = verification_badge(doc)
    return {"state": doc.get("state", "queued"), "ok": doc.get("ok"),
            "line": doc.get("line", ""), "done": doc.get("done", 0), "of": doc.get("of", 0),
            "badge": text, "css": css}


@transaction.atomic
def transition(run: Run, to: str, actor: str, reason: str = "",
               **fields: Any) -> bool:
    """Move ``run`` to status ``to`` if the lifecycle allows it from its current status.

    The update is conditional on the status read (compare-and-set), so concurrent
    writers (relay, reconciler, tasks) cannot move a run backwards. The new status and
    its event commit together: whoever sees the status finds the event (a 'lost' run
    is never seen before the reconciler's event that says why).
    """
    allowed_from = [src for src, targets in TRANSITIONS.items() if to in targets]
    now = timezone.now()
    updates: dict[str, Any] = {"status": to, **fields}
    if reason:
        updates["status_reason"] = reason
    if to == RunStatus.RUNNING:
        updates.setdefault("started_at", now)
    if to in (RunStatus.STOPPED, RunStatus.FAILED, RunStatus.LOST):
        updates["ended_at"] = now
    was = run.status
    changed = Run.objects.filter(pk=run.pk, status__in=allowed_from).update(**updates)
    run.refresh_from_db()
    if changed:
        record_event(run, EventKind.status(to), actor, reason or f"status is now {to}",
                     before={"status": was}, after={"status": to})
        push(run.pk, {"type": "run.status", "run": run_state(run)})
        if to == RunStatus.STOPPED and run.keeps_output and run.checkpoint_dir:
            request_verification(run, "system", "on stop")
    return bool(changed)


def request_verification(run: Run, actor: str, why: str = "") -> tuple[bool, str]:
    """Queue the exactly-once check of ``run``'s kept output (a Lab-queue job: it reads
    the whole run back). Returns (queued, what happened); a refusal (still active, or no
    kept output) is written to the run's log too."""
    refused = None
    current = run.verification or {}
    if run.is_active or run.status == RunStatus.PENDING:
        refused = f"the run is {run.status}; verify it once it has ended"
    elif not run.keeps_output or not run.checkpoint_dir:
        refused = "this run kept no output (its sink's keep_output is off)"
    elif current.get("state") in ("queued", "running") and \
            time.time() - float(current.get("at") or 0) < VERIFY_STALE_S:
        # One check at a time: a second job would overwrite the first one's verdict
        # with its progress (and the page would flip from "OK" back to "checking").
        return False, (f"an exactly-once check is already {current['state']}; its verdict "
                       "will show here")
    if refused:
        record_event(run, EventKind.VERIFY_REQUESTED, actor, f"not verified: {refused}")
        return False, refused
    state = {"state": "queued", "ok": None, "line": "queued", "done": 0, "of": 0,
             "at": time.time()}
    Run.objects.filter(pk=run.pk).update(verification=state)
    run.verification = state
    message = "exactly-once check queued" + (f" ({why})" if why else "")
    record_event(run, EventKind.VERIFY_REQUESTED, actor, message)
    push(run.pk, {"type": "run.status", "run": run_state(run)})
    transaction.on_commit(lambda: enqueue(Task.VERIFY_RUN, run.pk, actor))
    return True, message


def update_config(run: Run, **fields: Any) -> None:
    """Store what the runner reports about its configuration (audited when it changed)."""
    before = {k: getattr(run, k) for k in fields}
    Run.objects.filter(pk=run.pk).update(**fields)
    run.refresh_from_db()
    changed = [k for k in fields if getattr(run, k) != before[k]]
    if changed:
        audit.record("run.configured", run, before={k: before[k] for k in changed},
                     after={k: getattr(run, k) for k in changed}, actor="runner")
    push(run.pk, {"type": "run.status", "run": run_state(run)})


def create_run(pipeline: Pipeline, policy: Policy, user: Any) -> Run:
    """Create a run of the pipeline's current version and queue its start."""
    version = policy.current_version(user)  # the run keeps it until switched
    with recorded_by_caller():  # the run.created event below is its audit entry
        run = Run.objects.create(
            pipeline_version=pipeline.current_version, policy=policy,
            policy_version=version.version, created_by=user, workers=0,
            key_groups=int(pipeline.definition.get("key_groups", 8)))
    record_event(run, EventKind.CREATED, actor_for(user),
                 f"run of {pipeline.name} v{pipeline.version} under policy {policy.name} "
                 f"v{version.version}")
    transaction.on_commit(lambda: enqueue(Task.START_RUN, run.pk, actor_for(user)))
    return run


def restart_refusal(run: Run) -> str | None:
    """Why this run cannot be restarted from its checkpoint, or None."""
    from pathlib import Path

    if run.status not in (RunStatus.FAILED, RunStatus.LOST):
        return f"only a failed or lost run restarts from its checkpoint; this one is {run.status}"
    run_dir = Path(run.checkpoint_dir) if run.checkpoint_dir else None
    if run_dir is None or not (run_dir / "t0").exists() \
            or not (run_dir / "checkpoint" / "offsets").exists():
        return "it has no checkpoint to restart from (it failed before its query started)"
    if (run_dir / "generations.json").exists():
        return ("it was re-planned: its output is spread over several generations' "
                "checkpoints, which a restart does not resume yet")
    return None


def restart_run(run: Run, user: Any) -> tuple[bool, str]:
    """Start a failed or lost run's runner again on its checkpoint and clock (after its
    operator package was fixed, a worker came back, ...): Spark replays the batch it had
    not committed and the sinks' ledgers write each batch once."""
    why = restart_refusal(run)
    if why is not None:
        return False, why
    if not transition(run, RunStatus.PENDING, actor_for(user),
                      "restart from checkpoint requested", ended_at=None):
        return False, f"run {run.pk} is {run.status} now"
    record_event(run, EventKind.RESTART_REQUESTED, actor_for(user),
                 f"restart from the checkpoint in {run.checkpoint_dir}")
    transaction.on_commit(lambda: enqueue(Task.START_RUN, run.pk, actor_for(user)))
    return True, f"Run {run.pk} restarts from its checkpoint."


def request_stop(run: Run, user: Any) -> None:
    record_event(run, EventKind.STOP_REQUESTED, actor_for(user))
    transaction.on_commit(lambda: enqueue(Task.STOP_RUN, run.pk, actor_for(user)))


def request_reconfiguration(run: Run, command: str, args: dict[str, Any], user: Any,
                            message: str) -> None:
    """Audit and queue one runner reconfiguration (``set_workers``, ``rebalance``,
    ``move_groups``, ``set_frequency``); the Celery task sends it and records the
    runner's acknowledgement."""
    record_event(run, EventKind.RECONFIGURE_REQUESTED, actor_for(user), message,
                 {"command": command, **args})
    deadline = time.time() + COMMAND_TTL_S
    transaction.on_commit(lambda: enqueue(
        Task.RECONFIGURE_RUN, run.pk, {"command": command, "args": args}, actor_for(user),
        deadline))


def request_workers(run: Run, workers: int, user: Any, schedule: str = "batched") -> None:
    request_reconfiguration(run, "set_workers", {"workers": workers, "schedule": schedule},
                            user, f"set workers to {workers} ({schedule} migration)")


def request_rebalance(run: Run, planner: str, schedule: str, tau: float, user: Any) -> None:
    request_reconfiguration(run, "rebalance",
                            {"planner": planner, "schedule": schedule, "tau": tau}, user,
                            f"rebalance key groups ({planner}, tau {tau:g}, {schedule})")


def request_move_groups(run: Run, groups: list[int], executor: str, schedule: str,
                        user: Any) -> None:
    request_reconfiguration(run, "move_groups",
                            {"moves": {str(g): executor for g in groups},
                             "schedule": schedule}, user,
                            f"move key groups {', '.join(map(str, groups))} to executor "
                            f"{executor} ({schedule})")


def current_executors(run: Run) -> list[str]:
    """The executors owning key groups in the run's latest placement."""
    sample = run.samples.exclude(groups=None).order_by("-batch_id").only("groups").first()
    placement = ((sample.groups or {}).get("placement") or []) if sample else []
    return sorted({str(e) for e in placement if e is not None},
                  key=lambda e: (len(e), e))


def request_replan(run: Run, key_groups: int, scheme: str, user: Any) -> None:
    """A live re-plan to ``key_groups`` (runtime/replan.py): a new query beside the old
    one, handed over without downtime (``seamless``) or by ``stop-restart``."""
    request_reconfiguration(run, "replan", {"key_groups": key_groups, "scheme": scheme},
                            user, f"re-plan {run.key_groups} -> {key_groups} key groups "
                                  f"({scheme})")


def request_plan(run: Run, plan: dict[str, Any], user: Any) -> None:
    """Run the pipeline's Python operators as ``plan``'s processing elements (the plan
    optimiser's proposal, ``pipelines.plans``), by a seamless live re-plan."""
    pes = " | ".join(" -> ".join(pe) for pe in plan["pes"])
    request_reconfiguration(run, "replan", {"key_groups": run.key_groups or 8,
                                            "scheme": "seamless", "plan": plan}, user,
                            f"re-plan to {len(plan['pes'])} PE(s): {pes}")


def request_frequency(run: Run, ghz: float, user: Any) -> None:
    request_reconfiguration(run, "set_frequency", {"ghz": ghz}, user,
                            f"set CPU frequency to {ghz:g} GHz")


# ------------------------------------------------------------------------- metrics
def sample_from_record(record: dict[str, Any]) -> dict[str, Any]:
    """Wire dict (pushed to browsers) for a runner metrics record."""
    wire = {k: record.get(k) for k in SAMPLE_FIELDS}
    wire["backlog_s"] = record.get("source_behind_s")  # (the runner's name for it)
    if record.get("placement") is not None:
        wire["groups"] = {k: record.get(k) for k in GROUP_FIELDS}
    wire["t"] = record["t"]
    wire["written_at"] = record.get("written_at")
    wire["power_measured"] = record.get("power_source") == "measured"
    return wire


def sample_to_wire(sample: MetricSample) -> dict[str, Any]:
    wire = {k: getattr(sample, k) for k in STORED_FIELDS}
    wire["t"] = sample.t.timestamp()
    wire["power_measured"] = sample.power_measured
    return wire


def store_samples(run_id: int, wires: list[dict[str, Any]]) -> None:
    rows = []
    for w in wires:
        fields = {k: w.get(k) for k in STORED_FIELDS}
        fields["workers"] = fields.get("workers") or 0
        fields["frequency_source"] = fields.get("frequency_source") or ""
        fields["input_rows"] = fields.get("input_rows") or 0
        fields["records"] = fields.get("records") or 0
        rows.append(MetricSample(run_id=run_id, power_measured=bool(w.get("power_measured")),
                                 t=datetime.fromtimestamp(w["t"], tz=dt_timezone.utc),
                                 **fields))
    MetricSample.objects.bulk_create(rows, ignore_conflicts=True)


def raise_alert(run: Run, actor: str, message: str,
                payload: dict[str, Any] | None = None) -> None:
    """An alert is an audited event, pushed to the run page, and POSTed to the policy's
    webhook if it has one (by a Celery task, on commit: a slow receiver never delays
    the caller)."""
    payload = payload or {}
    record_event(run, EventKind.ALERT, actor, message, payload)
    webhook = run.policy_in_force.alert_webhook
    if webhook:
        body = {"run": run.pk, "policy": run.policy.name, "message": message,
                "at": timezone.now().isoformat(), **payload}
        transaction.on_commit(lambda: enqueue(Task.SEND_WEBHOOK, webhook, body))
