"""A team's own operators under Streamwise (issue 46): a pipeline of the example
package's operators (examples/streamwise-example-ops, installed like any package) runs on
the real embedded cluster, its processing elements profile themselves, COLA plans them
from the measured costs and the plan is applied by a live re-plan; the verifier applies
the same installed operators outside Spark and checks every output row."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipelines.runtime.query import planopt
from pipelines.runtime.query.dataflow_spark import pe_name, profile_dir
from pipelines.runtime.runner.harness import RunnerProcess
from pipelines.runtime.spec import definition
from pipelines.runtime.verify import verifier as verify

pytestmark = [pytest.mark.spark, pytest.mark.dbless, pytest.mark.timeout(900)]

STEPS = ("gross", "region", "receipt")


def _orders(rate: float) -> dict[str, Any]:
    return {"nodes": [
        {"id": "orders", "type": "generator", "seed": 5, "partitions": 2,
         "rate": {"kind": "constant", "records_per_s": rate},
         "keys": {"kind": "zipf", "n": 500, "s": 1.1}},
        {"id": "gross", "type": "python", "input": "orders", "function": "order_gross",
         "params": {"tax_pct": 21}},
        {"id": "region", "type": "python", "input": "gross", "function": "customer_region",
         "params": {"regions": 7}},
        {"id": "receipt", "type": "python", "input": "region", "function": "order_receipt",
         "params": {"rounds": 32}},
        {"id": "out", "type": "sink", "input": "receipt", "keep_output": True}],
        "trigger_ms": 2000}


def test_a_packages_operators_are_profiled_planned_by_cola_and_applied_live(
        tmp_path: Path, spark_cluster: Any) -> None:
    doc = _orders(1000)
    spec = definition.validate(doc)
    assert spec.graph is not None and spec.pe_plan is not None
    assert len(spec.pe_plan.pes) == 3  # one processing element per operator at first
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    run = RunnerProcess(tmp_path / "orders", spark_cluster.master_url, doc, redis_url,
                        token="tpkg", max_workers=2, initial_workers=2)
    with run:
        run.wait_batches(5)  # past the start-up backlog
        mark = len(run.metrics)
        run.wait_batches(3)
        window = run.metrics[mark:]
        records = sum(m["input_rows"] for m in window[1:])
        names = {pe_name(pe) for pe in spec.pe_plan.pes}
        profile = planopt.read_profile(profile_dir(run.work / "source-plan"),
                                       window[0]["t"], names, until=window[-1]["t"])
        measured = planopt.measured_graph(spec.graph, profile, records)
        cost = {s: profile.operators[s].steady_cpu_s / profile.operators[s].rows_in * 1e6
                for s in STEPS}
        print(json.dumps({"us_per_row": cost, "graph": measured.as_dict()}))
        # The receipt (32 rounds of SHA-256 a row) is the package's costly step.
        assert max(cost, key=cost.get) == "receipt", cost
        cola = planopt.max_sustainable(spec.graph, measured, spec.pe_plan, spec.partitions,
                                       2, "cola")
        none = planopt.max_sustainable(spec.graph, measured, spec.pe_plan, spec.partitions,
                                       2, "none")
        assert cola.feasible and len(cola.pes) < len(none.pes)
        plan = cola.pe_plan(spec.pe_plan).as_dict()
        ack = run.command("replan", timeout_s=600, scheme="seamless", plan=plan)
        assert ack["ok"], ack["message"]
        run.wait_batches(3)
        current = json.loads((run.work / "pe-plan.json").read_text())
        assert current["pes"] == plan["pes"] and current["generation"] == 1
    report = verify.verify_run_dir(run.work)
    assert report.ok, report.line()
    assert report.records > 0 and report.output_rows == report.records
