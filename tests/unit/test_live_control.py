"""The closed loop's pure controller (``control/live.py``) on synthetic runner records
drawn from the micro-batch model itself: the fit recovers the model, MPC scales with
the rate, the power budget and the worker range are hard, alerts say why."""
from __future__ import annotations

import json
import math

import pytest

from control import live
from control.strategies.mpc import Config
from pipelines.runtime.host import power

pytestmark = pytest.mark.dbless
F_MAX = 2.0
OVERHEAD, COST = 0.6, 4e-4  # s per batch, s per record on one worker at f_max


def _policy(strategy: str, **kw) -> live.LoopPolicy:
    args = dict(strategy=strategy, latency_bound_s=3.0, min_workers=1, max_workers=4,
                freqs_ghz=(1.2, 1.6, 2.0), power=power.power_model(), control_step_s=4.0)
    args.update(kw)
    return live.LoopPolicy(**args)


class Fake:
    """A micro-batch engine that behaves exactly like the model (plus a little spread)."""

    def __init__(self, first_batch: int = live.WARMUP_BATCHES) -> None:
        # A run past its start-up batches unless a test says otherwise.
        self.t, self.batch, self.latest, self.end = 1000.0, first_batch, 0, 0

    def records(self, rate: float, cfg: Config, seconds: float) -> list[dict]:
        out, stop = [], self.t + seconds
        per_record = COST * F_MAX / (cfg.workers * cfg.freq_ghz)
        rho = rate * per_record
        while self.t < stop:
            jitter = 1.0 + 0.15 * math.sin(self.batch)  # batches are not all alike
            # A batch reads what is available; in steady state that is D·rate with
            # D = o/(1-rho); overloaded, the backlog grows batch after batch.
            if self.latest == self.end:  # nothing waiting: a steady batch's arrivals
                self.latest += int(rate * OVERHEAD / max(1 - rho, 0.05))
            n = self.latest - self.end
            dur = (OVERHEAD + per_record * n) * jitter
            self.t += dur
            self.end = self.latest
            self.latest += int(rate * dur)
            self.batch += 1
            out.append({"batch_id": self.batch, "t": self.t, "input_rows": n, "records": n,
                        "batch_duration_ms": dur * 1000, "latency_p95_ms": 1950 * dur,
                        "workers": cfg.workers, "frequency_ghz": cfg.freq_ghz,
                        "power_w": power.modelled_power(cfg.workers, cfg.freq_ghz),
                        "source_latest": self.latest, "source_end": self.end,
                        "scheduled_rate": rate})
        return out


def _run(strategy: str, rates: list[float], **kw) -> list[live.LiveDecision]:
    ctl = live.LiveController(_policy(strategy, **kw))
    engine, cur, out = Fake(), Config(1, F_MAX), []
    for rate in rates:
        d = ctl.step(engine.records(rate, cur, 4.0), cur)
        out.append(d)
        cur = Config(d.chosen["workers"], d.chosen["freq_ghz"])
    return out


def test_the_fit_recovers_the_batch_model() -> None:
    decisions = _run("static-max", [1500, 2500, 3500, 4500, 2000, 3000])
    last = decisions[-1].inputs
    assert last["overhead_s"] == pytest.approx(OVERHEAD, rel=0.25)
    assert last["cost_per_record_s"] == pytest.approx(COST, rel=0.25)
    assert last["rate"] == pytest.approx(3000, rel=0.1)


def test_a_lightly_loaded_run_at_one_rate_is_not_scaled_up() -> None:
    # At one rate the fit cannot separate o from c; batch jitter must not be read as
    # load (it was: rho ~0.5 at 6 % load, and the MPC added a worker for nothing).
    decisions = _run("lat-node", [150] * 12, params={"horizon": 2})
    assert [d.chosen["workers"] for d in decisions] == [1] * 12
    assert decisions[-1].inputs["utilisation"] < 0.2


