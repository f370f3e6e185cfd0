"""Beam's NEXMark events as a PySpark streaming Python Data Source.

Offsets, admission control and scheduling are the record generator's
(``source.GeneratorStreamReader``): a micro-batch reads events ``[start, end)``, the
latest offset is the number of events *scheduled* by now under the run's rate shape
(constant, step, sine, random walk or a trace), capped by the read limit, so latency
stays open-loop. Event ``n`` is ``pipelines.nexmark.generator.event(n)`` — Beam's event
``n`` field for field — stamped with its scheduled emission time as its event time
(``dateTime``, epoch ms; ``event_time`` as a timestamp). An auction's length is drawn
as Beam draws it, from a NEXMark configuration at the schedule's starting rate.

The same function (:func:`scheduled_events`) gives the verifier the events a run read.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines.nexmark import generator as gen
from pipelines.runtime.spec import dataflow
from pipelines.runtime.spec import definition
from pipelines.runtime.query.source import (
    CHUNK_ROWS,
    GeneratorDataSource,
    GeneratorStreamReader,
    RangePartition,
)

SOURCE_NAME = "streamwise_nexmark"
_SPARK = {"long": LongType(), "double": DoubleType(), "string": StringType(),
          "timestamp": TimestampType()}
_ARROW = {"long": pa.int64(), "double": pa.float64(), "string": pa.string(),
          "timestamp": pa.timestamp("us", tz="UTC")}
COLUMNS = dataflow.NEXMARK_COLUMNS
SCHEMA = StructType([StructField(c, _SPARK[t], True) for c, t in COLUMNS.items()])
ARROW_SCHEMA = pa.schema([pa.field(c, _ARROW[t], nullable=True) for c, t in COLUMNS.items()])


@lru_cache(maxsize=8)
def _setup(spec_json: str) -> tuple[Any, gen.NexmarkConfig]:
    spec = definition.parse(spec_json)
    schedule = spec.schedule()
    nominal = max(1, round(schedule.rate_at(0.0)))
    return schedule, gen.NexmarkConfig.at_rate(nominal, **spec.nexmark)


def scheduled_events(spec_json: str, start: int, end: int, t0: float
                     ) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Events ``[start, end)`` of a run (started at ``t0``) and their emission times."""
    return events_between(*_setup(spec_json), start, end, t0)


def events_between(schedule: Any, config: gen.NexmarkConfig, start: int, end: int,
                   t0: float) -> tuple[list[dict[str, Any]], np.ndarray]:
    emit = schedule.emission_times(np.arange(start, end, dtype=np.int64)) + t0
    events = [gen.event(n, config, timestamp_ms=math.floor(float(t) * 1000.0))
              for n, t in zip(range(start, end), emit)]
    return events, emit


def to_arrow(start: int, events: list[dict[str, Any]], emit: np.ndarray) -> pa.RecordBatch:
    n = len(events)
    date_ms = np.fromiter((e["dateTime"] for e in events), dtype=np.int64, count=n)
    arrays = []
    for column, kind in COLUMNS.items():
        if column == "seq":
            arrays.append(pa.array(np.arange(start, start + n, dtype=np.int64)))
        elif column == "emit_ts":
            arrays.append(pa.array(emit, type=pa.float64()))
        elif column == "dateTime":
            arrays.append(pa.array(date_ms))
        elif column == "event_time":  # dateTime as a timestamp (µs)
            arrays.append(pa.array(date_ms * 1000).cast(_ARROW["timestamp"]))
        else:
            arrays.append(pa.array([e.get(column) for e in events], type=_ARROW[kind]))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


class NexmarkStreamReader(GeneratorStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.nexmark = _setup(self.spec_json)  # travels with the reader, like workload

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        for a in range(partition.start, partition.end, CHUNK_ROWS):
            b = min(a + CHUNK_ROWS, partition.end)
            events, emit = events_between(*self.nexmark, a, b, self.t0)
            yield to_arrow(a, events, emit)


class NexmarkDataSource(GeneratorDataSource):
    source_name = SOURCE_NAME
    source_schema = SCHEMA
    reader = NexmarkStreamReader
