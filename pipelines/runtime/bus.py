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

What a runner writes (metrics, events, acks) goes through an outbox: while Redis is
away the entries wait in order in the runner's memory and are written when it is back,
so a Redis restart delays records but neither loses them nor fails the query. Redis
keeps no disk copy, so a restart also loses what it held but the relay had not read
yet: the runner notices the new server (its ``run_id``) and writes its last
``RESEND_WINDOW_S`` of entries again. Re-reading is harmless downstream: samples are
unique per batch, and events carry the runner's ``seq``.
"""
from __future__ import annotations

import collections
import enum
import itertools
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from typing import Any, NotRequired, TypedDict

import redis

HEARTBEAT_TTL_S = 10
HEARTBEAT_EVERY_S = 2.0
# In each heartbeat: a pid is only meaningful on the host that wrote it.
HOSTNAME = socket.gethostname()
STREAM_MAXLEN = 20_000
LIVE_SET = "runs:live"
# The control plane's own health, as its processes last reported it (a hash: the relay's
# lag behind the runners' metrics, the reconciler's last pass): /metrics exports it.
HEALTH_KEY = "streamwise:health"
# Entries a runner holds while Redis is away: a day of one-second batches; past that the
# oldest are dropped (and counted) rather than the runner's memory growing without end.
OUTBOX_MAX = 100_000
# What a runner writes again when Redis restarted empty (the relay reads within a second).
RESEND_WINDOW_S = 60.0


class RunnerEvent(enum.StrEnum):
    """Every kind of event a runner puts on its events stream (the entry's ``type``).
    The relay records each as the RunEvent ``runner:<kind>`` and applies the lifecycle
    ones (``query_started`` -> running, ``stopped``, ``failed``) to the run."""

    RUNNER_STARTED = "runner_started"  # the process is up (pid)
    SESSION_STARTED = "session_started"  # the Spark application is up (app id, UI URL)
    EXECUTORS_READY = "executors_ready"  # the initial executors; the extras released
    QUERY_STARTED = "query_started"  # the streaming query runs (its schedule clock t0)
    # started again from its checkpoint: its Python worker did not connect back in time
    QUERY_RESTARTED = "query_restarted"
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
    REPLAN_STARTED = "replan_started"  # a live re-plan begins (scheme, key groups)
    REPLAN_SWITCHED = "replan_switched"  # the new query's output is forwarded from now
    REPLAN_DONE = "replan_done"  # its summary: overlap, catch-up, Gloss' metrics
    REPLAN_FAILED = "replan_failed"  # abandoned; the old query goes on (reason)


class RunnerCommand(enum.StrEnum):
    """Every command a runner takes from its commands stream (the reconfigurations:
    ``elastic.reconfigure.Reconfigurer.commands``); each gets exactly one :class:`Ack`."""

    STOP = "stop"  # {reason}: at once, after the current micro-batch
    SET_WORKERS = "set_workers"  # {workers, schedule?, planner?}: planned migration
    MOVE_GROUPS = "move_groups"  # {moves: {group: executor}, schedule?}
    REBALANCE = "rebalance"  # {planner?, tau?, schedule?}
    SET_FREQUENCY = "set_frequency"  # {ghz}
    REPLAN = "replan"  # {key_groups, scheme?}: a new query beside the old (replan.py)


# A reconfiguration not begun by then is refused, by the runner or by the task that
# would send it: a redelivered or long-queued command acts on a run that has moved on.
# (A stop never expires: it may wait out a slow start, and stopping twice is harmless.)
COMMAND_TTL_S = 120.0

# The commands that reconfigure a running query (all but stop), one at a time.
RECONFIGURATIONS = tuple(c.value for c in RunnerCommand if c is not RunnerCommand.STOP)


class Command(TypedDict):
    """One entry of ``run:<key>:commands`` (field ``c``)."""

    id: str  # the same id for a resend of the same request (a redelivered task)
    name: RunnerCommand
    args: dict[str, Any]
    sent_at: float
    deadline: NotRequired[float]  # epoch s; refused as expired if not begun by then


def expired(command: Command | dict[str, Any], now: float | None = None) -> float | None:
    """Seconds past ``command``'s deadline, or None while it may still be acted on."""
    deadline = command.get("deadline")
    if deadline is None or command.get("name") == RunnerCommand.STOP:
        return None
    late = (time.time() if now is None else now) - float(deadline)
    return late if late > 0 else None


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

    batch_id: int  # the run's output batch (epoch): continues across re-plans
    spark_batch_id: int  # the batch id in its query's checkpoint
    generation: int  # which query (a live re-plan starts the next one)
    job_group: str  # its query's run id (Spark's job group of its batches)
    t: float  # the sink's commit time
    input_rows: int
    records: int  # records that reached the sink (the latency sample)
    output_rows: int
    input_rate: float
    processed_rate: float
    scheduled_rate: float | None  # the source's schedule at t (modelled arrivals; None: a broker)
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
    # Where the offsets are not record counts (a Redis stream's packed entry IDs): the
    # records the source was ever given, and the seconds its newest is ahead of the end.
    source_arrived: float | None
    source_behind_s: float | None
    boundary_ms: float | None  # time spent between batches (placement, migration step)
    repinned: int
    frequency_ghz: float
    frequency_source: str
    power_w: float | None
    power_source: str
    # Per key group (index = group), from the batch's stateful tasks:
    placement: NotRequired[list[str | None]]
    ran_on: NotRequired[list[str | None]]
    executor_hosts: NotRequired[dict[str, str]]  # executor id -> its host
    drift: NotRequired[int]
    group_moves: NotRequired[int]
    group_ms: NotRequired[list[int | None]]
    # Task run time of every stage of the batch, all executors (the measured busy time).
    task_ms_total: NotRequired[int]
    group_records: NotRequired[list[int | None]]
    # Per stateful operator (named by its dataflow node): its bytes per key group.
    operator_bytes: NotRequired[list[dict[str, Any]]]
    group_bytes: NotRequired[list[int]]
    failed_tasks: NotRequired[int]
    dead_letters: NotRequired[int | None]  # a broker's entries that did not convert, so far
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


# A runner's Redis password: in its environment, never in runner.json or on its
# command line (the control plane writes the URL without it: ``public_url``).
PASSWORD_ENV = "STREAMWISE_REDIS_PASSWORD"


def connect(url: str) -> redis.Redis:
    """A client of ``url``; a URL without a password takes ``$STREAMWISE_REDIS_PASSWORD``
    if it is set."""
    extra: dict[str, Any] = {}
    password = os.environ.get(PASSWORD_ENV)
    if password and not urllib.parse.urlsplit(url).password:
        extra["password"] = password
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30,
                                socket_connect_timeout=5, health_check_interval=30,
                                **extra)