def test_a_measured_slope_outlives_the_spread_that_measured_it() -> None:
    ctl = live.LiveController(_policy("static-min"))
    engine, cur = Fake(), Config(1, F_MAX)
    for rate in [400, 900, 1400, 600] + [500] * 12:
        ctl.step(engine.records(rate, cur, 4.0), cur)
    assert ctl.model.slope_measured
    # Within batch jitter of the truth; the one-rate fallback would say ~3x COST.
    assert ctl.model.cost_s == pytest.approx(COST, rel=0.5)


def test_mpc_scales_up_with_the_rate_and_back_down() -> None:
    rates = [800] * 5 + [5000] * 8 + [800] * 8
    decisions = _run("lat-node", rates, params={"horizon": 2})
    workers = [d.chosen["workers"] for d in decisions]
    assert max(workers[5:13]) >= 3 and workers[-1] <= 2, workers
    d = decisions[8]
    assert len(d.predictions) == 2 and d.cost["total"] > 0 and d.solve_ms < 1000
    assert d.model_error["mape"]["latency"] is not None
    # The fake's power is the model's own: no error is claimed for it.
    assert d.model_error["mape"]["power"] is None
    assert d.model_error["last"]["power"]["measured"] is None
    assert d.model_error["last"]["power"]["modelled"] > 0
    json.dumps(d.as_dict(), allow_nan=False)  # storable as-is


def test_power_is_scored_only_when_measured() -> None:
    ctl = live.LiveController(_policy("lat-node", params={"horizon": 1}))
    engine, cur = Fake(), Config(1, F_MAX)
    for _ in range(8):
        records = engine.records(1000, cur, 4.0)
        for r in records:  # a RAPL reading 20 % above the model
            r.update(power_w=1.2 * r["power_w"], power_source="measured")
        d = ctl.step(records, cur)
    assert d.model_error["mape"]["power"] == pytest.approx(100 * 0.2 / 1.2, rel=0.01)


def test_the_power_budget_is_never_exceeded_and_its_cost_is_said() -> None:
    budget = power.modelled_power(2, 2.0) + 0.01
    for strategy in ("lat-node", "lat-power", "th-rule", "lat-rule", "static-max"):
        decisions = _run(strategy, [800] * 3 + [6000] * 6, power_budget_w=budget)
        for d in decisions:
            assert power.modelled_power(d.chosen["workers"], d.chosen["freq_ghz"]) <= budget
        assert any("budget" in a for d in decisions for a in d.alerts), strategy


def test_the_worker_range_is_hard_and_an_unreachable_bound_is_flagged() -> None:
    decisions = _run("lat-node", [900000] * 3, max_workers=2)
    assert all(d.chosen["workers"] <= 2 for d in decisions)
    assert any("no configuration up to 2 workers" in a for d in decisions for a in d.alerts)


def test_a_read_only_frequency_reading_is_not_a_frequency_change() -> None:
    ctl = live.LiveController(_policy("lat-node"))
    d = ctl.step(Fake().records(800, Config(1, 2.0), 4.0), Config(1, 1.99615))
    assert d.current["freq_ghz"] == 2.0 and "frequency" not in d.action


def test_no_decision_on_the_start_up_batches() -> None:
    ctl = live.LiveController(_policy("lat-node"))
    engine = Fake(first_batch=0)
    early = engine.records(900_000, Config(1, 2.0), 2.0)[:3]  # a start-up spike
    d = ctl.step(early, Config(1, 2.0))
    assert d.action == "hold" and "warming up" in d.reason


def test_a_qos_alert_after_k_violating_steps_once_per_streak() -> None:
    decisions = _run("static-min", [6000] * 6, params={"violation_steps": 3})
    qos = [d.step for d in decisions for a in d.alerts if a.startswith("QoS violated")]
    assert qos == [3]


