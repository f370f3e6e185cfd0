"""The PostgreSQL sink on the real server, without Spark: a batch is written once
whatever how often it is offered (its ledger row in the same transaction), a failed
transaction leaves neither rows nor ledger so the retry writes it, keyed rows are
upserted, other rows appended with their epoch, and a definition refuses a password or a
table name that is not plain."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest

from pipelines.runtime.connectors.postgres_sink import LEDGER, PostgresSink
from pipelines.runtime.spec import definition

pytestmark = [pytest.mark.dbless]  # no Django database: a table in the server's own

PG_URL = os.environ.get("PG_SINK_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.fixture()
def table() -> Iterator[str]:
    name = f"sw_unit_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"DELETE FROM {LEDGER} WHERE sink LIKE %s", (f"{name}@%",))


def _batch(keys: list[int], agg: list[float]) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.int64()), "agg": pa.array(agg, pa.float64()),
                     "records": pa.array([1] * len(keys), pa.int64())})


def test_a_batch_offered_twice_is_written_once_and_keys_are_upserted(table: str) -> None:
    sink = PostgresSink.for_run({"url": PG_URL, "table": table}, 123.5, ("key",))
    with sink.connect() as conn:
        assert sink.write(conn, _batch([1, 2], [1.0, 2.0]), 0)
        assert not sink.write(conn, _batch([1, 2], [9.0, 9.0]), 0)  # Spark ran it again
        assert sink.write(conn, _batch([2, 3], [5.0, 3.0]), 1)
        names, rows = sink.read(conn)
        got = {row[names.index("key")]: row[names.index("agg")] for row in rows}
        assert got == {1: 1.0, 2: 5.0, 3: 3.0}
        assert sink.written_epochs(conn) == {0: 2, 1: 2}
    other = PostgresSink.for_run({"url": PG_URL, "table": table}, 456.0, ("key",))
    with other.connect() as conn:  # another run into the same table has its own ledger
        assert other.write(conn, _batch([4], [4.0]), 0)


def test_a_failed_write_leaves_nothing_and_its_retry_writes_the_batch(table: str) -> None:
    sink = PostgresSink.for_run({"url": PG_URL, "table": table}, 1.0, ())
    with sink.connect() as conn:
        assert sink.write(conn, _batch([1], [1.0]), 0)
        bad = pa.table({"key": pa.array([2], pa.int64()), "agg": pa.array(["x"], pa.string()),
                        "records": pa.array([1], pa.int64())})
        with pytest.raises(psycopg.Error):
            sink.write(conn, bad, 1)  # a text into the double column: the whole batch fails
        assert sink.written_epochs(conn) == {0: 1}
        assert sink.write(conn, _batch([2, 2], [2.0, 3.0]), 1)  # appended, with the epoch
        names, rows = sink.read(conn)
        assert sorted((r[names.index("key")], r[names.index("epoch")]) for r in rows) == [
            (1, 0), (2, 1), (2, 1)]


@pytest.mark.parametrize(("sink", "where", "message"), [
    ({"url": "postgres://u:pw@127.0.0.1/db", "table": "t"}, "sink.url", "holds a password"),
    ({"url": "postgres://u@127.0.0.1/db?password=x", "table": "t"}, "sink.url",
     "holds a password"),
    ({"url": "mysql://127.0.0.1/db", "table": "t"}, "sink.url", "postgres://"),
    ({"url": "postgres://127.0.0.1/db", "table": "Counts; drop"}, "sink.table", "table name"),
    ({"url": "postgres://127.0.0.1/db", "table": LEDGER}, "sink.table", "ledger"),
    ({"url": "postgres://127.0.0.1/db"}, "sink.table", "table name"),
])
def test_a_postgres_sink_that_is_wrong_is_a_field_error(sink: dict, where: str,
                                                        message: str) -> None:
    doc = {"source": {"rate": {"kind": "constant", "records_per_s": 10}},
           "operators": [{"type": "keyed_aggregate"}], "sink": {"type": "postgres", **sink}}
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate(doc)
    assert err.value.path == where and message in err.value.message
