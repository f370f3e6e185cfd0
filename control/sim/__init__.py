"""Simulator and strategy comparison (pure Python, no Django).

``simulate(doc)`` takes the JSON scenario of ``control/sim/README.md`` and runs every
listed strategy on the same arrivals; the strategies are the control library's objects,
unchanged: ``MpcController`` (thesis Table 7.2 strategies), ``ThRule``, ``LatRule``,
``SPL``, ``PeakLoad``, ``DS2``, with its forecasters and rebalancers.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from control import forecasting as fc
from control import sysmodel as sm
from control.sim import engine as en
from control.sim import workloads as wl
from control.sim.workloads import ScenarioError
from control.sim.workloads import number as _num
from control.strategies import RULES, mpc, rules
from control.strategies.controller import MpcController
from control.strategies.mpc import Config

STRATEGY_NAMES = tuple(sorted(mpc.THESIS_STRATEGIES)) + RULES
__all__ = ["ScenarioError", "STRATEGY_NAMES", "simulate", "parse_scenario", "build_controller"]


def _obj(doc: dict, key: str) -> dict:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ScenarioError(f"{key}: must be an object")
    return value


def parse_scenario(doc: Any) -> en.Scenario:
    if not isinstance(doc, dict):
        raise ScenarioError("scenario must be a JSON object")
    steps = _num(doc, "steps", 180, 1, whole=True, high=1_000_000)
    step_s = _num(doc, "step_s", 1.0, 1e-6)
    seed = _num(doc, "seed", 1, 0, whole=True, high=2**63 - 1)
    workload = _obj(doc, "workload")
    system = _obj(doc, "system")
    qos = _obj(doc, "qos")
    rng = np.random.default_rng([seed, 999_983])
    rate_doc = workload.get("rate", {"kind": "random_walk", "scale": 1 / 25})
    if not isinstance(rate_doc, dict):
        raise ScenarioError("workload.rate: must be an object")
    rates = wl.rate_series(rate_doc, steps, step_s, rng)
    keys_doc = workload.get("keys", {"kind": "file"})
    if not isinstance(keys_doc, dict):
        raise ScenarioError("workload.keys: must be an object")
    p = wl.key_distribution(keys_doc)
    service_doc = workload.get("service", {})
    if not isinstance(service_doc, dict):
        raise ScenarioError("workload.service: must be an object")
    t_k = wl.service_times(service_doc, len(p), rng)
    arrivals = workload.get("arrivals", "poisson")
    if arrivals not in ("poisson", "fluid"):
        raise ScenarioError("workload.arrivals: 'poisson' or 'fluid'")
    freqs = system.get("freqs_ghz", list(sm.THESIS_FREQUENCIES_GHZ))
    if not isinstance(freqs, list) or not freqs or any(
            isinstance(f, bool) or not isinstance(f, int | float) or f <= 0 for f in freqs):
        raise ScenarioError("system.freqs_ghz: need a non-empty list of GHz > 0")
    min_w = _num(system, "min_workers", 1, 1, "system.", whole=True)
    max_w = _num(system, "max_workers", 12, 1, "system.", whole=True, high=100_000)
    if min_w > max_w:
        raise ScenarioError("system.min_workers: must be <= system.max_workers")
    mode = system.get("mode", "queue")
    if mode not in ("queue", "microbatch"):
        raise ScenarioError("system.mode: 'queue' or 'microbatch'")
    pacing = system.get("migration_schedule", "batched")
    if pacing not in ("batched", "all-at-once", "fluid"):
        raise ScenarioError("system.migration_schedule: 'batched', 'all-at-once' or 'fluid'")
    rebalancer = system.get("rebalancer", "flux")
    if rebalancer not in ("flux", "balanced"):
        raise ScenarioError("system.rebalancer: 'flux' or 'balanced'")
    sysm = en.SystemModel(
        min_workers=min_w, max_workers=max_w,
        freqs_ghz=tuple(sorted(float(f) for f in freqs)),
        queue_limit_s=_num(system, "queue_limit_s", 0.05, 0, "system."),
        migration_s_per_key=_num(system, "migration_s_per_key", 1e-4, 0, "system."),
        migration_schedule=pacing,
        mode=mode, batch_overhead_s=_num(system, "batch_overhead_s", 0.5, 0, "system."),
        rebalancer=rebalancer,
        flux_threshold=_num(system, "flux_threshold", 0.10, 0, "system."))
    return en.Scenario(
        rates=rates, p=p, t_k=t_k, steps=steps, step_s=step_s, seed=seed, arrivals=arrivals,
        key_drift=_num(workload, "key_drift", 0.0, 0, "workload.", high=1),
        service_drift=_num(workload, "service_drift", 0.0, 0, "workload."),
        latency_bound_s=_num(qos, "latency_bound_ms", 1.5, 1e-9, "qos.") / 1e3,
        throughput_ratio=_num(qos, "throughput_ratio", 0.95, 0, "qos.", high=1),
        initial_workers=_num(system, "initial_workers", max(min_w, max_w // 2), 1, "system.",
                             whole=True),
        system=sysm)


def _forecaster(spec: dict, where: str) -> fc.Forecaster:
    kind = spec.get("forecaster", "holt")
    if kind == "holt":
        try:
            return fc.Holt(alpha=_num(spec, "holt_alpha", 0.67, 0, where),
                           beta=_num(spec, "holt_beta", 0.26, 0, where))
        except ValueError as exc:
            raise ScenarioError(f"{where}holt: {exc}") from exc
    if kind == "ma3":
        return fc.MovingAverage3()
    if kind == "last":
        return fc.LastValue()
    raise ScenarioError(f"{where}forecaster: 'holt', 'ma3' or 'last'")


def strategy_label(spec: dict) -> str:
    name = spec["name"]
    if name in mpc.THESIS_STRATEGIES:
        if spec.get("switching", True):
            return f"{name} Sw h={int(spec.get('horizon', 1))}"
        return f"{name} NoSw"
    return name


Controller = Callable[[en.Measurement, Config], tuple[Config, float | None]]


def build_controller(spec: Any, scn: en.Scenario, index: int = 0) -> tuple[str, Controller]:
    """A callable (measurement, current config) -> (next config, rate forecast)."""
    where = f"strategies[{index}]."
    if not isinstance(spec, dict) or spec.get("name") not in STRATEGY_NAMES:
        raise ScenarioError(f"{where}name: one of {', '.join(STRATEGY_NAMES)}")
    name = spec["name"]
    sysm = scn.system
    bounds = {"n_min": sysm.min_workers, "n_max": sysm.max_workers}
    label = spec.get("label") or strategy_label(spec)
    if name in mpc.THESIS_STRATEGIES:
        switching = spec.get("switching", True)
        if not isinstance(switching, bool):
            raise ScenarioError(f"{where}switching: true (Sw) or false (NoSw)")
        horizon = _num(spec, "horizon", 1, 1, where, whole=True, high=5)
        # The artifact computes rho with a 0.95 safety margin (rho = T/n / (0.95 T_A)).
        params: dict[str, Any] = {"latency_bound_s": scn.latency_bound_s,
                                  "power": sysm.power,
                                  "utilisation_margin": _num(spec, "utilisation_margin", 0.95,
                                                             1e-3, where, high=1),
                                  "gamma": _num(spec, "gamma", 0.4, 0, where) if switching else 0.0}
        for key in ("alpha", "beta"):
            if key in spec:
                params[key] = _num(spec, key, None, 0, where)
        if "qos" in spec:
            # Table 7.5's distributed runs cost throughput by Eq. 7.1 (alpha·e^rho).
            if spec["qos"] not in mpc.QOS_KINDS:
                raise ScenarioError(f"{where}qos: one of {', '.join(mpc.QOS_KINDS)}")
            params["qos"] = spec["qos"]
        if not switching:
            horizon = 1
        ctl = MpcController(
            strategy=name, horizon=horizon, solver="dp", params=params,
            worker_options=tuple(range(sysm.min_workers, sysm.max_workers + 1)),
            freq_options=sysm.freqs_ghz, forecaster=_forecaster(spec, where))

        def mpc_step(m: en.Measurement, current: Config) -> tuple[Config, float | None]:
            if m.comp_time_s <= 0:
                return current, None
            decision = ctl.step(current, max(m.rate, 1e-9), m.comp_time_s, m.ca2, m.cs2,
                                m.latency_s if math.isfinite(m.latency_s) else None)
            return decision.chosen, decision.trajectory[0].rate

        mpc_step.controller = ctl  # type: ignore[attr-defined]
        return label, mpc_step
    if name == "th-rule":
        rule: Any = rules.ThRule(theta_max=_num(spec, "theta_max", 0.9, 0, where),
                                 theta_min=_num(spec, "theta_min", 0.8, 0, where), **bounds)
    elif name == "lat-rule":
        rule = rules.LatRule(bound_s=scn.latency_bound_s,
                             xi_max=_num(spec, "xi_max", 1.2, 0, where),
                             xi_min=_num(spec, "xi_min", 0.8, 0, where), **bounds)
    elif name == "spl":
        rule = rules.SPL(congestion_threshold=_num(spec, "congestion_threshold", 0.1, 0, where),
                         sensitivity=_num(spec, "sensitivity", 0.9, 0, where), **bounds)
    elif name == "peak-load":
        rule = rules.PeakLoad(f_max=sysm.f_max, **bounds)
    else:
        rule = rules.DS2(control_step_s=scn.step_s, **bounds)

    def rule_step(m: en.Measurement, current: Config) -> tuple[Config, float | None]:
        obs = rules.Observation(rate=m.rate, throughput=m.throughput,
                                utilisation=m.utilisation,
                                latency_s=m.latency_s if math.isfinite(m.latency_s) else 1e9,
                                workers=current.workers, freq_ghz=current.freq_ghz,
                                congestion=m.congestion)
        return rule.decide(obs).chosen, None

    return label, rule_step


def simulate(doc: Any, progress: Callable[[int, int], None] | None = None) -> dict:
    """Run every strategy of the scenario; JSON-ready output (series + summaries).
    ``progress(done, total)`` is called after every step (steps summed over
    strategies); an exception it raises ends the simulation (a time limit)."""
    scn = parse_scenario(doc)
    specs = doc.get("strategies", [{"name": "lat-node"}])
    if not isinstance(specs, list) or not specs:
        raise ScenarioError("strategies: need a non-empty list of {name, …}")
    built = [build_controller(spec, scn, i) for i, spec in enumerate(specs)]
    results = []
    total = len(built) * scn.steps
    for i, (label, ctl) in enumerate(built):
        def step_done(t: int, offset: int = i * scn.steps) -> None:
            if progress:
                progress(offset + t + 1, total)

        res = en.run(scn, label, ctl, on_step=step_done)
        mape = getattr(getattr(ctl, "controller", None), "forecast_mape", None)
        summary = dict(res.summary)
        if mape is not None and math.isfinite(mape):
            summary["forecast_mape_pct"] = mape
        results.append({"label": label, "summary": summary, "series": _clean(res.series()),
                        "conservation_error": res.conservation_error})
        if progress:
            progress((i + 1) * scn.steps, total)
    return {"steps": scn.steps, "step_s": scn.step_s,
            "latency_bound_ms": scn.latency_bound_s * 1e3, "power": "modelled (Eq. 6.11)",
            "results": results}


def _clean(series: dict[str, list]) -> dict[str, list]:
    out = {}
    for key, values in series.items():
        out[key] = [None if isinstance(v, float) and not math.isfinite(v) else
                    (round(v, 6) if isinstance(v, float) else v) for v in values]
    return out
