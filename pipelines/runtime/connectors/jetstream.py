"""A NATS JetStream stream as a replayable source: offsets, reads, parsing, dead letters.

No Spark here (the Spark reader is ``query/jetstream_source.py``); the verifier, the
runner's clock and the feeder share it. The client is nats-py, the NATS maintainers'
asyncio client, run on an event loop thread of its own (:class:`JetStreamClient`) so
that Spark's synchronous reader calls can use it.

**Offsets.** JetStream numbers a stream's messages 1, 2, 3, ... as it stores them (the
*stream sequence*, docs.nats.io, "JetStream" / "Streams"); a consumer can start at any
of them (``DeliverPolicy.BY_START_SEQUENCE`` with ``opt_start_seq``, "Consumers"). The
source's offset is the number of sequences passed: a batch ``[start, end)`` reads the
messages with sequences ``start + 1 .. end`` (a deleted message leaves a gap, which the
read skips), so offset 0 is the stream's beginning and the newest offset is the
stream's ``last_seq``. A batch therefore reads the same messages again after a restart,
a migration or a re-plan, as long as the stream keeps them (limits-based retention;
:func:`first_offset` says what a stream still holds).

**Records.** A message's payload is a JSON object; the definition declares which keys
become which columns and their types. A payload that is not JSON, not an object, lacks
a declared key or holds a value of the wrong type is a *dead letter*: it is published
to the stream ``<stream>_DEAD_LETTER`` (subject ``streamwise.dead-letter.<stream>``)
with its raw bytes as the payload and the reason and source sequence in headers, and
with ``Nats-Msg-Id: <stream>:<seq>``: JetStream drops a message whose ID it has seen
within the stream's duplicate window ("Message deduplication"), which this module
sets to ``DEAD_LETTER_DEDUPE_S``; so a batch read twice adds each letter once. The
message's JetStream timestamp (when the server stored it) is the record's emission
time: latency runs from there to the sink's commit.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import nats
from nats.js import api
from nats.js.errors import NotFoundError

from pipelines.runtime.connectors.records import Parsed, convert, parse_object
from pipelines.runtime.spec import definition

__all__ = ["Parsed", "convert", "parse_object"]

DEAD_LETTER_SUFFIX = "_DEAD_LETTER"
DEAD_LETTER_SUBJECT = "streamwise.dead-letter."
# A dead letter met again within a day is recognised (JetStream's duplicate window):
# retries, restarts and a re-plan's second generation read a range within minutes.
DEAD_LETTER_DEDUPE_S = 86_400.0
FETCH = 1_000  # messages per pull request: bounded replies however large the batch
CALL_TIMEOUT_S = 120.0

T = TypeVar("T")


class JetStreamClient:
    """One NATS connection with its event loop on a daemon thread; :meth:`call` runs a
    coroutine there and waits for it (Spark calls the reader synchronously)."""

    def __init__(self, url: str) -> None:
        self.url = url
        _probe(url)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="jetstream-client")
        self.thread.start()
        # A server that does not answer fails the first connect at once (its error is
        # the caller's to report, not a traceback per retry on stderr); a connection
        # lost later is retried for about a minute before calls fail.
        self.nc = self.call(nats.connect(
            url, connect_timeout=5, allow_reconnect=True, max_reconnect_attempts=30,
            reconnect_time_wait=2, error_cb=_quiet, name="streamwise"), timeout=30)
        self.js = self.nc.jetstream(timeout=30)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.call(self.nc.close(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)


def _probe(url: str) -> None:
    """Fail at once, with the OS's reason, if nothing listens at the URL (nats-py's
    first connect goes on retrying a server that refuses)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222),
                                  timeout=5):
        pass


async def _quiet(_exc: Exception) -> None:
    pass


@lru_cache(maxsize=8)
def _connection(url: str, pid: int) -> JetStreamClient:
    return JetStreamClient(url)


def connection(url: str) -> JetStreamClient:
    """One client per URL and process (a forked Python worker makes its own: the loop
    thread does not survive a fork)."""
    return _connection(url, os.getpid())


@dataclass(frozen=True)
class JetStreamSource:
    """Where a ``jetstream`` source reads and what its records hold."""

    url: str
    stream: str
    fields: Mapping[str, str] = field(default_factory=lambda: {"key": "long",
                                                              "value": "double"})
    optional: frozenset[str] = frozenset()  # fields a record may lack (NEXMark events)

    @property
    def dead_letter_stream(self) -> str:
        return dead_letter_stream(self.stream)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> JetStreamSource:
        from pipelines.runtime import connectors

        fields, optional = definition.record_schema(dict(params))
        return cls(url=connectors.server_url(params), stream=str(params["stream"]),
                   fields=fields, optional=optional)


def dead_letter_stream(stream: str) -> str:
    return stream + DEAD_LETTER_SUFFIX


def stream_source(spec: definition.PipelineSpec) -> JetStreamSource:
    return JetStreamSource.from_params(spec.source_doc)


async def _state(client: JetStreamClient, stream: str) -> api.StreamState | None:
    try:
        return (await client.js.stream_info(stream)).state
    except NotFoundError:
        return None


def end_offset(client: JetStreamClient, stream: str) -> int:
    """The newest offset: the stream's last sequence (0 for an empty or absent one)."""
    state = client.call(_state(client, stream))
    return int(state.last_seq or 0) if state is not None else 0


