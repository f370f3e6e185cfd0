"""Real data on the real embedded Spark cluster: a Redis stream fed by the feeder
(``python -m pipelines.feed``'s publisher), read by a run through a scale-up with
migration and a rebalance into a PostgreSQL table, with 1 % of its
entries malformed on purpose. The verifier reads the stream again for every batch's
offsets and checks the kept output record by record, then the table and its ledger;
every malformed entry is in the dead-letter stream with its reason, every good one was
counted, the query ran throughout. No Django database (the sink's table is in the
server's maintenance database): the dbless lane runs it once."""
from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
import redis

from pipelines.runtime.connectors import feed as feeder
from pipelines.runtime.connectors import redis_stream as rs
from pipelines.runtime.runner.harness import RunnerProcess
from pipelines.runtime.spec import definition
from pipelines.runtime.verify import verifier as verify

pytestmark = [pytest.mark.spark, pytest.mark.dbless]

RATE = 600
MALFORMED = 0.01


# The sink's database: the server's own maintenance database, a table of the test's own.
PG_URL = os.environ.get("PG_SINK_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def _count(url: str, stream: str, table: str) -> dict[str, Any]:
    return {"source": {"type": "redis_stream", "url": url, "stream": stream, "partitions": 2,
                       "rate": {"kind": "constant", "records_per_s": RATE},
                       "keys": {"kind": "zipf", "n": 300, "s": 1.0}},
            "operators": [{"type": "filter", "field": "value", "op": "<", "value": 900},
                          {"type": "keyed_aggregate", "key": "key", "agg": "sum",
                           "field": "value"}],
            "sink": {"type": "postgres", "url": PG_URL, "table": table, "keep_output": True},
            "key_groups": 2}


@dataclass
class Place:
    """A test's own stream (in the lane's Redis) and table (in PG_URL), removed after."""

    url: str
    stream: str
    table: str
    r: redis.Redis


@pytest.fixture()
def place() -> Iterator[Place]:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    here = Place(url=url, stream=f"sw-test-{uuid.uuid4().hex[:8]}",
                 table=f"sw_test_{uuid.uuid4().hex[:8]}", r=redis.Redis.from_url(url))
    yield here
    made = rs.StreamSource(url=url, stream=here.stream)
    here.r.delete(here.stream, made.dead_letter_stream, made.dead_letter_ids)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {here.table}")
        conn.execute("DELETE FROM streamwise_sink_batches WHERE sink LIKE %s",
                     (f"{here.table}@%",))


class Feeder:
    """The feeder's publisher in a thread, until stopped (into a Redis stream, or into
    any ``feeder.Publisher``)."""

    def __init__(self, r: redis.Redis | feeder.Publisher, stream: str,
                 feed: feeder.Feed) -> None:
        self.stop = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None
        publisher = feeder.RedisPublisher(r, stream) if isinstance(r, redis.Redis) else r

        def run() -> None:
            try:
                self.sent = feeder.publish(publisher, stream, feed, say=lambda _m: None,
                                           stop=self.stop.is_set)
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()

    def finish(self) -> int:
        """Stop publishing; the records sent."""
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive() and self.error is None, self.error
        return self.sent


def _scale_up_rebalance(run: RunnerProcess) -> None:
    """1 -> 2 workers with migration, then a rebalance, a few batches apart."""
    up = run.command("set_workers", timeout_s=300, workers=2, schedule="batched")
    assert up["ok"], up["message"]
    assert up["migration"]["groups_moved"] >= 1
    run.wait_batches(2)
    moved = run.command("rebalance", timeout_s=300, planner="ding-table", tau=0.5,
                        schedule="all-at-once")
    assert moved["ok"], moved["message"]


# In the database tests' lane (make test): the dbless lane ended last (ci28: 1,195 s
# against 1,152 s), and this run is about half that difference.
@pytest.mark.database_lane
def test_a_redis_stream_through_scale_up_and_rebalance_is_counted_exactly_once(
        tmp_path: Path, spark_cluster: Any, place: Place) -> None:
    url, stream, r = place.url, place.stream, place.r
    doc = _count(url, stream, place.table)
    spec = definition.validate(doc)
    source = rs.StreamSource.from_params(spec.raw["source"])
    # Published at RATE until the reconfigurations are done: the run reads the records
    # as they come, and which are malformed is a pure function of their index.
    feed = feeder.Feed(seed=9, rate={"kind": "constant", "records_per_s": RATE},
                       keys={"kind": "zipf", "n": 300, "s": 1.0}, malformed=MALFORMED)
    run = RunnerProcess(tmp_path / "run", spark_cluster.master_url, doc, url,
                        token="redis-source", max_workers=2, initial_workers=1)
    publisher = Feeder(r, stream, feed)
    with publisher, run:
        run.wait_batches(3)
        _scale_up_rebalance(run)
        run.wait_batches(2)
        total = publisher.finish()
        # Until every published entry has been read: the last batch's end is past
        # the stream's newest entry.
        run.wait_until(lambda: run.metrics and (run.metrics[-1].get("source_end") or 0)
                       >= rs.end_offset(r, stream), 600,
                       "the run to read the whole stream")
    # The verifier reads the stream again for each batch's offsets, checks each
    # kept batch, then the table (each key's last update) and its ledger (each
    # output batch once).
    report = verify.verify(spec, run.t0, run.work / "checkpoint", run.work / "output")
    assert report.ok, report.problems
    assert report.output_rows > 0 and report.sink_rows and report.sink_rows > 100

    # Every malformed entry is a dead letter with its reason, and only those.
    kinds = feeder.malformed_kind(feed.seed, np.arange(total, dtype=np.int64), MALFORMED)
    ids = [entry_id for page in rs.entries(r, stream, 0, rs.end_offset(r, stream))
           for entry_id, _ in page]
    assert len(ids) == total
    bad_ids = {ids[i] for i in np.flatnonzero(kinds >= 0)}
    assert 0.4 * MALFORMED * total < len(bad_ids) < 2 * MALFORMED * total
    letters = r.xrange(source.dead_letter_stream)
    assert len(letters) == len(bad_ids)  # each once
    assert {f[b"source_id"] for _, f in letters} == bad_ids
    reasons = {fields[b"reason"].decode().split(":")[0] for _, fields in letters}
    assert reasons == {"no field 'value'", "field 'value' is not a double",
                       "field 'key' is not a long"}, reasons
    # And every good one was read: the verifier read again what each batch read.
    assert report.records == total - len(bad_ids)


def test_a_runner_sigkilled_mid_run_resumes_and_writes_each_batch_to_postgres_once(
        tmp_path: Path, spark_cluster: Any, place: Place) -> None:
    """The runner SIGKILLed while its batches run back to back (one is in flight: its
    rows may be in the table already, its commit not yet in the checkpoint), then a new
    runner on the same checkpoint and clock: it runs that batch again, the ledger tells
    the sink it was written, and the table holds every key's count once."""
    url, stream, table, r = place.url, place.stream, place.table, place.r
    doc = _count(url, stream, table)
    spec = definition.validate(doc)
    feed = feeder.Feed(seed=5, rate={"kind": "constant", "records_per_s": RATE},
                       keys={"kind": "zipf", "n": 300, "s": 1.0})
    work = tmp_path / "run"
    with Feeder(r, stream, feed) as publisher:
        first = RunnerProcess(work, spark_cluster.master_url, doc, url, token="killed")
        with first:
            first.wait_batches(4)
            t0 = first.t0
            assert first.proc is not None
            # Killed, if it can be caught within 60 s, between a batch's write to the
            # table and Spark's commit of it (the case the ledger is for); else at once.
            caught = _in_flight(table, t0, work / "checkpoint", within_s=60)
            os.kill(first.proc.pid, signal.SIGKILL)
            first.proc.wait(30)
        ledger = _ledger(table, t0)
        committed = _committed(work / "checkpoint")
        again = RunnerProcess(work, spark_cluster.master_url, doc, url, token="resumed",
                              t0=t0)
        with again:
            again.wait_batches(3)
            publisher.finish()
            again.wait_until(lambda: again.metrics
                             and (again.metrics[-1].get("source_end") or 0)
                             >= rs.end_offset(r, stream), 600,
                             "the resumed run to read the whole stream")
    print(f"at the kill: {len(committed)} batches committed, {len(ledger)} in the "
          f"table's ledger (a batch written and not committed caught: {caught})")
    report = verify.verify(spec, t0, work / "checkpoint", work / "output")
    assert report.ok, report.problems
    assert report.sink_rows and report.sink_rows > 100
    # The ledger holds exactly the committed batches: none written twice (its key),
    # none written that the checkpoint did not commit in the end.
    assert set(_ledger(table, t0)) == _committed(work / "checkpoint")


def test_nexmark_q5_from_a_redis_stream_into_postgres_through_scale_up_rebalance_and_replan(
        tmp_path: Path, spark_cluster: Any, place: Place) -> None:
    """NEXMark Q5 (hot items) on Beam's events as the feeder publishes them into a Redis
    stream (``--events nexmark``), 1 % malformed, read from the stream's end at the
    start (``start: latest``: older entries are not the run's), through a scale-up with
    migration, a rebalance and a seamless re-plan whose replay starts at the entry IDs
    of its state horizon (``gloss.offset_times``), into a PostgreSQL table. The verifier
    reads the run's range of the stream again, computes Beam's Q5 over it and compares
    the table's rows, and each output batch in the ledger once."""
    from pipelines.nexmark import queries

    url, stream, r = place.url, place.stream, place.r
    r.xadd(stream, {"type": "bid", "note": b"before the run: not read"})
    doc = {**queries.definition(
        "Q5", RATE, key_groups=2,
        stream={"type": "redis_stream", "url": url, "stream": stream, "start": "latest"},
        to={"type": "postgres", "url": PG_URL, "table": place.table}), "trigger_ms": 2000}
    spec = definition.validate(doc)
    feed = feeder.Feed(seed=3, rate={"kind": "constant", "records_per_s": RATE},
                       keys={"kind": "uniform", "n": 1}, malformed=MALFORMED,
                       events="nexmark")
    run = RunnerProcess(tmp_path / "run", spark_cluster.master_url, doc, url,
                        token="q5-stream", max_workers=2, initial_workers=1)
    publisher = Feeder(r, stream, feed)
    with run:
        run.wait_until(lambda: (run.work / "source-start.json").exists(), 120,
                       "the run to pin its start")
        with publisher:
            run.wait_batches(2)
            _scale_up_rebalance(run)
            run.wait_batches(2)
            replan = run.command("replan", timeout_s=600, key_groups=4, scheme="seamless")
            assert replan["ok"], replan["message"]
            assert replan["snapshot_rows"] > 0  # the horizon's entries replayed
            assert replan["state_built_in"] == "application" and replan["seed_s"] is None
            run.wait_until(lambda: any(m["generation"] == 1 and m["output_rows"]
                                       for m in run.metrics), 240,
                           "the new generation to write windows")
            total = publisher.finish()
        run.wait_until(lambda: run.metrics and (run.metrics[-1].get("source_end") or 0)
                       >= rs.end_offset(r, stream), 600,
                       "the run to read the whole stream")
    from pipelines.runtime import connectors

    spec = connectors.pin_start(spec, run.work, create=False)
    assert connectors.start_offset(spec) > 0
    report = verify.verify(spec, run.t0, run.work / "checkpoint", run.work / "output")
    assert report.ok, report.problems
    # Windows closed in every phase (Q5 lists a window's top auctions: a few rows each).
    assert report.compared_rows >= 3 and report.sink_rows and report.sink_rows >= 3
    # Every malformed event is a dead letter (and the entry before the run is not read).
    kinds = feeder.malformed_kind(feed.seed, np.arange(total, dtype=np.int64), MALFORMED)
    source = rs.stream_source(spec)
    assert r.xlen(source.dead_letter_stream) == int((kinds >= 0).sum())
    assert report.records == total - int((kinds >= 0).sum())


def _ledger(table: str, t0: float) -> dict[int, int]:
    from pipelines.runtime.connectors.postgres_sink import PostgresSink

    sink = PostgresSink.for_run({"url": PG_URL, "table": table}, t0, ("key",))
    with sink.connect() as conn:
        return sink.written_epochs(conn)


def _committed(checkpoint: Path) -> set[int]:
    return set(verify.read_log(checkpoint / "commits"))


def _in_flight(table: str, t0: float, checkpoint: Path, within_s: float) -> bool:
    """Wait until the table's ledger holds a batch the checkpoint has not committed (its
    rows written, Spark's commit to come); False if that was not seen in ``within_s``."""
    import time

    from pipelines.runtime.connectors.postgres_sink import PostgresSink

    sink = PostgresSink.for_run({"url": PG_URL, "table": table}, t0, ("key",))
    deadline = time.monotonic() + within_s
    with sink.connect() as conn:
        conn.autocommit = True
        while time.monotonic() < deadline:
            if set(sink.written_epochs(conn)) - _committed(checkpoint):
                return True
            time.sleep(0.002)
    return False
