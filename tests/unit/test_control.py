"""Control library: models against hand-computed values, forecasters against reference
computations, and the three MPC solvers against each other."""
from __future__ import annotations

import dataclasses
import json
import math
import random

import numpy as np
import pytest

from control import forecasting as fc
from control import sysmodel as sm
from control.strategies import mpc

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass


def test_derived_metrics_by_hand() -> None:
    # Keys 0..2 with p = .5/.25/.25 and T = 2/4/8; key 0 on worker 0, keys 1-2 on 1.
    p, t, routing, t_a = [0.5, 0.25, 0.25], [2.0, 4.0, 8.0], [0, 1, 1], 1.0
    assert sm.worker_computation_time(p, t, routing, 0) == 2.0  # Eq. 6.1
    assert sm.worker_computation_time(p, t, routing, 1) == 6.0
    assert sm.operator_computation_time(p, t) == 4.0  # Eq. 6.2
    assert sm.worker_interarrival_time(t_a, p, routing, 1) == 2.0  # Eq. 6.3
    assert sm.worker_utilisation(t_a, p, t, routing, 0) == 1.0  # Eq. 6.4
    assert sm.worker_utilisation(t_a, p, t, routing, 1) == 3.0
    assert sm.ideal_service_time_routed(t_a, p, t, routing, 2) == 3.0  # Eq. 6.5
    assert sm.ideal_service_time(4.0, 2) == 2.0  # Eq. 6.7
    assert sm.effective_service_time(2.5, 2.0) == 2.5  # Eq. 6.6
    assert sm.scaled_computation_time(10.0, 2.0, 1.0) == 20.0  # T * f_meas / f
    assert sm.coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0


def test_kingman_and_feedback_by_hand() -> None:
    assert sm.kingman_waiting_time(2.0, 4.0, 1.0, 1.0) == pytest.approx(2.0)  # rho .5
    assert sm.kingman_waiting_time(0.8, 1.0, 0.5, 1.5) == pytest.approx(3.2)  # rho .8
    assert math.isinf(sm.kingman_waiting_time(1.0, 1.0, 1.0, 1.0))
    assert sm.feedback_factor([2, 4, 6, 8], [1, 2, 3, 4]) == pytest.approx(2.0)
    assert sm.feedback_factor([5.0, 1.0], [0.0, math.inf]) == 1.0
    assert sm.response_time(1.0, 2.0, 4.0, 1.0, 1.0, feedback=1.5) == pytest.approx(4.0)


def test_power_model_by_hand() -> None:
    model = sm.PowerModel({1.0: 1.0, 2.0: 2.0})
    assert model.voltage(1.5) == 1.5
    assert model.power(2, 1.5) == pytest.approx(2 * 1.5 * 1.5**2)  # Eq. 6.11
    assert sm.PowerModel({1.0: 1.0}, extra_cores=3, static_w=4).power(1, 1.0) == 8.0


def test_micro_batch_fixed_point_matches_iteration() -> None:
    model = sm.MicroBatchModel(overhead_s=0.2, cost_per_record_s=0.001)
    d = model.overhead_s
    for _ in range(200):  # iterate D <- o + lambda D c / n to its fixed point
        d = model.overhead_s + 500 * d * model.cost_per_record_s / 1
    assert model.batch_duration(500, 1) == pytest.approx(d) == pytest.approx(0.4)
    assert model.latency_quantile(500, 1, 0.95) == pytest.approx(0.78)
    assert math.isinf(model.batch_duration(1000, 1))
    assert model.batch_duration(1000, 2) == pytest.approx(0.4)


