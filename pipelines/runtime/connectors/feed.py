"""Drive a real broker with the product's workloads: ``python -m pipelines.feed redis|jetstream ...``.

Publishes the keyed workload (the generator's records: keys from a distribution, values
in [0, 1000)) or, with ``--events nexmark``, Beam's NEXMark events (person, auction and
bid, ``pipelines.nexmark.generator``; each event's ``dateTime`` its scheduled emission
time) at any of the rate shapes (constant, step, sine, random walk, trace):

* ``redis``: into a Redis stream, each record an entry with the fields ``key`` and
  ``value`` (an event: its own fields, ``type``, ``id`` ... ``dateTime``), added with
  ``XADD <stream> *``;
* ``jetstream``: into a NATS JetStream stream (made if absent, subject ``--subject``,
  default the stream's name), each record a JSON object ``{"key": .., "value": ..}``
  (an event: its fields as one object).

Either way the broker stamps each record, and that stamp is where its latency starts.
``--malformed F`` makes a fraction F of the records bad, in turn: a missing ``value``, a
``value`` that is not a number, and a key that is not UTF-8 (Redis) or a payload that is
not JSON (JetStream); for events a missing ``dateTime``, a ``dateTime`` that is not a
number, a ``type`` not UTF-8 / a payload cut short: what the dead-letter place is for. A progress line every few
seconds says how far it is.

    python -m pipelines.feed redis --url redis://127.0.0.1:6379/0 --stream orders \\
        --rate '{"kind": "constant", "records_per_s": 800}' \\
        --keys '{"kind": "zipf", "n": 200, "s": 1.1}' --seconds 60
    python -m pipelines.feed jetstream --url nats://127.0.0.1:4222 --stream ORDERS ...
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import redis

from control import workload
from pipelines.runtime.bus import public_url
from pipelines.runtime.spec import definition

MALFORMED_KINDS = ("missing value", "value not a number", "key not utf-8 / not JSON")
BATCH_S = 0.05  # publish what is due every 50 ms, in one round trip


@dataclass(frozen=True)
class Feed:
    """What to publish: the generator's workload (seed, rate, keys) for ``seconds``
    seconds or ``records`` records, whichever ends first (0: no limit), and the share
    of entries made malformed on purpose."""

    seed: int
    rate: dict
    keys: dict
    seconds: float = 0.0
    records: int = 0
    malformed: float = 0.0
    events: str = "keyed"  # or "nexmark": Beam's NEXMark events

    def spec(self) -> definition.PipelineSpec:
        """The workload as a generator's definition validates it (its schedule and keys);
        DefinitionError names the field (``source.rate`` ...)."""
        return definition.validate({
            "source": {"type": "generator", "seed": self.seed, "partitions": 1,
                       "rate": self.rate, "keys": self.keys},
            "operators": [{"type": "keyed_aggregate"}]})


def malformed_kind(seed: int, index: np.ndarray, share: float) -> np.ndarray:
    """-1 for a good record, else which of MALFORMED_KINDS record ``index`` is: a pure
    function of (seed, index), so a test knows which entries are bad."""
    if share <= 0:
        return np.full(len(index), -1, dtype=np.int64)
    u = workload.unit_interval(workload.splitmix64(index.astype(np.uint64), 0x626164, seed))
    bad = u < share
    return np.where(bad, index % len(MALFORMED_KINDS), -1)


EVENTS = ("keyed", "nexmark")


@dataclass(frozen=True)
class Events:
    """NEXMark events ``seq[0]..`` as the generator makes them (``dateTime``: each
    one's scheduled emission time, epoch ms)."""

    seq: np.ndarray
    events: list[dict[str, Any]]


Batch = workload.Records | Events


def nexmark_batch(feed: Feed, schedule: workload.RateSchedule, start: int, end: int,
                  t0: float) -> Events:
    """Events ``[start, end)`` of the feed: Beam's event ``n`` stamped with its
    scheduled time; auction lengths drawn at the schedule's starting rate."""
    import math

    from pipelines.nexmark import generator as gen

    config = gen.NexmarkConfig.at_rate(max(1, round(schedule.rate_at(0.0))))
    seq = np.arange(start, end, dtype=np.int64)
    emit = schedule.emission_times(seq) + t0
    return Events(seq, [gen.event(int(n), config, timestamp_ms=math.floor(float(t) * 1000.0))
                        for n, t in zip(seq, emit)])


def _bad_event(event: dict[str, Any], kind: int) -> dict[str, Any]:
    """An event made malformed (``malformed_kind``): no dateTime, a dateTime that is no
    number; kind 2 is the publisher's (bytes that are not UTF-8 / not JSON)."""
    event = dict(event)
    if kind == 0:
        del event["dateTime"]
    elif kind == 1:
        event["dateTime"] = "not-a-number"
    return event


def entries_for(feed: Feed, recs: Batch) -> list[dict[bytes, bytes]]:
    kinds = malformed_kind(feed.seed, recs.seq, feed.malformed)
    if isinstance(recs, Events):
        out = []
        for event, kind in zip(recs.events, kinds.tolist()):
            entry = {k.encode(): str(v).encode() for k, v in _bad_event(event, kind).items()}
            if kind == 2:
                entry[b"type"] = b"\xff\xfe" + entry[b"type"]
            out.append(entry)
        return out
    out = []
    for key, value, kind in zip(recs.key.tolist(), recs.value.tolist(), kinds.tolist()):
        entry = {b"key": str(key).encode(), b"value": repr(value).encode()}
        if kind == 0:
            del entry[b"value"]
        elif kind == 1:
            entry[b"value"] = b"not-a-number"
        elif kind == 2:
            entry[b"key"] = b"\xff\xfe" + entry[b"key"]
        out.append(entry)
    return out


def messages_for(feed: Feed, recs: Batch) -> list[bytes]:
    """The records as JSON payloads, the malformed ones made bad as ``entries_for``
    does (the third kind: a payload cut short, not JSON)."""
    kinds = malformed_kind(feed.seed, recs.seq, feed.malformed)
    if isinstance(recs, Events):
        return [json.dumps(_bad_event(event, kind)).encode()[:None if kind != 2 else 20]
                for event, kind in zip(recs.events, kinds.tolist())]
    out = []
    for key, value, kind in zip(recs.key.tolist(), recs.value.tolist(), kinds.tolist()):
        if kind == 0:
            out.append(b'{"key": %d}' % key)
        elif kind == 1:
            out.append(b'{"key": %d, "value": "not-a-number"}' % key)
        elif kind == 2:
            out.append(b'{"key": %d, "value": ' % key)
        else:
            out.append(json.dumps({"key": key, "value": value}).encode())
    return out


class Publisher(Protocol):
    def send(self, feed: Feed, recs: Batch) -> None: ...

    def held(self) -> int:
        """How many records the stream holds now."""

    def close(self) -> None:
        """Send what is buffered (the last file)."""


class RedisPublisher:
    """``maxlen``: keep about that many entries (``XADD … MAXLEN ~``), for a feeder that
    runs for ever; a run that falls further behind than that loses what was trimmed."""

    def __init__(self, r: redis.Redis, stream: str, maxlen: int = 0) -> None:
        self.r, self.stream, self.maxlen = r, stream, maxlen

    def send(self, feed: Feed, recs: Batch) -> None:
        pipe = self.r.pipeline(transaction=False)
        for entry in entries_for(feed, recs):
            pipe.xadd(self.stream, entry, maxlen=self.maxlen or None, approximate=True)
        pipe.execute()

    def held(self) -> int:
        return int(self.r.xlen(self.stream))

    def close(self) -> None:
        pass


class JetStreamPublisher:
    """Publishes asynchronously and waits for every acknowledgement before the next
    round (JetStream acknowledges each stored message)."""

    def __init__(self, url: str, stream: str, subject: str | None = None) -> None:
        from pipelines.runtime.connectors import jetstream as jsc

        self.jsc = jsc
        self.client = jsc.connection(url)
        self.stream, self.subject = stream, subject or stream
        jsc.ensure_stream(self.client, stream, [self.subject])

    def send(self, feed: Feed, recs: Batch) -> None:
        js, subject, stream = self.client.js, self.subject, self.stream

        async def send_all(payloads: list[bytes]) -> None:
            for payload in payloads:
                await js.publish_async(subject, payload, stream=stream)
            await js.publish_async_completed()

        self.client.call(send_all(messages_for(feed, recs)))

    def held(self) -> int:
        return self.jsc.message_count(self.client, self.stream)

    def close(self) -> None:
        pass


def csv_rows_for(feed: Feed, recs: workload.Records) -> list[str]:
    """The records as CSV rows under a ``key,value`` header, the malformed ones made bad:
    a row without its value cell, a value that is not a number, a key that is not an
    integer."""
    kinds = malformed_kind(feed.seed, recs.seq, feed.malformed)
    out = []
    for key, value, kind in zip(recs.key.tolist(), recs.value.tolist(), kinds.tolist()):
        out.append({0: f"{key}", 1: f"{key},not-a-number", 2: f"x{key},{value!r}"}
                   .get(kind, f"{key},{value!r}"))
    return out


class FilesPublisher:
    """Writes a file every ``file_s`` seconds into a folder under the files root (JSON
    Lines, CSV or Parquet), each written beside it and renamed in, so a reader never
    sees half a file. A Parquet file's columns are typed: its malformed records are
    left out (a typed column cannot hold a bad value)."""

    def __init__(self, path: str, fmt: str = "jsonl", file_s: float = 1.0) -> None:
        from pipelines.runtime import connectors

        self.directory = connectors.files_root() / path
        self.directory.mkdir(parents=True, exist_ok=True)
        self.format, self.file_s = fmt, file_s
        self.pending: list[tuple[Feed, workload.Records]] = []
        self.since = time.time()
        self.written = 0
        self.records = 0

    def send(self, feed: Feed, recs: workload.Records) -> None:
        self.pending.append((feed, recs))
        if time.time() - self.since >= self.file_s:
            self.close()

    def close(self) -> None:
        if not self.pending:
            return
        import os

        name = f"part-{time.time_ns()}-{self.written:06d}.{self.format}"
        tmp = self.directory / f".{name}.tmp"
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            keys, values = [], []
            for feed, recs in self.pending:
                good = malformed_kind(feed.seed, recs.seq, feed.malformed) < 0
                keys += recs.key[good].tolist()
                values += recs.value[good].tolist()
            pq.write_table(pa.table({"key": pa.array(keys, pa.int64()),
                                     "value": pa.array(values, pa.float64())}), tmp)
            self.records += len(keys)
        else:
            lines = ["key,value"] if self.format == "csv" else []
            for feed, recs in self.pending:
                lines += (csv_rows_for(feed, recs) if self.format == "csv"
                          else [m.decode() for m in messages_for(feed, recs)])
                self.records += len(recs.seq)
            tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.directory / name)
        self.written += 1
        self.pending = []
        self.since = time.time()

    def held(self) -> int:
        return self.records


