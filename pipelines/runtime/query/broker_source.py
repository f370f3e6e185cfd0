"""Brokers' streams as PySpark streaming Python Data Sources: a Redis stream
(``source.type`` = ``redis_stream``), a NATS JetStream stream (``jetstream``), and a
directory of files as they land (``files``, whose offsets are its arrival manifest's).

A broker's offsets are integers that grow with its stream (a Redis entry's packed ID,
a JetStream sequence: ``connectors/``), so a micro-batch reads the records in
``[start, end)`` and its records are fixed by its offsets; the reader reuses the
generator's machinery unchanged (``source.GeneratorStreamReader``): the planned ends
two query generations agree on, a re-plan's start and hold, the read limit. What
differs is where records come from and when a batch may end: the latest offset is the
stream's newest, and a batch capped at N records ends after the N-th record from its
start where the offsets are not dense.

Each partition is an offset range; its task reads its records, converts the declared
fields and sends a record that does not convert to the run's dead-letter place with
the reason (once, whichever task or retry meets it first); the query goes on with the
rest. A Kafka source would be one more subclass here and a connector module beside
``redis_stream``: offsets per partition, ranges read again by offset.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pipelines.runtime.connectors import files as fsc
from pipelines.runtime.connectors import jetstream as jsc
from pipelines.runtime.connectors import redis_stream as rs
from pipelines.runtime.query.source import (
    GeneratorDataSource,
    GeneratorStreamReader,
    RangePartition,
)
from pipelines.runtime.spec import definition

_SPARK: dict[str, DataType] = {"long": LongType(), "double": DoubleType(),
                               "string": StringType()}
_ARROW = {"long": pa.int64(), "double": pa.float64(), "string": pa.string()}


def spark_schema(fields: dict[str, str], optional: frozenset[str] = frozenset()
                 ) -> StructType:
    """``seq`` (the record's offset identity), the declared fields (nullable where a
    record may lack them), ``emit_ts`` (the broker's timestamp)."""
    return StructType([StructField("seq", LongType(), False)]
                      + [StructField(n, _SPARK[t], n in optional) for n, t in fields.items()]
                      + [StructField("emit_ts", DoubleType(), False)])


def declared_fields(spec: definition.PipelineSpec) -> tuple[dict[str, str], frozenset[str]]:
    """The source's record fields and those a record may lack."""
    return definition.record_schema(spec.source_doc)


class BrokerStreamReader(GeneratorStreamReader):
    """A broker's records in offset ranges; subclasses say how to read them."""

    def __init__(self, options: dict[str, str]) -> None:
        if options.get("secret"):
            # The connection the source names (this process is Spark's, not the
            # runner's); its URL travels inside the reader to the tasks.
            import json

            from pipelines.runtime import connectors

            connectors.register_connections(json.loads(options["secret"]))
        super().__init__(options)
        if not self.start:  # a new run's first query: where its definition starts
            self.start = int(self.spec.source_doc.get("start_offset", 0))
        self.fields, self.optional = declared_fields(self.spec)
        self.arrow_schema = pa.schema(
            [pa.field("seq", pa.int64(), nullable=False)]
            + [pa.field(n, _ARROW[t], nullable=n in self.optional)
               for n, t in self.fields.items()]
            + [pa.field("emit_ts", pa.float64(), nullable=False)])

    def _batches(self, start: int, end: int) -> Iterator[Any]:
        """Parsed records (``seq``, ``emit_ts``, ``columns``) of ``[start, end)``, a page
        at a time, their dead letters already sent."""
        raise NotImplementedError

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        for parsed in self._batches(partition.start, partition.end):
            if not len(parsed.seq):
                continue
            arrays = [pa.array(parsed.seq, type=pa.int64())]
            arrays += [pa.array(parsed.columns[n], type=_ARROW[t])
                       for n, t in self.fields.items()]
            arrays.append(pa.array(parsed.emit_ts, type=pa.float64()))
            yield pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


class RedisStreamReader(BrokerStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.source = rs.stream_source(self.spec)
        self._planned_end: int | None = None  # the last batch end latestOffset planned

    def _redis(self) -> Any:
        return rs.connection(self.source.url)

    def _available(self) -> int:
        return rs.end_offset(self._redis(), self.source.stream)

    def _capped_end(self, begin: int, available: int, most: int) -> int:
        return rs.end_after(self._redis(), self.source.stream, begin, most, available)

    def latestOffset(self, start: dict, limit: Any) -> dict:
        end = super().latestOffset(start, limit)
        self._planned_end = int(end["offset"])
        return end

    def reportLatestOffset(self) -> dict:
        """The newest offset, with what the control loop counts in records (a packed
        ID counts milliseconds): the entries the stream was ever given, and how far
        behind it the batch just planned ends, in the broker's seconds."""
        latest, added = rs.arrivals(self._redis(), self.source.stream)
        report: dict[str, Any] = {"offset": latest}
        if added is not None:
            report["entries_added"] = added
        if self._planned_end is not None and latest >= self._planned_end:
            report["behind_s"] = rs.emit_seconds(latest) - rs.emit_seconds(self._planned_end)
        return report

    def _batches(self, start: int, end: int) -> Iterator[Any]:
        r = self._redis()
        for page in rs.entries(r, self.source.stream, start, end):
            parsed = rs.parse(page, self.source.fields, optional=self.source.optional)
            if parsed.dead:
                rs.write_dead_letters(r, self.source, parsed.dead)
            yield parsed


class JetStreamReader(BrokerStreamReader):
    """Sequences are dense but for deleted messages: a batch capped at N ends N
    sequences on (the base's cap), reading at most N records."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.source = jsc.stream_source(self.spec)

    def _available(self) -> int:
        return jsc.end_offset(jsc.connection(self.source.url), self.source.stream)

    def _batches(self, start: int, end: int) -> Iterator[Any]:
        client = jsc.connection(self.source.url)
        for lo in range(start, end, jsc.FETCH * 10):
            parsed = jsc.parse(jsc.read(client, self.source.stream, lo,
                                        min(end, lo + jsc.FETCH * 10)), self.source.fields,
                               optional=self.source.optional)
            if parsed.dead:
                jsc.write_dead_letters(client, self.source, parsed.dead)
            yield parsed


class FilesReader(BrokerStreamReader):
    """A directory's landed files (``connectors/files.py``): an offset is a file, a
    batch at most ``max_files_per_trigger`` of them, each read whole by one task."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.source = fsc.files_source(self.spec)

    def _available(self) -> int:
        return fsc.end_offset(self.source)

    def _capped_end(self, begin: int, available: int, most: int) -> int:
        return min(available, begin + self.source.max_files_per_trigger)

    def _batches(self, start: int, end: int) -> Iterator[Any]:
        files = fsc.landed(self.source, look=False)
        for f in files[start:end]:
            parsed = fsc.read_file(self.source, f)
            fsc.write_dead_letters(self.source, f, parsed.dead)
            yield parsed


class BrokerDataSource(GeneratorDataSource):
    @classmethod
    def schema_of(cls, spec: definition.PipelineSpec) -> StructType:
        return spark_schema(*declared_fields(spec))


class RedisStreamDataSource(BrokerDataSource):
    source_name = "streamwise_redis_stream"
    reader = RedisStreamReader


class JetStreamDataSource(BrokerDataSource):
    source_name = "streamwise_jetstream"
    reader = JetStreamReader


class FilesDataSource(BrokerDataSource):
    source_name = "streamwise_files"
    reader = FilesReader