def public_url(url: str) -> str:
    """``url`` without its password (what may be written to a file or a log)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def password_env(url: str) -> dict[str, str]:
    """The environment that gives a runner ``url``'s password (``connect``)."""
    password = urllib.parse.urlsplit(url).password
    return {PASSWORD_ENV: urllib.parse.unquote(password)} if password else {}


def _is_outcome(ack: dict[str, Any], command_id: str) -> bool:
    """Whether ``ack`` is the outcome of ``command_id``: the runner's answer to its first
    delivery, not to a resend ("received before; not applied again")."""
    return ack.get("command_id") == command_id and not ack.get("duplicate")


class _RunStreams:
    """One run's streams and keys on ``client`` (``key``: the run's bus key)."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.r = client
        self.key = key
        self.run_id = run_id_of(key)

    def clear_heartbeat(self) -> None:
        """The runner, on its way out; the reconciler, for a runner it found lost."""
        self.r.delete(heartbeat_key(self.key))


class RunnerBus(_RunStreams):
    """The runner's side: what it writes (metrics, events, acknowledgements, its
    heartbeat) through an outbox that holds them while Redis is away, and the commands
    it reads."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        super().__init__(client, key)
        self._outbox: collections.deque[tuple[str, str, str]] = collections.deque(
            maxlen=OUTBOX_MAX)
        self._outbox_lock = threading.Lock()
        self._away = False
        self.dropped = 0  # entries the full outbox let go
        # Entries written lately, (time, stream, field, JSON), to write again should Redis
        # restart empty; and the server they were written to (INFO's run_id).
        self._recent: collections.deque[tuple[float, str, str, str]] = collections.deque(
            maxlen=OUTBOX_MAX)
        self._server: str | None = None
        self.resent = 0
        self._event_seq = itertools.count()

    def _write(self, stream: str, field: str, body: dict[str, Any]) -> str | None:
        """Append to ``stream`` after everything still waiting in the outbox; the entry
        id, or None when Redis is away (the entry then waits for the next write or
        :meth:`flush`)."""
        with self._outbox_lock:
            if len(self._outbox) == OUTBOX_MAX:
                self.dropped += 1
            self._outbox.append((stream, field, json.dumps(body)))
            return self._flush_locked()

    def flush(self) -> bool:
        """Write what waits in the outbox; True when it is empty."""
        with self._outbox_lock:
            self._flush_locked()
            return not self._outbox

    @property
    def waiting(self) -> int:
        """Entries held in the outbox, not yet on Redis."""
        return len(self._outbox)

    def _note_server(self) -> None:
        """Remember which Redis server holds our entries; if it is a new one (a restart
        lost its memory), queue the recent entries again, ahead of the waiting ones."""
        server = str(self.r.info("server").get("run_id"))
        if self._server is not None and server != self._server:
            cutoff = time.time() - RESEND_WINDOW_S
            again = [(stream, field, raw) for t, stream, field, raw in self._recent
                     if t >= cutoff]
            self._outbox.extendleft(reversed(again))
            self._recent.clear()
            self.resent += len(again)
            print(f"Redis restarted: writing the last {len(again)} entries again",
                  file=sys.stderr, flush=True)
        self._server = server

    def check_server(self) -> None:
        """Called every heartbeat: notice a Redis that restarted between two writes."""
        with self._outbox_lock:
            try:
                self._note_server()
            except (redis.ConnectionError, redis.TimeoutError):
                self._away = True
                return
            if self._outbox:
                self._flush_locked()

    def _flush_locked(self) -> str | None:
        entry_id = None
        try:
            if self._away or self._server is None:
                self._note_server()
            while self._outbox:
                stream, field, raw = self._outbox[0]
                entry_id = self.r.xadd(stream, {field: raw}, maxlen=STREAM_MAXLEN,
                                       approximate=True)
                self._outbox.popleft()
                now = time.time()
                self._recent.append((now, stream, field, raw))
                while self._recent and self._recent[0][0] < now - RESEND_WINDOW_S:
                    self._recent.popleft()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not self._away:
                print(f"Redis unreachable, holding records: {exc}", file=sys.stderr,
                      flush=True)
            self._away = True
            return None
        if self._away:
            print("Redis is back; held records written", file=sys.stderr, flush=True)
            self._away = False
        return entry_id

    def publish_metrics(self, record: MetricsRecord) -> str | None:
        wire = {**record, "run_id": self.run_id, "written_at": time.time()}
        return self._write(metrics_key(self.key), "m", wire)

    def publish_event(self, kind: RunnerEvent, **payload: Any) -> str | None:
        body = {"type": str(RunnerEvent(kind)), "t": time.time(), **payload,
                "seq": next(self._event_seq)}
        return self._write(events_key(self.key), "e", body)

    def heartbeat(self, **payload: Any) -> None:
        self.check_server()
        self.r.set(heartbeat_key(self.key),
                   json.dumps({"t": time.time(), "host": HOSTNAME, **payload}),
                   ex=HEARTBEAT_TTL_S)

    def read_commands(self, last_id: str, block_ms: int) -> list[tuple[str, dict[str, Any]]]:
        got = self.r.xread({commands_key(self.key): last_id}, block=block_ms, count=16)
        out = []
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                out.append((entry_id, json.loads(fields["c"])))
        return out

    def ack(self, command_id: str, ok: bool, message: str, **payload: Any) -> None:
        ack: Ack = {"command_id": command_id, "ok": ok, "message": message, "t": time.time()}
        self._write(acks_key(self.key), "a", {**ack, **payload})