# Every broker the feeder drives: its name -> how to make its publisher from the
# command line's arguments.
PUBLISHERS: dict[str, Callable[[argparse.Namespace], Publisher]] = {
    "redis": lambda a: RedisPublisher(redis.Redis.from_url(a.url), a.stream, a.maxlen),
    "jetstream": lambda a: JetStreamPublisher(a.url, a.stream, a.subject),
    "files": lambda a: FilesPublisher(a.path, a.format, a.file_seconds),
}
DEFAULT_URLS = {"redis": "redis://127.0.0.1:6379/0", "jetstream": "nats://127.0.0.1:4222"}


def publish(publisher: Publisher, stream: str, feed: Feed,
            say: Callable[[str], None] = print, progress_every_s: float = 5.0,
            clock: Callable[[], float] = time.time,
            stop: Callable[[], bool] = lambda: False) -> int:
    """Publish ``feed`` on its schedule, until it is done or ``stop()``; returns the
    records sent."""
    spec = feed.spec()
    schedule, keys = spec.schedule(), spec.key_distribution()
    t0 = clock()
    sent = 0
    said = t0
    while True:
        now = clock() - t0
        due = schedule.records_by(now)
        if feed.records:
            due = min(due, feed.records)
        if due > sent:
            publisher.send(feed, nexmark_batch(feed, schedule, sent, due, t0)
                           if feed.events == "nexmark" else
                           workload.generate(feed.seed, sent, due, schedule, keys, t0))
            sent = due
        done = ((feed.records and sent >= feed.records)
                or (feed.seconds and now >= feed.seconds) or stop())
        if done:
            publisher.close()
        if clock() - said >= progress_every_s or done:
            said = clock()
            say(f"feed: {sent:,} records in {now:,.1f} s "
                f"({sent / max(now, 1e-9):,.0f}/s), stream {stream} holds "
                f"{publisher.held():,}")
        if done:
            return sent
        time.sleep(BATCH_S)


