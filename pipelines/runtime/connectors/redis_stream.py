"""A Redis stream as a replayable source: offsets, reads, parsing and dead letters.

No Spark here (the Spark reader is ``query/broker_source.py``); the verifier, the feeder
and the reader share it.

**Offsets.** A stream entry's ID is ``<ms>-<seq>`` (milliseconds of the server's clock
when it was added, then a sequence within that millisecond), and IDs only grow: Redis
refuses an XADD whose ID is not above the stream's last one (redis.io, "Redis Streams",
"Entry IDs"). The source's offset is the ID packed into one integer,
``ms * 2**SEQ_BITS + seq`` (:func:`pack`), so the offset order is the stream's order and
everything the product does with offsets (the batches' planned ends that two query
generations agree on, a re-plan's start, the verifier's ranges, Spark's offset log
``{"offset": n}``) works on a stream unchanged. A batch reads the entries with packed
IDs in ``[start, end)``: ``XRANGE key <unpack(start)> <unpack(end - 1)>``, inclusive
on both ends (redis.io, XRANGE), so it reads the same entries again after a restart,
a migration or a re-plan, as long as the stream still holds them (a stream trimmed
past a checkpoint's offset cannot be replayed; :func:`first_offset` tells).

**Records.** An entry's fields are byte strings; the definition declares which field
becomes which column and its type (``FIELD_TYPES``). An entry that lacks a declared
field or whose value does not parse is a *dead letter*: it goes to the stream
``<stream>:dead-letter`` with its raw fields, the reason and its source ID, once: a
script adds it only if its source ID is new to the set ``<stream>:dead-letter:ids``, in
one step on the server, so a batch read twice (a retried task, a restart, a re-plan's
second generation) or two tasks writing in any order add each letter once. The record's
broker timestamp, the ID's milliseconds, is its emission time: latency runs from there
to the sink's commit.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import redis

from pipelines.runtime.connectors.records import Parsed, convert_text
from pipelines.runtime.spec import definition

__all__ = ["Parsed"]

SEQ_BITS = 20  # entries within one millisecond: XADD * makes far fewer than a million
SEQ_MASK = (1 << SEQ_BITS) - 1
# ms < 2**43 (year 2248) keeps a packed ID inside a signed 64-bit long (Spark's LongType).
MAX_MS = (1 << 43) - 1
FIELD_TYPES = ("long", "double", "string")
DEAD_LETTER_SUFFIX = ":dead-letter"
PAGE = 10_000  # entries per XRANGE call: a bounded reply however large the batch


class StreamIdError(ValueError):
    """An entry ID this source cannot pack (a sequence past SEQ_BITS, a time past 2248)."""


def pack(entry_id: bytes | str) -> int:
    """The offset of the entry with this ID (``b"1700000000000-3"`` -> an int)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms_text, _, seq_text = text.partition("-")
    ms, seq = int(ms_text), int(seq_text or 0)
    if not (0 <= ms <= MAX_MS and 0 <= seq <= SEQ_MASK):
        raise StreamIdError(f"entry ID {text} is outside what a packed offset holds "
                            f"(ms <= {MAX_MS}, seq <= {SEQ_MASK})")
    return (ms << SEQ_BITS) | seq


def unpack(offset: int) -> str:
    """The entry ID an offset names (the inverse of :func:`pack`)."""
    return f"{offset >> SEQ_BITS}-{offset & SEQ_MASK}"


def emit_seconds(offset: int) -> float:
    """The broker's timestamp of the entry at ``offset``: its ID's milliseconds."""
    return (offset >> SEQ_BITS) / 1000.0


