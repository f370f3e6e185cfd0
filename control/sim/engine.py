"""Discrete-time simulator of one elastic keyed operator (thesis §6.1: emitter → n workers
→ collector, a routing table key → worker, one CPU frequency for the machine).

One control step of ``step_s`` seconds at a time, vectorised over keys and workers:

1. Arrivals: N_t triggering tuples (Poisson with mean λ_t·Δ, or exactly λ_t·Δ in
   "fluid" mode) split over keys by p_k (multinomial) — the same draws for every
   strategy (common random numbers: the stream for step t is seeded by (seed, t)).
2. Work: a tuple of key k costs T_k·f_max/f seconds (thesis §6.2.2: time ∝ 1/f).
   Worker i gets the demand of its keys (new arrivals plus the source backlog).
3. Backpressure (§6.2.1): a worker's queue holds at most ``queue_limit_s`` of work;
   the single emitter blocks as soon as any queue is full, so the *same* fraction φ of
   every key's demand is admitted and the rest waits at the source (congestion 1 − φ).
4. Service: worker i processes min(queue + admitted, (Δ − migration delay)/s_i)
   tuples, s_i its mean tuple cost; moved state costs the receiving worker
   ``migration_s_per_key`` seconds per key in the next step (§6.4: state is loaded
   before the key's pending tuples are processed).
5. Latency (mean over the step's outputs): s_i + Kingman's G/G/1 wait at the offered
   utilisation (Eq. 6.9, c_a² = 1 for Poisson, 0 fluid; c_s² from the per-key cost
   spread on the worker) + the time to drain the queue ahead (Little) + the source
   wait; or, in "microbatch" mode, the control library's ``MicroBatchModel``.
6. Power: the control library's ``PowerModel`` (Eq. 6.11), *modelled*.

Conservation holds exactly: Σ arrivals = Σ outputs + Σ worker queues + source backlog.
Utilisation in steady state equals Eq. 6.4 (tested).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from control import sysmodel as sm
from control.planning import schedule
from control.sim import workloads as wl
from control.strategies import rebalance
from control.strategies.mpc import Config

F_STEP_GHZ = 0.1


@dataclass(frozen=True)
class SystemModel:
    min_workers: int = 1
    max_workers: int = 12
    freqs_ghz: tuple[float, ...] = sm.THESIS_FREQUENCIES_GHZ
    queue_limit_s: float = 0.05
    migration_s_per_key: float = 1e-4
    # How moves are paced (Megaphone §3.3, the planners' ``schedule``): the receiving
    # worker loses the same capacity either way, but its tuples wait behind one
    # schedule step's transfers, not behind all of them.
    migration_schedule: str = "batched"  # or "all-at-once", "fluid"
    mode: str = "queue"  # or "microbatch"
    batch_overhead_s: float = 0.5
    rebalancer: str = "flux"  # or "balanced"
    flux_threshold: float = 0.10
    # The artifact's trigger for a rebalance at the same n: rho_max > 1.1 or
    # rho_max / rho_min > 1.3, never in the step right after a reconfiguration.
    rebalance_rho_max: float = 1.1
    rebalance_ratio: float = 1.3
    # The one power model of simulation and live runs (sysmodel.power_model).
    power: sm.PowerModel = field(default_factory=sm.power_model)

    @property
    def f_max(self) -> float:
        return max(self.freqs_ghz)


@dataclass(frozen=True)
class Scenario:
    rates: np.ndarray  # triggering tuples/s per step
    p: np.ndarray  # key frequencies
    t_k: np.ndarray  # seconds per tuple per key at f_max
    steps: int
    step_s: float = 1.0
    seed: int = 1
    arrivals: str = "poisson"  # or "fluid"
    key_drift: float = 0.0  # fraction of keys swapping popularity per step
    service_drift: float = 0.0  # relative per-step random walk of every T_k
    latency_bound_s: float = 0.0015
    throughput_ratio: float = 0.95
    initial_workers: int = 6
    system: SystemModel = field(default_factory=SystemModel)


@dataclass
class Measurement:
    """What the monitor saw over one step (the controllers' input, thesis Table 6.1)."""

    rate: float  # new triggering tuples / s
    throughput: float
    utilisation: float  # max over workers of busy time / step
    comp_time_s: float  # T at the current frequency
    ca2: float
    cs2: float
    latency_s: float
    congestion: float


@dataclass
class StepRecord:
    t: int
    rate: float
    forecast: float | None
    workers: int
    freq_ghz: float
    n_in: float
    n_out: float
    latency_ms: float
    utilisation: float
    power_w: float
    congestion: float
    queued: float
    moved_keys: int
    solve_ms: float
    throughput_violation: bool
    latency_violation: bool


@dataclass
class SimResult:
    label: str
    steps: list[StepRecord]
    summary: dict
    conservation_error: float

    def series(self) -> dict[str, list]:
        keys = StepRecord.__dataclass_fields__.keys()
        return {k: [getattr(s, k) for s in self.steps] for k in keys}


class Simulation:
    """The operator's state for one strategy run."""

    def __init__(self, scn: Scenario) -> None:
        self.scn = scn
        sysm = scn.system
        self.n = max(sysm.min_workers, min(sysm.max_workers, scn.initial_workers))
        self.f = sysm.f_max
        self.keys = len(scn.p)
        self.routing = np.asarray(rebalance.balanced(
            (scn.p * scn.t_k).tolist(), self.n).routing, dtype=np.int64)
        self.queue = np.zeros(sysm.max_workers)
        self.backlog = np.zeros(self.keys)
        self.migration_delay = np.zeros(sysm.max_workers)
        self.migration_stall = np.zeros(sysm.max_workers)  # longest wait behind a step
        self.t_k = scn.t_k.astype(float).copy()
        self.p = scn.p.astype(float).copy()
        self.total_in = 0.0
        self.total_out = 0.0
        self.last_counts = np.zeros(self.keys)
        self.last_offered_rho = np.zeros(sysm.max_workers)
        self.just_reconfigured = False
        self.moved_last = 0

    def arrivals(self, t: int) -> np.ndarray:
        scn = self.scn
        rng = np.random.default_rng([scn.seed, t])
        if scn.key_drift > 0:
            self.p = wl.drift_keys(self.p, rng, scn.key_drift)
        if scn.service_drift > 0:
            self.t_k = self.t_k * np.exp(scn.service_drift * rng.standard_normal(self.keys))
        mean = scn.rates[t] * scn.step_s
        if scn.arrivals == "fluid":
            return mean * self.p
        total = rng.poisson(mean)
        return rng.multinomial(total, self.p).astype(float)

    def step(self, t: int) -> tuple[Measurement, dict]:
        scn, sysm = self.scn, self.scn.system
        dt, n = scn.step_s, self.n
        counts = self.arrivals(t)
        demand = self.backlog + counts
        cost = self.t_k * (sysm.f_max / self.f)  # seconds per tuple now
        a = np.bincount(self.routing, demand, minlength=n)[:n]
        work = np.bincount(self.routing, demand * cost, minlength=n)[:n]
        work2 = np.bincount(self.routing, demand * cost * cost, minlength=n)[:n]
        mean_cost = float(np.average(cost, weights=self.p))
        s = np.where(a > 0, work / np.maximum(a, 1e-300), mean_cost)
        cap_time = np.maximum(dt - self.migration_delay[:n], 0.0)
        cap = cap_time / s
        room = np.maximum(cap + sysm.queue_limit_s / s - self.queue[:n], 0.0)
        busy = a > 0
        phi = float(min(1.0, np.min(room[busy] / a[busy]))) if busy.any() else 1.0
        admitted = a * phi
        self.backlog = demand * (1 - phi)
        q0 = self.queue[:n].copy()
        processed = np.minimum(q0 + admitted, cap)
        q1 = q0 + admitted - processed
        self.queue[:n] = q1
        rho = processed * s / dt
        offered_rho = np.where(cap_time > 0, admitted * s / np.maximum(cap_time, 1e-300), np.inf)
        self.last_offered_rho = np.zeros(sysm.max_workers)
        self.last_offered_rho[:n] = a * s / dt
        n_in, n_out = float(counts.sum()), float(processed.sum())
        self.total_in += n_in
        self.total_out += n_out
        ca2 = 0.0 if scn.arrivals == "fluid" else 1.0
        cs2 = np.where(work > 0, work2 * a / np.maximum(work * work, 1e-300) - 1.0, 0.0)
        cs2 = np.maximum(cs2, 0.0)
        drain = (q0 + q1) / 2 * s  # time to work off the queue ahead
        if sysm.mode == "microbatch":
            rho_max = float(offered_rho.max()) if n else 0.0
            batch = sysm.batch_overhead_s / (1 - rho_max) if rho_max < 1 else dt
            lat_i = 1.5 * batch + drain + self.migration_stall[:n] / 2
        else:
            # Kingman is a steady-state formula: near rho = 1 it diverges, but within one
            # step a queue cannot make a tuple wait longer than the step itself.
            kingman = np.minimum(np.where(offered_rho < 1,
                                          offered_rho / np.maximum(1 - offered_rho, 1e-12)
                                          * (ca2 + cs2) / 2 * s, 0.0), dt)
            lat_i = s + kingman + drain + self.migration_stall[:n] / 2
        source_wait = 0.0
        backlog_total = float(self.backlog.sum())
        if n_out > 0:
            latency = float(np.sum(processed * lat_i) / n_out)
            source_wait = backlog_total / 2 / (n_out / dt)
        else:
            latency = math.inf if (q1.sum() + backlog_total) > 0 else float(s.mean())
        latency += source_wait
        self.migration_delay[:] = 0.0
        self.migration_stall[:] = 0.0
        self.last_counts = counts
        comp = float(np.sum(counts * cost) / counts.sum()) if counts.sum() > 0 else mean_cost
        cs2_all = float(np.sum(counts * cost * cost) * counts.sum()
                        / max(np.sum(counts * cost) ** 2, 1e-300) - 1) if counts.sum() > 0 else 0.0
        m = Measurement(rate=n_in / dt, throughput=n_out / dt,
                        utilisation=float(rho.max()) if n else 0.0, comp_time_s=comp,
                        ca2=ca2, cs2=max(cs2_all, 0.0), latency_s=latency,
                        congestion=1 - phi)
        info = {"n_in": n_in, "n_out": n_out, "queued": float(q1.sum()) + backlog_total,
                "power_w": sysm.power.power(n, self.f), "rho": rho}
        return m, info

    def apply(self, u: Config) -> int:
        """Switch to ``u``; rebalance when n changed, or when the load is uneven."""
        sysm = self.scn.system
        n2 = max(sysm.min_workers, min(sysm.max_workers, u.workers))
        changed = n2 != self.n or abs(u.freq_ghz - self.f) > 1e-9
        self.f = u.freq_ghz
        moved = 0
        rho = self.last_offered_rho[:self.n]
        uneven = (not self.just_reconfigured and rho.size and (
            rho.max() > sysm.rebalance_rho_max
            or (rho.min() > 0 and rho.max() / rho.min() > sysm.rebalance_ratio)))
        if n2 != self.n or uneven:
            moved = self._rebalance(n2)
        self.just_reconfigured = changed
        self.moved_last = moved
        return moved

    def _rebalance(self, n2: int) -> int:
        sysm = self.scn.system
        seen = self.last_counts.sum()
        freq = self.last_counts / seen if seen > 0 else self.p
        weights = (freq * self.t_k).tolist()  # wt_k = p_k * T_k (§6.4.3), last value
        previous = self.routing
        if sysm.rebalancer == "balanced":
            new = rebalance.balanced(weights, n2).routing
        else:
            new = rebalance.flux(weights, n2, previous.tolist(),
                                 threshold=sysm.flux_threshold).routing
        new = np.asarray(new, dtype=np.int64)
        moved_mask = new != previous
        # Queued tuples of retired workers follow their keys' state: spread them over
        # the workers that received those keys, in proportion to the keys' weights.
        for w in range(n2, self.n):
            q = self.queue[w]
            if q > 0:
                mine = previous == w
                share = np.bincount(new[mine], np.asarray(weights)[mine] + 1e-300,
                                    minlength=n2)[:n2]
                self.queue[:n2] += q * share / share.sum()
            self.queue[w] = 0.0
        arrivals_to = np.bincount(new[moved_mask], minlength=sysm.max_workers)
        self.migration_delay[:] = arrivals_to[:sysm.max_workers] * sysm.migration_s_per_key
        if moved_mask.any():  # per receiving worker, its longest single schedule step
            for worker, count in schedule.receives_per_step(
                    new[moved_mask], sysm.migration_schedule).items():
                self.migration_stall[worker] = count * sysm.migration_s_per_key
        self.routing = new
        self.n = n2
        return int(moved_mask.sum())


def run(scn: Scenario, label: str, controller: Callable[[Measurement, Config],
        tuple[Config, float | None]], on_step: Callable[[int], None] | None = None
        ) -> SimResult:
    """Simulate ``scn.steps`` steps with ``controller`` deciding after each one."""
    sim = Simulation(scn)
    records: list[StepRecord] = []
    forecast: float | None = None
    solve_ms = 0.0
    for t in range(scn.steps):
        m, info = sim.step(t)
        n_in = info["n_in"]
        ratio = info["n_out"] / n_in if n_in > 0 else 1.0
        records.append(StepRecord(
            t=t, rate=m.rate, forecast=forecast, workers=sim.n, freq_ghz=sim.f,
            n_in=n_in, n_out=info["n_out"], latency_ms=m.latency_s * 1e3,
            utilisation=m.utilisation, power_w=info["power_w"], congestion=m.congestion,
            queued=info["queued"], moved_keys=sim.moved_last, solve_ms=solve_ms,
            throughput_violation=ratio < scn.throughput_ratio,
            latency_violation=m.latency_s > scn.latency_bound_s))
        started = time.perf_counter()
        u, forecast = controller(m, Config(sim.n, sim.f))
        solve_ms = (time.perf_counter() - started) * 1e3
        sim.apply(u)
        if on_step:
            on_step(t)
    queued = float(sim.queue.sum() + sim.backlog.sum())
    error = abs(sim.total_in - sim.total_out - queued) / max(sim.total_in, 1.0)
    return SimResult(label, records, summarise(records, scn), error)


SUMMARY_FIELDS = ("throughput_violations", "latency_violations", "reconfigurations",
                  "mean_amplitude", "mean_workers", "mean_power_w", "median_latency_ms",
                  "p95_latency_ms", "solve_ms_p95", "forecast_mape_pct", "moved_keys")


def summarise(records: list[StepRecord], scn: Scenario) -> dict:
    """The thesis' §7.2.3 metrics for one run."""
    reconf, amplitudes = 0, []
    for prev, cur in zip(records, records[1:], strict=False):
        dn = cur.workers - prev.workers
        df = round((cur.freq_ghz - prev.freq_ghz) / F_STEP_GHZ)
        if dn or df:
            reconf += 1
            amplitudes.append(math.hypot(dn, df))
    solve = sorted(r.solve_ms for r in records)
    p95 = solve[min(len(solve) - 1, int(math.ceil(0.95 * len(solve))) - 1)] if solve else 0.0
    pairs = [(r.rate, r.forecast) for r in records if r.forecast is not None and r.rate > 0]
    mape = (100 * float(np.mean([abs(a - f) / a for a, f in pairs]))) if pairs else None
    return {
        "throughput_violations": sum(r.throughput_violation for r in records),
        "latency_violations": sum(r.latency_violation for r in records),
        "reconfigurations": reconf,
        "mean_amplitude": float(np.mean(amplitudes)) if amplitudes else 0.0,
        "mean_workers": float(np.mean([r.workers for r in records])),
        "mean_power_w": float(np.mean([r.power_w for r in records])),
        "median_latency_ms": float(np.median([r.latency_ms for r in records])),
        "p95_latency_ms": float(np.percentile([r.latency_ms for r in records], 95)),
        "solve_ms_p95": p95,
        "forecast_mape_pct": mape,
        "moved_keys": int(sum(r.moved_keys for r in records)),
    }
