"""The plan optimiser on the real embedded Spark cluster: a running pipeline of six
Python operators (the HFT kernel split) is profiled, the profile agrees with each
operator timed on its own, COLA's plan is applied by a live re-plan, and the run's
output is checked record by record."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from control import workload
from pipelines.runtime.spec import definition
from pipelines.runtime.query import planopt
from pipelines.runtime.operators import catalogue as pyops
from pipelines.runtime.verify import verifier as verify
from pipelines.runtime.query.dataflow_spark import pe_name, profile_dir
from pipelines.runtime.runner.harness import RunnerProcess

pytestmark = [pytest.mark.spark, pytest.mark.dbless, pytest.mark.timeout(900)]

RATE = 2000.0


def _sample(spec: definition.PipelineSpec, rows: int, t0: float) -> pd.DataFrame:
    """Generated quotes with the columns a PE's batches carry (the event time too)."""
    r = workload.generate(spec.seed, 0, rows, spec.schedule(), spec.key_distribution(), t0)
    return pd.DataFrame({"seq": r.seq, "key": r.key, "value": r.value, "emit_ts": r.emit_ts,
                         "event_time": pd.to_datetime(r.emit_ts, unit="s")})


def _profile_agrees_with_the_operators_timed_alone(profiled: dict[str, float],
                                                   alone: dict[str, float]) -> None:
    """Each operator's µs a row in the run's profile against the same operator timed
    alone in a fresh process. The two are taken in different processes at different
    moments, so the machine's speed between them may differ, e.g. while another
    process takes a core: no fixed bound on one ratio holds. The machine's speed
    moves every operator's ratio alike, so each ratio is judged against their
    median; what a wrong profile does (an operator's rows or CPU given to another, a
    cost per batch read as per row) moves one ratio by far more than the factor 2
    allowed, while a busy or quiet core does not move one operator alone by 2x."""
    ratios = {s: profiled[s] / alone[s] for s in profiled}
    typical = statistics.median(ratios.values())
    for step, ratio in ratios.items():
        assert 0.5 <= ratio / typical <= 2.0, (step, ratios)
    # The heaviest operator (the fit, about twice the next) is the heaviest in both.
    assert max(profiled, key=profiled.get) == max(alone, key=alone.get), (profiled, alone)


def test_a_profiled_plan_is_optimised_and_applied_live_with_exactly_once_output(
        tmp_path: Path, spark_cluster: Any) -> None:
    doc = pyops.hft_split_definition(RATE)
    doc["trigger_ms"] = 2000
    spec = definition.validate(doc)
    assert spec.graph is not None and spec.pe_plan is not None
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    run = RunnerProcess(tmp_path / "plan", spark_cluster.master_url, doc, redis_url,
                        token="tplan", max_workers=2, initial_workers=2)
    steps = [pyops.PeStep(n, spec.graph.node(n).params["function"],
                          spec.graph.node(n).params["params"]) for n in pyops.HFT_STEPS]
    with run:
        first = run.wait_batches(8)  # past the start-up backlog
        # Each operator timed alone while the query runs on (the same machine speed),
        # on batches of the size the PEs read: a source partition's share of a batch.
        per_call = max(50, int(first[-1]["input_rows"] / spec.partitions))
        mark = len(run.metrics)
        alone = pyops.time_chain_alone_isolated(steps, _sample(spec, per_call, run.t0), 16.0)
        run.wait_batches(1)
        window = run.metrics[mark:]
        since, until = window[0]["t"], window[-1]["t"]
        records = sum(m["input_rows"] for m in window[1:])
        names = {pe_name(pe) for pe in spec.pe_plan.pes}
        profile = planopt.read_profile(profile_dir(run.work / "source-plan"), since, names,
                                       until=until)
        measured = planopt.measured_graph(spec.graph, profile, records)
        # Per row the operator read (the profile's rows; the window's source records
        # may hold a flush more or less).
        ops = profile.operators
        profiled = {s: ops[s].steady_cpu_s / ops[s].rows_in * 1e6 for s in pyops.HFT_STEPS}
        alone_us = {s: v * 1e6 for s, v in alone.items()}
        print(json.dumps({"rows_per_call": per_call, "profiled_us": profiled,
                          "alone_us": alone_us, "graph": measured.as_dict()}))
        _profile_agrees_with_the_operators_timed_alone(profiled, alone_us)
        # COLA on the measured graph beats the unfused plan, and is applied live.
        cola = planopt.max_sustainable(spec.graph, measured, spec.pe_plan, spec.partitions,
                                       2, "cola")
        # What the profile is for: the plan COLA chooses from it is the one it chooses
        # from the operators' costs timed alone.
        timed_alone = dataclasses.replace(measured, cpu_per_record={
            s: alone[s] * ops[s].rows_in / records for s in pyops.HFT_STEPS})
        assert cola.pes == planopt.max_sustainable(
            spec.graph, timed_alone, spec.pe_plan, spec.partitions, 2, "cola").pes
        none = planopt.max_sustainable(spec.graph, measured, spec.pe_plan, spec.partitions,
                                       2, "none")
        assert cola.feasible and len(cola.pes) < len(none.pes)
        assert cola.max_rate > none.max_rate
        plan = cola.pe_plan(spec.pe_plan).as_dict()
        ack = run.command("replan", timeout_s=600, scheme="seamless", plan=plan)
        assert ack["ok"], ack["message"]
        assert ack["plan"]["pes"] == plan["pes"]
        run.wait_batches(4)
        current = json.loads((run.work / "pe-plan.json").read_text())
        assert current["pes"] == plan["pes"] and current["generation"] == 1
        # The new PEs profile themselves.
        fused = planopt.read_profile(profile_dir(run.work / "source-plan"),
                                     pes={pe_name(tuple(pe)) for pe in plan["pes"]})
        assert not fused.empty
    report = verify.verify_run_dir(run.work)
    assert report.ok, report.line()
    assert report.records > 0 and report.output_rows == report.records