@dataclass(frozen=True)
class StreamSource:
    """Where a ``redis_stream`` source reads and what its records hold."""

    url: str
    stream: str
    fields: Mapping[str, str] = field(default_factory=lambda: {"key": "long",
                                                              "value": "double"})
    start: str = "earliest"  # or "latest": where a new run's first batch starts
    optional: frozenset[str] = frozenset()  # fields a record may lack (NEXMark events)

    @property
    def dead_letter_stream(self) -> str:
        return dead_letter_stream(self.stream)

    @property
    def dead_letter_ids(self) -> str:
        """The set of the source IDs already in the dead-letter stream."""
        return self.dead_letter_stream + ":ids"

    def connect(self) -> redis.Redis:
        """A client of its own (``connection`` shares one per URL)."""
        return redis.Redis.from_url(self.url, socket_timeout=30, socket_connect_timeout=10)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> StreamSource:
        from pipelines.runtime import connectors

        fields, optional = definition.record_schema(dict(params))
        return cls(url=connectors.server_url(params), stream=str(params["stream"]),
                   fields=fields, start=str(params.get("start", "earliest")),
                   optional=optional)


def dead_letter_stream(stream: str) -> str:
    """Where the entries of ``stream`` that do not convert go."""
    return stream + DEAD_LETTER_SUFFIX


def stream_source(spec: definition.PipelineSpec) -> StreamSource:
    """The ``redis_stream`` source of a definition."""
    return StreamSource.from_params(spec.source_doc)


@lru_cache(maxsize=8)
def connection(url: str) -> redis.Redis:
    """One client per URL and process (a Python worker reads batch after batch, the
    runner and the verifier ask again and again; redis-py's clients are thread-safe)."""
    return StreamSource(url=url, stream="").connect()


def end_offset(r: redis.Redis, stream: str) -> int:
    """One past the newest entry's offset (0 for a stream that is empty or absent)."""
    newest = r.xrevrange(stream, count=1)
    return pack(newest[0][0]) + 1 if newest else 0


def arrivals(r: redis.Redis, stream: str) -> tuple[int, int | None]:
    """The end offset and how many entries the stream was ever given (XINFO STREAM's
    ``entries-added``, Redis 7; None before), read in one transaction. A packed ID
    counts milliseconds, not entries: the control loop's arrival rate is the growth of
    the second."""
    pipe = r.pipeline(transaction=True)
    pipe.xrevrange(stream, count=1)
    pipe.xinfo_stream(stream)
    try:
        newest, info = pipe.execute()
    except redis.ResponseError:  # no such stream yet
        return 0, 0
    added = info.get("entries-added", info.get(b"entries-added"))
    return (pack(newest[0][0]) + 1 if newest else 0,
            int(added) if added is not None else None)


def trimmed(r: redis.Redis, stream: str) -> int | None:
    """How many of the entries the stream was ever given it no longer holds (trimmed or
    deleted), from one XINFO STREAM reply; None before Redis 7 (no ``entries-added``)."""
    try:
        info = r.xinfo_stream(stream)
    except redis.ResponseError:  # no such stream
        return 0
    added = info.get("entries-added", info.get(b"entries-added"))
    length = info.get("length", info.get(b"length"))
    return None if added is None else int(added) - int(length)


def first_offset(r: redis.Redis, stream: str) -> int | None:
    """The oldest entry's offset still in the stream (None when it is empty)."""
    oldest = r.xrange(stream, count=1)
    return pack(oldest[0][0]) if oldest else None


def end_after(r: redis.Redis, stream: str, begin: int, most: int, available: int) -> int:
    """The end of a batch that starts at ``begin`` and reads at most ``most`` entries,
    not past ``available``: one past the ``most``-th entry from ``begin``."""
    if begin >= available:
        return begin
    entries = r.xrange(stream, min=unpack(begin), max=unpack(available - 1), count=most)
    if len(entries) < most:
        return available
    return pack(entries[-1][0]) + 1


