"""A Parquet dataset as a pipeline's sink, each micro-batch written exactly once.

Layout (Hive-style, so Spark, pandas, DuckDB or ``pyarrow.dataset`` read it with its
``run`` and ``epoch`` columns): ``<files root>/<path>/run=<t0 ms>/epoch=<N>/part-0.parquet``.
Each output batch (the run's epoch, the same across a re-plan's generations) is one
file, written to a temporary name beside it and renamed into place (a POSIX rename is
atomic): a reader sees a batch whole or not at all, and a batch that Spark runs again
after a failure replaces its file with the same rows, so each batch is in the dataset
once — the guarantee Spark's own file sink gets from its ``_spark_metadata`` log, here
by the batch's id (Structured Streaming guide, "Using Foreach and ForeachBatch").

A keyed aggregate emits a key's new value in each batch (update mode): the dataset
keeps every update, and a key's current value is its row in the highest epoch
(:meth:`ParquetSink.latest`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipelines.runtime import connectors

_EPOCH_DIR = re.compile(r"^epoch=(\d+)$")


@dataclass(frozen=True)
class ParquetSink:
    """Where a run's output goes: the run's folder of the dataset and the key columns
    (empty: append)."""

    directory: Path
    key_columns: tuple[str, ...]

    @classmethod
    def for_run(cls, params: dict[str, Any], t0: float, key_columns: tuple[str, ...]
                ) -> ParquetSink:
        root = connectors.files_root() / str(params["path"])
        return cls(directory=root / f"run={int(round(t0 * 1000))}", key_columns=key_columns)

    def epoch_file(self, epoch: int) -> Path:
        return self.directory / f"epoch={epoch}" / "part-0.parquet"

    def write(self, table: pa.Table, epoch: int) -> bool:
        """Write output batch ``epoch`` (replacing a previous write of it, which held
        the same rows); True if it was new."""
        import pyarrow.parquet as pq

        final = self.epoch_file(epoch)
        fresh = not final.exists()
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".part-0.{os.getpid()}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        return fresh

    def writer(self) -> Any:
        """The function the run's sink calls with each batch: (table, epoch)."""
        return self.write

    def written_epochs(self) -> dict[int, int]:
        """Epoch -> rows, for every batch in the run's folder."""
        import pyarrow.parquet as pq

        out: dict[int, int] = {}
        if not self.directory.is_dir():
            return out
        for sub in self.directory.iterdir():
            m = _EPOCH_DIR.match(sub.name)
            part = sub / "part-0.parquet"
            if m and part.exists():
                out[int(m.group(1))] = pq.ParquetFile(part).metadata.num_rows
        return out

    def rows(self) -> Any:
        """Every row written (a pandas DataFrame with its ``epoch``)."""
        import pandas as pd
        import pyarrow.parquet as pq

        frames = []
        for epoch in sorted(self.written_epochs()):
            df = pq.read_table(self.epoch_file(epoch)).to_pandas()
            df["epoch"] = epoch
            frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def latest(self) -> Any:
        """Each key's current row (``connectors.latest_rows``)."""
        from pipelines.runtime import connectors

        return connectors.latest_rows(self.rows(), self.key_columns)
