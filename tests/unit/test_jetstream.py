"""The JetStream connector on the real NATS server, and the Parquet sink, without
Spark: sequences as offsets read a range the same way in parts as in one read (a
deleted message leaves a gap, not a shift), JSON payloads are typed strictly and the
ones that do not fit are dead letters once, the runner's clock remembers when the
stream grew, the feeder publishes its workload, a batch written twice to Parquet is
there once, and definitions name a stream or a relative folder but never a password or
an absolute path."""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.runtime.connectors import feed as feeder
from pipelines.runtime import connectors
from pipelines.runtime.connectors import jetstream as jsc
from pipelines.runtime.connectors.parquet_sink import ParquetSink
from pipelines.runtime.spec import definition

pytestmark = [pytest.mark.dbless]

NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")


@pytest.fixture()
def stream() -> Iterator[tuple[jsc.JetStreamClient, jsc.JetStreamSource]]:
    client = jsc.connection(NATS_URL)
    source = jsc.JetStreamSource(NATS_URL, f"SW_UNIT_{uuid.uuid4().hex[:8]}")
    jsc.ensure_stream(client, source.stream, [source.stream])
    try:
        yield client, source
    finally:
        for name in (source.stream, source.dead_letter_stream):
            try:
                client.call(client.js.delete_stream(name))
            except Exception:  # noqa: BLE001 - never made
                pass


def _publish(client: jsc.JetStreamClient, subject: str, payloads: list[bytes]) -> None:
    async def go() -> None:
        for p in payloads:
            await client.js.publish(subject, p)

    client.call(go())


def test_ranges_in_parts_read_what_one_read_does_and_a_deleted_message_is_a_gap(
        stream) -> None:
    client, source = stream
    _publish(client, source.stream,
             [json.dumps({"key": i % 5, "value": i / 2}).encode() for i in range(2500)])
    assert jsc.end_offset(client, source.stream) == 2500
    assert jsc.first_offset(client, source.stream) == 0
    whole = jsc.read(client, source.stream, 0, 2500)
    assert [m.seq for m in whole] == list(range(1, 2501))
    parts = [m for a, b in ((0, 7), (7, 1200), (1200, 2500))
             for m in jsc.read(client, source.stream, a, b)]
    assert parts == whole
    # Timestamps are the server's, in order, and recent.
    ts = [m.ts for m in whole]
    assert ts == sorted(ts) and abs(ts[-1] - time.time()) < 300
    client.call(client.js.delete_msg(source.stream, 100))
    client.call(client.js.delete_msg(source.stream, 2500))  # the range's last
    gap = jsc.read(client, source.stream, 90, 2500)
    assert [m.seq for m in gap] == [s for s in range(91, 2500) if s != 100]
    assert jsc.read(client, source.stream, 5, 5) == []


@pytest.mark.parametrize(("payload", "reason"), [
    (b'{"key": 1}', "no field 'value'"),
    (b'{"key": 1, "value": "x"}', "field 'value' is not a double"),
    (b'{"key": 1.5, "value": 2}', "field 'key' is not a long"),
    (b'{"key": true, "value": 2}', "field 'key' is not a long"),
    (b'{"key": 1, "value": 2', "not JSON"),
    (b'[1, 2]', "not a JSON object"),
    (b'\xff\xfe', "not JSON"),
])
def test_a_payload_that_does_not_fit_the_declared_fields_says_why(payload: bytes,
                                                                  reason: str) -> None:
    row, why = jsc.parse_object(payload, {"key": "long", "value": "double"})
    assert row is None and why is not None and why.startswith(reason), why
    row, why = jsc.parse_object(b'{"key": 3, "value": 4, "other": null}',
                                {"key": "long", "value": "double"})
    assert row == {"key": 3, "value": 4.0} and why is None


def test_malformed_messages_are_dead_letters_once_with_their_reason(stream) -> None:
    client, source = stream
    payloads = [b'{"key": 1, "value": 1.0}', b"{bad", b'{"key": 2}',
                b'{"key": 3, "value": 3}']
    _publish(client, source.stream, payloads)
    parsed = jsc.read_range(source, 0, 4)
    assert parsed.seq == [1, 4] and parsed.columns == {"key": [1, 3], "value": [1.0, 3.0]}
    assert [d[0] for d in parsed.dead] == [2, 3]
    assert jsc.write_dead_letters(client, source, parsed.dead) == 2
    # Read again (a retried task, a replay): nothing new.
    assert jsc.write_dead_letters(client, source, jsc.read_range(source, 0, 4).dead) == 0
    letters = jsc.dead_letters(client, source)
    assert [(x["source_seq"], x["raw"]) for x in letters] == [(2, b"{bad"),
                                                              (3, b'{"key": 2}')]
    assert letters[1]["reason"] == "no field 'value'"
    assert jsc.dead_letter_count(client, source) == 2


