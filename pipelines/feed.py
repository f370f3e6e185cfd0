"""Drive a real broker with the product's workloads: ``python -m pipelines.feed redis ...``.

Publishes the keyed workload (the generator's records: keys from a distribution, values
in [0, 1000)) at any of its rate shapes (constant, step, sine, random walk, trace) into a
Redis stream, each record an entry with the fields ``key`` and ``value``, added with
``XADD <stream> *``: the server stamps it, and that stamp is where the record's latency
starts. ``--malformed F`` makes a fraction F of the entries bad, in turn: a missing
``value``, a ``value`` that is not a number, a ``key`` that is not UTF-8 (what the
dead-letter stream is for). A progress line every few seconds says how far it is.

    python -m pipelines.feed redis --url redis://127.0.0.1:6379/0 --stream orders \\
        --rate '{"kind": "constant", "records_per_s": 800}' \\
        --keys '{"kind": "zipf", "n": 200, "s": 1.1}' --seconds 60
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import redis

from control import workload
from pipelines.runtime.spec import definition

MALFORMED_KINDS = ("missing value", "value not a number", "key not utf-8")
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


def entries_for(feed: Feed, recs: workload.Records) -> list[dict[bytes, bytes]]:
    kinds = malformed_kind(feed.seed, recs.seq, feed.malformed)
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


def publish_redis(r: redis.Redis, stream: str, feed: Feed,
                  say: Callable[[str], None] = print, progress_every_s: float = 5.0,
                  clock: Callable[[], float] = time.time,
                  stop: Callable[[], bool] = lambda: False) -> int:
    """Publish ``feed`` into ``stream`` on its schedule, until it is done or ``stop()``;
    returns the records sent."""
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
            recs = workload.generate(feed.seed, sent, due, schedule, keys, t0)
            pipe = r.pipeline(transaction=False)
            for entry in entries_for(feed, recs):
                pipe.xadd(stream, entry)
            pipe.execute()
            sent = due
        done = ((feed.records and sent >= feed.records)
                or (feed.seconds and now >= feed.seconds) or stop())
        if clock() - said >= progress_every_s or done:
            said = clock()
            say(f"feed: {sent:,} records in {now:,.1f} s "
                f"({sent / max(now, 1e-9):,.0f}/s), stream {stream} holds {r.xlen(stream):,}")
        if done:
            return sent
        time.sleep(BATCH_S)


def _json_arg(text: str, what: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--{what}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SystemExit(f"--{what}: must be a JSON object")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.feed",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="broker", required=True)
    p = sub.add_parser("redis", help="into a Redis stream (XADD)")
    p.add_argument("--url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--stream", required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rate", default='{"kind": "constant", "records_per_s": 1000}',
                   help="a rate shape as in a definition's source.rate (JSON)")
    p.add_argument("--keys", default='{"kind": "uniform", "n": 1000}',
                   help="a key distribution as in a definition's source.keys (JSON)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after (0: never)")
    p.add_argument("--records", type=int, default=0, help="stop after (0: never)")
    p.add_argument("--malformed", type=float, default=0.0,
                   help="share of entries made bad on purpose, 0..1")
    args = parser.parse_args(argv)
    if not 0 <= args.malformed <= 1:
        parser.error("--malformed must be between 0 and 1")
    feed = Feed(seed=args.seed, rate=_json_arg(args.rate, "rate"),
                keys=_json_arg(args.keys, "keys"), seconds=args.seconds,
                records=args.records, malformed=args.malformed)
    try:
        feed.spec()
    except definition.DefinitionError as exc:
        parser.error(str(exc).replace("source.", "--", 1))
    r = redis.Redis.from_url(args.url)
    try:
        r.ping()
    except redis.RedisError as exc:
        print(f"feed: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    try:
        publish_redis(r, args.stream, feed, say=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
