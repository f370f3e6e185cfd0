"""The runner contract on Redis, the only bus between a run's runner and the control
plane. No Django import.

Per run, keyed by its bus key ``<run id>.<token>`` (the token is unique per run, so a
database that reuses a row id, as SQLite does after deletes, never meets an older
run's streams or a late heartbeat):

* ``run:<key>:metrics``  stream, one entry per micro-batch (field ``m``: JSON)
* ``run:<key>:events``   stream, runner lifecycle events (field ``e``: JSON)
* ``run:<key>:commands`` stream, commands for the runner (field ``c``: JSON with ``id``)
* ``run:<key>:acks``     stream, one acknowledgement per command (field ``a``: JSON)
* ``run:<key>:heartbeat`` key with a TTL, refreshed by the runner while it lives
* ``runs:live``          set of bus keys whose streams the relay should follow

Streams are capped (``MAXLEN ~``) so a forgotten run cannot fill Redis. JSON keeps the
contract readable from ``redis-cli`` and from any language.
"""
from __future__ import annotations

import enum
import json
import time
import uuid
from typing import Any, NotRequired, TypedDict

import redis

HEARTBEAT_TTL_S = 10
HEARTBEAT_EVERY_S = 2.0
STREAM_MAXLEN = 20_000
LIVE_SET = "runs:live"


class RunnerEvent(enum.StrEnum):
    """Every kind of event a runner puts on its events stream (the entry's ``type``).
    The relay records each as the RunEvent ``runner:<kind>`` and applies the lifecycle
    ones (``query_started`` -> running, ``stopped``, ``failed``) to the run."""

    RUNNER_STARTED = "runner_started"  # the process is up (pid)
    SESSION_STARTED = "session_started"  # the Spark application is up (app id, UI URL)
    EXECUTORS_READY = "executors_ready"  # the initial executors; the extras released
    QUERY_STARTED = "query_started"  # the streaming query runs (its schedule clock t0)
    STOPPED = "stopped"  # ended on request
    FAILED = "failed"  # ended by an error (reason)
    GROUPS_REASSIGNED = "groups_reassigned"  # groups of a lost executor placed anew
    MIGRATION_STARTED = "migration_started"  # a planned move of key groups begins
    MIGRATION_STEP_APPLIED = "migration_step_applied"  # a step's moves took effect
    MIGRATION_STEP = "migration_step"  # a step's batch ran (verified on target or not)
    MIGRATION_DONE = "migration_done"  # the migration's summary
    PLACEMENT_DRIFT = "placement_drift"  # Spark ran groups off their placement
    DECOMMISSION_REFUSED = "decommission_refused"  # an executor still held groups
    WORKERS_CHANGED = "workers_changed"
    FREQUENCY_CHANGED = "frequency_changed"


class RunnerCommand(enum.StrEnum):
    """Every command a runner takes from its commands stream (``reconfigure.Reconfigurer.cmd_<name>``);
    each gets exactly one :class:`Ack`."""

    STOP = "stop"  # {reason}: at once, after the current micro-batch
    SET_WORKERS = "set_workers"  # {workers, schedule?, planner?}: planned migration
    MOVE_GROUPS = "move_groups"  # {moves: {group: executor}, schedule?}
    REBALANCE = "rebalance"  # {planner?, tau?, schedule?}
    SET_FREQUENCY = "set_frequency"  # {ghz}


# The commands that reconfigure a running query (all but stop), one at a time.
RECONFIGURATIONS = tuple(c.value for c in RunnerCommand if c is not RunnerCommand.STOP)


class Command(TypedDict):
    """One entry of ``run:<key>:commands`` (field ``c``)."""

    id: str
    name: RunnerCommand
    args: dict[str, Any]
    sent_at: float


class Ack(TypedDict):
    """One entry of ``run:<key>:acks`` (field ``a``); a command's own results (e.g.
    ``workers``, ``executors``, ``migration``, ``placement``, ``ghz``) ride along."""

    command_id: str
    ok: bool
    message: str
    t: float


class MigrationProgress(TypedDict):
    """The migration under way when a batch ran (``MetricsRecord.migration``)."""

    id: str
    reason: str
    strategy: str
    steps: int
    applied: int


