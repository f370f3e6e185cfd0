"""The simulator against first principles: conservation, the zero-load latency, Eq. 6.4
in steady state, determinism, and bad scenarios rejected with one line."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from control import sim
from control import sysmodel as sm
from control.sim import engine as en
from control.strategies.mpc import Config

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass


def _hold(m: en.Measurement, current: Config) -> tuple[Config, None]:
    return current, None


def _scenario(**changes) -> en.Scenario:
    doc = {"steps": 30, "seed": 3,
           "workload": {"rate": {"kind": "constant", "rate": 4000}, "keys": {"kind": "zipf",
                        "n": 200, "s": 0.7}, "service": {"mean_ms": 0.5, "per_key_cv": 0.5},
                        "arrivals": "fluid"},
           "system": {"max_workers": 8, "initial_workers": 4}}
    for key, value in changes.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return sim.parse_scenario(doc)


@pytest.mark.parametrize("strategy", ["th-rule", "lat-node", "spl"])
def test_records_are_conserved_under_overload_and_reconfiguration(strategy: str) -> None:
    doc = {"steps": 60, "seed": 5,
           "workload": {"rate": {"kind": "spike", "base": 6000, "peak": 30000, "at_s": 10,
                                 "length_s": 20}},
           "system": {"max_workers": 8, "initial_workers": 2},
           "strategies": [{"name": strategy}]}
    res = sim.simulate(doc)["results"][0]
    assert res["conservation_error"] < 1e-12
    series = res["series"]
    assert max(series["queued"]) > 0, "the spike must overload the operator"
    assert any(series["throughput_violation"])
    total_in = sum(series["n_in"])
    # (the series are rounded to 6 decimals for JSON)
    assert total_in == pytest.approx(sum(series["n_out"]) + series["queued"][-1], rel=1e-9)


def test_latency_is_the_service_time_when_utilisation_goes_to_zero() -> None:
    scn = _scenario(workload={"rate": {"kind": "constant", "rate": 0.01},
                              "service": {"mean_ms": 0.7, "per_key_cv": 0.0}})
    result = en.run(scn, "hold", _hold)
    for step in result.steps:
        assert step.latency_ms == pytest.approx(0.7, rel=1e-6)


def test_utilisation_matches_eq_6_4_in_steady_state() -> None:
    scn = _scenario()
    simulation = en.Simulation(scn)
    for t in range(5):
        _, info = simulation.step(t)
    rate = float(scn.rates[0])
    p, times = scn.p.tolist(), scn.t_k.tolist()
    routing = simulation.routing.tolist()
    for i in range(simulation.n):
        expected = sm.worker_utilisation(1.0 / rate, p, times, routing, i)  # Eq. 6.4
        assert info["rho"][i] == pytest.approx(expected, rel=1e-9)


def test_frequency_scales_the_service_time() -> None:
    scn = _scenario(workload={"rate": {"kind": "constant", "rate": 0.01},
                              "service": {"mean_ms": 0.6, "per_key_cv": 0.0}})

    def slow(m: en.Measurement, current: Config) -> tuple[Config, None]:
        return Config(current.workers, 1.2), None

    result = en.run(scn, "slow", slow)
    assert result.steps[-1].latency_ms == pytest.approx(0.6 * 2.0 / 1.2, rel=1e-6)
    assert result.steps[-1].power_w < result.steps[0].power_w


def test_same_seed_same_result_different_seed_different_arrivals() -> None:
    doc = {"steps": 40, "seed": 11, "strategies": [{"name": "lat-power", "horizon": 2},
                                                   {"name": "ds2"}]}
    a, b = sim.simulate(doc), sim.simulate(json.loads(json.dumps(doc)))
    for ra, rb in zip(a["results"], b["results"], strict=True):
        assert ra["series"] == {**rb["series"], "solve_ms": ra["series"]["solve_ms"]}
        assert {k: v for k, v in ra["summary"].items() if k != "solve_ms_p95"} == \
            {k: v for k, v in rb["summary"].items() if k != "solve_ms_p95"}
    c = sim.simulate({**doc, "seed": 12})
    assert c["results"][0]["series"]["n_in"] != a["results"][0]["series"]["n_in"]


def test_strategies_share_the_same_arrivals() -> None:
    out = sim.simulate({"steps": 30, "strategies": [{"name": "th-rule"}, {"name": "peak-load"}]})
    assert out["results"][0]["series"]["n_in"] == out["results"][1]["series"]["n_in"]


def test_thesis_metrics_count_reconfigurations_and_amplitude() -> None:
    recs = [en.StepRecord(t, 1, None, n, f, 100, 100 * r, 1, 0.5, 10, 0, 0, 0, 0.1,
                          r < 0.95, False)
            for t, (n, f, r) in enumerate([(4, 2.0, 1), (4, 2.0, 0.9), (6, 2.0, 1),
                                           (6, 1.8, 1), (6, 1.8, 1)])]
    s = en.summarise(recs, _scenario())
    assert s["reconfigurations"] == 2
    assert s["mean_amplitude"] == pytest.approx((2 + 2) / 2)
    assert s["throughput_violations"] == 1


def _cli(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "control", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_cli_simulate_prints_series_and_summary() -> None:
    out = _cli("simulate", stdin=json.dumps({"steps": 10, "strategies": [
        {"name": "lat-node", "horizon": 2}, {"name": "th-rule"}]}))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [r["label"] for r in doc["results"]] == ["lat-node Sw h=2", "th-rule"]
    assert len(doc["results"][0]["series"]["workers"]) == 10
    assert doc["power"].startswith("modelled")


@pytest.mark.parametrize("doc,words", [
    ("{", "invalid JSON"),
    ("[]", "JSON object"),
    ('{"steps": -1}', "steps"),
    ('{"strategies": [{"name": "magic"}]}', "strategies[0].name"),
    ('{"strategies": [{"name": "lat-node", "horizon": 9}]}', "horizon"),
    ('{"workload": {"rate": {"kind": "step", "before": 1}}}', "workload.rate.after"),
    ('{"workload": {"rate": {"kind": "trace", "rates": [1, -2]}}}', "rates[1]"),
    ('{"system": {"min_workers": 5, "max_workers": 2}}', "min_workers"),
    ('{"qos": {"latency_bound_ms": 0}}', "latency_bound_ms"),
])
def test_cli_rejects_bad_scenarios_with_one_line(doc: str, words: str) -> None:
    out = _cli("simulate", stdin=doc)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines


def test_csv_trace_upload_parses_and_rejects() -> None:
    from control.sim import workloads as wl

    assert wl.parse_csv_trace("second,rate\n0,100\n1,250.5\n") == [100.0, 250.5]
    with pytest.raises(sim.ScenarioError, match="row 3"):
        wl.parse_csv_trace("rate\n1\nx\n")
    assert np.isclose(wl.key_distribution({"kind": "file"}).sum(), 1.0)


def test_paced_migration_lowers_the_latency_spike_not_the_capacity_loss() -> None:
    spikes, outputs = {}, {}
    for pace in ("all-at-once", "batched", "fluid"):
        res = sim.simulate({"steps": 4, "workload": {"rate": {"kind": "constant", "rate": 8000}},
                            "system": {"migration_schedule": pace, "initial_workers": 6,
                                       "migration_s_per_key": 2e-4},
                            "strategies": [{"name": "th-rule"}]})["results"][0]["series"]
        assert res["moved_keys"][1] > 10  # th-rule scaled 6 -> 5 after step 0
        spikes[pace], outputs[pace] = res["latency_ms"][1], res["n_out"][1]
    assert spikes["all-at-once"] > 2 * spikes["batched"]
    assert spikes["batched"] == pytest.approx(spikes["fluid"])
    assert outputs["all-at-once"] == outputs["batched"]
    bad = _cli("simulate", stdin='{"system": {"migration_schedule": "teleport"}}')
    assert bad.returncode == 2 and "migration_schedule" in bad.stderr