@pytest.mark.parametrize("strategy, params, field", [
    ("lat-power", {"horizon": 6}, "horizon"),
    ("lat-power", {"horizon": 1.5}, "horizon"),
    ("lat-node", {"alpha": 0}, "alpha"),
    ("lat-node", {"gamma": -1}, "gamma"),
    ("th-rule", {"theta_max": 0.5, "theta_min": 0.8}, "theta_min"),
    ("lat-rule", {"speed": 2}, "speed"),
    ("lat-node", {"forecaster": "oracle"}, "forecaster"),
    ("mystery", {}, "strategy"),
])
def test_bad_parameters_name_their_field(strategy, params, field) -> None:
    with pytest.raises(live.LoopError) as info:
        live.check_params(strategy, params)
    assert str(info.value).startswith(f"{field}:")


def _with_placement(records: list[dict], placement: list[str], loads: list[float]) -> list[dict]:
    return [{**r, "placement": placement, "group_ms": loads, "group_bytes": [1000] * len(loads)}
            for r in records]


def test_an_imbalanced_placement_is_rebalanced_once_with_the_least_state_moved() -> None:
    plan = live.plan_rebalance(_with_placement([{}], ["a", "a", "b", "b"], [100, 100, 10, 10]),
                               0.3)
    assert plan is not None and len(plan["moves"]) == 1
    (group, to), = plan["moves"].items()
    assert group in ("0", "1") and to == "b"
    assert plan["imbalance"] == pytest.approx(200 / 110 - 1)
    assert plan["planned_imbalance"] == pytest.approx(120 / 110 - 1)
    # Balanced within the threshold, or only one hot group that no move can spread: no plan.
    assert live.plan_rebalance(_with_placement([{}], ["a", "a", "b", "b"], [100, 90, 95, 80]),
                               0.3) is None
    assert live.plan_rebalance(_with_placement([{}], ["a", "a", "b", "b"], [300, 10, 10, 10]),
                               0.3) is None
    assert live.plan_rebalance(_with_placement([{}], ["a", "a", "b", "b"], [100, 100, 10, 10]),
                               0) is None  # turned off


def test_a_planned_rebalance_meets_its_cap_on_random_instances() -> None:
    import random

    rng = random.Random(7)
    for _ in range(200):
        groups, owners = rng.randint(4, 8), ["a", "b", "c"][:rng.randint(2, 3)]
        placement = [owners[g % len(owners)] for g in range(groups)]
        rng.shuffle(placement)
        loads = [rng.uniform(1, 100) for _ in range(groups)]
        plan = live.plan_rebalance(_with_placement([{}], placement, loads), 0.3)
        if plan is None:
            continue
        target = list(placement)
        for g, e in plan["moves"].items():
            assert target[int(g)] != e  # a move changes its group's owner
            target[int(g)] = e
        assert live.keyed_imbalance(target, loads) == pytest.approx(plan["planned_imbalance"])
        assert plan["planned_imbalance"] <= 0.15 + 1e-9  # the planner's cap, tau = 0.3/2
        assert set(target) == set(placement)  # same workers, each still owning a group


def test_the_controller_rebalances_when_it_holds_and_not_again_within_the_cooldown() -> None:
    ctl = live.LiveController(_policy("lat-node", params={"horizon": 2}))
    engine, cur = Fake(), Config(2, F_MAX)
    actions = []
    for _ in range(live.REBALANCE_COOLDOWN_STEPS + 1):
        records = _with_placement(engine.records(150, cur, 4.0), ["a", "a", "b", "b"],
                                  [100, 100, 10, 10])
        d = ctl.step(records, cur)
        actions.append(d.action)
        cur = Config(d.chosen["workers"], d.chosen["freq_ghz"])
    assert cur.workers == 2, actions  # the MPC holds; the placement is what is off
    assert actions[0] == "rebalance" and actions[1:-1] == ["hold"] * 4, actions
    assert actions[-1] == "rebalance"
    assert "imbalance" in d.reason and d.inputs["rebalance"]["moves"]
    json.dumps(d.as_dict(), allow_nan=False)