def publish_redis(r: redis.Redis, stream: str, feed: Feed, **kwargs: Any) -> int:
    """``publish`` into a Redis stream."""
    return publish(RedisPublisher(r, stream), stream, feed, **kwargs)


def _json_arg(text: str, what: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--{what}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SystemExit(f"--{what}: must be a JSON object")
    return doc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.feed",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="broker", required=True)
    for broker, help_text in (("redis", "into a Redis stream (XADD)"),
                              ("jetstream", "into a NATS JetStream stream (JSON payloads)"),
                              ("files", "files into a folder under the files root")):
        p = sub.add_parser(broker, help=help_text)
        if broker == "files":
            p.add_argument("--path", required=True,
                           help="the folder, relative to the files root (as a definition's "
                           "source.path)")
            p.add_argument("--format", choices=definition.FILE_FORMATS, default="jsonl")
            p.add_argument("--file-seconds", type=float, default=1.0,
                           help="a file every so many seconds")
        else:
            p.add_argument("--url", default=DEFAULT_URLS[broker])
            p.add_argument("--stream", required=True)
        if broker == "redis":
            p.add_argument("--maxlen", type=int, default=0,
                           help="keep about this many entries (0: all)")
        if broker == "jetstream":
            p.add_argument("--subject", default=None,
                           help="the subject to publish on (default: the stream's name)")
        if broker != "files":
            p.add_argument("--events", choices=EVENTS, default="keyed",
                           help="what to publish: the keyed workload (key, value) or "
                           "NEXMark events (a definition's \"events\": \"nexmark\")")
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--rate", default='{"kind": "constant", "records_per_s": 1000}',
                       help="a rate shape as in a definition's source.rate (JSON)")
        p.add_argument("--keys", default='{"kind": "uniform", "n": 1000}',
                       help="a key distribution as in a definition's source.keys (JSON)")
        p.add_argument("--seconds", type=float, default=0.0, help="stop after (0: never)")
        p.add_argument("--records", type=int, default=0, help="stop after (0: never)")
        p.add_argument("--malformed", type=float, default=0.0,
                       help="share of records made bad on purpose, 0..1")
        p.add_argument("--repeat", action="store_true",
                       help="publish the --seconds of the rate shape again and again")
        if broker != "files":
            p.add_argument("--password-env", default=None, metavar="VAR",
                           help="the server's password is in this environment variable "
                           "(never on the command line)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.repeat and not args.seconds:
        parser.error("--repeat needs --seconds (the length of one repetition)")
    if getattr(args, "password_env", None):
        import os

        from pipelines.runtime import connectors

        if args.password_env not in os.environ:
            parser.error(f"--password-env: {args.password_env} is not set")
        args.url = connectors.with_password(args.url, os.environ[args.password_env])
    if args.broker == "files" and not definition.RELATIVE_PATH.match(args.path):
        parser.error("--path must be a relative folder (under the files root) without ..")
    if not 0 <= args.malformed <= 1:
        parser.error("--malformed must be between 0 and 1")
    feed = Feed(seed=args.seed, rate=_json_arg(args.rate, "rate"),
                keys=_json_arg(args.keys, "keys"), seconds=args.seconds,
                records=args.records, malformed=args.malformed,
                events=getattr(args, "events", "keyed"))
    try:
        feed.spec()
    except definition.DefinitionError as exc:
        parser.error(str(exc).replace("source.", "--", 1))
    try:
        publisher = PUBLISHERS[args.broker](args)
        publisher.held()
    except Exception as exc:  # noqa: BLE001 - any client's failure to reach its server
        where = args.path if args.broker == "files" else public_url(args.url)
        print(f"feed: cannot reach {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        while True:
            try:
                publish(publisher, getattr(args, "stream", None) or args.path, feed,
                        say=lambda m: print(m, flush=True))
            except Exception as exc:  # noqa: BLE001 - a server gone for a while
                if not args.repeat:
                    raise
                print(f"feed: {type(exc).__name__}: {exc}; again in 2 s", flush=True)
                time.sleep(2)
                continue
            if not args.repeat:
                break
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
