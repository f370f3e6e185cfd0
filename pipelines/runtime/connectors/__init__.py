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

import time
from collections.abc import Callable
from typing import Protocol


from pipelines.runtime.spec import definition


class OffsetClock(Protocol):
    def records_by(self, t: float) -> int:
        """The offset the input reaches ``t`` seconds after the run's start."""

    def rate_at(self, t: float) -> float | None:
        """The arrival rate the source is scheduled to have at ``t`` (modelled), or None
        where nothing schedules it (a broker: its measured input rate stands in)."""


class RedisStreamClock:
    """A Redis stream's offsets are packed entry IDs, which carry the server's clock:
    the input by ``t`` is the entry IDs up to that millisecond, but no further than the
    stream's newest entry (an idle stream has no input waiting). The newest entry is
    asked for at most every ``REFRESH_S``."""

    REFRESH_S = 0.2

    def __init__(self, spec: definition.PipelineSpec, t0: float | Callable[[], float]
                 ) -> None:
        from pipelines.runtime.connectors import redis_stream as rs

        self.rs = rs
        self.source = rs.stream_source(spec)
        # The run's start, or how to read it (a runner learns it after its metrics exist).
        self._t0 = t0
        self._end = (0, -1e18)  # (offset, when read)

    @property
    def t0(self) -> float:
        return self._t0() if callable(self._t0) else self._t0

    def _newest_end(self) -> int:
        now = time.monotonic()
        if now - self._end[1] > self.REFRESH_S:
            conn = self.rs.connection(self.source.url)
            self._end = (self.rs.end_offset(conn, self.source.stream), now)
        return self._end[0]

    def records_by(self, t: float) -> int:
        ms = max(0, int((self.t0 + t) * 1000))
        return min(ms << self.rs.SEQ_BITS, self._newest_end())

    def rate_at(self, t: float) -> float | None:
        return None


def dead_letter_counter(spec: definition.PipelineSpec) -> Callable[[], int | None] | None:
    """A function that counts the run's dead letters so far (None for a source that
    has none: the generator's records always convert)."""
    if spec.source_type != "redis_stream":
        return None
    from pipelines.runtime.connectors import redis_stream as rs

    source = rs.stream_source(spec)

    def count() -> int | None:
        try:
            return rs.dead_letter_count(rs.connection(source.url), source)
        except Exception:  # noqa: BLE001 - a count missing for a batch, not a failed run
            return None

    return count


def offset_clock(spec: definition.PipelineSpec, t0: float | Callable[[], float]
                 ) -> OffsetClock:
    """The input's reach in the run's offsets, and its scheduled rate (module docstring)."""
    if spec.source_type == "redis_stream":
        return RedisStreamClock(spec, t0)
    return spec.schedule()
