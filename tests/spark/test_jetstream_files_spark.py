"""Real data on the real embedded Spark cluster, beyond Redis: a NATS JetStream stream
read from its end into a Parquet dataset through a scale-up with migration, and a folder
of JSON Lines files read as they land into a Redis stream, each with 1 % of its records
malformed and each verified end to end (the sources' Redis tests: test_sources_spark.py).
No Django database; run in the database lane to balance the lanes
(conftest.DATABASE_LANE_FILES)."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from pipelines.runtime.connectors import feed as feeder
from pipelines.runtime.runner.harness import RunnerProcess
from pipelines.runtime.spec import definition
from pipelines.runtime.verify import verifier as verify
from tests.spark.test_sources_spark import MALFORMED, RATE, Feeder, _committed

pytestmark = [pytest.mark.spark, pytest.mark.dbless]


NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")


def test_a_jetstream_stream_through_a_scale_up_into_parquet_exactly_once(
        tmp_path: Path, spark_cluster: Any) -> None:
    """JetStream's sequences as offsets, its timestamps as emission times, the dead
    letters in the stream beside it, the output a Parquet dataset under the files root:
    across a scale-up with migration, the dataset holds each committed batch once and
    each key's last update equals the count over every good message. The run starts at
    the stream's end (``start: latest``): what the stream held before is not its."""
    from pipelines.runtime.connectors import jetstream as jsc
    from pipelines.runtime.connectors.parquet_sink import ParquetSink

    import shutil

    from pipelines.runtime import connectors

    # (the runner, warm since the session began, has the session's files root)
    stream = f"SW_TEST_{uuid.uuid4().hex[:8]}"
    dataset = f"tests/{stream.lower()}"
    doc = {"source": {"type": "jetstream", "url": NATS_URL, "stream": stream,
                      "start": "latest", "partitions": 2, "rate": {"kind": "constant", "records_per_s": RATE},
                      "keys": {"kind": "zipf", "n": 300, "s": 1.0}},
           "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count",
                          "field": "value"}],
           "sink": {"type": "parquet", "path": dataset, "keep_output": True},
           "key_groups": 2}
    spec = definition.validate(doc)
    feed = feeder.Feed(seed=4, rate={"kind": "constant", "records_per_s": RATE},
                       keys={"kind": "zipf", "n": 300, "s": 1.0}, malformed=MALFORMED)
    client = jsc.connection(NATS_URL)
    source = jsc.JetStreamSource(NATS_URL, stream)
    try:
        jetstream_publisher = feeder.JetStreamPublisher(NATS_URL, stream)
        before = 300  # in the stream before the run: never the run's
        feeder.publish(jetstream_publisher, stream, feeder.Feed(
            seed=1, rate={"kind": "constant", "records_per_s": 100_000},
            keys={"kind": "uniform", "n": 10}, records=before), say=lambda _m: None)
        publisher = Feeder(jetstream_publisher, stream, feed)
        run = RunnerProcess(tmp_path / "run", spark_cluster.master_url, doc,
                            os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"),
                            token="jetstream-source", max_workers=2, initial_workers=1)
        with run:
            # The run pins its start (the stream's end) before its query starts.
            pinned = run.work / connectors.SOURCE_START_FILE
            run.wait_until(pinned.exists, 300, "the run to pin its start")
            assert json.loads(pinned.read_text())["offset"] == before
            publisher.__enter__()
            run.wait_batches(3)
            up = run.command("set_workers", timeout_s=300, workers=2, schedule="batched")
            assert up["ok"], up["message"]
            assert up["migration"]["groups_moved"] >= 1
            run.wait_batches(2)
            total = publisher.finish()
            run.wait_until(lambda: run.metrics and (run.metrics[-1].get("source_end") or 0)
                           >= jsc.end_offset(client, stream), 600,
                           "the run to read the whole stream")
            # The dead-letter count reaches the run's metrics (the page's counter).
            run.wait_until(lambda: run.metrics and run.metrics[-1].get("dead_letters"),
                           120, "a dead-letter count in the run's metrics")
        spec = connectors.pin_start(spec, run.work, create=False)  # (its pinned start)
        report = verify.verify(spec, run.t0, run.work / "checkpoint", run.work / "output")
        assert report.ok, report.problems
        sink = ParquetSink.for_run(spec.sink, run.t0, ("key",))
        assert sink.directory.parent == connectors.files_root() / dataset
        assert report.sink_rows and report.sink_rows > 100
        assert set(sink.written_epochs()) == _committed(run.work / "checkpoint")

        kinds = feeder.malformed_kind(feed.seed, np.arange(total, dtype=np.int64),
                                      MALFORMED)
        bad = {before + i + 1 for i in np.flatnonzero(kinds >= 0)}  # (sequences from 1)
        letters = jsc.dead_letters(client, source)
        assert sorted(x["source_seq"] for x in letters) == sorted(bad)  # each once
        reasons = {x["reason"].split(":")[0] for x in letters}
        assert reasons == {"no field 'value'", "field 'value' is not a double",
                           "not JSON"}, reasons
        assert report.records == total - len(bad)
        assert max(m.get("dead_letters") or 0 for m in run.metrics) <= len(bad)
    finally:
        if "publisher" in locals():
            publisher.stop.set()  # (a failure before it was finished)
        shutil.rmtree(connectors.files_root() / dataset, ignore_errors=True)
        for name in (stream, source.dead_letter_stream):
            try:
                client.call(client.js.delete_stream(name))
            except Exception:  # noqa: BLE001 - never made
                pass


