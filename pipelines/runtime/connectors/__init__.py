"""Sources outside the product (brokers, stores), without Spark: how their offsets map
to time, how to read a range again. The Spark readers are in ``query/`` (``source.py``'s
``DATA_SOURCES`` lists them); this package is what the runner, the verifier and the
feeder share.

``offset_clock(spec, t0)`` answers, for any source, what the runner asks of its input
in offsets: how far the input reaches by a time (is input waiting, how far behind is a
catching-up generation, what arrived during a re-plan) and the rate it is scheduled to
have. For the generator that is its rate schedule; for a broker it is the broker's own
clock and newest entry, and no schedule."""
from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


from pipelines.runtime.spec import definition


class OffsetClock(Protocol):
    def records_by(self, t: float) -> int:
        """The offset the input reaches ``t`` seconds after the run's start."""

    def rate_at(self, t: float) -> float | None:
        """The arrival rate the source is scheduled to have at ``t`` (modelled), or None
        where nothing schedules it (a broker: its measured input rate stands in)."""


# The connections this process may use: name -> {"kind", "url", "password"}. Filled by
# whoever starts the work from what it was given privately: the runner from its 0600
# runner.json, a Spark reader from its redacted ``secret`` option, the web app from its
# database (``pipelines.connections``). Never logged, never on a command line.
CONNECTIONS: dict[str, dict[str, str]] = {}


class ConnectionUnknown(LookupError):
    """A definition names a connection this process was not given."""