def test_a_decision_becomes_runner_commands_workers_first() -> None:
    commands = live.reconfiguration_commands({"workers": 1, "freq_ghz": 2.45},
                                             {"workers": 2, "freq_ghz": 2.2},
                                             "scale+frequency", None)
    assert commands == [("set_workers", {"workers": 2}), ("set_frequency", {"ghz": 2.2})]
    # The same configuration up to float noise is no command; a rebalance is its moves.
    assert live.reconfiguration_commands({"workers": 2, "freq_ghz": 2.45},
                                         {"workers": 2, "freq_ghz": 2.45 + 1e-9},
                                         "hold", None) == []
    plan = {"moves": {"3": "1"}, "imbalance": 0.5}
    assert live.reconfiguration_commands({"workers": 2, "freq_ghz": 2.0},
                                         {"workers": 2, "freq_ghz": 2.0},
                                         "rebalance", plan) == [
        ("move_groups", {"moves": {"3": "1"}, "schedule": live.REBALANCE_SCHEDULE})]


@pytest.mark.parametrize("strategy, params", [
    ("lat-node", {"horizon": 2}), ("lat-power", {"forecaster": "ma3"}),
    ("lat-node", {"forecaster": "last"}), ("th-rule", {}), ("lat-rule", {}), ("spl", {}),
    ("ds2", {}), ("peak-load", {}), ("static-min", {})])
def test_controller_state_round_trips_through_json(strategy, params) -> None:
    """A controller rebuilt from its JSON state decides exactly as the one that kept
    running (the product restores it from Redis at every tick)."""
    kept = live.LiveController(_policy(strategy, params=params))
    engine, cur = Fake(), Config(1, F_MAX)
    rates = [800, 900, 5000, 5200, 6000, 900, 700, 4000, 800, 800]
    for i, rate in enumerate(rates):
        records = engine.records(rate, cur, 4.0)
        if i >= 3:  # from here on, every step is taken by a controller restored from JSON
            text = json.dumps(kept.to_state())
            restored = live.LiveController.from_state(_policy(strategy, params=params),
                                                      json.loads(text))
            assert restored.to_state() == kept.to_state()
            twin = restored.step(records, cur)
        d = kept.step(records, cur)
        if i >= 3:
            assert twin.as_dict() | {"solve_ms": 0} == d.as_dict() | {"solve_ms": 0}
            assert restored.to_state() == kept.to_state()
        cur = Config(d.chosen["workers"], d.chosen["freq_ghz"])


def test_a_state_for_another_strategy_or_version_is_refused() -> None:
    state = live.LiveController(_policy("lat-node")).to_state()
    with pytest.raises(live.LoopError):
        live.LiveController.from_state(_policy("th-rule"), state)
    with pytest.raises(live.LoopError):
        live.LiveController.from_state(_policy("lat-node"), {**state, "version": 0})


class _MemoryLoop:
    """In-memory adapters for every port of control.controlloop.ControlLoop."""

    def __init__(self, engine: Fake, pending: str | None = None) -> None:
        self.engine, self.config, self.waiting = engine, Config(1, F_MAX), pending
        self.rate, self.state_text, self.stored, self.sent = 800.0, None, [], []
        self.new: list[dict] = []
        self.consumed_batches = 0

    def collect(self) -> list[dict]:
        self.new = self.engine.records(self.rate, self.config, 4.0) if self.rate else []
        return self.new

    def consumed(self) -> None:
        self.consumed_batches += len(self.new)

    def current(self, records: list[dict], f_max: float) -> Config:
        return self.config

    def load(self) -> dict | None:
        return json.loads(self.state_text) if self.state_text else None

    def save(self, state: dict) -> None:
        self.state_text = json.dumps(state)

    def pending(self) -> str | None:
        return self.waiting

    def store(self, decision, outcome, message) -> int:
        self.stored.append((decision.action, outcome, message))
        return len(self.stored)

    def realise(self, decision, stored) -> None:
        self.sent.append((stored, decision.chosen))
        self.config = Config(decision.chosen["workers"], decision.chosen["freq_ghz"])


