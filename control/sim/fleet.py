"""Several runs on one cluster in the simulator: the Strategy Lab's fleet scenarios
(pure Python, no Django).

Each run is a scenario of its own (``control/sim/README.md``: workload, qos, system, one
strategy) with a priority, a guarantee, an optional maximum share, excluded periods and
decision plug-ins. All runs step together; after each step every run's controller
proposes, its policy's gate (``control.gates.PolicyGate``: guards, then plug-ins, on the
simulated clock) reviews the proposal, and then one arbiter (``control.fleet``) shares
the cluster's cores between the proposals, exactly as the product's control loop does
on live runs (``control.ticks``). Every listed arbiter runs the same arrivals, so that an
operator can compare arbiters and priorities before using them.

A claim's cost curve is the run's Kingman response time (thesis Eq. 6.8-6.9) at each
number of workers, from the step's measurement, as ``control.fleet.violation_cost``.

Scenario document::

    {"steps": 120, "step_s": 1, "seed": 1, "start": "2026-12-07T10:00:00+00:00",
     "cluster": {"cores": 4}, "arbiters": ["priority", "fcfs"],
     "runs": [{"name": "payments", "priority": 3, "guaranteed_workers": 1,
               "max_share_workers": null, "excluded_periods": [],
               "decision_plugins": [], "strategy": {"name": "lat-node"},
               "workload": {...}, "qos": {...}, "system": {...}}, ...]}
"""
from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from control import fleet, gates, plugins
from control import sysmodel as sm
from control.controlloop import Outcome
from control.live import LiveDecision, action_of
from control.sim import build_controller, parse_scenario
from control.sim import engine as en
from control.sim.workloads import ScenarioError
from control.sim.workloads import number as _num
from control.strategies.mpc import Config

MAX_RUNS = 20


@dataclass
class FleetRun:
    name: str
    priority: int
    guaranteed: int
    max_share: int | None
    scenario: en.Scenario
    strategy: dict[str, Any]
    guards: fleet.Guards
    plugin_names: list[str]


@dataclass
class FleetScenario:
    steps: int
    step_s: float
    start: float  # epoch s of step 0 (the guards' and plug-ins' clock)
    cores: int
    arbiters: list[str]
    runs: list[FleetRun] = field(default_factory=list)


