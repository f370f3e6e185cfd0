"""The elastic runtime on the real embedded Spark cluster (1-core executors, small G,
short runs), driven over the bus like the control plane drives it: placement commands
move exactly the requested groups, every schedule and scale step keeps exactly-once
results, and scale-down migrates before it decommissions. (The HFT operator's state
across a migration is checked in ``test_replan_spark.py``, in the same run as its
re-plan.)

These tests use no database, so ``make test`` runs them once (in the PostgreSQL pass).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelines.runtime.spec import definition
from pipelines.runtime.verify import verifier as verify
from pipelines.runtime.runner.harness import RunnerProcess

pytestmark = [pytest.mark.spark, pytest.mark.dbless]

COUNT = {"source": {"type": "generator", "seed": 4, "partitions": 2,
                    "rate": {"kind": "constant", "records_per_s": 1200},
                    "keys": {"kind": "zipf", "n": 3000, "s": 0.9}},
         "operators": [{"type": "filter", "field": "value", "op": "<", "value": 950},
                       {"type": "keyed_aggregate", "key": "key", "agg": "sum",
                        "field": "value"}],
         "sink": {"type": "latency", "keep_output": True},
         "key_groups": 6}


def _runner(tmp_path: Path, cluster: Any, doc: dict, name: str, **cfg: Any) -> RunnerProcess:
    import os

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    return RunnerProcess(tmp_path / name, cluster.master_url, doc, redis_url,
                         token=f"t{name}", **cfg)


def _verified(run: RunnerProcess, doc: dict) -> verify.VerifyReport:
    report = verify.verify(definition.validate(doc), run.t0, run.work / "checkpoint",
                           run.work / "output")
    assert report.ok, report.problems
    assert report.batches >= 10 and report.output_rows > 0
    return report


def _ack(run: RunnerProcess, name: str, **args: Any) -> dict[str, Any]:
    ack = run.command(name, timeout_s=300, **args)
    assert ack["ok"], ack["message"]
    return ack


def test_scale_moves_and_rebalance_keep_exactly_once(tmp_path: Path, spark_cluster: Any) -> None:
    # Every batch must run where the table says (drift 0). Spark's delay scheduling
    # gives up on a busy preferred executor after spark.locality.wait (3 s by default)
    # and the runner then re-pins the group at the next boundary (migration.py): on a
    # loaded machine a 1-core executor's queue of four groups' tasks passes 3 s. A wait
    # longer than any batch here keeps the check about our placement, not the load.
    run = _runner(tmp_path, spark_cluster, COUNT, "elastic", max_workers=2, initial_workers=1,
                  locality_wait="120s")
    with run:
        first = run.wait_batches(3)[-1]
        assert set(first["placement"]) == {first["ran_on"][0]}  # one executor holds all

        # Scale up: the new executor receives state (placement and Spark's tasks say so).
        up = _ack(run, "set_workers", workers=2, schedule="batched")
        new = [e for e in up["executors"] if e not in first["placement"]]
        assert len(up["executors"]) == 2 and len(new) == 1
        migration = up["migration"]
        assert migration["verified"] and migration["groups_moved"] >= 1
        assert all(s["verified"] for s in migration["step_details"])
        after = run.wait_batches(2)[-1]
        assert new[0] in after["placement"] and after["ran_on"] == after["placement"]

        # Each schedule moves exactly the requested groups, and nothing else.
        for schedule in ("all-at-once", "fluid", "batched"):
            before = run.metrics[-1]["placement"]
            a, b = sorted(set(before), key=lambda e: -before.count(e))
            on_a = [g for g, e in enumerate(before) if e == a]
            on_b = [g for g, e in enumerate(before) if e == b]
            # Two groups a -> b and one b -> a: both keep groups; batched needs Δ = 2 steps.
            moves = {str(on_a[0]): b, str(on_a[1]): b, str(on_b[0]): a}
            ack = _ack(run, "move_groups", moves=moves, schedule=schedule)
            assert ack["migration"]["steps"] == {"all-at-once": 1, "fluid": 3,
                                                 "batched": 2}[schedule]
            assert ack["migration"]["groups_moved"] == len(moves)
            changed = {g for g, (x, y) in enumerate(zip(before, ack["placement"], strict=True))
                       if x != y}
            assert changed == {int(g) for g in moves}
            seen = run.wait_batches(1)[-1]
            assert seen["placement"] == ack["placement"] == seen["ran_on"]

        rebalance = _ack(run, "rebalance", planner="ding-table", tau=0.5, schedule="fluid")
        assert rebalance["plan"]["max_load"] <= rebalance["plan"]["cap"] * (1 + 1e-9) \
            or "balanced" in rebalance["plan"]["planner"]

        # Scale down: the victim's groups move first, then it is decommissioned; no
        # task fails. Planned with the MTM look-ahead on the routing table (Ding §4).
        refused = run.command("set_workers", workers=1, planner="mtm-table")
        assert not refused["ok"] and 'needs "mtm"' in refused["message"]
        mark = run.metrics[-1]["batch_id"]
        down = _ack(run, "set_workers", workers=1, schedule="fluid", planner="mtm-table",
                    mtm={"1": {"2": 1.0}, "2": {"1": 1.0}}, mtm_gamma=0.8)
        assert down["plan"]["planner"] == "mtm-table", down["plan"]
        assert len(down["executors"]) == 1 and len(down["released"]) == 1
        assert down["released"][0] not in down["migration"]["target"]
        window = run.wait_batches(3)
        assert set(window[-1]["placement"]) == set(down["executors"])
        assert sum(m.get("failed_tasks") or 0 for m in run.metrics
                   if m["batch_id"] > mark) == 0
        assert all(m.get("drift") == 0 for m in run.metrics[3:] if "drift" in m)

        refused = run.command("move_groups", moves={"0": "99"})
        assert not refused["ok"] and "not registered" in refused["message"]
        refused = run.command("set_workers", workers=5)
        assert not refused["ok"] and "1..2" in refused["message"]
    kinds = [e["type"] for e in run.events]
    assert kinds.count("migration_done") >= 6 and "decommission_refused" not in kinds
    _verified(run, COUNT)