def _loop(ports: _MemoryLoop, **kw):
    from control.controlloop import ControlLoop

    return ControlLoop(policy=_policy("lat-node", params={"horizon": 2}), metrics=ports,
                       configuration=ports, controllers=ports, decisions=ports,
                       actuator=ports, **kw)


def test_the_control_loop_decides_stores_and_realises_through_its_ports() -> None:
    from control.controlloop import Outcome

    ports = _MemoryLoop(Fake())
    loop = _loop(ports)
    ports.rate = 0
    assert loop.tick() is None and ports.consumed_batches == 0  # nothing new: no step
    ports.rate = 800
    for rate in [800] * 3 + [6000] * 4:
        ports.rate = rate
        tick = loop.tick()
        assert tick is not None and tick.stored == len(ports.stored)
    outcomes = [o for _a, o, _m in ports.stored]
    assert Outcome.PENDING in outcomes and ports.sent  # it scaled up, through the actuator
    assert ports.sent[0][1]["workers"] > 1
    assert loop.controller().step_index == len(ports.stored)  # state kept between ticks
    assert ports.consumed_batches > 0


@pytest.mark.parametrize("kw, pending, outcome, words", [
    ({"dry_run": True}, None, "dry-run", "dry run"),
    ({}, "decision 41", "busy", "decision 41 is still being applied")])
def test_a_dry_run_or_a_pending_reconfiguration_sends_nothing(kw, pending, outcome,
                                                              words) -> None:
    ports = _MemoryLoop(Fake(), pending=pending)
    loop = _loop(ports, **kw)
    for rate in [800] * 2 + [6000] * 4:
        ports.rate = rate
        loop.tick()
    acted = [(o, m) for a, o, m in ports.stored if a != "hold"]
    assert acted and all(o == outcome and words in m for o, m in acted)
    assert ports.sent == []


def test_rules_read_the_measured_busy_time_not_the_model() -> None:
    # Two workers, each running 3 groups; 4-s batches in which every group's task took
    # 1.2 s: each worker is busy 3.6 s of 4, 90 %, whatever the batch model says.
    def batch(i: int) -> dict:
        return {"batch_id": 30 + i, "t": 100.0 + 4 * i, "input_rows": 400, "records": 400,
                "batch_duration_ms": 4000, "latency_p95_ms": 7800, "workers": 2,
                "frequency_ghz": F_MAX, "scheduled_rate": 100, "group_ms": [1200] * 6,
                "ran_on": ["1", "1", "1", "2", "2", "2"], "placement": ["1"] * 3 + ["2"] * 3}

    records = [batch(i) for i in range(4)]
    obs = live.observe(records[1:], records[0])
    assert obs.busy == pytest.approx(0.9)
    ctl = live.LiveController(_policy("th-rule", params={"theta_max": 0.8, "theta_min": 0.5}))
    d = ctl.step(records, Config(2, F_MAX))
    assert d.inputs["busy"] == pytest.approx(0.9, abs=0.05)
    assert d.inputs["utilisation"] < 0.1  # the model: 100 records/s are nothing
    assert d.chosen["workers"] == 3, d.reason
    # No task times (a pipeline without keyed state): the model, as before.
    plain = [{k: v for k, v in r.items() if k not in ("group_ms", "ran_on", "placement")}
             for r in records]
    assert live.observe(plain, None).busy is None
    d = live.LiveController(_policy("th-rule")).step(plain, Config(2, F_MAX))
    assert d.chosen["workers"] <= 2