def test_holt_matches_a_reference_computation() -> None:
    xs = [300.0, 310.0, 305.0, 330.0, 342.0, 338.0, 360.0]
    a, b = 0.67, 0.26
    s, trend = xs[1], xs[1] - xs[0]  # reference: s_1 = x_1, b_1 = x_1 - x_0
    for x in xs[2:]:
        s_new = a * x + (1 - a) * (s + trend)
        trend = b * (s_new - s) + (1 - b) * trend
        s = s_new
    holt = fc.Holt(a, b)
    for x in xs:
        holt.observe(x)
    assert holt.forecast(3) == pytest.approx([s + trend, s + 2 * trend, s + 3 * trend])


def test_moving_average_last_value_and_mape() -> None:
    ma = fc.MovingAverage3()
    for x in (1.0, 2.0, 3.0):
        ma.observe(x)
    assert ma.forecast(3) == pytest.approx([2.0, 7 / 3, 22 / 9])
    last = fc.LastValue()
    last.observe(5.0)
    assert last.forecast(2) == [5.0, 5.0]
    assert fc.mape([100, 200, 0], [110, 180, 3]) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        fc.Holt().forecast(1)


def _random_problem(rng: random.Random) -> mpc.MpcProblem:
    workers = tuple(range(1, rng.randint(2, 5) + 1))
    freqs = tuple(sorted(rng.sample(sm.THESIS_FREQUENCIES_GHZ, rng.randint(1, 4))))
    h = rng.randint(1, 3)
    rates = tuple(rng.uniform(50_000, 500_000) for _ in range(h))
    return mpc.MpcProblem(
        worker_options=workers, freq_options=freqs,
        current=mpc.Config(rng.choice(workers), rng.choice(freqs)),
        rate_forecast=rates, comp_time_s=rng.uniform(2e-6, 12e-6), f_measured=2.0,
        ca2=rng.uniform(0.2, 2), cs2=rng.uniform(0.2, 2), feedback=rng.uniform(0.5, 2),
        qos=rng.choice(mpc.QOS_KINDS), resource=rng.choice(mpc.RESOURCE_KINDS),
        latency_bound_s=rng.uniform(5e-6, 5e-5), alpha=rng.choice([2.0, 200.0]),
        beta=0.5, gamma=rng.choice([0.0, 0.4]),
        latency_model=rng.choice(mpc.LATENCY_MODELS), batch_overhead_s=rng.uniform(1e-6, 2e-5),
        power_budget_w=rng.choice([None, rng.uniform(1.0, 8.0)]),
        transition=rng.choice([None, mpc.TransitionModel(
            executor_start_s=rng.uniform(0, 3e-5), reload_s_per_byte=rng.uniform(0, 1e-10),
            state_bytes=rng.uniform(0, 2e5))]))


def test_bnb_dp_and_exhaustive_agree_on_random_instances() -> None:
    rng = random.Random(2016)
    for _ in range(250):
        problem = _random_problem(rng)
        results = {name: mpc.decide(problem, name) for name in mpc.SOLVERS}
        best = results["exhaustive"].cost
        for name, decision in results.items():
            assert decision.cost == pytest.approx(best, rel=1e-9), (name, problem)
            plan = [mpc.Config(step.workers, step.freq_ghz) for step in decision.trajectory]
            assert plan[0] == decision.chosen
            assert sum(step.cost for step in mpc.evaluate(problem, plan)) == \
                pytest.approx(decision.cost)
        assert results["bnb"].nodes_explored <= results["bnb"].nodes_total