def first_offset(client: JetStreamClient, stream: str) -> int | None:
    """The offset before the oldest message the stream still holds (None: empty)."""
    state = client.call(_state(client, stream))
    if state is None or not state.messages:
        return None
    return int(state.first_seq) - 1


def message_count(client: JetStreamClient, stream: str) -> int:
    state = client.call(_state(client, stream))
    return int(state.messages or 0) if state is not None else 0


@dataclass(frozen=True)
class Message:
    seq: int
    ts: float  # the server's timestamp, epoch seconds
    data: bytes


async def _read(client: JetStreamClient, stream: str, start: int, end: int
                ) -> list[Message]:
    js = client.js
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start + 1,
        ack_policy=api.AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True,
        num_replicas=1, name=client.nc._nuid.next().decode())
    info = await js.add_consumer(stream, config=config)
    sub = await js.pull_subscribe_bind(stream=stream, name=info.name)
    out: list[Message] = []
    last = start
    try:
        while last < end:
            try:
                msgs = await sub.fetch(min(end - last, FETCH), timeout=5)
            except nats.errors.TimeoutError:
                break  # nothing stored past ``last`` up to ``end`` (deleted)
            for m in msgs:
                meta = m.metadata
                seq = int(meta.sequence.stream)
                if seq > end:
                    last = end
                    break
                out.append(Message(seq, meta.timestamp.timestamp(), m.data))
                last = seq
    finally:
        await sub.unsubscribe()
        try:
            await js.delete_consumer(stream, info.name)
        except Exception:  # noqa: BLE001 - an ephemeral consumer ends by itself anyway
            pass
    return out


def read(client: JetStreamClient, stream: str, start: int, end: int) -> list[Message]:
    """The messages with offsets in ``[start, end)`` (sequences ``start+1 .. end``)."""
    if end <= start:
        return []
    return client.call(_read(client, stream, start, end))


def parse(messages: list[Message], fields: Mapping[str, str],
          into: Parsed | None = None, optional: Collection[str] = ()) -> Parsed:
    out = into if into is not None else Parsed()
    for name in fields:
        out.columns.setdefault(name, [])
    for m in messages:
        row, reason = parse_object(m.data, fields, optional)
        if row is None:
            out.dead.append((m.seq, m.data, str(reason)))
            continue
        out.seq.append(m.seq)
        out.emit_ts.append(m.ts)
        for name in fields:
            out.columns[name].append(row[name])
    return out


def read_range(source: JetStreamSource, start: int, end: int) -> Parsed:
    """Every message in ``[start, end)``, parsed (a batch's read; the verifier's)."""
    return parse(read(connection(source.url), source.stream, start, end), source.fields,
                 optional=source.optional)


async def _ensure_stream(client: JetStreamClient, name: str, subjects: list[str],
                         duplicate_window: float = 120.0) -> None:
    try:
        await client.js.stream_info(name)
    except NotFoundError:
        await client.js.add_stream(api.StreamConfig(
            name=name, subjects=subjects, storage=api.StorageType.FILE,
            duplicate_window=duplicate_window))


def ensure_stream(client: JetStreamClient, name: str, subjects: list[str]) -> None:
    """A stream of ``subjects``, made if absent (the feeder's, a test's)."""
    client.call(_ensure_stream(client, name, subjects))


async def _dead_letters(client: JetStreamClient, source: JetStreamSource,
                        dead: list[tuple[int, bytes, str]]) -> int:
    await _ensure_stream(client, source.dead_letter_stream,
                         [DEAD_LETTER_SUBJECT + source.stream], DEAD_LETTER_DEDUPE_S)
    added = 0
    for seq, raw, reason in dead:
        ack = await client.js.publish(
            DEAD_LETTER_SUBJECT + source.stream, raw, stream=source.dead_letter_stream,
            headers={"Nats-Msg-Id": f"{source.stream}:{seq}",
                     "Streamwise-Source-Seq": str(seq),
                     "Streamwise-Reason": reason.replace("\r", " ").replace("\n", " ")})
        added += 0 if ack.duplicate else 1
    return added


def write_dead_letters(client: JetStreamClient, source: JetStreamSource,
                       dead: list[tuple[int, bytes, str]]) -> int:
    """Publish each dead letter (raw payload; reason and source sequence in headers)
    unless it was published before; returns how many were new."""
    if not dead:
        return 0
    return client.call(_dead_letters(client, source, dead))


def dead_letter_count(client: JetStreamClient, source: JetStreamSource) -> int:
    return message_count(client, source.dead_letter_stream)


async def _dead_letter_messages(client: JetStreamClient, source: JetStreamSource
                                ) -> list[dict[str, Any]]:
    state = await _state(client, source.dead_letter_stream)
    if state is None or not state.messages:
        return []
    out = []
    for seq in range(int(state.first_seq), int(state.last_seq) + 1):
        try:
            m = await client.js.get_msg(source.dead_letter_stream, seq)
        except NotFoundError:
            continue
        headers = m.headers or {}
        out.append({"source_seq": int(headers.get("Streamwise-Source-Seq", 0)),
                    "reason": headers.get("Streamwise-Reason", ""), "raw": m.data})
    return out


def dead_letters(client: JetStreamClient, source: JetStreamSource) -> list[dict[str, Any]]:
    """The dead-letter stream's messages: source sequence, reason, raw payload."""
    return client.call(_dead_letter_messages(client, source))
