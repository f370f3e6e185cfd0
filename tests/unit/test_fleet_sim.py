"""Several runs on one cluster in the simulator (control/sim/fleet.py): the arbiters on
the same arrivals, the guards and plug-ins on the simulated clock, clear errors."""
from __future__ import annotations

import copy

import pytest

from control.sim import fleet as fleetsim
from control.sim.workloads import ScenarioError


def _doc(**changes) -> dict:
    doc = copy.deepcopy(fleetsim.EXAMPLE)
    doc.update(changes)
    return doc


def _run(result: dict, arbiter: str, name: str) -> dict:
    block = next(r for r in result["results"] if r["arbiter"] == arbiter)
    return next(r for r in block["runs"] if r["name"] == name)


def test_the_priority_arbiter_moves_a_core_to_the_high_priority_run_and_fcfs_does_not() -> None:
    result = fleetsim.simulate_fleet(_doc())
    assert [r["arbiter"] for r in result["results"]] == ["priority", "fcfs"]
    for block in result["results"]:
        assert max(block["cores_used"]) <= result["cores"]  # never over the cluster
    payments = _run(result, "priority", "payments")["series"]
    reports = _run(result, "priority", "reports")["series"]
    # The rate steps at 60 s; within 3 control steps of asking for a second worker the
    # high-priority run has it, and the low-priority run gave one back.
    asked = next(t for t in range(60, 120) if payments["asked"][t] > 1)
    assert max(payments["workers"][asked:asked + 4]) >= 2
    assert min(reports["workers"][asked:asked + 4]) == 1
    assert _run(result, "priority", "reports")["summary"]["preempted"] >= 1
    assert any("preempted" in why for why in _run(result, "priority", "reports")["reasons"])
    fcfs = _run(result, "fcfs", "payments")
    assert max(fcfs["series"]["workers"]) == 1 and fcfs["summary"]["refused"] > 0
    totals = {r["arbiter"]: r["summary"] for r in result["results"]}
    assert totals["fcfs"]["preemptions"] == 0
    # What the priorities are for: fewer violations where they weigh most.
    assert totals["priority"]["weighted_violations"] < totals["fcfs"]["weighted_violations"]
    assert _run(result, "priority", "payments")["summary"]["latency_violations"] < \
        fcfs["summary"]["latency_violations"]


def _falling_run(start: str, plugins: list[str]) -> dict:
    run = {"name": "falling", "priority": 1, "decision_plugins": plugins,
           "strategy": {"name": "lat-node"},
           "workload": {"rate": {"kind": "step", "before": 1500, "after": 200, "at_s": 20},
                        "keys": {"kind": "zipf", "n": 64, "s": 0.5},
                        "service": {"mean_ms": 1.0}},
           "qos": {"latency_bound_ms": 5},
           "system": {"max_workers": 3, "initial_workers": 2, "freqs_ghz": [2.0]}}
    return {"steps": 60, "start": start, "cluster": {"cores": 4}, "arbiters": ["priority"],
            "runs": [run]}


def test_the_example_plugin_vetoes_scale_downs_in_the_lab_in_the_last_minutes_only() -> None:
    late = fleetsim.simulate_fleet(_falling_run("2026-12-07T10:55:00+00:00",
                                                ["quiet-hour-end"]))
    run = _run(late, "priority", "falling")
    workers = run["series"]["workers"]
    assert run["summary"]["vetoed"] > 0
    assert all(a <= b for a, b in zip(workers, workers[1:]))  # never down
    assert any("plug-in quiet-hour-end: no scale-down" in r for r in run["reasons"])
    early = fleetsim.simulate_fleet(_falling_run("2026-12-07T10:00:00+00:00",
                                                 ["quiet-hour-end"]))
    run = _run(early, "priority", "falling")
    assert run["summary"]["vetoed"] == 0
    assert run["series"]["workers"][-1] < max(run["series"]["workers"])


def test_an_excluded_period_holds_every_reconfiguration_in_the_lab() -> None:
    doc = _falling_run("2026-12-07T10:00:00+00:00", [])
    doc["runs"][0]["excluded_periods"] = ["0-30 10 * * *"]
    run = _run(fleetsim.simulate_fleet(doc), "priority", "falling")
    assert run["summary"]["excluded"] > 0 and set(run["series"]["workers"]) == {2}


@pytest.mark.parametrize("change, message", [
    ({"runs": []}, "runs: a list of 1 to 20 runs"),
    ({"arbiters": ["best"]}, "arbiters: a non-empty list of priority, fcfs"),
    ({"cluster": {"cores": 2}}, "the runs' minimum workers need 3 cores, the cluster has 2"),
    ({"start": "noon"}, "start: an ISO 8601 time"),
])
def test_bad_fleet_scenarios_are_clear_errors(change: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        fleetsim.parse_fleet(_doc(**change))


def test_errors_inside_a_run_name_its_path() -> None:
    doc = _doc()
    doc["runs"][1]["excluded_periods"] = ["61 * * * *"]
    with pytest.raises(ScenarioError, match=r"runs\[1\]\..*not a valid cron expression"):
        fleetsim.parse_fleet(doc)
    doc = _doc()
    doc["runs"][2]["decision_plugins"] = ["ghost"]
    with pytest.raises(ScenarioError, match=r"runs\[2\]\.no decision plug-in 'ghost'"):
        fleetsim.parse_fleet(doc)
    doc = _doc()
    doc["runs"][0]["strategy"] = {"name": "magic"}
    with pytest.raises(ScenarioError, match=r"runs\[0\]\.strategy\.name: one of"):
        fleetsim.parse_fleet(doc)
    doc = _doc()
    doc["runs"][0]["qos"] = {"latency_bound_ms": -1}
    with pytest.raises(ScenarioError, match=r"runs\[0\]\.qos\.latency_bound_ms"):
        fleetsim.parse_fleet(doc)
