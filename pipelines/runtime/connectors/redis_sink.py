"""A Redis stream as a pipeline's sink, each micro-batch written exactly once.

Each output batch (the run's epoch, the same across a re-plan's generations) is added
in one server-side script: it first records the batch in the ledger hash
``<stream>:sink-batches`` (field ``<run>:<epoch>`` -> rows, ``HSETNX``) and adds the
batch's rows as entries (``XADD <stream> *``, fields as the output's columns plus
``epoch`` and ``run``, the run's start) only if that field is new. A script runs alone on the server, so a batch
that Spark runs again after a failure, or two generations offering the same epoch,
add its rows once (the idempotence by batch id that Structured Streaming's
``foreachBatch`` contract asks of a sink). A keyed aggregate's update-mode rows are
appended like any others: a key's current value is its entry of the highest epoch
(:meth:`RedisStreamSink.latest`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

LEDGER_SUFFIX = ":sink-batches"
# KEYS: the stream, the ledger hash; ARGV: the ledger field, the row count, the number
# of columns n, the n column names, then the values row by row.
_ADD_BATCH = """
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
local rows, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local at = 4 + n
for r = 1, rows do
  local entry = {}
  for c = 1, n do
    entry[2 * c - 1] = ARGV[3 + c]
    entry[2 * c] = ARGV[at]
    at = at + 1
  end
  redis.call('XADD', KEYS[1], '*', unpack(entry))
end
return 1
"""


@dataclass(frozen=True)
class RedisStreamSink:
    url: str
    stream: str
    key_columns: tuple[str, ...]
    sink_name: str

    @classmethod
    def for_run(cls, params: dict[str, Any], t0: float, key_columns: tuple[str, ...]
                ) -> RedisStreamSink:
        from pipelines.runtime import connectors

        return cls(url=connectors.server_url(params), stream=str(params["stream"]),
                   key_columns=key_columns, sink_name=f"{t0!r}")

    @property
    def ledger(self) -> str:
        return self.stream + LEDGER_SUFFIX

    def connect(self) -> redis.Redis:
        from pipelines.runtime.connectors import redis_stream as rs

        return rs.connection(self.url)

    def write(self, table: Any, epoch: int) -> bool:
        """Add output batch ``epoch`` (a pyarrow table) unless it was added before."""
        names = [*table.column_names, "epoch", "run"]
        columns = [table.column(n).to_pylist() for n in table.column_names]
        args: list[Any] = [f"{self.sink_name}:{epoch}", table.num_rows, len(names), *names]
        for row in zip(*columns):
            args += [*(repr(v) if isinstance(v, float) else v for v in row), epoch,
                     self.sink_name]
        if table.num_rows == 0:
            args = args[:3 + len(names)]
        r = self.connect()
        return bool(r.register_script(_ADD_BATCH)(keys=[self.stream, self.ledger],
                                                  args=args))

    def writer(self) -> Any:
        return self.write

    def written_epochs(self) -> dict[int, int]:
        """Epoch -> rows, as the ledger has them for this run."""
        prefix = f"{self.sink_name}:"
        out = {}
        for field, rows in self.connect().hgetall(self.ledger).items():
            name = field.decode()
            if name.startswith(prefix):
                out[int(name[len(prefix):])] = int(rows)
        return out

    def rows(self) -> Any:
        """Every entry of this run's batches (a pandas DataFrame, numbers parsed)."""
        import pandas as pd

        records = []
        for _id, fields in self.connect().xrange(self.stream):
            row = {k.decode(): v.decode() for k, v in fields.items()}
            if row.get("run") == self.sink_name:
                records.append(row)
        df = pd.DataFrame(records)
        for column in df.columns:
            try:
                df[column] = pd.to_numeric(df[column])
            except ValueError:  # a text column
                pass
        return df

    def latest(self) -> Any:
        """Each key's current row (``connectors.latest_rows``)."""
        from pipelines.runtime import connectors

        return connectors.latest_rows(self.rows(), self.key_columns)