def test_a_costly_move_is_made_before_the_peak_or_not_for_a_short_one() -> None:
    # One worker at 2 GHz: 600 records/s is rho 0.3, 1500/s rho 0.75 (p95 7.8 s against a
    # 6-s bound); a move to 2 workers takes X = 4 s (executor start + state reload).
    base = dict(worker_options=(1, 2), freq_options=(2.0,), current=mpc.Config(1, 2.0),
                comp_time_s=5e-4, f_measured=2.0, latency_model="microbatch",
                batch_overhead_s=1.0, latency_bound_s=6.0, qos="latency", resource="node",
                gamma=0.4)
    move = mpc.TransitionModel(executor_start_s=2.0, reload_s_per_byte=1e-6,
                               state_bytes=4e6)
    assert move.seconds(1, 2) == pytest.approx(4.0) and move.seconds(2, 1) == pytest.approx(2.0)
    rising = (600.0, 1500.0, 1500.0)
    # Priced only by S, the move waits for the peak; priced with its latency, it is made
    # while latency is still low (Q is exponential: the same 4 s cost less there).
    assert mpc.decide(mpc.MpcProblem(**base, rate_forecast=rising)).chosen.workers == 1
    early = mpc.decide(mpc.MpcProblem(**base, rate_forecast=rising, transition=move))
    assert early.chosen.workers == 2
    assert early.trajectory[0].transition_cost > 0
    assert all(s.transition_cost == 0 for s in early.trajectory[1:])
    # A one-step blip: a move that takes 10 s would break the bound by more than riding
    # the blip out on one worker does.
    blip = (1500.0, 600.0, 600.0)
    slow = mpc.TransitionModel(executor_start_s=8.0, reload_s_per_byte=1e-6,
                               state_bytes=4e6)
    assert mpc.decide(mpc.MpcProblem(**base, rate_forecast=blip)).chosen.workers == 2
    assert mpc.decide(mpc.MpcProblem(**base, rate_forecast=blip,
                                     transition=slow)).chosen.workers == 1
    # Within the bound a move costs nothing: at low load, scaling down is not held back.
    down = dict(base, current=mpc.Config(2, 2.0))
    low = mpc.decide(mpc.MpcProblem(**down, rate_forecast=(300.0, 300.0), transition=slow))
    assert low.chosen.workers == 1 and low.trajectory[0].transition_cost == 0
    for solver in mpc.SOLVERS:
        assert mpc.decide(mpc.MpcProblem(**base, rate_forecast=rising, transition=move),
                          solver).cost == pytest.approx(early.cost)


def test_bnb_prunes_the_thesis_space_and_records_serialise() -> None:
    problem = mpc.MpcProblem(
        worker_options=tuple(range(1, 13)), freq_options=sm.THESIS_FREQUENCIES_GHZ,
        current=mpc.Config(6, 2.0), rate_forecast=(300_000.0, 320_000.0),
        comp_time_s=15e-6, f_measured=2.0, latency_bound_s=1.5e-3)
    decision = mpc.decide(problem, "bnb")
    assert decision.nodes_total == 108 + 108**2
    assert decision.nodes_explored < decision.nodes_total
    assert decision.cost == pytest.approx(mpc.decide(problem, "dp").cost)
    record = json.loads(json.dumps(decision.as_dict(), allow_nan=False))
    assert record["chosen"]["workers"] == decision.chosen.workers
    assert len(record["trajectory"]) == 2


def test_saturated_configurations_still_give_a_plan() -> None:
    problem = mpc.MpcProblem(worker_options=(1, 2), freq_options=(1.2, 2.0),
                             current=mpc.Config(1, 1.2), rate_forecast=(1e7,),
                             comp_time_s=1e-5, f_measured=2.0)
    decision = mpc.decide(problem, "dp")
    assert decision.chosen == mpc.Config(2, 2.0)  # the least overloaded
    assert decision.trajectory[0].utilisation > 1
    assert json.loads(json.dumps(decision.as_dict()))["trajectory"][0]["latency_s"] is None
    with pytest.raises(ValueError, match="solver must be one of"):
        mpc.decide(problem, "annealing")


