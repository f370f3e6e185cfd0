"""The deterministic generator as a PySpark streaming Python Data Source.

Offsets are record indices: a micro-batch reads records ``[start, end)``. The latest
offset is the number of records *scheduled* by now (``N(now - t0)``, see
``workload.RateSchedule``), capped by the read limit, so the source is open-loop: while
Spark stalls, scheduled records pile up and their latency (measured from the scheduled
emission time each record carries) includes the wait.

Options (strings, as Spark passes them): ``spec`` (the validated definition as JSON),
``t0`` (epoch seconds of the run's start; part of the checkpointed query so a restart
replays the same schedule), ``plan_dir`` (optional, below), ``start`` (the first record
to read, default 0) and ``hold`` (a path: while no file is there the source reports no
new record). A re-plan's new generation (``replan.py``) reads from the old one's
committed end; after a stop-and-restart it holds until its state snapshot has been
loaded in a batch of its own. A re-planned dataflow pipeline's generation replays from
earlier (``first_ends``: its first batches end where the old one's last two batches
ended, so that from there on its watermark and what it has emitted are the old one's).

A query that reads the source in several places (a dataflow pipeline joining two
branches of one source) holds one reader per place, each asked for its latest offset
when Spark plans a micro-batch. Read from the clock, their ends would differ by a few
records and the branches would see different batches. With ``plan_dir`` the first
reader to plan the batch starting at ``start`` writes its end to ``plan_dir/<start>``
(an exclusive create) and every other reader takes that end: by induction from offset
0 all branches read the same records in every batch. The same agreement makes the two
generations of a live re-plan read the same epochs (Gloss' deterministic input,
Rajadurai et al., ASPLOS 2018, §6.1): the new query starts at a batch boundary of the
old one and from there takes the old one's ends, or the old one takes the new one's.
Planned ends are kept ``PLAN_KEEP_S`` so a generation catching up still finds them.

``gate`` (a path; a re-plan's new generation on a processing-time trigger): while the
generation is behind the forwarded output, each of its batches is planned only once the
forwarding query has written its batch of the current trigger interval
(:func:`wait_for_forwarded`), so that the two queries' batches take turns instead of
starting together at every trigger (both triggers fire at the same epoch-aligned
instants) and stretching the batch the run's output waits for.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import DoubleType, LongType, StructField, StructType

from control import workload
from pipelines.runtime.spec import definition

SOURCE_NAME = "streamwise_generator"
SCHEMA = StructType([
    StructField("seq", LongType(), False),
    StructField("key", LongType(), False),
    StructField("value", DoubleType(), False),
    StructField("emit_ts", DoubleType(), False),
])
ARROW_SCHEMA = pa.schema([pa.field("seq", pa.int64(), nullable=False),
                          pa.field("key", pa.int64(), nullable=False),
                          pa.field("value", pa.float64(), nullable=False),
                          pa.field("emit_ts", pa.float64(), nullable=False)])
CHUNK_ROWS = 65_536  # Arrow batch size yielded by read(): bounded memory per task
# How long a planned batch end stays in plan_dir: longer than any re-plan's overlap
# (replan.CATCH_UP_TIMEOUT_S), so the generation behind still reads the agreed ends.
PLAN_KEEP_S = 900.0


@lru_cache(maxsize=8)
def _workload(spec_json: str) -> tuple[workload.RateSchedule, workload.KeyDistribution, int]:
    # Cached per Python worker: building a distribution from the 2,836-symbol file on
    # every partition would dominate small micro-batches.
    spec = definition.parse(spec_json)
    return spec.schedule(), spec.key_distribution(), spec.seed


@dataclass
class RangePartition(InputPartition):
    start: int
    end: int


class GeneratorStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.spec_json = options["spec"]
        self.t0 = float(options["t0"])
        self.spec = spec = definition.parse(self.spec_json)
        self.partitions_n = spec.partitions
        self.max_rows = spec.max_records_per_batch
        self.plan_dir = Path(options["plan_dir"]) if options.get("plan_dir") else None
        self.start = int(options.get("start") or 0)
        self.hold = Path(options["hold"]) if options.get("hold") else None
        self.first_ends = [int(e) for e in (options.get("first_ends") or "").split(",") if e]
        self.gate = Path(options["gate"]) if options.get("gate") else None
        # The reader is made on the driver's host and pickled to every task: the
        # schedule and key distribution (read from the data files there) travel with
        # it, so an executor on another host needs none of this machine's files.
        self.workload = _workload(self.spec_json)

    def initialOffset(self) -> dict:
        return {"offset": self.start}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def _available(self) -> int:
        schedule, _, _ = self.workload
        return schedule.records_by(time.time() - self.t0)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["offset"])
        if self.gate is not None:
            wait_for_forwarded(self.gate, begin)
        available = self._available()
        if self.hold is not None and not self.hold.exists():
            return {"offset": begin}
        pending = [e for e in self.first_ends if e > begin]
        if pending:
            # A replay (a re-planned dataflow's state rebuilt from earlier records) ends
            # its first batches where the old query's last batches ended: from there on
            # it meets the planned boundaries.
            return {"offset": pending[0]}
        if isinstance(limit, ReadAllAvailable):
            end = max(begin, available)
        else:
            cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
            end = max(begin, self._capped_end(begin, available, int(cap)))
        return {"offset": self._agree(begin, end) if self.plan_dir else end}

    def _capped_end(self, begin: int, available: int, most: int) -> int:
        """The end of a batch from ``begin`` of at most ``most`` records (offsets here
        are record indices; a broker's offsets are not dense: ``broker_source``)."""
        return min(available, begin + most)

    def _agree(self, begin: int, end: int) -> int:
        """The end every reader of this query uses for the batch starting at ``begin``.

        A reader that finds ``begin`` planned already is behind the planner (a re-plan's
        new generation catching up): it may cover several planned batches at once, up to
        its own ``end``, and still end where a planned batch ends; so it catches up in
        fewer, larger batches and stays on the boundaries it must meet at the hand-over.
        """
        assert self.plan_dir is not None
        if end <= begin:
            # Nothing new (a rate of 0, or a trigger sooner than the next record): no
            # batch, so nothing to agree on. A planned end equal to its start would name
            # itself as the batch after it, and the walk below would follow it for ever
            # (a schedule starting at 0 records/s would hang its query after batch 0).
            return begin
        self.plan_dir.mkdir(parents=True, exist_ok=True)
        path = self.plan_dir / str(begin)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            agreed = self._planned(path)
            while True:
                following = self.plan_dir / str(agreed)
                if not following.exists():
                    return agreed
                further = self._planned(following)
                if further > end or further <= agreed:  # (a planned end is never its start)
                    return agreed
                agreed = further
        with os.fdopen(fd, "w") as out:
            out.write(str(end))
        if begin % 64 == 0 or not self._pruned:
            self._prune(begin)
        return end

    @staticmethod
    def _planned(path: Path) -> int:
        for _ in range(200):  # the writer is between its create and its write
            text = path.read_text().strip()
            if text:
                return int(text)
            time.sleep(0.005)
        raise RuntimeError(f"no planned end in {path}")

    _pruned = False

    def _prune(self, begin: int) -> None:
        """Forget ends planned long ago (another generation may still need recent ones)."""
        assert self.plan_dir is not None
        self._pruned = True
        horizon = time.time() - PLAN_KEEP_S
        for old in self.plan_dir.iterdir():
            try:
                if (old.name.isdigit() and int(old.name) < begin
                        and old.stat().st_mtime < horizon):
                    old.unlink(missing_ok=True)
            except FileNotFoundError:  # another reader pruned it
                pass

    def reportLatestOffset(self) -> dict:
        return {"offset": self._available()}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        lo, hi = int(start["offset"]), int(end["offset"])
        n = max(1, min(self.partitions_n, hi - lo))
        bounds = [lo + (hi - lo) * k // n for k in range(n + 1)]
        return [RangePartition(a, b) for a, b in zip(bounds, bounds[1:])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        schedule, keys, seed = self.workload
        for a in range(partition.start, partition.end, CHUNK_ROWS):
            b = min(a + CHUNK_ROWS, partition.end)
            r = workload.generate(seed, a, b, schedule, keys, self.t0)
            yield pa.RecordBatch.from_arrays(
                [pa.array(r.seq), pa.array(r.key), pa.array(r.value), pa.array(r.emit_ts)],
                schema=ARROW_SCHEMA)

    def commit(self, end: dict) -> None:
        pass


class GeneratorDataSource(DataSource):
    """The record generator; a subclass names another reader (``nexmark_source``)."""

    source_name = SOURCE_NAME
    source_schema = SCHEMA
    reader: type[GeneratorStreamReader] = GeneratorStreamReader

    @classmethod
    def name(cls) -> str:
        return cls.source_name

    @classmethod
    def schema_of(cls, spec: definition.PipelineSpec) -> StructType:
        """The rows' schema for this definition (a broker's source declares its fields)."""
        return cls.source_schema

    def schema(self) -> StructType:
        return self.schema_of(definition.parse(self.options["spec"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return self.reader(self.options)


# Every source a definition may name: its ``source.type`` -> the Python data source
# class that reads it (module:class, imported when a query is built: a Redis client or
# a NEXMark model loads only where it is used). A Kafka source would be one more line
# and one class like ``broker_source.RedisStreamReader``.
DATA_SOURCES: dict[str, str] = {
    "generator": "pipelines.runtime.query.source:GeneratorDataSource",
    "nexmark": "pipelines.runtime.query.nexmark_source:NexmarkDataSource",
    "redis_stream": "pipelines.runtime.query.broker_source:RedisStreamDataSource",
    "jetstream": "pipelines.runtime.query.broker_source:JetStreamDataSource",
    "files": "pipelines.runtime.query.broker_source:FilesDataSource",
}


def data_source_for(source_type: str) -> type[GeneratorDataSource]:
    """The data source class of a definition's ``source.type`` (``DATA_SOURCES``)."""
    import importlib

    module, _, name = DATA_SOURCES[source_type].partition(":")
    return getattr(importlib.import_module(module), name)


def source_options(spec: definition.PipelineSpec, t0: float,
                   plan_dir: Path | str | None = None, start: int = 0,
                   hold: Path | str | None = None,
                   first_ends: tuple[int, ...] = (),
                   gate: Path | str | None = None) -> dict[str, str]:
    options = {"spec": json.dumps(spec.raw, sort_keys=True), "t0": repr(t0)}
    from pipelines.runtime import connectors

    secret = connectors.connection_secret(spec.source_doc)
    if secret is not None:
        options["secret"] = secret
    if plan_dir is not None:
        options["plan_dir"] = str(plan_dir)
    if start:
        options["start"] = str(start)
    if hold is not None:
        options["hold"] = str(hold)
    if first_ends:
        options["first_ends"] = ",".join(str(e) for e in first_ends)
    if gate is not None:
        options["gate"] = str(gate)
    return options


GATE_POLL_S = 0.02


def wait_for_forwarded(gate: Path, begin: int) -> float:
    """A catching-up generation's turn to plan its batch starting at ``begin``; returns
    the seconds waited. ``gate`` is a JSON document the runner rewrites whenever the
    forwarding query's batch is written (``replan.Arbiter``): ``committed_at`` (epoch
    seconds), ``forwarded_end`` (the source offset the run's output reaches) and
    ``trigger_s`` (the pipeline's processing-time trigger). Spark fires both queries'
    triggers at the same multiples of the interval; this waits until the forwarding
    query has written its batch of the current interval, at most until the next trigger
    instant (an overloaded query's batch may run past it). No wait without the file (the
    generation forwards, or the re-plan ended), nor once ``begin`` reaches the forwarded
    end: that batch is the hand-over, which the old query leaves to this one
    (``replan.Arbiter.begin``; Gloss §7.2)."""
    waited_from = time.time()
    deadline: float | None = None
    while True:
        try:
            doc = json.loads(gate.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # gone, or being replaced
            return time.time() - waited_from
        trigger_s = float(doc.get("trigger_s") or 0.0)
        forwarded_end = doc.get("forwarded_end")
        if trigger_s <= 0 or (forwarded_end is not None and begin >= int(forwarded_end)):
            return time.time() - waited_from
        now = time.time()
        interval_start = now - now % trigger_s
        if deadline is None:
            deadline = interval_start + trigger_s
        if float(doc.get("committed_at") or 0.0) >= interval_start or now >= deadline:
            return now - waited_from
        time.sleep(GATE_POLL_S)


# The per-batch latency observation (query.py says how latency follows from it).
OBSERVATION = "sw_latency"
# percentile_approx accuracy: rank error <= 1/ACCURACY of the batch's rows.
PERCENTILE_ACCURACY = 10_000


def read_stream(spark: SparkSession, data_source: type[GeneratorDataSource],
                spec: definition.PipelineSpec, t0: float,
                plan_dir: Path | str | None = None, start: int = 0,
                hold: Path | str | None = None,
                first_ends: tuple[int, ...] = (),
                gate: Path | str | None = None) -> DataFrame:
    """The source's records as a stream. The schema given here spares a Python round
    trip on the driver at query start."""
    spark.dataSource.register(data_source)
    return (spark.readStream.format(data_source.source_name)
            .schema(data_source.schema_of(spec))
            .options(**source_options(spec, t0, plan_dir, start, hold, first_ends, gate))
            .load())


def observe_latency(df: DataFrame) -> DataFrame:
    """Count and emission-time quantiles of the records passing here, per batch."""
    return df.observe(
        OBSERVATION,
        F.count(F.lit(1)).alias("records"),
        F.min("emit_ts").alias("first_emit"),
        F.percentile_approx("emit_ts", [0.01, 0.05, 0.5], PERCENTILE_ACCURACY).alias("q"),
    )


def warm_up(_rows: Iterator[Any]) -> Iterator[int]:
    """Run once on each executor while the query starts: the first micro-batch then
    finds the Python worker started and this module (pyarrow, numpy) imported."""
    yield len(RangePartition.__name__)
