"""The relay: Redis streams of live runs -> Channels groups (push) and the DB (record).

One asyncio loop XREADs the metrics and events streams of every run in ``runs:live``
and of every run the database holds as active (blocking, so a record is forwarded as
soon as the runner writes it), pushes first and stores second (latency to the browser
does not wait for the database), and applies runner lifecycle events to the Run
(``query_started`` -> running, ``stopped``, ``failed``).

Redis is a cache and the database the record: the set ``runs:live`` is written once, at
a run's start, so a Redis restart empties it; the database's active runs are followed
anyway. A stream's read position advances only past what has been stored, so a database
or channel-layer error means the same entries are read again, never dropped. Re-reading
is harmless: samples are unique per (run, batch), relayed events per the runner's
sequence number, and a batch already pushed is not pushed twice.

    python manage.py relay
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from pipelines import actions
from pipelines.models import ACTIVE_STATUSES, EventKind, Run, RunStatus
from pipelines.runtime import bus as busmod
from pipelines.runtime.bus import RunnerEvent

log = logging.getLogger(__name__)
# On first sight of a run (e.g. relay restart) older samples are stored, not pushed.
PUSH_MAX_AGE_S = 10.0
# How often the relay asks the database which runs are active (one indexed query).
ACTIVE_REFRESH_S = 2.0


def _mb(n: float | None) -> str:
    return f"{(n or 0) / 1e6:.2f} MB"


def describe(kind: str, e: dict[str, Any]) -> str:
    """One timeline line for a runner event (the payload keeps every detail)."""
    if kind == RunnerEvent.EXECUTORS_READY:
        released = e.get("released") or []
        return (f"executors {', '.join(e.get('executors') or []) or '—'} ready"
                + (f"; released {', '.join(released)} (launched up to the policy's maximum "
                   f"of {e.get('max_workers')})" if released else ""))
    if kind == RunnerEvent.MIGRATION_STARTED:
        return (f"{e.get('strategy')} migration {e.get('migration_id')}: {e.get('groups')} "
                f"groups, {_mb(e.get('bytes'))} in {e.get('steps')} steps ({e.get('reason')})")
    if kind == RunnerEvent.MIGRATION_STEP_APPLIED:
        moves = ", ".join(f"g{m['group']} {m['from']}→{m['to']}" for m in e.get("moves", []))
        return f"step {e.get('step', 0) + 1} applied after batch {e.get('after_batch')}: {moves}"
    if kind == RunnerEvent.MIGRATION_STEP:
        ok = "on target" if e.get("verified") else "NOT on target: " + str(e.get("ran_on"))
        return (f"step {e.get('index', 0) + 1}/{e.get('steps')}: {len(e.get('moves', []))} "
                f"groups, {_mb(e.get('bytes'))}, batch {e.get('batch_id')} took "
                f"{e.get('batch_duration_ms')} ms, {ok}")
    if kind == RunnerEvent.MIGRATION_DONE:
        return (f"migration {e.get('migration_id')} {'verified' if e.get('verified') else 'FAILED'}"
                f": {e.get('groups_moved')} groups, {_mb(e.get('bytes_moved'))} in "
                f"{e.get('steps')} steps, {e.get('duration_s')} s"
                + (f" ({e.get('failed')})" if e.get("failed") else ""))
    if kind == RunnerEvent.PLACEMENT_DRIFT:
        return (f"batch {e.get('batch_id')}: groups {e.get('groups')} ran off their placement "
                f"(ran on {e.get('ran_on')})")
    if kind == RunnerEvent.QUERY_RESTARTED:
        return (f"generation {e.get('generation')}'s query started again from its "
                f"checkpoint (attempt {e.get('attempt')}): {e.get('reason')}")
    if kind == RunnerEvent.FREQUENCY_CHANGED:
        return f"CPU frequency {e.get('ghz')} GHz ({e.get('source')})"
    if kind == RunnerEvent.REPLAN_STARTED:
        return (f"re-plan {e.get('from_groups')} → {e.get('to_groups')} key groups "
                f"({e.get('scheme')}): generation {e.get('generation')} starting")
    if kind == RunnerEvent.REPLAN_SWITCHED:
        return (f"generation {e.get('generation')} ({e.get('key_groups')} key groups) "
                f"forwards from output batch {e.get('epoch')}")
    if kind == RunnerEvent.REPLAN_DONE:
        where = {"process": " in a transfer process",
                 "application": " in the run's application"}.get(e.get("state_built_in"), "")
        state = (f"state rebuilt from {e.get('snapshot_rows')} replayed records{where}"
                 if e.get("replayed") else
                 f"state {e.get('snapshot_rows')} keys read in {e.get('snapshot_s')} s")
        return (f"re-plan {e.get('from_groups')} → {e.get('to_groups')} key groups "
                f"({e.get('scheme')}): downtime {e.get('downtime_s')} s, disrupted "
                f"{e.get('disrupted_s')} s, overlap {e.get('overlap_s')} s, catch-up "
                f"{e.get('catch_up_s')} s, {state}, worst p95 {e.get('worst_p95_ms')} ms")
    return e.get("reason") or ", ".join(f"{k}={v}" for k, v in e.items())


def _run_holds(bus_key: str) -> bool:
    """Whether the database has the run this bus key belongs to (same id and token)."""
    try:
        run = Run.objects.get(pk=busmod.run_id_of(bus_key))
    except (Run.DoesNotExist, ValueError):
        return False
    return run.bus_key == bus_key


def _active_bus_keys() -> set[str]:
    """Bus keys of the runs the database holds as active (starting, running, stopping)."""
    return {busmod.bus_key(pk, token) for pk, token in
            Run.objects.filter(status__in=ACTIVE_STATUSES).values_list("pk", "bus_token")}


def apply_runner_event(run_id: int, entry_id: str, event: dict[str, Any]) -> bool:
    """Record a runner event and apply it to the run; True when the run has ended."""
    run = Run.objects.get(pk=run_id)
    kind = event.get("type", "unknown")
    details = {k: v for k, v in event.items() if k not in ("type", "t", "seq")}
    if kind == RunnerEvent.RUNNER_STARTED:
        actions.update_config(run, runner_pid=event.get("pid"))
    elif kind == RunnerEvent.SESSION_STARTED:
        actions.update_config(run, spark_app_id=event.get("app_id", ""),
                              spark_ui_url=event.get("spark_ui") or "")
    elif kind == RunnerEvent.QUERY_STARTED:
        actions.transition(run, RunStatus.RUNNING, "runner", "streaming query started",
                           workers=event.get("workers", 0),
                           key_groups=event.get("key_groups", run.key_groups),
                           frequency_source=event.get("frequency_source", ""),
                           frequencies=event.get("frequencies") or [])
    elif kind == RunnerEvent.FREQUENCY_CHANGED:
        actions.update_config(run, frequency_ghz=event.get("ghz"),
                              frequency_source=event.get("source", ""))
    elif kind == RunnerEvent.WORKERS_CHANGED:
        actions.update_config(run, workers=event.get("workers", run.workers))
    elif kind == RunnerEvent.REPLAN_SWITCHED:
        actions.update_config(run, key_groups=event.get("key_groups", run.key_groups))
    message = describe(kind, details)
    actions.record_event(run, EventKind.runner(kind), "runner", message, details,
                         source_id=entry_id)
    if kind == RunnerEvent.STOPPED:
        actions.transition(run, RunStatus.STOPPED, "runner", event.get("reason", "stopped"))
        return True
    if kind == RunnerEvent.FAILED:
        actions.transition(run, RunStatus.FAILED, "runner", event.get("reason", "failed"))
        return True
    return False


class Relay:
    def __init__(self, redis_url: str | None = None) -> None:
        self.redis = aioredis.from_url(redis_url or settings.REDIS_URL, decode_responses=True)
        self.layer = get_channel_layer()
        self.cursors: dict[str, str] = {}
        self.forwarded = 0
        self.known: set[str] = set()  # bus keys whose run the database holds
        self.active: set[str] = set()  # bus keys of the runs the database holds as active
        self.active_read_at = float("-inf")
        # Per metrics stream, the highest batch pushed to the browsers: a batch read again
        # (storing failed and is retried, or the runner wrote it again after a Redis
        # restart) is stored, never pushed twice.
        self.pushed: dict[str, int] = {}

    async def step(self, block_ms: int = 500) -> int:
        """One XREAD round over all live runs; returns the entries handled."""
        live = await self.redis.smembers(busmod.LIVE_SET)
        if time.monotonic() - self.active_read_at >= ACTIVE_REFRESH_S:
            self.active = await database_sync_to_async(_active_bus_keys)()
            self.active_read_at = time.monotonic()
            # A run deleted while live would make every later store fail: let it go.
            for bus_key in self.known - self.active:
                if not await database_sync_to_async(_run_holds)(bus_key):
                    self.known.discard(bus_key)
                    live.discard(bus_key)
                    await self.redis.srem(busmod.LIVE_SET, bus_key)
        for bus_key in [k for k in live if k not in self.known and k not in self.active]:
            if await database_sync_to_async(_run_holds)(bus_key):
                self.known.add(bus_key)
            else:  # e.g. left by a database that was reset: nothing to record it in
                log.warning("forgetting live bus key %s: no such run", bus_key)
                await self.redis.srem(busmod.LIVE_SET, bus_key)
        self.known = (self.known & live) | self.active
        streams: dict[str, str] = {}
        for bus_key in self.known:
            for key in (busmod.metrics_key(bus_key), busmod.events_key(bus_key)):
                streams[key] = self.cursors.get(key, "0-0")
        for key in [k for k in self.cursors if k not in streams]:
            del self.cursors[key]
            self.pushed.pop(key, None)
        if not streams:
            await asyncio.sleep(block_ms / 1000)
            return 0
        got = await self.redis.xread(streams, block=block_ms, count=1000)
        handled = 0
        for key, entries in got or []:
            run_id = busmod.run_id_of(key)
            if key.endswith(":metrics"):
                await self._metrics(key, run_id, entries)
            else:
                await self._events(key, run_id, entries)
            handled += len(entries)
        return handled

    async def _metrics(self, key: str, run_id: int, entries: list) -> None:
        """Push the samples not pushed yet, store all, then advance past them."""
        first_sight = self.cursors.get(key, "0-0") == "0-0"
        pushed = self.pushed.get(key, -1)
        wires = []
        for entry_id, fields in entries:
            try:
                wires.append((entry_id, actions.sample_from_record(json.loads(fields["m"]))))
            except (KeyError, ValueError):  # not the runner contract: nothing to retry
                log.warning("skipping malformed entry %s of %s", entry_id, key)
        now = time.time()
        fresh = [w for _id, w in wires if (w.get("batch_id") or 0) > pushed
                 and (not first_sight or now - (w.get("written_at") or 0) < PUSH_MAX_AGE_S)]
        if fresh:
            await self.layer.group_send(actions.group_name(run_id),
                                        {"type": "run.metrics", "samples": fresh})
            self.forwarded += len(fresh)
        self.pushed[key] = max([pushed] + [w.get("batch_id") or 0 for _id, w in wires])
        await database_sync_to_async(actions.store_samples)(run_id, [w for _id, w in wires])
        self.cursors[key] = entries[-1][0]
        written = [w.get("written_at") for _id, w in wires if w.get("written_at")]
        if written:  # how long the newest sample took from the runner to the database
            await self.redis.hset(busmod.HEALTH_KEY, mapping={
                "relay_lag_s": round(max(0.0, time.time() - max(written)), 4),
                "relay_at": round(time.time(), 3)})

    async def _events(self, key: str, run_id: int, entries: list) -> None:
        """Apply each event in order; the read position passes an event once it is stored."""
        bus_key = key.split(":")[1]
        for entry_id, fields in entries:
            try:
                event = json.loads(fields["e"])
            except (KeyError, ValueError):  # not the runner contract: nothing to retry
                log.warning("skipping malformed entry %s of %s", entry_id, key)
                self.cursors[key] = entry_id
                continue
            # The runner's own sequence number names the event: the same event written
            # again after a Redis restart has another entry id but the same seq.
            source_id = f"seq:{event['seq']}" if "seq" in event else entry_id
            try:
                ended = await database_sync_to_async(apply_runner_event)(run_id, source_id,
                                                                         event)
            except Run.DoesNotExist:  # deleted while live: nothing to record it in
                ended = True
            self.cursors[key] = entry_id
            if ended:
                await self.redis.srem(busmod.LIVE_SET, bus_key)
                self.known.discard(bus_key)
                self.active.discard(bus_key)

    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.step()
            except Exception:
                log.exception("relay step failed; retrying in 1 s")
                await asyncio.sleep(1)
