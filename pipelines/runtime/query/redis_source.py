"""A Redis stream as a PySpark streaming Python Data Source (``source.type`` =
``redis_stream``).

Offsets are packed entry IDs (``connectors.redis_stream``): a micro-batch reads the
entries in ``[start, end)`` with XRANGE, so its records are fixed by its offsets, and the
reader reuses the generator's machinery unchanged (``source.GeneratorStreamReader``):
the planned ends two query generations agree on, a re-plan's start and hold, the read
limit. What differs is where the records come from and when a batch may end: the latest
offset is one past the stream's newest entry, and a batch capped at N records ends after
the N-th entry from its start (the IDs are not dense).

Each partition is an ID range; its task reads its entries in pages, converts the
declared fields and sends an entry that does not convert to the run's dead-letter
stream with the reason (once, whichever task or retry meets it first); the query goes
on with the rest.
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

from pipelines.runtime.connectors import redis_stream as rs
from pipelines.runtime.query.source import (
    GeneratorDataSource,
    GeneratorStreamReader,
    RangePartition,
)
from pipelines.runtime.spec import definition

SOURCE_NAME = "streamwise_redis_stream"
_SPARK: dict[str, DataType] = {"long": LongType(), "double": DoubleType(),
                               "string": StringType()}
_ARROW = {"long": pa.int64(), "double": pa.float64(), "string": pa.string()}


def spark_schema(fields: dict[str, str]) -> StructType:
    """``seq`` (the packed entry ID), the declared fields, ``emit_ts`` (broker time)."""
    return StructType([StructField("seq", LongType(), False)]
                      + [StructField(n, _SPARK[t], False) for n, t in fields.items()]
                      + [StructField("emit_ts", DoubleType(), False)])


class RedisStreamReader(GeneratorStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.source = rs.stream_source(self.spec)
        self.arrow_schema = pa.schema(
            [pa.field("seq", pa.int64(), nullable=False)]
            + [pa.field(n, _ARROW[t], nullable=False) for n, t in self.source.fields.items()]
            + [pa.field("emit_ts", pa.float64(), nullable=False)])

    def _redis(self) -> Any:
        return rs.connection(self.source.url)

    def _available(self) -> int:
        return rs.end_offset(self._redis(), self.source.stream)

    def _capped_end(self, begin: int, available: int, most: int) -> int:
        return rs.end_after(self._redis(), self.source.stream, begin, most, available)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        r = self._redis()
        for page in rs.entries(r, self.source.stream, partition.start, partition.end):
            parsed = rs.parse(page, self.source.fields)
            if parsed.dead:
                rs.write_dead_letters(r, self.source, parsed.dead)
            if not parsed.seq:
                continue
            arrays = [pa.array(parsed.seq, type=pa.int64())]
            arrays += [pa.array(parsed.columns[n], type=_ARROW[t])
                       for n, t in self.source.fields.items()]
            arrays.append(pa.array(parsed.emit_ts, type=pa.float64()))
            yield pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


class RedisStreamDataSource(GeneratorDataSource):
    source_name = SOURCE_NAME
    reader = RedisStreamReader

    @classmethod
    def schema_of(cls, spec: definition.PipelineSpec) -> StructType:
        return spark_schema(dict(rs.stream_source(spec).fields))
