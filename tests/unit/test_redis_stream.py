"""The Redis stream connector on the real Redis, without Spark: packed entry IDs keep the
stream's order and round-trip, a range read in parts or capped at N entries reads
exactly what one read does, malformed entries become dead letters once, the feeder
publishes its workload, and a definition names a stream but never a password."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from pipelines.runtime.connectors import feed as feeder
from pipelines.runtime import connectors
from pipelines.runtime.connectors import redis_stream as rs
from pipelines.runtime.spec import definition

pytestmark = [pytest.mark.dbless]


@pytest.fixture()
def stream() -> Iterator[tuple[redis.Redis, rs.StreamSource]]:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    source = rs.StreamSource(url=url, stream=f"sw-unit-{uuid.uuid4().hex[:8]}")
    r = source.connect()
    try:
        yield r, source
    finally:
        r.delete(source.stream, source.dead_letter_stream, source.dead_letter_ids)


@given(st.integers(0, rs.MAX_MS), st.integers(0, rs.SEQ_MASK),
       st.integers(0, rs.MAX_MS), st.integers(0, rs.SEQ_MASK))
def test_packed_ids_round_trip_and_keep_the_streams_order(ms: int, seq: int, ms2: int,
                                                         seq2: int) -> None:
    a, b = rs.pack(f"{ms}-{seq}"), rs.pack(f"{ms2}-{seq2}".encode())
    assert rs.unpack(a) == f"{ms}-{seq}" and 0 <= a < 2**63
    assert (a < b) == ((ms, seq) < (ms2, seq2))
    assert rs.emit_seconds(a) == ms / 1000.0


def test_an_id_past_what_an_offset_holds_is_refused() -> None:
    with pytest.raises(rs.StreamIdError):
        rs.pack(f"1-{rs.SEQ_MASK + 1}")
    with pytest.raises(rs.StreamIdError):
        rs.pack(f"{rs.MAX_MS + 1}-0")


def test_ranges_in_parts_or_capped_read_what_one_read_does(stream) -> None:
    r, source = stream
    # Explicit IDs: several entries in one millisecond, gaps between milliseconds.
    ids = [f"{1000 + ms}-{seq}" for ms in (0, 1, 7, 30) for seq in range(4)]
    for i, entry_id in enumerate(ids):
        r.xadd(source.stream, {"key": str(i), "value": str(i / 2)}, id=entry_id)
    end = rs.end_offset(r, source.stream)
    assert end == rs.pack(ids[-1]) + 1 and rs.first_offset(r, source.stream) == rs.pack(ids[0])
    whole = rs.read_range(source, 0, end, r)
    assert [rs.unpack(s) for s in whole.seq] == ids
    assert whole.columns["key"] == list(range(len(ids)))
    for parts in (1, 2, 3, 7, 50):
        seqs = [s for a, b in rs.split(rs.pack(ids[0]), end, parts)
                for s in rs.read_range(source, a, b, r).seq]
        assert seqs == whole.seq
    begin, read = 0, []
    while begin < end:  # batches of at most 5 entries, each ending after its 5th
        stop = rs.end_after(r, source.stream, begin, 5, end)
        batch = rs.read_range(source, begin, stop, r).seq
        assert 0 < len(batch) <= 5
        read += batch
        begin = stop
    assert read == whole.seq
    assert rs.end_after(r, source.stream, end, 5, end) == end  # nothing new: no batch


def test_malformed_entries_are_dead_letters_once_with_their_reason(stream) -> None:
    r, source = stream
    good = r.xadd(source.stream, {"key": "1", "value": "2.5"})
    missing = r.xadd(source.stream, {"key": "2"})
    not_a_number = r.xadd(source.stream, {"key": "3", "value": "abc"})
    not_finite = r.xadd(source.stream, {"key": "4", "value": "inf"})
    too_long = r.xadd(source.stream, {"key": str(2**63), "value": "1"})
    parsed = rs.read_range(source, 0, rs.end_offset(r, source.stream), r)
    assert parsed.seq == [rs.pack(good)] and parsed.columns["value"] == [2.5]
    reasons = {entry_id: reason for entry_id, _, reason in parsed.dead}
    assert reasons[missing] == "no field 'value'"
    assert reasons[not_a_number].startswith("field 'value' is not a double")
    assert "finite" in reasons[not_finite] and "long's range" in reasons[too_long]
    # A later task's letters first (tasks of a batch end in any order), then all of
    # them (a retried task), then again (the batch read again after a restart).
    assert rs.write_dead_letters(r, source, parsed.dead[2:]) == 2
    assert rs.write_dead_letters(r, source, parsed.dead) == 2
    assert rs.write_dead_letters(r, source, parsed.dead[::-1]) == 0
    letters = {f[b"source_id"]: f for _, f in r.xrange(source.dead_letter_stream)}
    assert sorted(letters) == sorted([missing, not_a_number, not_finite, too_long])
    assert len(r.xrange(source.dead_letter_stream)) == 4 == rs.dead_letter_count(r, source)
    assert letters[not_a_number][b"raw:value"] == b"abc"


def test_the_feeder_publishes_its_workload_with_the_malformed_share_it_was_given(
        stream) -> None:
    r, source = stream
    feed = feeder.Feed(seed=3, rate={"kind": "constant", "records_per_s": 50_000},
                       keys={"kind": "zipf", "n": 40, "s": 1.1}, records=4000,
                       malformed=0.05)
    lines: list[str] = []
    assert feeder.publish_redis(r, source.stream, feed, say=lines.append) == 4000
    assert lines and "4,000 records" in lines[-1]
    parsed = rs.read_range(source, 0, rs.end_offset(r, source.stream), r)
    kinds = feeder.malformed_kind(3, np.arange(4000, dtype=np.int64), 0.05)
    assert len(parsed.dead) == int((kinds >= 0).sum()) and 100 < len(parsed.dead) < 300
    assert len(parsed.seq) + len(parsed.dead) == 4000
    assert set(parsed.columns["key"]) <= set(range(40))
    clock = connectors.offset_clock(definition.validate(_doc(source)), t0=0.0)
    assert clock.records_by(1e12) == rs.end_offset(r, source.stream)  # no further than the newest
    assert clock.rate_at(5.0) is None


def _doc(source: rs.StreamSource, **extra: object) -> dict:
    return {"source": {"type": "redis_stream", "url": source.url, "stream": source.stream,
                       **extra},
            "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count"}]}


@pytest.mark.parametrize(("extra", "where", "message"), [
    ({"url": "redis://:secret@127.0.0.1:6379/0"}, "source.url", "holds a password"),
    ({"url": "redis://127.0.0.1:6379/0?password=x"}, "source.url", "holds a password"),
    ({"url": "http://127.0.0.1/"}, "source.url", "must be a redis://"),
    ({"stream": ""}, "source.stream", "1-256 characters"),
    ({"fields": {"key": "long"}}, "source.fields", "needs 'value'"),
    ({"fields": {"key": "long", "value": "double", "seq": "long"}}, "source.fields.seq",
     "identifier"),
    ({"fields": {"key": "long", "value": "float"}}, "source.fields.value", "is not one of"),
    ({"seed": 3}, "source.seed", "unknown field"),
])
def test_a_stream_source_that_is_wrong_is_a_field_error(extra, where, message) -> None:
    doc = _doc(rs.StreamSource(url="redis://127.0.0.1:6379/0", stream="s"))
    doc["source"].update(extra)
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate(doc)
    assert err.value.path == where and message in err.value.message


def test_a_stream_source_round_trips_and_feeds_only_a_keyed_aggregate() -> None:
    import json

    doc = _doc(rs.StreamSource(url="redis://127.0.0.1:6379/0", stream="orders"))
    spec = definition.validate(doc)
    assert spec.source_type == "redis_stream" and "seed" not in spec.raw["source"]
    assert definition.parse(json.dumps(spec.raw)) == spec
    doc["operators"] = [{"type": "hft_window", "window": 10, "slide": 2}]
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate(doc)
    assert err.value.path == "operators[0]"


def test_a_latest_start_is_pinned_once_for_the_run(stream, tmp_path) -> None:
    """``start: latest`` reads from the stream's end when the run first starts; the
    offset is kept in the run's folder, so a restart (or the verifier) starts there
    again whatever the stream holds by then."""
    r, source = stream
    r.xadd(source.stream, {"key": "1", "value": "1"})
    spec = definition.validate({"source": {"type": "redis_stream", "url": source.url,
                                           "stream": source.stream, "start": "latest"},
                                "operators": [{"type": "keyed_aggregate"}]})
    assert connectors.start_offset(spec) == 0
    assert connectors.pin_start(spec, tmp_path, create=False) is spec  # not yet pinned
    pinned = connectors.pin_start(spec, tmp_path)
    end = rs.end_offset(r, source.stream)
    assert connectors.start_offset(pinned) == end > 0
    # A packed ID has 19 digits: it survives the JSON a Spark reader gets its spec in.
    import json

    assert connectors.start_offset(definition.parse(json.dumps(pinned.raw))) == end
    r.xadd(source.stream, {"key": "2", "value": "2"})
    again = connectors.pin_start(spec, tmp_path)  # a restart: the same offset
    assert connectors.start_offset(again) == end
    earliest = definition.validate({**spec.raw, "source": {**spec.raw["source"],
                                                           "start": "earliest"}})
    assert connectors.pin_start(earliest, tmp_path / "other") is earliest
    # Trimming what came before the run costs it nothing; trimming its own entries is
    # told (the verifier then says the run cannot be checked, not that records were lost).
    r.xtrim(source.stream, maxlen=1, approximate=False)
    assert connectors.trimmed_from_run(again, tmp_path) == 0
    r.xadd(source.stream, {"key": "3", "value": "3"})
    r.xtrim(source.stream, maxlen=1, approximate=False)
    assert connectors.trimmed_from_run(again, tmp_path) == 1


def test_a_batch_offered_twice_to_a_redis_stream_sink_is_added_once(stream) -> None:
    import pyarrow as pa

    from pipelines.runtime.connectors.redis_sink import RedisStreamSink

    r, source = stream
    sink = RedisStreamSink.for_run({"url": source.url, "stream": source.stream},
                                   1700000000.5, ("key",))
    other = RedisStreamSink.for_run({"url": source.url, "stream": source.stream},
                                    1700000999.5, ("key",))  # another run, same stream
    batch = pa.table({"key": [1, 2], "records": [1, 1], "agg": [0.25, 1.0]})
    try:
        assert sink.write(batch, 0) is True
        assert sink.write(batch, 0) is False  # a retried batch, a second generation
        assert sink.write(pa.table({"key": [2], "records": [3], "agg": [3.5]}), 1)
        assert sink.write(pa.table({"key": [], "records": [], "agg": []}), 2)
        assert other.write(batch, 0) is True
        assert sink.written_epochs() == {0: 2, 1: 1, 2: 0}
        assert r.xlen(source.stream) == 5
        latest = sink.latest().set_index("key")
        assert latest.loc[2, "records"] == 3 and latest.loc[2, "agg"] == 3.5
        assert latest.loc[1, "agg"] == 0.25 and len(latest) == 2
    finally:
        r.delete(sink.ledger)


def _q5_on(source: rs.StreamSource, **stream: object) -> dict:
    from pipelines.nexmark import queries

    return queries.definition("Q5", 1000, stream={"type": "redis_stream", "url": source.url,
                                                  "stream": source.stream, **stream})


def test_nexmark_events_published_into_a_stream_read_back_as_the_generator_makes_them(
        stream) -> None:
    """``--events nexmark``: each event an entry of its own fields; read back with the
    fields a NEXMark stream declares (a kind's others absent, not dead letters), they are
    Beam's events, stamped with their scheduled times; the malformed ones are dead
    letters with the reason."""
    from pipelines.nexmark import generator as gen
    from pipelines.runtime.verify import verifier

    r, source = stream
    feed = feeder.Feed(seed=3, rate={"kind": "constant", "records_per_s": 50_000},
                       keys={"kind": "uniform", "n": 1}, records=3000, malformed=0.03,
                       events="nexmark")
    assert feeder.publish_redis(r, source.stream, feed, say=lambda _m: None) == 3000
    spec = definition.validate(_q5_on(source))
    parsed = rs.read_range(rs.stream_source(spec), 0, rs.end_offset(r, source.stream), r)
    kinds = feeder.malformed_kind(3, np.arange(3000, dtype=np.int64), 0.03)
    assert len(parsed.dead) == int((kinds >= 0).sum()) > 30
    assert {reason.split(":")[0] for _i, _raw, reason in parsed.dead} == {
        "no field 'dateTime'", "field 'dateTime' is not a long", "field 'type' is not a string"}
    events = verifier._stream_events(spec, rs.end_offset(r, source.stream))
    config = gen.NexmarkConfig.at_rate(50_000)
    good = np.flatnonzero(kinds < 0)
    assert len(events) == len(good)
    for i in (0, 1, len(good) // 2, len(good) - 1):
        want = gen.event(int(good[i]), config, timestamp_ms=events[i]["dateTime"])
        assert events[i] == want


def test_a_dataflow_reads_a_stream_of_events_or_fields_and_sinks_into_a_table() -> None:
    src = rs.StreamSource(url="redis://127.0.0.1:6379/0", stream="s")
    doc = _q5_on(src, start="latest")
    doc["nodes"][-1]["to"] = {"type": "postgres", "url": "postgres://u@h/db", "table": "q5"}
    spec = definition.validate(doc)
    assert spec.source_type == "redis_stream" and definition.nexmark_events(spec)
    assert spec.sink == {"type": "postgres", "keep_output": True, "url": "postgres://u@h/db",
                         "table": "q5"}
    assert spec.sink_key_columns == ()  # Q5's windows are appended
    assert "dateTime" in spec.graph.source.columns
    # A stream of declared fields: its columns, event time the broker's timestamp.
    fields = {"nodes": [
        {"id": "in", "type": "redis_stream", "url": src.url, "stream": "s",
         "fields": {"sensor": "string", "reading": "double"}},
        {"id": "per", "type": "keyed_aggregate", "input": "in", "key": ["sensor"],
         "aggregates": {"total": ["sum", "reading"]}},
        {"id": "out", "type": "sink", "input": "per",
         "to": {"type": "redis_stream", "url": src.url, "stream": "totals"}}]}
    spec = definition.validate(fields)
    assert set(spec.graph.source.columns) == {"seq", "sensor", "reading", "emit_ts",
                                              "event_time"}
    assert spec.sink_key_columns == ("sensor",)
    for bad, where, message in [
        ({"events": "tpch"}, "nodes[0] (events).events", "is not one of"),
        ({"fields": {"a": "long"}}, "nodes[0] (events).events", "not both"),
        ({"seed": 1}, "nodes[0] (events).seed", "unknown field"),
    ]:
        with pytest.raises(definition.DefinitionError) as err:
            definition.validate(_q5_on(src, **bad))
        assert err.value.path == where and message in str(err.value)
    doc = _q5_on(src)
    doc["nodes"][-1]["to"] = {"type": "postgres", "url": "postgres://u:pw@h/db", "table": "t"}
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate(doc)
    assert err.value.path == "nodes[4] (out).to.url" and "password" in str(err.value)
    doc["nodes"][-1]["to"] = {"type": "latency"}
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate(doc)
    assert err.value.path == "nodes[4] (out).to.type"


def test_a_replay_starts_at_the_entry_ids_of_the_state_horizon() -> None:
    """A re-planned windowed query over a Redis stream replays from the entry ID whose
    time is the state horizon before the switch (the IDs carry the broker's clock); a
    JetStream sequence carries none, which the form says before a run starts."""
    from pipelines.runtime.replan import gloss

    src = rs.StreamSource(url="redis://127.0.0.1:6379/0", stream="s")
    spec = definition.validate(_q5_on(src))
    horizon, _ = spec.graph.state_horizon(spec.watermark_s)
    at_ms = 1_800_000_000_000
    start = rs.pack(f"{at_ms}-7")
    replay = gloss.replay_start(spec, start, t0=0.0)
    assert replay == rs.pack(f"{at_ms - int((horizon + gloss.REPLAY_MARGIN_S) * 1000)}-0")
    assert gloss.replan_refusal(spec) is None
    pinned = definition.with_source_doc(spec, {**spec.source_doc, "start_offset": start - 5})
    assert gloss.replay_start(pinned, start, t0=0.0) == start - 5  # not before the run's
    jet = definition.validate(queries_on_jetstream())
    assert "carry no time" in (gloss.replan_refusal(jet) or "")


def queries_on_jetstream() -> dict:
    from pipelines.nexmark import queries

    return queries.definition("Q5", 1000, stream={"type": "jetstream",
                                                  "url": "nats://127.0.0.1:4222",
                                                  "stream": "EVENTS"})


def test_a_pipeline_modules_input_is_read_again_from_the_stream(stream) -> None:
    """What the verifier gives a pipeline module's reference run when its source is a
    stream: the entries of the range, as the run's source presents them (``seq``, the
    declared fields, ``emit_ts`` and ``event_time`` from the entry's time)."""
    from pipelines.runtime.verify import verifier

    r, source = stream
    ids = [f"{1_700_000_000_000 + i}-0" for i in range(5)]
    for i, entry_id in enumerate(ids):
        r.xadd(source.stream, {"key": str(i % 2), "value": str(i * 1.5)}, id=entry_id)
    spec = definition.validate({
        "app": "streamwise_example_ops.jobs:customer_totals",
        "source": {"type": "redis_stream", "url": source.url, "stream": source.stream,
                   "fields": {"key": "long", "value": "double"}, "start": "earliest"}})
    frame = verifier.python_frames(spec, 0.0, 0, rs.end_offset(r, source.stream))["source"]
    assert frame["key"].tolist() == [0, 1, 0, 1, 0]
    assert frame["value"].tolist() == [0.0, 1.5, 3.0, 4.5, 6.0]
    assert [rs.unpack(s) for s in frame["seq"]] == ids
    assert frame["event_time"].iloc[0] == pd.Timestamp(1_700_000_000, unit="s")
