"""A PostgreSQL table as a pipeline's sink, each micro-batch written exactly once.

Each output batch (the run's epoch, the same across a re-plan's generations) is
written in one transaction together with a row in the ledger table
``streamwise_sink_batches (sink, epoch)``: the transaction first inserts the ledger row
(``ON CONFLICT DO NOTHING``) and writes the batch's rows only if that row is new, so a
batch that Spark runs again after a failure (its commit not yet in the checkpoint) is
written once, and a batch whose transaction failed is written by the retry (Spark's
``foreachBatch`` contract: "the batchId can be used to deduplicate and transactionally
write the output", Structured Streaming programming guide, "Using Foreach and
ForeachBatch"). A keyed aggregate's rows are upserted by key (its update mode emits a
key's new value); other outputs are appended with their epoch.

The ``sink`` name in the ledger is the run's own (its start time and the table), so
two runs into one table keep their own ledgers.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pipelines.runtime.spec import definition

LEDGER = definition.POSTGRES_LEDGER
_PG_TYPES = {"int64": "bigint", "int32": "integer", "double": "double precision",
             "float": "real", "string": "text", "large_string": "text", "bool": "boolean",
             "timestamp[us, tz=UTC]": "timestamptz"}


def pg_type(arrow_type: Any) -> str:
    return _PG_TYPES.get(str(arrow_type), "text")


@dataclass(frozen=True)
class PostgresSink:
    """Where a run's output goes: ``url`` (no password: a connection's secret is given
    to the runner apart), ``table``, the key columns to upsert by (empty: append), and
    the run's name in the ledger."""

    url: str
    table: str
    key_columns: tuple[str, ...]
    sink_name: str

    @classmethod
    def for_run(cls, params: dict[str, Any], t0: float,
                key_columns: tuple[str, ...]) -> PostgresSink:
        """A run's sink (a definition's ``sink`` and the run's start, which names its
        ledger rows and stays the same when the run resumes from its checkpoint)."""
        from pipelines.runtime import connectors

        return cls(url=connectors.server_url(params), table=str(params["table"]),
                   key_columns=key_columns, sink_name=f"{params['table']}@{t0!r}")

    def _table(self) -> sql.Composable:
        return sql.Identifier(*self.table.split("."))

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, connect_timeout=10)

    def writer(self) -> Any:
        """The function the run's sink calls with each batch (table, epoch): one
        connection the query generations share, opened again after a failed write
        (Spark retries the batch)."""
        held: list[psycopg.Connection] = []

        def write(table: Any, epoch: int) -> bool:
            if not held or held[0].closed:
                held[:] = [self.connect()]
            try:
                return self.write(held[0], table, epoch)
            except Exception:
                held[0].close()
                raise

        return write

    def ensure(self, conn: psycopg.Connection, columns: Sequence[tuple[str, str]]) -> None:
        """The ledger and the table (columns: (name, PostgreSQL type)), if missing."""
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink text NOT NULL, epoch bigint NOT NULL, "
            "rows integer NOT NULL, written_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (sink, epoch))").format(sql.Identifier(LEDGER)))
        cols = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns]
        if not self.key_columns:
            cols.append(sql.SQL("epoch bigint NOT NULL"))
        else:
            cols.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, self.key_columns))))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self._table(), sql.SQL(", ").join(cols)))

    def write(self, conn: psycopg.Connection, table: Any, epoch: int) -> bool:
        """Write one batch (a pyarrow table) as output batch ``epoch``, in one
        transaction with its ledger row; False if that batch was written before."""
        names = list(table.column_names)
        with conn.transaction():
            self.ensure(conn, [(n, pg_type(table.schema.field(n).type)) for n in names])
            fresh = conn.execute(sql.SQL(
                "INSERT INTO {} (sink, epoch, rows) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING RETURNING epoch").format(sql.Identifier(LEDGER)),
                (self.sink_name, epoch, table.num_rows)).fetchone()
            if fresh is None:
                return False
            if table.num_rows == 0:
                return True
            rows = list(zip(*(table.column(n).to_pylist() for n in names)))
            target = names if self.key_columns else [*names, "epoch"]
            if not self.key_columns:
                rows = [(*row, epoch) for row in rows]
            insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                self._table(), sql.SQL(", ").join(map(sql.Identifier, target)),
                sql.SQL(", ").join(sql.Placeholder() * len(target)))
            if self.key_columns:
                updated = [n for n in names if n not in self.key_columns]
                insert = sql.SQL("{} ON CONFLICT ({}) DO UPDATE SET {}").format(
                    insert, sql.SQL(", ").join(map(sql.Identifier, self.key_columns)),
                    sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                                       for n in updated))
            with conn.cursor() as cur:
                cur.executemany(insert, rows)
        return True

    def read(self, conn: psycopg.Connection) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Every row of the table (for the verifier)."""
        with conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT * FROM {}").format(self._table()))
            names = [d.name for d in cur.description or ()]
            return names, cur.fetchall()

    def written_epochs(self, conn: psycopg.Connection) -> dict[int, int]:
        """Epoch -> rows, as the ledger has them for this run."""
        rows = conn.execute(sql.SQL("SELECT epoch, rows FROM {} WHERE sink = %s").format(
            sql.Identifier(LEDGER)), (self.sink_name,)).fetchall()
        return {int(e): int(n) for e, n in rows}