def test_the_clock_remembers_how_far_the_stream_reached_at_earlier_times(stream) -> None:
    client, source = stream
    spec = definition.validate({"source": {"type": "jetstream", "url": NATS_URL,
                                           "stream": source.stream},
                                "operators": [{"type": "keyed_aggregate"}]})
    t0 = time.time()
    clock = connectors.offset_clock(spec, t0)
    assert clock.rate_at(0) is None
    assert clock.records_by(time.time() - t0) == 0
    time.sleep(clock.REFRESH_S * 1.5)
    between = time.time() - t0
    time.sleep(clock.REFRESH_S * 1.5)
    _publish(client, source.stream, [b"{}"] * 10)
    time.sleep(clock.REFRESH_S * 1.5)
    assert clock.records_by(time.time() - t0) == 10
    assert clock.records_by(between) == 0  # before the messages came


def test_the_feeder_publishes_json_with_the_malformed_share_it_was_given(stream) -> None:
    client, source = stream
    feed = feeder.Feed(seed=3, rate={"kind": "constant", "records_per_s": 100_000},
                       keys={"kind": "uniform", "n": 50}, records=3000, malformed=0.05)
    lines: list[str] = []
    publisher = feeder.JetStreamPublisher(NATS_URL, source.stream)
    assert feeder.publish(publisher, source.stream, feed, say=lines.append) == 3000
    assert "3,000 records" in lines[-1]
    parsed = jsc.read_range(source, 0, 3000)
    kinds = feeder.malformed_kind(3, np.arange(3000, dtype=np.int64), 0.05)
    assert sorted(d[0] for d in parsed.dead) == [int(i) + 1 for i in np.flatnonzero(kinds >= 0)]
    assert len(parsed.seq) == int((kinds < 0).sum())
    assert set(parsed.columns["key"]) <= set(range(50))


def test_a_batch_written_twice_to_parquet_is_there_once_and_keys_take_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMWISE_FILES_ROOT", str(tmp_path))
    sink = ParquetSink.for_run({"path": "a/b"}, 1700000000.123, ("key",))
    assert sink.directory == tmp_path / "a" / "b" / "run=1700000000123"
    first = pa.table({"key": [1, 2], "records": [1, 1], "agg": [1.0, 1.0]})
    assert sink.write(first, 0) is True
    assert sink.write(first, 0) is False  # a retried batch: replaced, not added
    assert sink.write(pa.table({"key": [2], "records": [3], "agg": [3.0]}), 1) is True
    assert sink.written_epochs() == {0: 2, 1: 1}
    assert len(sink.rows()) == 3
    latest = sink.latest().set_index("key")
    assert latest.loc[2, "records"] == 3 and latest.loc[1, "records"] == 1
    assert not list(sink.directory.rglob("*.tmp"))
    import pyarrow.dataset as ds

    # Any Parquet reader sees the run and the epoch as columns (Hive partitions).
    table = ds.dataset(tmp_path / "a" / "b", partitioning="hive").to_table()
    assert table.num_rows == 3 and {"run", "epoch"} <= set(table.column_names)


@pytest.mark.parametrize(("doc", "where", "message"), [
    ({"source": {"type": "jetstream", "url": "nats://u:pw@127.0.0.1:4222", "stream": "A"}},
     "source.url", "password"),
    ({"source": {"type": "jetstream", "url": "redis://127.0.0.1:6379", "stream": "A"}},
     "source.url", "nats://"),
    ({"source": {"type": "jetstream", "url": NATS_URL, "stream": "a.b"}},
     "source.stream", "JetStream stream name"),
    ({"sink": {"type": "parquet", "path": "/etc"}}, "sink.path", "relative"),
    ({"sink": {"type": "parquet", "path": "a/../../b"}}, "sink.path", "without .."),
    ({"sink": {"type": "parquet"}}, "sink.path", "relative"),
])
def test_a_jetstream_source_or_parquet_sink_that_is_wrong_is_a_field_error(
        doc: dict, where: str, message: str) -> None:
    full = {"source": {"type": "jetstream", "url": NATS_URL, "stream": "ORDERS"},
            "operators": [{"type": "keyed_aggregate"}], **doc}
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate(full)
    assert err.value.path == where and message in str(err.value)


def test_a_jetstream_source_feeds_only_a_keyed_aggregate() -> None:
    spec = definition.validate({"source": {"type": "jetstream", "url": NATS_URL,
                                           "stream": "ORDERS"},
                                "operators": [{"type": "keyed_aggregate"}],
                                "sink": {"type": "parquet", "path": "out/orders"}})
    assert spec.source_type == "jetstream" and "seed" not in spec.raw["source"]
    assert spec.sink == {"type": "parquet", "keep_output": True, "path": "out/orders"}
    with pytest.raises(definition.DefinitionError, match="keyed_aggregate so far"):
        definition.validate({"source": {"type": "jetstream", "url": NATS_URL,
                                        "stream": "ORDERS"},
                             "operators": [{"type": "hft_window", "window": 4,
                                            "slide": 2}],
                             "state_store": "rocksdb"})