def test_busy_time_counts_every_stage_of_a_batch_not_only_the_stateful_one() -> None:
    # A saturated worker: 4-s batches back to back whose stateful stage took 2.4 s and
    # whose source read and partial aggregation took 1.4 s more (the REST API's stage
    # summaries). The stateful stage alone reads 60 % busy; all stages 95 %.
    def batch(i: int, total: int | None) -> dict:
        r = {"batch_id": 30 + i, "t": 100.0 + 4 * i, "input_rows": 400, "records": 400,
             "batch_duration_ms": 4000, "latency_p95_ms": 7800, "workers": 1,
             "frequency_ghz": F_MAX, "scheduled_rate": 100, "group_ms": [600] * 4,
             "ran_on": ["1"] * 4, "placement": ["1"] * 4}
        if total is not None:
            r["task_ms_total"] = total
        return r

    stateful_only = [batch(i, None) for i in range(4)]
    every_stage = [batch(i, 3800) for i in range(4)]
    assert live.observe(stateful_only[1:], stateful_only[0]).busy == pytest.approx(0.6)
    assert live.observe(every_stage[1:], every_stage[0]).busy == pytest.approx(0.95)
    d = live.LiveController(_policy("th-rule")).step(every_stage, Config(1, F_MAX))
    assert d.chosen["workers"] == 2, d.reason


def test_a_frequency_step_costs_one_pstate_of_the_run() -> None:
    """Eq. 6.17's switching term counts P-states: 10 % of f_max apart when emulated."""
    assert live.pstate_step((1.47, 1.71, 1.96, 2.2, 2.45)) == pytest.approx(0.24)
    assert live.pstate_step((2.45,)) == 0.1
    ctl = live.LiveController(_policy("lat-power", freqs_ghz=(1.47, 1.71, 1.96, 2.2, 2.45)))
    assert ctl._mpc.params["f_step"] == pytest.approx(0.24)


def test_the_transition_meter_measures_executor_start_and_reload_per_byte() -> None:
    model = live.BatchModel(overhead_s=1.0, cost_s=1e-3)  # D = 1 + 0.001·rows (1 worker)
    meter = live.TransitionMeter()

    def rec(t: float, workers: int, placement: list[str], took_s: float,
            migration: str | None = None) -> dict:
        return {"t": t, "workers": workers, "input_rows": 1000 * workers,
                "batch_duration_ms": took_s * 1000, "frequency_ghz": F_MAX,
                "placement": placement, "group_bytes": [1e6] * 4,
                "migration": {"id": migration} if migration else None}

    one, two = ["1"] * 4, ["1", "1", "2", "2"]
    meter.observe([rec(100, 1, one, 2.0)], model, F_MAX)
    meter.scale_decided(100.0, 2)
    # The new executor's first batch commits at 112; the migration's two batches move
    # two groups (2 MB) and take 3 s more than the model's 2 s.
    meter.observe([rec(106, 1, one, 2.0), rec(112, 2, one, 2.0, "m1"),
                   rec(116, 2, two, 4.0, "m1"), rec(118, 2, two, 3.0, "m1")], model, F_MAX)
    assert list(meter.executor_start_s) == [12.0] and not meter.reload_s_per_byte
    meter.observe([rec(120, 2, two, 2.0)], model, F_MAX)  # the migration is over
    assert list(meter.reload_s_per_byte) == [pytest.approx(3.0 / 2e6)]
    priced = meter.model(state_bytes=4e6)
    assert priced.seconds(2, 4) == pytest.approx(12.0 + 1.5e-6 * 2e6)
    assert priced.seconds(2, 1) == pytest.approx(1.5e-6 * 2e6)
    again = live.TransitionMeter.from_state(json.loads(json.dumps(meter.to_state())))
    assert again.model(4e6) == priced