class ControlBus(_RunStreams):
    """The control plane's side: the commands it sends and their acknowledgements, the
    runner's heartbeat, and the run's place in the relay's live set."""

    def send_command(self, name: RunnerCommand | str, *, command_id: str | None = None,
                     deadline: float | None = None, **args: Any) -> str:
        """Queue a command for the runner (ValueError for a name it does not take).
        ``command_id`` names the request (a resend with the same id is not applied
        again); ``deadline`` defaults to :data:`COMMAND_TTL_S` from now."""
        command_id = command_id or uuid.uuid4().hex
        now = time.time()
        command: Command = {"id": command_id, "name": RunnerCommand(name), "args": args,
                            "sent_at": now,
                            "deadline": now + COMMAND_TTL_S if deadline is None else deadline}
        self.r.xadd(commands_key(self.key), {"c": json.dumps(command)},
                    maxlen=STREAM_MAXLEN, approximate=True)
        return command_id

    def wait_ack(self, command_id: str, timeout_s: float) -> dict[str, Any] | None:
        """Block until the runner acknowledges ``command_id`` or the timeout passes. The
        runner's answer to a resend ("received before") is not the outcome: the wait
        goes on for the acknowledgement of the first delivery."""
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
                    if _is_outcome(ack, command_id):
                        return ack

    def find_ack(self, command_id: str) -> dict[str, Any] | None:
        """The runner's acknowledgement of ``command_id`` if it is already there (a task
        redelivered after its worker died while it waited)."""
        for _entry_id, fields in self.r.xrange(acks_key(self.key)):
            ack = json.loads(fields["a"])
            if _is_outcome(ack, command_id):
                return ack
        return None

    def read_heartbeat(self) -> dict[str, Any] | None:
        raw = self.r.get(heartbeat_key(self.key))
        return json.loads(raw) if raw else None

    def heartbeat_age_s(self) -> float:
        """Seconds since the heartbeat was written, by Redis' clock (its remaining TTL):
        the runner's own clock may be another host's, and its ``t`` is up to a heartbeat
        period old. 0 when there is none."""
        ttl_ms = self.r.pttl(heartbeat_key(self.key))
        return max(0.0, HEARTBEAT_TTL_S - ttl_ms / 1000) if ttl_ms >= 0 else 0.0

    def mark_live(self) -> None:
        self.r.sadd(LIVE_SET, self.key)

    def mark_done(self) -> None:
        self.r.srem(LIVE_SET, self.key)

    def reset(self) -> None:
        """Forget every stream of this run (a fresh start of the same id)."""
        self.r.delete(metrics_key(self.key), events_key(self.key),
                      commands_key(self.key), acks_key(self.key),
                      heartbeat_key(self.key))
