"""The deterministic generator: pure functions of (seed, i), checked against
brute-force references."""
from __future__ import annotations

import math

import numpy as np
import pytest

from control import workload as wl
from control.workload import data_root

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass


def brute_emission_time(rates: list[float], i: int, tail: str) -> float:
    """Walk second by second until the cumulative count passes i."""
    total, s = 0.0, 0
    while True:
        r = rates[s % len(rates)] if tail == "loop" else rates[min(s, len(rates) - 1)]
        if total + r > i:
            return s + (i - total) / r
        total += r
        s += 1


@pytest.mark.parametrize("tail", ["hold", "loop"])
def test_emission_times_match_brute_force(tail: str) -> None:
    rates = [3.0, 0.0, 5.0, 2.5, 7.0]
    schedule = wl.RateSchedule(tuple(rates), tail=tail)
    seq = np.arange(0, 80)
    got = schedule.emission_times(seq)
    want = [brute_emission_time(rates, int(i), tail) for i in seq]
    assert np.allclose(got, want)
    # records_by is the inverse: exactly i records are scheduled before record i.
    for i, t in zip(seq, got):
        assert schedule.records_by(t + 1e-9) == i + 1
        assert schedule.records_by(t - 1e-9) == i


def test_records_are_pure_functions_of_seed_and_index() -> None:
    schedule = wl.RateSchedule((1000.0,))
    keys = wl.zipf_keys(50, 1.2)
    whole = wl.generate(7, 0, 10_000, schedule, keys, t0=100.0)
    parts = [wl.generate(7, a, b, schedule, keys, t0=100.0)
             for a, b in [(0, 1), (1, 4321), (4321, 10_000)]]
    for column in ("seq", "key", "value", "emit_ts"):
        assert np.array_equal(getattr(whole, column),
                              np.concatenate([getattr(p, column) for p in parts]))
    other_seed = wl.generate(8, 0, 10_000, schedule, keys, t0=100.0)
    assert not np.array_equal(whole.key, other_seed.key)
    assert whole.emit_ts[1000] == pytest.approx(101.0)


def test_key_sampling_follows_the_distribution() -> None:
    keys = wl.zipf_keys(20, 1.0)
    sample = wl.generate(1, 0, 200_000, wl.RateSchedule((1e6,)), keys, 0.0).key
    freq = np.bincount(sample, minlength=20) / len(sample)
    assert np.abs(freq - keys.probabilities()).max() < 0.005


def test_artifact_files_load() -> None:
    dist = wl.read_key_distribution(data_root() / "elastic-hft" / "probability_distribution")
    assert dist.n == 2836
    assert math.isclose(dist.probabilities().sum(), 1.0, rel_tol=1e-9)
    rates = wl.read_rate_trace(data_root() / "elastic-hft" / "random_walk_rates")
    assert len(rates) == 180 and rates[0] == 300000


def test_bad_files_give_clear_errors(tmp_path) -> None:
    bad = tmp_path / "trace"
    bad.write_text("2\n0 100\n1 abc\n")
    with pytest.raises(wl.WorkloadError, match="line 3|:3:"):
        wl.read_rate_trace(bad)
    with pytest.raises(wl.WorkloadError, match="cannot read"):
        wl.read_key_distribution(tmp_path / "missing")


