"""What Streamwise's sources cost against a plain PySpark application reading the same
broker: per source (a Redis stream, a JetStream stream, a folder of JSON Lines files),
the rate at which a keyed count drains a backlog of the same records, and the CPU
seconds per 1,000 records of every process of the application (driver, executor,
Python workers), both sides in one Spark session, alternating, on the same cluster.

Streamwise's side is the product's reader (``query.source.DATA_SOURCES``): offsets the
re-plan and migration rely on, typed fields, dead letters, broker timestamps. The
plain side is what a PySpark user writes without Streamwise: for the folder, Spark's
own JSON file source with the same ``maxFilesPerTrigger``; for the brokers (no Spark
connector for either exists on PyPI), a minimal Python data source that reads the
same ranges with the same client and converts the same fields, and nothing more. Both
sides read at most the same records per batch. The drain rate stands in for the
sustainable rate: the most records per second the query gets through once it runs,
from the end of its first batch to the end of its last (and the CPU over the same
batches). The query's start to the end of its first batch is a one-off cost, reported
apart (``start_s``): a Python data source starts its planner process then (measured:
~1.1 s against 0.3 s for Spark's file source), which on a 3-batch backlog halved the
files source's drain rate while its batches took 1.1x the plain ones.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import DoubleType, LongType, StructField, StructType

from pipelines.runtime.host.procs import cmdline, proc_table, tree_pids

SOURCES = ("redis_stream", "jetstream", "files")
PLAIN_SCHEMA = StructType([StructField("key", LongType()), StructField("value", DoubleType())])


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--records", type=int, default=60_000, help="the backlog per source")
    ap.add_argument("--batch", type=int, default=10_000, help="records per batch at most")
    ap.add_argument("--reps", type=int, default=2, help="drains per side and source")
    ap.add_argument("--sources", default=",".join(SOURCES),
                    help=f"comma-separated, of: {', '.join(SOURCES)}")
    ap.add_argument("--nats-url", default="nats://127.0.0.1:4222")


def check(args: argparse.Namespace) -> None:
    args.sources = [s.strip() for s in str(args.sources).split(",") if s.strip()]
    unknown = set(args.sources) - set(SOURCES)
    if unknown or not args.sources:
        raise ValueError(f"--sources: of {', '.join(SOURCES)} (not {sorted(unknown)})")
    if not 1_000 <= args.records <= 5_000_000 or not 100 <= args.batch <= args.records:
        raise ValueError("--records: 1,000 to 5,000,000; --batch: 100 to --records")
    if not 1 <= args.reps <= 10:
        raise ValueError("--reps: 1 to 10")


# --- the plain side: what a PySpark user writes for a broker without Streamwise ------

@dataclass
class _Range(InputPartition):
    start: str
    end: str


class _PlainRedisReader(DataSourceStreamReader):
    """Offsets are entry IDs; a batch is the next ``batch`` entries, one partition."""

    def __init__(self, options: dict[str, str]) -> None:
        self.url, self.stream = options["url"], options["stream"]
        self.batch = int(options["batch"])

    def initialOffset(self) -> dict:
        return {"id": "0-0"}

    def latestOffset(self, start: dict, limit: Any) -> dict:  # type: ignore[override]
        import redis

        r = redis.Redis.from_url(self.url)
        page = r.xrange(self.stream, min="(" + start["id"], count=self.batch)
        return {"id": page[-1][0].decode() if page else start["id"]}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [_Range(start["id"], end["id"])]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        import redis

        assert isinstance(partition, _Range)
        r = redis.Redis.from_url(self.url)
        for _id, fields in r.xrange(self.stream, min="(" + partition.start,
                                    max=partition.end):
            yield int(fields[b"key"]), float(fields[b"value"])

    def commit(self, end: dict) -> None:
        pass


class _PlainJetStreamReader(DataSourceStreamReader):
    """Offsets are stream sequences; a batch is the next ``batch`` sequences, read by
    one ephemeral pull consumer per batch."""

    def __init__(self, options: dict[str, str]) -> None:
        self.url, self.stream = options["url"], options["stream"]
        self.batch = int(options["batch"])

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:  # type: ignore[override]
        import asyncio

        import nats

        async def last() -> int:
            nc = await nats.connect(self.url)
            try:
                return int((await nc.jetstream().stream_info(self.stream)).state.last_seq)
            finally:
                await nc.close()

        return {"seq": min(asyncio.run(last()), int(start["seq"]) + self.batch)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [_Range(str(start["seq"]), str(end["seq"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import asyncio

        import nats
        from nats.js import api

        assert isinstance(partition, _Range)
        lo, hi = int(partition.start), int(partition.end)

        async def fetch() -> tuple[list[int], list[float]]:
            nc = await nats.connect(self.url)
            keys: list[int] = []
            values: list[float] = []
            try:
                js = nc.jetstream()
                sub = await js.pull_subscribe(self.stream, stream=self.stream,
                                              config=api.ConsumerConfig(
                                                  deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                                  opt_start_seq=lo + 1,
                                                  ack_policy=api.AckPolicy.NONE))
                got = lo
                while got < hi:
                    for m in await sub.fetch(min(1000, hi - got), timeout=5):
                        got = m.metadata.sequence.stream
                        if got > hi:
                            break
                        doc = json.loads(m.data)
                        keys.append(int(doc["key"]))
                        values.append(float(doc["value"]))
                await sub.unsubscribe()
            finally:
                await nc.close()
            return keys, values

        keys, values = asyncio.run(fetch())
        yield pa.RecordBatch.from_arrays([pa.array(keys, pa.int64()),
                                          pa.array(values, pa.float64())],
                                         names=["key", "value"])

    def commit(self, end: dict) -> None:
        pass


class PlainRedisSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "plain_redis_stream"

    def schema(self) -> StructType:
        return PLAIN_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _PlainRedisReader(self.options)


class PlainJetStreamSource(PlainRedisSource):
    @classmethod
    def name(cls) -> str:
        return "plain_jetstream"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _PlainJetStreamReader(self.options)


# --- the backlogs ---------------------------------------------------------------------

@dataclass
class Backlog:
    source: str
    params: dict[str, Any]  # the definition's source fields
    cleanup: Any


def _backlog(source: str, args: argparse.Namespace, redis_url: str, files_dir: Path
             ) -> Backlog:
    from pipelines.runtime.connectors import feed as feeder

    feed = feeder.Feed(seed=5, rate={"kind": "constant", "records_per_s": 1_000_000},
                       keys={"kind": "uniform", "n": 1000}, records=args.records)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    quiet = {"say": lambda _m: None}
    if source == "redis_stream":
        import redis

        r = redis.Redis.from_url(redis_url)
        feeder.publish(feeder.RedisPublisher(r, name), name, feed, **quiet)
        return Backlog(source, {"url": redis_url, "stream": name},
                       lambda: r.delete(name, name + ":dead-letter"))
    if source == "jetstream":
        from pipelines.runtime.connectors import jetstream as jsc

        stream = name.upper().replace("-", "_")
        feeder.publish(feeder.JetStreamPublisher(args.nats_url, stream), stream, feed,
                       **quiet)
        client = jsc.connection(args.nats_url)
        return Backlog(source, {"url": args.nats_url, "stream": stream},
                       lambda: client.call(client.js.delete_stream(stream)))
    from control import workload

    folder = files_dir / name
    folder.mkdir(parents=True)
    spec = feed.spec()
    schedule, keys = spec.schedule(), spec.key_distribution()
    # One file per 1,000 records: a batch reads batch / 1,000 files on both sides.
    for lo in range(0, args.records, 1000):
        recs = workload.generate(feed.seed, lo, min(lo + 1000, args.records), schedule,
                                 keys, time.time())
        (folder / f"part-{lo:09d}.jsonl").write_bytes(
            b"\n".join(feeder.messages_for(feed, recs)) + b"\n")
    return Backlog(source, {"path": name, "format": "jsonl",
                            "max_files_per_trigger": max(1, args.batch // 1000)},
                   lambda: shutil.rmtree(files_dir / name, ignore_errors=True))


# --- one drain ------------------------------------------------------------------------

def _cpu(roots: list[int], app_id: str, worker_pid: int) -> float:
    table = proc_table()
    mine = set(tree_pids(roots, table))
    executors = [p for p in tree_pids([worker_pid], table)
                 if "CoarseGrainedExecutorBackend" in cmdline(p) and app_id in cmdline(p)]
    mine |= set(tree_pids(executors, table))
    return sum(table[p][1] for p in mine if p in table)


def _stream(spark: Any, side: str, backlog: Backlog, args: argparse.Namespace) -> Any:
    if side == "streamwise":
        from pipelines.runtime.query.source import data_source_for, read_stream
        from pipelines.runtime.spec import definition

        spec = definition.validate({
            "source": {"type": backlog.source, **backlog.params, "partitions": 1,
                       "rate": {"kind": "constant", "records_per_s": 1000}},
            "operators": [{"type": "keyed_aggregate"}],
            "max_records_per_batch": args.batch})
        return read_stream(spark, data_source_for(backlog.source), spec, time.time())
    if backlog.source == "files":
        from pipelines.runtime import connectors

        return (spark.readStream.schema(PLAIN_SCHEMA)
                .option("maxFilesPerTrigger", backlog.params["max_files_per_trigger"])
                .json(str(connectors.files_root() / backlog.params["path"])))
    cls = PlainRedisSource if backlog.source == "redis_stream" else PlainJetStreamSource
    spark.dataSource.register(cls)
    return (spark.readStream.format(cls.name())
            .options(url=backlog.params["url"], stream=backlog.params["stream"],
                     batch=str(args.batch)).load())


def _batch_end(progress: dict[str, Any]) -> float:
    from pipelines.runtime.runner.metrics import iso_to_epoch

    return iso_to_epoch(progress["timestamp"]) + progress["durationMs"]["triggerExecution"] / 1e3


def _drain(spark: Any, side: str, backlog: Backlog, args: argparse.Namespace,
           work: Path, worker_pid: int) -> dict[str, float]:
    """Drain the backlog; the rate and CPU of the batches after the first (the query's
    start and first batch, a one-off cost that a Python data source pays more of, its
    planner process started then, are reported apart as ``start_s``)."""
    df = _stream(spark, side, backlog, args)
    counted = df.groupBy("key").count()
    checkpoint = work / f"ckpt-{uuid.uuid4().hex[:8]}"
    app_id = spark.sparkContext.applicationId
    began = time.time()
    query = (counted.writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        while not [p for p in query.recentProgress if p.get("numInputRows")]:
            if not query.isActive:
                raise RuntimeError(f"{side} {backlog.source}: {query.exception()}")
            time.sleep(0.002)
        cpu0 = _cpu([os.getpid()], app_id, worker_pid)
        query.processAllAvailable()
        cpu = _cpu([os.getpid()], app_id, worker_pid) - cpu0
        batches = [p for p in query.recentProgress if p.get("numInputRows")]
    finally:
        query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    rows = sum(int(p["numInputRows"]) for p in batches)
    if rows < args.records * 0.9:
        raise RuntimeError(f"{side} read {rows} of {args.records} {backlog.source} records")
    steady = sum(int(p["numInputRows"]) for p in batches[1:])
    if len(batches) < 3 or not steady:
        raise RuntimeError(f"{side}: {len(batches)} batches; raise --records over --batch "
                           "for at least 3")
    seconds = _batch_end(batches[-1]) - _batch_end(batches[0])
    return {"records_per_s": steady / seconds, "cpu_s_per_1000": cpu / steady * 1000,
            "records": rows, "start_s": _batch_end(batches[0]) - began}


def run(master_url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.runtime.cluster import standalone as cluster
    from pipelines.runtime.query.session import build_session

    info = cluster.load(work / "spark")
    if info is None:
        raise RuntimeError(f"no cluster in {work / 'spark'}")
    # (before the JVM starts: its Python workers inherit the folder the files are in)
    os.environ["STREAMWISE_FILES_ROOT"] = str(work / "files")
    spark = build_session(master_url, "bench-sources", 1, args.executor_memory)
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    out: dict[str, Any] = {"benchmark": "sources", "records": args.records,
                           "batch": args.batch, "reps": args.reps, "sources": {}}
    try:
        for source in args.sources:
            backlog = _backlog(source, args, args.redis_url, work / "files")
            try:
                samples: dict[str, list[dict[str, float]]] = {"streamwise": [], "plain": []}
                # A drain of each side first, not measured: classes loaded, workers up.
                for side in ("streamwise", "plain"):
                    _drain(spark, side, backlog, args, work, info.worker_pid)
                for rep in range(args.reps):
                    for side in (("streamwise", "plain") if rep % 2 == 0
                                 else ("plain", "streamwise")):
                        samples[side].append(_drain(spark, side, backlog, args, work,
                                                    info.worker_pid))
                        print(f"{source} {side} {rep}: {samples[side][-1]}",
                              file=sys.stderr, flush=True)
            finally:
                backlog.cleanup()
            med = {side: {k: round(statistics.median(s[k] for s in rows), 3)
                          for k in ("records_per_s", "cpu_s_per_1000", "start_s")}
                   for side, rows in samples.items()}
            out["sources"][source] = {
                "median": med,
                "rate_ratio": round(med["streamwise"]["records_per_s"]
                                    / med["plain"]["records_per_s"], 3),
                "cpu_ratio": round(med["streamwise"]["cpu_s_per_1000"]
                                   / med["plain"]["cpu_s_per_1000"], 3),
            }
    finally:
        spark.stop()
    out["target"] = "rate_ratio >= 0.85 and cpu_ratio <= 1.15 (at most 15 % lost)"
    return out