def split(start: int, end: int, parts: int, r: redis.Redis | None = None,
          stream: str | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` in ``parts`` ranges of about equal time (packed IDs grow with the
    broker's clock, so equal ID ranges hold equal shares of a steady stream)."""
    parts = max(1, min(parts, end - start))
    bounds = [start + (end - start) * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def entries(r: redis.Redis, stream: str, start: int, end: int
            ) -> Iterator[list[tuple[bytes, dict[bytes, bytes]]]]:
    """The entries with offsets in ``[start, end)``, a page at a time."""
    lo = start
    while lo < end:
        page = r.xrange(stream, min=unpack(lo), max=unpack(end - 1), count=PAGE)
        if not page:
            return
        yield page
        if len(page) < PAGE:
            return
        lo = pack(page[-1][0]) + 1


def _convert(raw: bytes, kind: str) -> Any:
    return convert_text(raw.decode("utf-8"), kind)


def parse(page: list[tuple[bytes, dict[bytes, bytes]]], fields: Mapping[str, str],
          into: Parsed | None = None, optional: Collection[str] = ()) -> Parsed:
    """Each entry's declared fields converted to their types; an entry that misses one
    (but an ``optional`` one: None) or whose value does not convert is a dead letter
    with the reason."""
    out = into if into is not None else Parsed()
    for name in fields:
        out.columns.setdefault(name, [])
    encoded = {name: name.encode() for name in fields}
    for entry_id, raw in page:
        row = {}
        reason = None
        for name, kind in fields.items():
            value = raw.get(encoded[name])
            if value is None:
                if name in optional:
                    row[name] = None
                    continue
                reason = f"no field {name!r}"
                break
            try:
                row[name] = _convert(value, kind)
            except (ValueError, UnicodeDecodeError) as exc:
                reason = f"field {name!r} is not a {kind}: {str(exc)[:120]}"
                break
        if reason is not None:
            out.dead.append((entry_id, raw, reason))
            continue
        offset = pack(entry_id)
        out.seq.append(offset)
        out.emit_ts.append(emit_seconds(offset))
        for name in fields:
            out.columns[name].append(row[name])
    return out


def read_range(source: StreamSource, start: int, end: int,
               r: redis.Redis | None = None) -> Parsed:
    """Every entry in ``[start, end)``, parsed (what a batch reads, what the verifier
    reads again)."""
    conn = r or connection(source.url)
    parsed = Parsed()
    for page in entries(conn, source.stream, start, end):
        parse(page, source.fields, parsed, source.optional)
    return parsed


# KEYS: the dead-letter stream, its set of source IDs; ARGV: the source ID, then field,
# value pairs. Adds the letter only for a source ID the set did not hold (atomic: a
# script runs alone on the server).
_ADD_ONCE = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
return 1
"""


def write_dead_letters(r: redis.Redis, source: StreamSource,
                       dead: list[tuple[bytes, dict[bytes, bytes], str]]) -> int:
    """Add each dead letter to the dead-letter stream (its raw fields as ``raw:<name>``,
    ``reason``, ``source_id``) unless a read before added it; returns how many were new."""
    add_once = r.register_script(_ADD_ONCE)
    keys = [source.dead_letter_stream, source.dead_letter_ids]
    added = 0
    for entry_id, raw, reason in dead:
        args: list[Any] = [entry_id, b"source_id", entry_id, b"reason", reason.encode()]
        for k, v in raw.items():
            args += [b"raw:" + k, v]
        added += int(add_once(keys=keys, args=args))
    return added


def dead_letter_count(r: redis.Redis, source: StreamSource) -> int:
    return int(r.xlen(source.dead_letter_stream))


def as_arrays(parsed: Parsed, fields: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Columns as numpy arrays (``seq``, ``emit_ts`` and the declared fields)."""
    dtype = {"long": np.int64, "double": np.float64, "string": object}
    out = {"seq": np.asarray(parsed.seq, dtype=np.int64),
           "emit_ts": np.asarray(parsed.emit_ts, dtype=np.float64)}
    for name, kind in fields.items():
        out[name] = np.asarray(parsed.columns.get(name, []), dtype=dtype[kind])
    return out