@pytest.mark.parametrize("solver", ["dp", "bnb", "exhaustive"])
def test_a_slow_plan_always_beats_a_saturated_one(solver) -> None:
    # 1 worker saturated (rho 1.5), 2 workers at rho 0.75 but predicted 62 s against a
    # 0.5 s bound (feedback 4): exp(124) once outweighed INFEASIBLE·rho, and a live run
    # under a rate step was scaled down.
    problem = mpc.MpcProblem(worker_options=(1, 2), freq_options=(2.0,),
                             current=mpc.Config(2, 2.0), rate_forecast=(15_000.0, 15_000.0),
                             comp_time_s=1e-4, f_measured=2.0, feedback=4.0,
                             latency_model="microbatch", batch_overhead_s=2.0,
                             latency_bound_s=0.5)
    decision = mpc.decide(problem, solver)
    assert decision.chosen == mpc.Config(2, 2.0)
    assert decision.trajectory[0].latency_s == pytest.approx(4 * 1.95 * 2.0 / 0.25)
    # Past the cap the latency cost still rises, continuously, and stays below saturation.
    ratios = np.array([0.5, 19.9, 20.0, 20.1, 100.0, 1e6, np.inf])
    costs = mpc.latency_qos(2.0, ratios)
    assert np.all(np.diff(costs) >= 0) and costs[2] == pytest.approx(mpc.latency_qos(2.0, 20.0))
    assert mpc.latency_qos(2.0, 20.0 + 1e-9) == pytest.approx(costs[2])
    assert costs[-1] < mpc.saturated_qos(2.0, 1.0)


def test_the_power_budget_is_hard_and_microbatch_latency_follows_the_model() -> None:
    base = dict(worker_options=(1, 2, 3, 4), freq_options=(1.2, 2.0),
                current=mpc.Config(2, 2.0), rate_forecast=(1500.0,), comp_time_s=1e-3,
                f_measured=2.0, latency_model="microbatch", batch_overhead_s=0.5,
                latency_bound_s=2.0, qos="latency", resource="node")
    free = mpc.decide(mpc.MpcProblem(**base), "dp")
    rho, _tp, latency, _p, _q = mpc.predict(mpc.MpcProblem(**base), mpc.Config(2, 2.0), 1500.0)
    assert rho == pytest.approx(0.75)
    assert latency == pytest.approx(sm.MicroBatchModel(0.5, 1e-3).latency_quantile(1500, 2, 0.95))
    power = sm.power_model()  # the MPC's default
    budget = power.power(2, 1.2) + 1e-9  # only (1|2 workers, 1.2 GHz) and (1, 2.0) fit
    capped = mpc.decide(mpc.MpcProblem(**base, power_budget_w=budget), "dp")
    assert power.power(capped.chosen.workers, capped.chosen.freq_ghz) <= budget
    assert power.power(free.chosen.workers, free.chosen.freq_ghz) > budget
    # Nothing fits: the least powerful configuration, never a bigger one.
    none = mpc.decide(mpc.MpcProblem(**base, power_budget_w=0.01), "dp")
    assert none.chosen == mpc.Config(1, 1.2)


def test_vectorised_stage_costs_equal_the_scalar_model() -> None:
    rng = random.Random(7)
    for _ in range(50):
        problem = _random_problem(rng)
        configs = problem.configs()
        table = mpc.stage_costs(problem)
        for i, rate in enumerate(problem.rate_forecast):
            for j, u in enumerate(configs):
                scalar = mpc.predict(problem, u, rate)[4] + mpc.resource_cost(problem, u)
                assert table[i, j] == pytest.approx(scalar, rel=1e-12)


DECIDE = {"strategy": "lat-power", "current": {"workers": 4, "freq_ghz": 2.0},
          "workers": [1, 12], "horizon": 2, "params": {"latency_bound_s": 0.0015},
          "forecaster": {"kind": "holt", "alpha": 0.67, "beta": 0.26},
          "observation": {"rate_history": [300000, 304969, 336481, 330586],
                          "comp_time_s": 2.5e-5, "f_measured": 2.0}}