def test_the_mpc_prices_a_measured_transition_and_says_so() -> None:
    ctl = live.LiveController(_policy("lat-node", params={"horizon": 2}))
    ctl.transitions.executor_start_s.append(6.0)
    ctl.transitions.reload_s_per_byte.append(2e-6)
    engine, cur = Fake(), Config(1, F_MAX)
    records = engine.records(800, cur, 4.0)
    for r in records:
        r["group_bytes"] = [1e6] * 4
    d = ctl.step(records, cur)
    priced = d.inputs["transition"]
    assert priced["state_bytes"] == 4e6 and priced["executor_start_s"] == 6.0
    assert priced["seconds_one_up"] == pytest.approx(6.0 + 2e-6 * 2e6)
    assert "transition" in d.cost
    state = json.loads(json.dumps(ctl.to_state()))
    assert live.LiveController.from_state(ctl.policy, state).transitions.model(1) == \
        ctl.transitions.model(1)


def test_the_mtm_is_estimated_from_the_runs_own_worker_counts() -> None:
    mtm = live.estimate_mtm([1, 1, 2, 2, 3, 2, 2, 3, 2], lo=1, hi=4)
    # From 2 the run went to 3 twice (and the prior adds half a change each way).
    assert mtm[2] == {1: pytest.approx(0.5 / 3), 3: pytest.approx(2.5 / 3)}
    assert mtm[3] == {2: pytest.approx(2.5 / 3), 4: pytest.approx(0.5 / 3)}
    assert mtm[4] == {3: 1.0} and mtm[1] == {2: 1.0}
    assert live.estimate_mtm([2, 2], lo=2, hi=2) == {}
    with pytest.raises(live.LoopError, match="migration_planner"):
        live.check_params("lat-node", {"migration_planner": "magic"})
    with pytest.raises(live.LoopError, match="mtm_gamma"):
        live.check_params("th-rule", {"mtm_gamma": 1})

    ctl = live.LiveController(_policy("static-max", params={"migration_planner": "mtm-table",
                                                            "mtm_gamma": 0.5}))
    engine, cur = Fake(), Config(1, F_MAX)
    d = ctl.step(engine.records(800, cur, 4.0), cur)
    assert d.chosen["workers"] == 4
    planner = d.inputs["migration_planner"]
    assert planner["planner"] == "mtm-table" and planner["mtm_gamma"] == 0.5
    assert planner["mtm"]["4"] == {"3": 1.0}
    (command, args), = live.reconfiguration_commands(d.current, d.chosen, d.action, None,
                                                      planner=planner)
    assert command == "set_workers" and args["planner"] == "mtm-table" and args["mtm"]


def test_the_runtime_plans_a_routing_table_with_the_mtm_look_ahead() -> None:
    from pipelines.runtime.elastic import migration as elastic

    current = ["1", "2", "1", "2", "1", "2", "1"]  # not contiguous: Spark's placement
    loads, sizes = [1.14, 1.11, 0.76, 1.72, 0.57, 1.41, 1.43], [2.46, 1.09, 1.33, 2.17,
                                                               1.59, 0.62, 2.67]
    target, info = elastic.plan_target(current, loads, sizes, 3, ["3"], "mtm-table", 0.3,
                                       {"mtm": {3: {4: 1.0}}, "gamma": 0.8})
    assert info["planner"] == "mtm-table" and set(target) == {"1", "2", "3"}
    myopic, _ = elastic.plan_target(current, loads, sizes, 3, ["3"], "ding-table", 0.3)
    assert info["migration_cost"] >= sum(s for s, a, b in zip(sizes, current, myopic,
                                                              strict=True) if a != b)


def test_reload_time_is_read_from_the_moved_groups_task_times() -> None:
    # Saturated batches are long because they are big, not because state moved: with
    # per-group task times the meter counts only the moved groups' extra task time.
    model = live.BatchModel(overhead_s=1.0, cost_s=1e-9)  # a slope not measured yet
    meter = live.TransitionMeter()

    def rec(t: float, placement: list[str], group_ms: list[float],
            migration: str | None = None) -> dict:
        return {"t": t, "workers": 2, "input_rows": 10**6, "batch_duration_ms": 15_000,
                "frequency_ghz": F_MAX, "placement": placement, "group_ms": group_ms,
                "group_bytes": [1e6] * 4, "migration": {"id": migration} if migration else None}

    one, two = ["1"] * 4, ["1", "1", "2", "2"]
    meter.observe([rec(10, one, [900] * 4), rec(25, two, [900, 900, 2900, 3900], "m"),
                   rec(40, two, [900] * 4)], model, F_MAX)
    # Groups 2 and 3 reloaded on executor 2: 2 s + 3 s there, for 2 MB.
    assert list(meter.reload_s_per_byte) == [pytest.approx(5.0 / 2e6)]