class MetricsRecord(TypedDict):
    """One entry of ``run:<key>:metrics`` (field ``m``): one micro-batch, built by
    ``batch_metrics.BatchMetrics`` from Spark's progress and the sink's commit. Times are
    epoch seconds, durations milliseconds; latencies are measured per record (emission
    time -> commit). The placement fields are absent when the batch's tasks could not
    be read (then ``monitor_error`` says why)."""

    batch_id: int
    t: float  # the sink's commit time
    input_rows: int
    records: int  # records that reached the sink (the latency sample)
    output_rows: int
    input_rate: float
    processed_rate: float
    scheduled_rate: float  # the source's schedule at t (modelled arrivals)
    output_rate: float | None
    batch_duration_ms: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    latency_max_ms: float | None
    workers: int
    state_rows: int
    trigger_started_at: float
    durations_ms: dict[str, int]  # Spark's own phases of the batch
    source_start: int | None
    source_end: int | None
    source_latest: int | None  # records scheduled by now: arrivals and backlog
    boundary_ms: float | None  # time spent between batches (placement, migration step)
    repinned: int
    frequency_ghz: float
    frequency_source: str
    power_w: float | None
    power_source: str
    # Per key group (index = group), from the batch's stateful tasks:
    placement: NotRequired[list[str | None]]
    ran_on: NotRequired[list[str | None]]
    drift: NotRequired[int]
    group_moves: NotRequired[int]
    group_ms: NotRequired[list[int | None]]
    group_records: NotRequired[list[int | None]]
    # Per stateful operator (named by its dataflow node): its bytes per key group.
    operator_bytes: NotRequired[list[dict[str, Any]]]
    group_bytes: NotRequired[list[int]]
    failed_tasks: NotRequired[int]
    migration: NotRequired[MigrationProgress | None]
    monitor_error: NotRequired[str]
    # Added by the bus on publish:
    run_id: NotRequired[int]
    written_at: NotRequired[float]


def metrics_key(bus_key: str) -> str:
    return f"run:{bus_key}:metrics"


def events_key(bus_key: str) -> str:
    return f"run:{bus_key}:events"


def commands_key(bus_key: str) -> str:
    return f"run:{bus_key}:commands"


def acks_key(bus_key: str) -> str:
    return f"run:{bus_key}:acks"


def heartbeat_key(bus_key: str) -> str:
    return f"run:{bus_key}:heartbeat"


def bus_key(run_id: int, token: str) -> str:
    return f"{run_id}.{token}"


def run_id_of(key: str) -> int:
    """The run id in a bus key or a stream name (``run:<id>.<token>:metrics``)."""
    return int(key.split(":")[1 if key.startswith("run:") else 0].split(".")[0])


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30,
                                socket_connect_timeout=5, health_check_interval=30)


class RunBus:
    """One run's view of the bus, used by both the runner and the control plane."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.r = client
        self.key = key
        self.run_id = run_id_of(key)

    # ---------------------------------------------------------------- runner side
    def publish_metrics(self, record: MetricsRecord) -> str:
        wire = {**record, "run_id": self.run_id, "written_at": time.time()}
        return self.r.xadd(metrics_key(self.key), {"m": json.dumps(wire)},
                           maxlen=STREAM_MAXLEN, approximate=True)

    def publish_event(self, kind: RunnerEvent, **payload: Any) -> str:
        body = {"type": str(RunnerEvent(kind)), "t": time.time(), **payload}
        return self.r.xadd(events_key(self.key), {"e": json.dumps(body)},
                           maxlen=STREAM_MAXLEN, approximate=True)

    def heartbeat(self, **payload: Any) -> None:
        self.r.set(heartbeat_key(self.key), json.dumps({"t": time.time(), **payload}),
                   ex=HEARTBEAT_TTL_S)

    def clear_heartbeat(self) -> None:
        self.r.delete(heartbeat_key(self.key))

    def read_commands(self, last_id: str, block_ms: int) -> list[tuple[str, dict[str, Any]]]:
        got = self.r.xread({commands_key(self.key): last_id}, block=block_ms, count=16)
        out = []
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                out.append((entry_id, json.loads(fields["c"])))
        return out

    def ack(self, command_id: str, ok: bool, message: str, **payload: Any) -> None:
        ack: Ack = {"command_id": command_id, "ok": ok, "message": message, "t": time.time()}
        self.r.xadd(acks_key(self.key), {"a": json.dumps({**ack, **payload})},
                    maxlen=STREAM_MAXLEN, approximate=True)

    # --------------------------------------------------------- control-plane side
    def send_command(self, name: RunnerCommand | str, **args: Any) -> str:
        """Queue a command for the runner (ValueError for a name it does not take)."""
        command_id = uuid.uuid4().hex
        command: Command = {"id": command_id, "name": RunnerCommand(name), "args": args,
                            "sent_at": time.time()}
        self.r.xadd(commands_key(self.key), {"c": json.dumps(command)},
                    maxlen=STREAM_MAXLEN, approximate=True)
        return command_id

    def wait_ack(self, command_id: str, timeout_s: float) -> dict[str, Any] | None:
        """Block until the runner acknowledges ``command_id`` or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        last = "0-0"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            got = self.r.xread({acks_key(self.key): last},
                               block=max(1, int(min(remaining, 1.0) * 1000)), count=64)
            for _stream, entries in got or []:
                for entry_id, fields in entries:
                    last = entry_id
                    ack = json.loads(fields["a"])
                    if ack.get("command_id") == command_id:
                        return ack

    def read_heartbeat(self) -> dict[str, Any] | None:
        raw = self.r.get(heartbeat_key(self.key))
        return json.loads(raw) if raw else None

    def mark_live(self) -> None:
        self.r.sadd(LIVE_SET, self.key)

    def mark_done(self) -> None:
        self.r.srem(LIVE_SET, self.key)

    def reset(self) -> None:
        """Forget every stream of this run (a fresh start of the same id)."""
        self.r.delete(metrics_key(self.key), events_key(self.key),
                      commands_key(self.key), acks_key(self.key),
                      heartbeat_key(self.key))
