"""The plan optimiser without Spark: Python operators and their PEs (``pyops.py``), the
definition's ``plan``, the profile (``planopt.read_profile``) and COLA on a measured
graph checked against every chain partition (brute force)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from control import workload
from pipelines.runtime.spec import dataflow
from pipelines.runtime.spec import definition
from pipelines.runtime.query import planopt
from pipelines.runtime.operators import catalogue as pyops


def _quotes(n: int = 3000) -> pd.DataFrame:
    spec = definition.validate(pyops.hft_split_definition(1000))
    r = workload.generate(spec.seed, 0, n, spec.schedule(), spec.key_distribution(), 1.7e9)
    return pd.DataFrame({"seq": r.seq, "key": r.key, "value": r.value, "emit_ts": r.emit_ts})


def _steps() -> list[pyops.PeStep]:
    return [pyops.PeStep(s, f"quote_{s}", {"ticks": 64} if s == "fit" else {})
            for s in pyops.HFT_STEPS]


def test_a_pe_gives_the_same_rows_however_its_input_is_split(tmp_path: Path) -> None:
    df = _quotes()
    # (operators add their columns to the frame they are given: each call its own copy)
    whole = pd.concat(list(pyops.run_pe(iter([df.copy()]), _steps())), ignore_index=True)
    pieces = [df.iloc[i:i + 700].copy() for i in range(0, len(df), 700)]
    profiler = pyops.PeProfiler(str(tmp_path), "all", _steps())
    split = pd.concat(list(pyops.run_pe(iter(pieces), _steps(), profiler)),
                      ignore_index=True)
    pd.testing.assert_frame_equal(whole, split, rtol=1e-9)
    assert {"price", "sector", "bucket_ms", "slope", "score", "message"} <= set(whole)
    lines = [json.loads(x) for f in tmp_path.glob("*.jsonl")
             for x in f.read_text().splitlines()]
    assert sum(x["rows_in"] for x in lines) == len(df)
    assert sum(x["tasks"] for x in lines) == 1
    assert all(x["ops"]["fit"]["cpu_s"] > 0 for x in lines if x["rows_in"])


def test_nexmark_bids_through_the_python_operators() -> None:
    bids = pd.DataFrame({"auction": [1.0, 2.0, 3.0, 4.0], "bidder": [7.0, 8.0, 9.0, 10.0],
                         "price": [np.nan, 99.0, 1_124.0, 1_000_000.0],
                         "extra": ["", "aeiou", None, "xyz"]})
    steps = [pyops.PeStep(s, f"bid_{s}", {"ticks": 16} if s == "fraud" else {})
             for s in ("euro", "extra", "band", "fraud", "format")]
    out = pd.concat(list(pyops.run_pe(iter([bids]), steps)), ignore_index=True)
    # Beam Query1: price * 89 / 100 in whole numbers (a missing price as 0)
    assert out["price"].tolist() == [0, 88, 1_000, 890_000]
    assert out["band"].tolist() == [0, 0, 1, 4]  # bands below 100, 1k, 10k, 100k, above
    assert out["extra_len"].tolist() == [0, 5, 0, 3]
    assert out["extra_vowels"].tolist() == [0, 5, 0, 0]
    assert out["message"][2].startswith("3:9:1000:")


def test_each_operator_is_timed_alone_in_a_fresh_process() -> None:
    """The profile's independent check: every operator of the chain gets a CPU time
    per row from a process of its own (the caller's heap not timed with it)."""
    steps = _steps()
    alone = pyops.time_chain_alone_isolated(steps, _quotes(500), 1.0, pause_s=0.05)
    assert list(alone) == list(pyops.HFT_STEPS)
    assert all(0 < v < 1e-3 for v in alone.values()), alone  # under a ms a row
    broken = [pyops.PeStep("x", "no_such_operator", {})]
    with pytest.raises(RuntimeError, match="timing the operators alone failed"):
        pyops.time_chain_alone_isolated(broken, _quotes(10), 0.1)


def test_the_plan_is_validated_against_the_graph() -> None:
    def err(plan: dict) -> str:
        with pytest.raises(definition.DefinitionError) as exc:
            definition.validate(pyops.hft_split_definition(1000, plan=plan))
        return str(exc.value)

    assert "is in two PEs" in err({"pes": [["parse", "enrich"], ["enrich", "bucket", "fit",
                                                                  "score", "format"]]})
    assert "does not read parse" in err({"pes": [["parse", "bucket"], ["enrich"], ["fit"],
                                                 ["score"], ["format"]]})
    assert "format is in no PE" in err({"pes": [["parse", "enrich", "bucket", "fit",
                                                 "score"]]})
    assert "'out' is not a python node" in err({"exlocate": [["fit", "out"]]})
    assert "must not share a PE" in err({"pes": [list(pyops.HFT_STEPS)],
                                         "exlocate": [["fit", "parse"]]})
    spec = definition.validate(pyops.hft_split_definition(1000))
    assert spec.pe_plan is not None and len(spec.pe_plan.pes) == 6  # default: unfused
    fused = definition.validate(pyops.hft_split_definition(
        1000, plan={"pes": [list(pyops.HFT_STEPS)], "partitions": 2}))
    assert fused.pe_plan == dataflow.PePlan((pyops.HFT_STEPS,), 2)
    assert fused.raw["plan"]["pes"] == [list(pyops.HFT_STEPS)]
    with pytest.raises(definition.DefinitionError, match="function"):
        doc = pyops.hft_split_definition(1000)
        doc["nodes"][4]["function"] = "quote_fitt"
        definition.validate(doc)


def _write_profile(directory: Path, per_task: float, per_byte: float,
                   cpu: dict[str, float], bytes_per_row: float = 100.0) -> None:
    """Profile lines of one PE per operator made by a known linear crossing cost."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    sizes = [(int(rng.integers(200, 5000)), int(rng.integers(1, 4))) for _ in range(20)]
    for k, op in enumerate(cpu):
        with open(directory / f"{op}.{k}.jsonl", "w") as out:
            for i, (rows, tasks) in enumerate(sizes):  # every PE sees the same rows
                moved = int(2 * rows * bytes_per_row)
                op_cpu = cpu[op] * rows
                out.write(json.dumps({
                    "t": 1000.0 + i, "pe": op, "pid": k, "tasks": tasks, "batches": tasks,
                    "cpu_s": op_cpu + per_task * tasks + per_byte * moved,
                    "rows_in": rows, "bytes_in": moved // 2, "rows_out": rows,
                    "bytes_out": moved // 2,
                    "ops": {op: {"cpu_s": op_cpu, "rows_in": rows, "rows_out": rows,
                                 "bytes_out": moved // 2}}}) + "\n")


def test_the_profile_recovers_operator_and_crossing_costs(tmp_path: Path) -> None:
    cpu = {s: c * 1e-6 for s, c in zip(pyops.HFT_STEPS, (0.5, 0.4, 0.3, 6.0, 0.4, 2.0),
                                         strict=True)}
    _write_profile(tmp_path, per_task=2e-3, per_byte=15e-9, cpu=cpu)
    prof = planopt.read_profile(tmp_path)
    per_task, per_byte = prof.crossing_costs()
    assert per_task == pytest.approx(2e-3, rel=1e-6)
    assert per_byte == pytest.approx(15e-9, rel=1e-6)
    spec = definition.validate(pyops.hft_split_definition(1000))
    assert spec.graph is not None
    rows = prof.operators["parse"].rows_in
    measured = planopt.measured_graph(spec.graph, prof, rows)
    for op, c in cpu.items():
        assert measured.cpu_per_record[op] == pytest.approx(c, rel=1e-9)
    assert planopt.read_profile(tmp_path, since=1010.0).operators["fit"].rows_in < rows


def _chain_partitions(ops: tuple[str, ...]):
    for cuts in itertools.product((False, True), repeat=len(ops) - 1):
        pes, current = [], [ops[0]]
        for op, cut in zip(ops[1:], cuts, strict=True):
            if cut:
                pes.append(tuple(current))
                current = []
            current.append(op)
        pes.append(tuple(current))
        yield pes


@pytest.mark.parametrize("exlocate", [(), (("enrich", "fit"),), (("parse", "format"),
                                                                 ("bucket", "score"))])
def test_cola_reaches_the_best_chain_partition_of_the_measured_graph(
        tmp_path: Path, exlocate: tuple) -> None:
    cpu = {s: c * 1e-6 for s, c in zip(pyops.HFT_STEPS, (0.5, 0.4, 0.3, 6.0, 0.4, 2.0),
                                         strict=True)}
    _write_profile(tmp_path, per_task=1e-3, per_byte=15e-9, cpu=cpu)
    plan = {"exlocate": [list(p) for p in exlocate]} if exlocate else None
    spec = definition.validate(pyops.hft_split_definition(1000, plan=plan))
    assert spec.graph is not None and spec.pe_plan is not None
    prof = planopt.read_profile(tmp_path)
    measured = planopt.measured_graph(spec.graph, prof, prof.operators["parse"].rows_in)
    cola = planopt.max_sustainable(spec.graph, measured, spec.pe_plan, 2, 2, "cola")
    best = max(
        (planopt.evaluate(spec.graph, measured, pes, 1.0, 2, "brute", spec.pe_plan)
         for pes in _chain_partitions(pyops.HFT_STEPS)),
        key=lambda p: p.max_rate if not any(
            any(a in pe and b in pe for pe in p.pes) for a, b in exlocate) else -1.0)
    assert cola.feasible
    assert cola.max_rate == pytest.approx(best.max_rate, rel=1e-6)
    none = planopt.max_sustainable(spec.graph, measured, spec.pe_plan, 2, 2, "none")
    assert cola.max_rate > none.max_rate
    for a, b in exlocate:
        assert all(not (a in pe and b in pe) for pe in cola.pes)


def test_a_profile_line_far_above_the_operators_median_is_left_out_of_its_steady_cost(
        tmp_path: Path) -> None:
    """One call of 84 ms among calls of ~3 ms (a full garbage collection, a first call
    in a new worker) is no cost of the operator's rows: COLA plans on the others'."""
    cpu = {s: 1e-6 for s in pyops.HFT_STEPS}
    _write_profile(tmp_path, per_task=1e-3, per_byte=15e-9, cpu=cpu)
    spiked = tmp_path / "format.spike.jsonl"
    [written] = tmp_path.glob("format.*.jsonl")
    line = json.loads(written.read_text().splitlines()[0])
    before = line["ops"]["format"]["cpu_s"]
    line["ops"]["format"]["cpu_s"] = 26 * before  # 26 µs a row against 1
    line["cpu_s"] += 25 * before
    spiked.write_text(json.dumps(line) + "\n")
    prof = planopt.read_profile(tmp_path)
    fmt = prof.operators["format"]
    steady = [(c, r) for c, r in fmt.lines if c / r < 2e-6]
    assert len(steady) == len(fmt.lines) - 1
    assert fmt.steady_cpu_s == pytest.approx(
        sum(c for c, _ in steady) / sum(r for _, r in steady) * fmt.rows_in)
    assert fmt.steady_cpu_s == pytest.approx(1e-6 * fmt.rows_in)
    assert fmt.cpu_s > 1.2 * fmt.steady_cpu_s  # the sum holds the spike
    # An operator without spikes: its steady cost is its whole cost.
    assert prof.operators["fit"].steady_cpu_s == pytest.approx(prof.operators["fit"].cpu_s)
    # Fewer than three lines: all of them, whatever they hold.
    few = planopt.OperatorProfile("x", cpu_s=3.0, rows_in=2, lines=[(1.0, 1), (2.0, 1)])
    assert few.steady_cpu_s == 3.0