def test_a_transition_weight_of_zero_is_the_thesis_objective() -> None:
    base = dict(worker_options=(1, 2), freq_options=(2.0,), current=Config(1, 2.0),
                comp_time_s=5e-4, f_measured=2.0, latency_model="microbatch",
                batch_overhead_s=1.0, latency_bound_s=6.0, qos="latency", resource="node",
                rate_forecast=(600.0, 1500.0, 1500.0))
    from control.strategies import mpc

    move = mpc.TransitionModel(executor_start_s=2.0, reload_s_per_byte=1e-6, state_bytes=4e6)
    plain = mpc.decide(mpc.MpcProblem(**base))
    off = mpc.decide(mpc.MpcProblem(**base, transition=move, transition_weight=0.0))
    assert off.chosen == plain.chosen and off.cost == pytest.approx(plain.cost)
    with pytest.raises(live.LoopError, match="transition_weight"):
        live.check_params("lat-node", {"transition_weight": -1})


def test_lat_power_steps_its_frequency_down_when_the_bound_allows() -> None:
    """On P-states 10 % of f_max apart (as emulated) at a light load, live Lat-Power
    lowers the frequency a P-state at a time; Lat-Node stays at f_max."""
    freqs = (1.2, 1.4, 1.6, 1.8, 2.0)
    for strategy, steps_down in (("lat-power", True), ("lat-node", False)):
        ctl = live.LiveController(_policy(strategy, freqs_ghz=freqs, max_workers=2,
                                          params={"horizon": 2}))
        if steps_down:
            assert ctl._mpc.params["beta"] == live.LAT_POWER_BETA
        engine, cur = Fake(), Config(1, F_MAX)
        seen = []
        for _ in range(6):
            d = ctl.step(engine.records(0.3 / COST, cur, 8.0), cur)
            cur = Config(d.chosen["workers"], d.chosen["freq_ghz"])
            seen.append(cur.freq_ghz)
        assert (min(seen) < F_MAX) is steps_down, (strategy, seen)
        assert all(abs(a - b) <= 0.2 + 1e-9 for a, b in zip([F_MAX, *seen], seen,
                                                           strict=False)), seen


def test_a_stream_whose_offsets_are_time_is_counted_in_records() -> None:
    """A Redis stream's offsets are packed entry IDs (2**20 a millisecond): its arrivals
    come from the entries it was ever given, its backlog from the seconds its newest
    entry is ahead of the batch's end at that rate, never from offset differences
    (which made a 4,000 records/s stream look like 10**9)."""
    def batch(i: int) -> dict:
        end = (1_800_000_000_000 + 1000 * i) << 20
        return {"batch_id": 30 + i, "t": 100.0 + i, "trigger_started_at": 99.5 + i,
                "input_rows": 4000, "records": 4000, "batch_duration_ms": 900,
                "latency_p95_ms": 1500, "workers": 1, "frequency_ghz": F_MAX,
                "source_end": end, "source_latest": end + (500 << 20),
                "source_arrived": 1_000_000 + 4000 * i, "source_behind_s": 0.5}

    records = [batch(i) for i in range(5)]
    obs = live.observe(records[1:], records[0])
    assert obs.rate == pytest.approx(4000)
    assert obs.backlog == 2000
    # A Redis before 7 (no entries_added): the batches' own rates, not the offsets.
    older = [{**r, "source_arrived": None, "input_rate": 3900.0} for r in records]
    assert live.observe(older[1:], older[0]).rate == pytest.approx(3900)