def test_a_data_file_is_a_regular_file_inside_the_data_root(tmp_path, monkeypatch) -> None:
    """A definition's trace or key file: traversal, absolute paths, links out of the root,
    devices, pipes and oversized files are refused with one line, before anything
    outside the root is opened; a definition naming one is refused at that field."""
    import os

    from pipelines.runtime.spec import definition

    root = tmp_path / "data"
    (root / "traces").mkdir(parents=True)
    (root / "traces" / "ok").write_text("2\n0 100\n1 200\n")
    (root / "escape").symlink_to("/etc")
    (root / "zero").symlink_to("/dev/zero")
    os.mkfifo(root / "pipe")
    with open(root / "huge", "wb") as f:  # sparse: no disk used
        f.truncate(wl.MAX_DATA_FILE_BYTES + 1)
    monkeypatch.setenv("STREAMWISE_DATA_ROOT", str(root))
    assert wl.resolve_data_path("traces/ok") == (root / "traces" / "ok").resolve()
    assert wl.read_rate_trace(wl.resolve_data_path("traces/ok")) == [100.0, 200.0]
    refused = {
        "traces/../../../../etc/shadow": "without '..'",
        "/etc/shadow": "without '..'",
        "/dev/zero": "without '..'",
        "escape/hostname": "outside the data root",
        "zero": "outside the data root",
        "pipe": "no such file",
        "traces": "no such file",
        "traces/missing": "no such file",
        "huge": "more than the",
    }
    for name, words in refused.items():
        with pytest.raises(wl.WorkloadError, match="cannot read") as exc:
            wl.resolve_data_path(name)
        assert words in str(exc.value) and "\n" not in str(exc.value), name
    # An existing and a missing file outside the root get the same answer.
    assert str(pytest.raises(wl.WorkloadError, wl.resolve_data_path, "../etc/passwd").value) \
        .replace("passwd", "X") == str(pytest.raises(
            wl.WorkloadError, wl.resolve_data_path, "../etc/nope").value).replace("nope", "X")
    doc = {"source": {"type": "generator", "seed": 1, "partitions": 1,
                      "rate": {"kind": "trace", "file": "../../etc/shadow"},
                      "keys": {"kind": "uniform", "n": 4}},
           "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count",
                          "field": "value"}],
           "sink": {"type": "latency"}, "key_groups": 2}
    with pytest.raises(definition.DefinitionError) as bad:
        definition.validate(doc)
    assert bad.value.path == "source.rate.file" and "without '..'" in bad.value.message
    doc["source"]["rate"]["file"] = "traces/ok"
    assert definition.validate(doc).schedule().rate_at(1.5) == 200.0


def test_reader_partitions_cover_the_offsets_and_replay_identically() -> None:
    from pipelines.runtime.spec import definition
    from pipelines.runtime.query import source

    spec = definition.validate({
        "source": {"seed": 5, "partitions": 3, "rate": {"kind": "constant", "records_per_s": 50},
                   "keys": {"kind": "uniform", "n": 10}},
        "operators": [{"type": "keyed_aggregate"}]})
    reader = source.GeneratorStreamReader(source.source_options(spec, t0=1000.0))
    parts = reader.partitions({"offset": 10}, {"offset": 110})
    assert [(p.start, p.end) for p in parts] == [(10, 43), (43, 76), (76, 110)]
    rows = np.concatenate([batch.column("seq").to_numpy() for p in parts
                           for batch in reader.read(p)])
    assert np.array_equal(rows, np.arange(10, 110))
    again = [batch for p in parts for batch in reader.read(p)]
    first = [batch for p in parts for batch in reader.read(p)]
    assert all(a.equals(b) for a, b in zip(again, first))


def test_readers_of_one_source_agree_on_every_batch_end(tmp_path) -> None:
    """Two readers of the same source (a self-joined dataflow) asked at different
    instants plan the same ends: the first to plan a batch decides it."""
    import time

    from pipelines.runtime.spec import definition
    from pipelines.runtime.query import source
    from pipelines.runtime.query.source import ReadMaxRows

    spec = definition.validate({
        "source": {"seed": 5, "rate": {"kind": "constant", "records_per_s": 10_000},
                   "keys": {"kind": "uniform", "n": 10}},
        "operators": [{"type": "keyed_aggregate"}]})
    options = source.source_options(spec, t0=time.time() - 5, plan_dir=tmp_path / "plan")
    first, second = source.GeneratorStreamReader(options), source.GeneratorStreamReader(options)
    start, begins = {"offset": 0}, []
    for _ in range(3):
        a = first.latestOffset(start, ReadMaxRows(10**9))
        time.sleep(0.05)  # the clock moved: alone, the second reader would plan more
        b = second.latestOffset(start, ReadMaxRows(10**9))
        assert a == b and a["offset"] > start["offset"]
        begins.append(start["offset"])
        start = a
    # Planned ends are kept a while (a re-plan's new query may still need them), then
    # forgotten: all but the one planned last once they are older than PLAN_KEEP_S.
    plan = tmp_path / "plan"
    assert sorted(int(p.name) for p in plan.iterdir()) == begins
    import os

    for entry in plan.iterdir():
        os.utime(entry, (0, 0))
    first._prune(begins[-1])
    assert sorted(p.name for p in plan.iterdir()) == [str(begins[-1])]