def parse_fleet(doc: Any) -> FleetScenario:
    """The fleet scenario, or ScenarioError naming the path of the first bad field."""
    if not isinstance(doc, dict):
        raise ScenarioError("scenario must be a JSON object")
    steps = _num(doc, "steps", 120, 1, whole=True, high=100_000)
    step_s = _num(doc, "step_s", 1.0, 1e-3)
    seed = _num(doc, "seed", 1, 0, whole=True, high=2**63 - 1)
    start_text = doc.get("start", "2026-12-07T10:00:00+00:00")
    try:
        start = dt.datetime.fromisoformat(str(start_text))
    except ValueError:
        raise ScenarioError("start: an ISO 8601 time, e.g. 2026-12-07T10:00:00+00:00") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=dt.UTC)
    cluster = doc.get("cluster", {})
    if not isinstance(cluster, dict):
        raise ScenarioError("cluster: must be an object")
    cores = _num(cluster, "cores", None, 1, "cluster.", whole=True, high=100_000)
    arbiters = doc.get("arbiters", ["priority", "fcfs"])
    if not isinstance(arbiters, list) or not arbiters or any(
            a not in fleet.ARBITERS for a in arbiters):
        raise ScenarioError(f"arbiters: a non-empty list of {', '.join(fleet.ARBITERS)}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not 1 <= len(runs) <= MAX_RUNS:
        raise ScenarioError(f"runs: a list of 1 to {MAX_RUNS} runs")
    out = FleetScenario(steps, step_s, start.timestamp(), cores, list(arbiters))
    names = set()
    for i, run in enumerate(runs):
        where = f"runs[{i}]."
        if not isinstance(run, dict):
            raise ScenarioError(f"runs[{i}]: must be an object")
        name = str(run.get("name") or f"run {i + 1}")
        if name in names:
            raise ScenarioError(f"{where}name: {name!r} is used twice")
        names.add(name)
        single = {k: run[k] for k in ("workload", "qos", "system") if k in run}
        try:
            scn = parse_scenario({**single, "steps": steps, "step_s": step_s,
                                  "seed": seed + i})
        except ScenarioError as exc:
            raise ScenarioError(f"{where}{exc}") from None
        strategy = run.get("strategy", {"name": "lat-node"})
        if not isinstance(strategy, dict):
            raise ScenarioError(f"{where}strategy: must be an object")
        try:
            build_controller(strategy, scn)
        except ScenarioError as exc:
            raise ScenarioError(f"{where}{str(exc).replace('strategies[0].', 'strategy.')}"
                                ) from None
        periods = run.get("excluded_periods", [])
        names_ = run.get("decision_plugins", [])
        if not isinstance(periods, list) or not isinstance(names_, list):
            raise ScenarioError(f"{where}excluded_periods and decision_plugins: lists")
        try:
            guards = fleet.Guards(
                excluded_periods=tuple(str(p) for p in periods),
                max_reconfigurations_per_hour=run.get("max_reconfigurations_per_hour"),
                cooldown_up_s=_num(run, "cooldown_up_s", 0.0, 0, where),
                cooldown_down_s=_num(run, "cooldown_down_s", 0.0, 0, where))
            plugins.load([str(n) for n in names_])
        except (fleet.FleetError, plugins.PluginError) as exc:
            raise ScenarioError(f"{where}{exc}") from None
        share = run.get("max_share_workers")
        out.runs.append(FleetRun(
            name=name, priority=_num(run, "priority", 1, 1, where, whole=True, high=100),
            guaranteed=_num(run, "guaranteed_workers", 1, 0, where, whole=True),
            max_share=None if share is None else _num(run, "max_share_workers", None, 1,
                                                       where, whole=True),
            scenario=scn, strategy=strategy, guards=guards,
            plugin_names=[str(n) for n in names_]))
    floors = sum(r.scenario.system.min_workers for r in out.runs)
    if floors > cores:
        raise ScenarioError(f"cluster.cores: the runs' minimum workers need {floors} cores, "
                            f"the cluster has {cores}")
    return out


def cost_curve(run: FleetRun, m: en.Measurement, freq_ghz: float) -> dict[int, float]:
    """The run's modelled violation cost at each worker count (Eq. 6.8-6.9 at the step's
    rate, per-tuple time and variability)."""
    sysm = run.scenario.system
    rate = max(m.rate, 1e-9)
    t = m.comp_time_s * freq_ghz / sysm.f_max if m.comp_time_s > 0 else 0.0
    curve = {}
    for n in range(sysm.min_workers, sysm.max_workers + 1):
        if t <= 0:
            curve[n] = 0.0
            continue
        latency = sm.response_time(t, sm.ideal_service_time(t, n), 1.0 / rate, m.ca2, m.cs2)
        curve[n] = fleet.violation_cost(latency, run.scenario.latency_bound_s,
                                        utilisation=rate * t / n)
    return curve


def _proposal(step: int, now: float, current: Config, chosen: Config, reason: str
              ) -> LiveDecision:
    action = action_of(current.workers, current.freq_ghz, chosen.workers, chosen.freq_ghz)
    return LiveDecision(step=step, t=now, strategy="sim", inputs={},
                        chosen={"workers": chosen.workers, "freq_ghz": chosen.freq_ghz},
                        current={"workers": current.workers, "freq_ghz": current.freq_ghz},
                        action=action, predictions=[], cost={}, solve_ms=0.0, reason=reason,
                        alerts=[], model_error={})


def run_arbiter(fs: FleetScenario, arbiter_name: str,
                on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Every run of ``fs`` under one arbiter: per run its series and summary, and the
    cluster's cores in use per step."""
    arbiter = fleet.arbiter(arbiter_name)
    sims = [en.Simulation(r.scenario) for r in fs.runs]
    controllers = [build_controller(r.strategy, r.scenario)[1] for r in fs.runs]
    applied: list[list[fleet.Applied]] = [[] for _ in fs.runs]
    clock = [fs.start]
    policy_gates = [gates.PolicyGate(
        run=r.name, policy=r.name, guards=r.guards, plugins=plugins.load(r.plugin_names),
        history=lambda i=i: applied[i], clock=lambda: clock[0],
        min_workers=r.scenario.system.min_workers, max_workers=r.scenario.system.max_workers)
        for i, r in enumerate(fs.runs)]
    records: list[list[en.StepRecord]] = [[] for _ in fs.runs]
    asked_series: list[list[int]] = [[] for _ in fs.runs]
    outcome_counts = [{o: 0 for o in ("excluded", "vetoed", "refused", "preempted")}
                      for _ in fs.runs]
    used: list[int] = []
    forecasts: list[float | None] = [None] * len(fs.runs)
    reasons: list[list[str]] = [[] for _ in fs.runs]
    for t in range(fs.steps):
        clock[0] = fs.start + t * fs.step_s
        wanted: list[Config] = []
        curves = []
        for i, (run, sim, ctl) in enumerate(zip(fs.runs, sims, controllers)):
            m, info = sim.step(t)
            scn = run.scenario
            n_in = info["n_in"]
            ratio = info["n_out"] / n_in if n_in > 0 else 1.0
            records[i].append(en.StepRecord(
                t=t, rate=m.rate, forecast=forecasts[i], workers=sim.n, freq_ghz=sim.f,
                n_in=n_in, n_out=info["n_out"], latency_ms=m.latency_s * 1e3,
                utilisation=m.utilisation, power_w=info["power_w"], congestion=m.congestion,
                queued=info["queued"], moved_keys=sim.moved_last, solve_ms=0.0,
                throughput_violation=ratio < scn.throughput_ratio,
                latency_violation=m.latency_s > scn.latency_bound_s))
            current = Config(sim.n, sim.f)
            chosen, forecasts[i] = ctl(m, current)
            verdict = policy_gates[i].review(_proposal(t, clock[0], current, chosen, ""), True) \
                if (chosen.workers, chosen.freq_ghz) != (current.workers, current.freq_ghz) \
                else None
            if verdict is not None and verdict.decision is None:
                outcome_counts[i][str(verdict.outcome or Outcome.VETOED)] += 1
                reasons[i].append(f"step {t}: {verdict.outcome}: {verdict.message}")
                chosen = current
            elif verdict is not None:
                chosen = Config(verdict.decision.chosen["workers"], chosen.freq_ghz)
            wanted.append(chosen)
            curves.append(cost_curve(run, m, chosen.freq_ghz))
        claims = [fleet.Claim(run=r.name, priority=r.priority, guaranteed=r.guaranteed,
                              held=sim.n, asked=w.workers, cost_by_workers=curve,
                              max_share=r.max_share, asked_at=float(i))
                  for i, (r, sim, w, curve) in enumerate(zip(fs.runs, sims, wanted, curves))]
        # First come, first served here: the runs ask in a fixed order, the first listed
        # first, the same at every step.
        allocation = arbiter.allocate(fs.cores, claims)
        total = 0
        for i, (run, sim, want) in enumerate(zip(fs.runs, sims, wanted)):
            share = allocation.shares[run.name]
            workers = share.granted if want.workers > sim.n or share.preempted else \
                want.workers
            if share.preempted:
                outcome_counts[i]["preempted"] += 1
                reasons[i].append(f"step {t}: {share.reason}")
            elif share.refused and want.workers > sim.n and workers <= sim.n:
                outcome_counts[i]["refused"] += 1
            asked_series[i].append(want.workers)
            if workers != sim.n:
                applied[i].append(fleet.Applied(clock[0], fleet.direction(sim.n, workers)))
            sim.apply(Config(workers, want.freq_ghz))
            total += sim.n
        used.append(total)
        if on_step:
            on_step(t)
    runs_out = []
    for i, run in enumerate(fs.runs):
        summary = en.summarise(records[i], run.scenario)
        summary.update(outcome_counts[i])
        summary["priority"] = run.priority
        runs_out.append({
            "name": run.name, "priority": run.priority, "guaranteed": run.guaranteed,
            "summary": summary,
            "series": {"workers": [r.workers for r in records[i]], "asked": asked_series[i],
                       "latency_ms": [None if not math.isfinite(r.latency_ms)
                                      else round(r.latency_ms, 6) for r in records[i]],
                       "rate": [round(r.rate, 3) for r in records[i]]},
            "reasons": reasons[i][:50]})
    return {"arbiter": arbiter_name, "label": fleet.ARBITERS[arbiter_name]().label,
            "runs": runs_out, "cores_used": used,
            "summary": {"latency_violations": sum(r["summary"]["latency_violations"]
                                                  for r in runs_out),
                        "weighted_violations": sum(r["summary"]["latency_violations"]
                                                   * r["priority"] for r in runs_out),
                        "mean_cores_used": float(np.mean(used)) if used else 0.0,
                        "max_cores_used": max(used, default=0),
                        "preemptions": sum(r["summary"]["preempted"] for r in runs_out)}}


def simulate_fleet(doc: Any, progress: Callable[[int, int], None] | None = None
                   ) -> dict[str, Any]:
    """Every arbiter of the fleet scenario on the same arrivals (JSON-ready)."""
    fs = parse_fleet(doc)
    total = fs.steps * len(fs.arbiters)
    results = []
    started = time.perf_counter()
    for k, name in enumerate(fs.arbiters):
        def step_done(t: int, offset: int = k * fs.steps) -> None:
            if progress:
                progress(offset + t + 1, total)

        results.append(run_arbiter(fs, name, on_step=step_done))
    return {"kind": "fleet", "steps": fs.steps, "step_s": fs.step_s, "cores": fs.cores,
            "runs": [r.name for r in fs.runs], "results": results,
            "duration_s": round(time.perf_counter() - started, 3)}


def is_fleet(doc: Any) -> bool:
    """A fleet scenario (several runs on one cluster) rather than a single run's."""
    return isinstance(doc, dict) and "runs" in doc


def _example_run(name: str, priority: int, before: float, after: float, max_workers: int,
                 initial_workers: int) -> dict[str, Any]:
    return {"name": name, "priority": priority, "guaranteed_workers": 1,
            "strategy": {"name": "lat-node"},
            "workload": {"rate": {"kind": "step", "before": before, "after": after,
                                  "at_s": 60},
                         "keys": {"kind": "zipf", "n": 64, "s": 0.5},
                         "service": {"mean_ms": 1.0}},
            "qos": {"latency_bound_ms": 5},
            "system": {"max_workers": max_workers, "initial_workers": initial_workers,
                       "freqs_ghz": [2.0]}}


# Three runs on 4 cores: "payments" (priority 3) steps from 800 to 1,700 records/s at 60 s
# (1 ms a record: one worker no longer keeps up); "reports" (priority 1) holds two
# workers at 1,500/s; "audit" (priority 2) one at 400/s.
EXAMPLE: dict[str, Any] = {
    "steps": 120, "step_s": 1, "seed": 1, "cluster": {"cores": 4},
    "arbiters": ["priority", "fcfs"],
    "runs": [_example_run("payments", 3, 800, 1700, 3, 1),
             _example_run("reports", 1, 1500, 1500, 3, 2),
             _example_run("audit", 2, 400, 400, 2, 1)]}