def test_a_folder_of_landing_files_through_a_scale_up_is_counted_exactly_once(
        tmp_path: Path, spark_cluster: Any) -> None:
    """JSON Lines files written by the feeder into a folder under the files root, two a
    second, 1 % of their lines malformed: the run reads them as they land, at most two
    per batch, through a scale-up with migration, into a Redis stream; the verifier
    reads each batch's files again (the folder's arrival manifest fixes which) and the
    output stream, and every malformed line is in the folder's dead letters once, with
    its reason."""
    import shutil

    from pipelines.runtime import connectors
    from pipelines.runtime.connectors import files

    folder = f"tests/landing-{uuid.uuid4().hex[:8]}"
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    sink_stream = f"sw-test-out-{uuid.uuid4().hex[:8]}"
    doc = {"source": {"type": "files", "path": folder, "format": "jsonl",
                      "max_files_per_trigger": 2, "partitions": 2,
                      "rate": {"kind": "constant", "records_per_s": RATE},
                      "keys": {"kind": "zipf", "n": 300, "s": 1.0}},
           "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "mean",
                          "field": "value"}],
           "sink": {"type": "redis_stream", "url": redis_url, "stream": sink_stream,
                    "keep_output": True},
           "key_groups": 2}
    spec = definition.validate(doc)
    source = files.files_source(spec)
    feed = feeder.Feed(seed=6, rate={"kind": "constant", "records_per_s": RATE},
                       keys={"kind": "zipf", "n": 300, "s": 1.0}, malformed=MALFORMED)
    try:
        publisher = Feeder(feeder.FilesPublisher(folder, "jsonl", file_s=0.5), folder,
                           feed)
        run = RunnerProcess(tmp_path / "run", spark_cluster.master_url, doc,
                            os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"),
                            token="files-source", max_workers=2, initial_workers=1)
        with publisher, run:
            run.wait_batches(3)
            up = run.command("set_workers", timeout_s=300, workers=2, schedule="batched")
            assert up["ok"], up["message"]
            run.wait_batches(2)
            total = publisher.finish()
            run.wait_until(lambda: run.metrics and (run.metrics[-1].get("source_end") or 0)
                           >= files.end_offset(source), 600,
                           "the run to read every file")
        report = verify.verify(spec, run.t0, run.work / "checkpoint", run.work / "output")
        assert report.ok, report.problems
        assert report.output_rows > 100
        # The output stream holds each committed batch once (its ledger), each key's
        # last update the mean over its records (checked by the verifier).
        assert report.sink_rows and report.sink_rows > 100
        from pipelines.runtime.connectors.redis_sink import RedisStreamSink

        out = RedisStreamSink.for_run(spec.sink, run.t0, ("key",))
        assert set(out.written_epochs()) == _committed(run.work / "checkpoint")
        letters = files.dead_letters(source)
        kinds = feeder.malformed_kind(feed.seed, np.arange(total, dtype=np.int64),
                                      MALFORMED)
        assert len(letters) == int((kinds >= 0).sum())  # each once
        assert {x["reason"].split(":")[0] for x in letters} == {
            "no field 'value'", "field 'value' is not a double", "not JSON"}
        assert report.records == total - len(letters)
        # Batches of at most two files each.
        landed = files.landed(source, look=False)
        ends = verify.end_offsets(run.work / "checkpoint")
        bounds = [0] + [ends[b] for b in sorted(ends)]
        assert len(landed) > 4 and max(b - a for a, b in zip(bounds, bounds[1:])) <= 2
    finally:
        shutil.rmtree(connectors.files_root() / folder, ignore_errors=True)
        redis.Redis.from_url(redis_url).delete(sink_stream, sink_stream + ":sink-batches")