def register_connections(connections: dict[str, dict[str, str]] | None) -> None:
    CONNECTIONS.update(connections or {})


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` in its user part (redis://:pw@host, nats://user:pw@host,
    postgres://user:pw@host), percent-encoded."""
    from urllib.parse import quote, urlsplit, urlunsplit

    if not password:
        return url
    parts = urlsplit(url)
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def server_url(params: dict[str, Any]) -> str:
    """The URL a source's or sink's client connects to: its own ``url``, or its
    connection's URL with the connection's password."""
    name = params.get("connection")
    if not name:
        return str(params["url"])
    known = CONNECTIONS.get(str(name))
    if known is None:
        raise ConnectionUnknown(f"connection {name!r} was not given to this process")
    return with_password(known["url"], known.get("password", ""))


def connection_secret(params: dict[str, Any]) -> str | None:
    """The connection a source names, as the private option its Spark reader gets
    (JSON; Spark redacts options named like ``secret`` in its plans and UI)."""
    import json

    name = params.get("connection")
    if not name or name not in CONNECTIONS:
        return None
    return json.dumps({name: CONNECTIONS[name]})


def files_root() -> Path:
    """The folder under which a definition's relative paths (a files source's
    directory, a Parquet sink's) lie: ``STREAMWISE_FILES_ROOT``, else ``files/`` in the
    product's var folder. A definition cannot name a path outside it."""
    explicit = os.environ.get("STREAMWISE_FILES_ROOT")
    if explicit:
        return Path(explicit)
    var = os.environ.get("STREAMWISE_VAR")
    return (Path(var) if var else Path(__file__).resolve().parents[3] / "var") / "files"


# Every sink a definition may name besides the latency sink: its ``sink.type`` -> the
# class that writes it (module:class, with ``for_run(params, t0, key_columns)`` and
# ``writer()``: the function the run's sink calls with each batch's rows and epoch).
SINKS: dict[str, str] = {
    "postgres": "pipelines.runtime.connectors.postgres_sink:PostgresSink",
    "parquet": "pipelines.runtime.connectors.parquet_sink:ParquetSink",
    "redis_stream": "pipelines.runtime.connectors.redis_sink:RedisStreamSink",
}


def sink_for_run(spec: definition.PipelineSpec, t0: float) -> Any | None:
    """The run's own sink (``SINKS``), or None for the latency sink alone. A keyed
    aggregate's update-mode output is upserted by key."""
    kind = spec.sink.get("type")
    if kind not in SINKS:
        return None
    import importlib

    module, _, name = SINKS[kind].partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls.for_run(spec.sink, t0, key_columns=spec.sink_key_columns)


SOURCE_START_FILE = "source-start.json"


def start_offset(spec: definition.PipelineSpec) -> int:
    """The offset a run's first batch starts from (0 but for a pinned ``latest``)."""
    return int(spec.source_doc.get("start_offset", 0))


def pin_start(spec: definition.PipelineSpec, run_dir: Path, create: bool = True
              ) -> definition.PipelineSpec:
    """A ``latest`` source's start pinned for the run: the stream's end offset when the
    run first started, kept in the run's folder (``SOURCE_START_FILE``) and read from
    there on every later start and by the verifier. Other definitions unchanged."""
    import json

    source = spec.source_doc
    if source.get("start") != "latest" or "start_offset" in source:
        return spec
    path = run_dir / SOURCE_START_FILE
    try:
        offset = int(json.loads(path.read_text())["offset"])
    except FileNotFoundError:
        if not create:
            return spec
        pinned: dict[str, Any] = {"pinned_at": time.time()}
        if spec.source_type == "redis_stream":
            # With the entries the stream was given by then: how many of the run's
            # the stream has trimmed since can be told (``trimmed_from_run``).
            from pipelines.runtime.connectors import redis_stream as rs

            rsource = rs.stream_source(spec)
            offset, pinned["entries_added"] = rs.arrivals(rs.connection(rsource.url),
                                                          rsource.stream)
        else:
            access = source_access(spec)
            assert access is not None  # (a latest start is a broker's)
            offset = access.end_offset()
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"offset": offset, **pinned}))
        tmp.replace(path)
    return definition.with_source_doc(spec, {**source, "start_offset": offset})


def trimmed_from_run(spec: definition.PipelineSpec, run_dir: Path) -> int:
    """How many of the entries a run read (or has still to read) its Redis stream no
    longer holds: trimmed (a feeder's ``--maxlen``, an XTRIM) since the run pinned its
    start. A stream only ever loses its oldest entries, so those trimmed beyond the
    entries it was given before the run are the run's. 0 where that cannot be told (a
    run from the stream's start, a Redis before 7)."""
    import json

    if spec.source_type != "redis_stream":
        return 0
    try:
        before = json.loads((run_dir / SOURCE_START_FILE).read_text()).get("entries_added")
    except (OSError, ValueError):
        return 0
    if before is None:
        return 0
    from pipelines.runtime.connectors import redis_stream as rs

    rsource = rs.stream_source(spec)
    gone = rs.trimmed(rs.connection(rsource.url), rsource.stream)
    return 0 if gone is None else max(0, gone - int(before))


@dataclass(frozen=True)
class SourceAccess:
    """What the runner reads of a source outside Spark: its newest offset and its dead
    letters so far."""

    end_offset: Callable[[], int]
    dead_letters: Callable[[], int]


def source_access(spec: definition.PipelineSpec) -> SourceAccess | None:
    """How to read a broker or folder source's newest offset and dead-letter count (None
    for the product's own generators)."""
    kind = spec.source_type
    if kind == "redis_stream":
        from pipelines.runtime.connectors import redis_stream as rs

        rsource = rs.stream_source(spec)
        return SourceAccess(
            lambda: rs.end_offset(rs.connection(rsource.url), rsource.stream),
            lambda: rs.dead_letter_count(rs.connection(rsource.url), rsource))
    if kind == "jetstream":
        from pipelines.runtime.connectors import jetstream as jsc

        jsource = jsc.stream_source(spec)
        return SourceAccess(
            lambda: jsc.end_offset(jsc.connection(jsource.url), jsource.stream),
            lambda: jsc.dead_letter_count(jsc.connection(jsource.url), jsource))
    if kind == "files":
        from pipelines.runtime.connectors import files

        fsource = files.files_source(spec)
        return SourceAccess(lambda: files.end_offset(fsource),
                            lambda: files.dead_letter_count(fsource))
    return None


class BrokerClock:
    """A broker's input by a time: its newest offset, asked for at most every
    ``REFRESH_S``, and what it was at earlier times (the ends seen, kept for
    ``HISTORY_S``), so that "how much arrived in the last few seconds" has an answer
    where the offsets carry no time (a JetStream sequence, a folder's files)."""

    REFRESH_S = 0.2
    HISTORY_S = 600.0

    def __init__(self, read_end: Callable[[], int], t0: float | Callable[[], float]
                 ) -> None:
        self._read_end = read_end
        # The run's start, or how to read it (a runner learns it after its metrics exist).
        self._t0 = t0
        self._seen: list[tuple[float, int]] = []  # (epoch seconds, newest end), in order

    @property
    def t0(self) -> float:
        return self._t0() if callable(self._t0) else self._t0

    def _newest_end(self) -> int:
        now = time.time()
        if not self._seen or now - self._seen[-1][0] > self.REFRESH_S:
            self._seen.append((now, self._read_end()))
            if self._seen[0][0] < now - self.HISTORY_S:
                del self._seen[:bisect.bisect_left(self._seen, (now - self.HISTORY_S,))]
        return self._seen[-1][1]

    def records_by(self, t: float) -> int:
        newest = self._newest_end()
        at = self.t0 + t
        if at >= self._seen[-1][0] - self.REFRESH_S:
            return newest
        i = bisect.bisect_right(self._seen, (at, float("inf")))
        return self._seen[max(0, i - 1)][1]

    def rate_at(self, t: float) -> float | None:
        return None


class RedisStreamClock(BrokerClock):
    """A Redis stream's offsets are packed entry IDs, which carry the server's clock:
    the input by ``t`` is the entry IDs up to that millisecond, but no further than the
    stream's newest entry (an idle stream has no input waiting)."""

    def records_by(self, t: float) -> int:
        from pipelines.runtime.connectors.redis_stream import SEQ_BITS

        ms = max(0, int((self.t0 + t) * 1000))
        return min(ms << SEQ_BITS, self._newest_end())


def dead_letter_counter(spec: definition.PipelineSpec) -> Callable[[], int | None] | None:
    """A function that counts the run's dead letters so far (None for a source that
    has none: the generator's records always convert)."""
    access = source_access(spec)
    if access is None:
        return None

    def count() -> int | None:
        try:
            return access.dead_letters()
        except Exception:  # noqa: BLE001 - a count missing for a batch, not a failed run
            return None

    return count


def offset_clock(spec: definition.PipelineSpec, t0: float | Callable[[], float]
                 ) -> OffsetClock:
    """The input's reach in the run's offsets, and its scheduled rate (module docstring):
    a broker's or folder's own clock (a Redis stream's IDs carry time; a JetStream
    sequence or a folder's files do not), else the generator's schedule."""
    access = source_access(spec)
    if access is None:
        return spec.schedule()
    clock = RedisStreamClock if spec.source_type == "redis_stream" else BrokerClock
    return clock(access.end_offset, t0)


def latest_rows(df: Any, key_columns: tuple[str, ...]) -> Any:
    """Each key's row from the highest epoch that holds it (update mode's current
    value), or every row when the sink appends (a sink's rows as a pandas DataFrame
    with their ``epoch``)."""
    if df.empty or not key_columns:
        return df
    return (df.sort_values("epoch", kind="stable")
            .drop_duplicates(list(key_columns), keep="last")
            .reset_index(drop=True))