def _cli(args, stdin: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "control", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_cli_decide_prints_a_decision_record() -> None:
    done = _cli(["decide", "--solver", "bnb"], json.dumps(DECIDE))
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["strategy"] == "lat-power" and record["solver"] == "bnb"
    assert len(record["rate_forecast"]) == 2 and len(record["trajectory"]) == 2
    assert 1 <= record["chosen"]["workers"] <= 12


@pytest.mark.parametrize("doc, words", [
    ("{not json", "invalid JSON at line 1"),
    ("[]", "must be a JSON object"),
    (json.dumps(dict(DECIDE, strategy="oracle")), "strategy must be one of"),
    (json.dumps(dict(DECIDE, workers=[5, 2])), "workers must be [min, max]"),
    (json.dumps(dict(DECIDE, horizon=0)), "horizon must be a whole number"),
    (json.dumps(dict(DECIDE, params={"delta": 1})), "params may only set"),
    (json.dumps(dict(DECIDE, observation={"rate_history": []})), "rate_history"),
    (json.dumps(dict(DECIDE, forecaster={"kind": "holt", "alpha": 3})), "forecaster:"),
])
def test_cli_rejects_malformed_input_with_exit_2(doc: str, words: str) -> None:
    done = _cli(["decide"], doc)
    assert done.returncode == 2
    assert done.stdout == ""
    assert words in done.stderr and done.stderr.count("\n") == 1


def _brute_makespan(weights, workers: int) -> float:
    import itertools

    return min(max(sum(w for w, a in zip(weights, assign) if a == i) for i in range(workers))
               for assign in itertools.product(range(workers), repeat=len(weights)))


def test_balanced_is_within_graham_bound_of_brute_force() -> None:
    from control.strategies import rebalance

    rng = random.Random(11)
    for _ in range(40):
        workers = rng.randint(2, 3)
        weights = [rng.uniform(0.1, 5) for _ in range(rng.randint(3, 7))]
        result = rebalance.balanced(weights, workers)
        opt = _brute_makespan(weights, workers)
        assert opt - 1e-12 <= result.makespan <= (4 / 3 - 1 / (3 * workers)) * opt + 1e-12
        assert sum(result.loads) == pytest.approx(sum(weights))
    # By hand: {7, 6, 5, 4} on 2 workers: 7|6, 5 -> 6's worker, 4 -> 7's: 11 = OPT.
    assert rebalance.balanced([7, 6, 5, 4], 2).makespan == 11
    # LPT's classic miss: {5, 4, 3, 3, 3} gives 10 against OPT 9 (5+4 | 3+3+3),
    # inside the 7/6 bound for two workers.
    assert rebalance.balanced([5, 4, 3, 3, 3], 2).makespan == 10
    assert _brute_makespan([5, 4, 3, 3, 3], 2) == 9


def test_flux_moves_few_keys_and_stops_at_its_threshold() -> None:
    from control.strategies import rebalance

    rng = random.Random(12)
    for _ in range(60):
        weights = [rng.uniform(0.1, 3) for _ in range(12)]
        previous = [rng.randrange(4) for _ in weights]
        new_workers = rng.choice([3, 4, 5])
        result = rebalance.flux(weights, new_workers, previous, threshold=0.1)
        assert sum(result.loads) == pytest.approx(sum(weights))
        assert set(result.routing) <= set(range(new_workers))
        loads = result.loads
        donor, receiver = max(loads), min(loads)
        stuck = all(not (0 < w < donor - receiver) for k, w in enumerate(weights)
                    if loads[result.routing[k]] == donor)
        assert donor - receiver <= 0.1 * donor + 1e-12 or stuck
        fresh = rebalance.balanced(weights, new_workers, previous)
        assert len(result.moved) <= len(fresh.moved) + 12  # never worse than moving all
    # Removing worker 2: its keys go to the least-loaded survivors, others stay.
    r = rebalance.flux([1, 1, 1, 1, 2], 2, [0, 0, 1, 1, 2], threshold=0.5)
    assert r.routing[:4] == (0, 0, 1, 1) and r.moved == (4,)


def _obs(**kw):
    from control.strategies.rules import Observation

    base = dict(rate=1000.0, throughput=1000.0, utilisation=0.85, latency_s=1.0, workers=4,
                freq_ghz=2.0)
    return Observation(**{**base, **kw})


def test_rules_fire_at_their_thresholds() -> None:
    from control.strategies.rules import DS2, LatRule, PeakLoad, ThRule

    th = ThRule(theta_max=0.9, theta_min=0.8, n_max=5)
    assert th.decide(_obs(utilisation=0.91)).chosen.workers == 5
    assert th.decide(_obs(utilisation=0.90)).chosen.workers == 4  # strict >
    assert th.decide(_obs(utilisation=0.80)).chosen.workers == 4  # strict <
    assert th.decide(_obs(utilisation=0.79)).chosen.workers == 3
    assert th.decide(_obs(utilisation=0.99, workers=5)).chosen.workers == 5  # clamped

    lat = LatRule(bound_s=1.0, xi_max=1.2, xi_min=0.8)
    assert lat.decide(_obs(latency_s=1.21)).chosen.workers == 5
    assert lat.decide(_obs(latency_s=1.2)).chosen.workers == 4
    assert lat.decide(_obs(latency_s=0.79)).chosen.workers == 3
    assert "0.79 < 0.8" in lat.decide(_obs(latency_s=0.79)).reason

    assert PeakLoad(n_max=12, f_max=2.0).decide(_obs()).chosen.workers == 12

    # 4 workers at rho 0.5 process 1000/s: 500/s per worker-second of busy time, so
    # capacity 2,000/s. Flink defaults: target 0.7, boundary 0.3, max scale-down 0.6.
    ds2 = DS2(n_max=20, grace_period_s=4, control_step_s=2)
    assert ds2.target(_obs(utilisation=0.5, rate=4500.0)) == math.ceil(4500 / 350)
    assert ds2.decide(_obs(utilisation=0.5, rate=1500.0)).chosen.workers == 4  # in band
    assert ds2.decide(_obs(utilisation=0.5, rate=4500.0)).chosen.workers == 13
    low = _obs(utilisation=0.5, rate=500.0)  # target 2 < 4, out of band
    assert "grace" in ds2.decide(low).reason  # 2 s after the scale-up
    assert ds2.decide(low).chosen.workers == 2  # 4 s: allowed, floor ceil(4 * 0.4) = 2
    assert DS2(n_max=20).decide(_obs(utilisation=0.1, rate=50.0, workers=10,
                                     throughput=1000.0)).chosen.workers == 4  # max factor


def test_spl_remembers_moves_that_did_not_pay() -> None:
    from control.strategies.rules import SPL

    spl = SPL(n_max=8)
    assert spl.decide(_obs(workers=4, congestion=0.3, throughput=1000)).chosen.workers == 5
    # Still congested at 5 with nothing known about 6: try 6. Once the memory says 6
    # gave no more than 1/0.9 of today's throughput, stay; and never go back down to
    # 4, which was congested.
    at5 = spl.decide(_obs(workers=5, congestion=0.3, throughput=1010))
    assert at5.chosen.workers == 6
    spl.memory[6] = (1020.0, True)
    assert spl.decide(_obs(workers=5, congestion=0.3, throughput=1010)).chosen.workers == 5
    assert spl.decide(_obs(workers=5, congestion=0.0, throughput=1010)).chosen.workers == 5
    # A workload change (throughput at this level moves > 10 %) forgets the memory.
    assert spl.decide(_obs(workers=5, congestion=0.0, throughput=600)).chosen.workers == 4


def test_step_metrics_by_hand() -> None:
    from control.monitoring import step_metrics

    # Arrivals every 0.5 s (rate 2/s, c_a = 0); groups: 3 tuples costing 0.3 s in all
    # and 1 tuple costing 0.4 s; both groups on worker 0 of 2.
    m = step_metrics([0.0, 0.5, 1.0, 1.5, 2.0], [3, 1], [0.3, 0.4], [0, 0], 2,
                     service_times=[0.1, 0.1, 0.1, 0.4])
    assert m.rate == pytest.approx(2.0) and m.ca2 == pytest.approx(0.0)
    assert m.p == pytest.approx((0.75, 0.25)) and m.t == pytest.approx((0.1, 0.4))
    assert m.comp_time == pytest.approx(0.175)  # Eq. 6.2
    assert m.utilisation == pytest.approx((0.35, 0.0))  # T_W^0 / T_A^0 = 0.175 / 0.5
    assert m.cs2 == pytest.approx((0.15 / 0.175) ** 2)
    assert m.waiting_s is None
    timed = step_metrics([0.0, 0.5, 1.0], [1], [0.2], [0], 1, latency_s=0.5)
    assert timed.waiting_s == pytest.approx(0.3)  # R_Q - T (Eq. 6.8)
    with pytest.raises(ValueError):
        step_metrics([0.0], [1], [0.1], [0], 1)


def test_controller_applies_feedback_from_measured_latency() -> None:
    from control.strategies.controller import MpcController

    ctl = MpcController("lat-node", tuple(range(1, 13)), (2.0,), horizon=2,
                        params={"latency_bound_s": 0.002}, forecaster=fc.LastValue())
    current = mpc.Config(6, 2.0)
    first = ctl.step(current, 300_000, 2.5e-5, 1.0, 1.0)
    predicted_wq = ctl._last_prediction
    assert first.chosen.workers >= 8  # 300K/s at 25 us needs > 7.5 workers
    # Measured waiting time twice the prediction: the next problem uses e = 2.
    ctl.step(first.chosen, 300_000, 2.5e-5, 1.0, 1.0,
             measured_latency_s=2.5e-5 + 2 * predicted_wq)
    assert sm.feedback_factor(list(ctl._measured_wq), list(ctl._predicted_wq)) == \
        pytest.approx(2.0)
    assert ctl.forecast_mape == 0.0  # last-value forecast of a constant rate
    ctl.step(first.chosen, 330_000, 2.5e-5, 1.0, 1.0)
    assert ctl.forecast_mape == pytest.approx(100 * 30_000 / 330_000 / 2)
    with pytest.raises(ValueError):
        MpcController("oracle", (1,), (2.0,))


def test_node_strategies_run_at_maximum_frequency() -> None:
    from control.strategies.controller import MpcController

    freqs = sm.THESIS_FREQUENCIES_GHZ
    assert mpc.strategy_freqs("lat-node", freqs) == (2.0,)
    assert mpc.strategy_freqs("th-power", freqs) == freqs
    node = MpcController("th-node", tuple(range(1, 13)), freqs, forecaster=fc.LastValue())
    assert node.step(mpc.Config(6, 1.2), 200_000, 2.5e-5, 1, 1).chosen.freq_ghz == 2.0


def test_one_power_model_for_simulation_and_live_runs() -> None:
    from control.sim import engine
    from pipelines.runtime.host import power

    sim_power = engine.SystemModel(min_workers=1, max_workers=12).power
    for n, f in ((12, 2.0), (1, 1.2), (4, 2.45)):
        assert sim_power.power(n, f) == pytest.approx(power.modelled_power(n, f))
    assert power.modelled_power(12, 2.0) == pytest.approx(12 * sm.WATTS_PER_CORE_AT_2GHZ)
    # The watts' calibration (C_eff) never changes what a power-aware MPC decides.
    rng = random.Random(11)
    for _ in range(40):
        problem = _random_problem(rng)
        if problem.power_budget_w is not None or problem.resource != "power":
            continue
        other = dataclasses.replace(problem, power=sm.PowerModel(sm.ASSUMED_VOLTAGES,
                                                                 c_eff=1.0))
        assert mpc.decide(problem).chosen == mpc.decide(other).chosen
