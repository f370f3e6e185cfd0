"""Reactive baselines (thesis §5.4.1, §7.2.4–7.2.5) and a modern rate-based peer.

* ``ThRule``: add workers if utilisation rho > theta_max, remove if rho < theta_min
  (shared memory: (0.9, 0.8) or (0.95, 0.8)).
* ``LatRule``: the ratio of measured mean latency to the bound; above xi_max add, below
  xi_min remove (shared memory 1.2 / 0.8).
* ``PeakLoad``: n and f always at their maximum.
* ``SPL`` (Gedik et al., TPDS 2014, as the thesis ran it: congestion threshold 0.1,
  sensitivity 0.9, level = worker count): add a worker while congested (the source is
  blocked more than the threshold), remove one while not, and remember per level the
  throughput and congestion seen, refusing a move that the memory says did not pay
  (up without >= 1/sensitivity more throughput; down to a level that was congested or
  had < sensitivity of today's throughput). The memory is forgotten when the throughput
  at the current level moves by more than 1 - sensitivity (the workload changed).
* ``DS2``: DS2 (Kalavri et al., OSDI 2018) / Flink-autoscaler style. The true processing
  rate of one worker is what it processes per second of useful (busy) time,
  ``throughput / (n * rho)``. The target parallelism is
  ``ceil(rate / (true_rate * target_utilisation))``. It holds while capacity lies in the
  utilisation band; scale-ups apply at once; scale-downs are limited by the max factor
  and wait out the grace period after a scale-up.

Every rule keeps the frequency it is given (the thesis' rules do not use DVFS) and
clamps n to [n_min, n_max]. Each decision says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from control.strategies.mpc import Config


@dataclass(frozen=True)
class Observation:
    """What the monitor measured over the last control step."""

    rate: float  # arrivals per second
    throughput: float  # outputs per second
    utilisation: float  # mean worker utilisation rho
    latency_s: float  # mean latency
    workers: int
    freq_ghz: float
    congestion: float = 0.0  # fraction of the step the source was blocked (SPL)


@dataclass(frozen=True)
class RuleDecision:
    chosen: Config
    reason: str


@dataclass
class _Bounded:
    n_min: int = 1
    n_max: int = 12

    def _clamp(self, n: int) -> int:
        return max(self.n_min, min(self.n_max, n))

    def state(self) -> dict[str, Any]:
        """What the rule learned across steps, as JSON (its settings are the policy's)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` returned."""

    def _threshold_step(self, obs: Observation, label: str, value: float, high: float,
                        low: float, step: int) -> RuleDecision:
        """Event-condition-action: +step above ``high``, -step below ``low``."""
        n = obs.workers
        if value > high:
            n, why = self._clamp(n + step), f"{label} {value:.2f} > {high}"
        elif value < low:
            n, why = self._clamp(n - step), f"{label} {value:.2f} < {low}"
        else:
            why = f"{label} {value:.2f} within [{low}, {high}]"
        return RuleDecision(Config(n, obs.freq_ghz), why)


@dataclass
class ThRule(_Bounded):
    theta_max: float = 0.9
    theta_min: float = 0.8
    step: int = 1

    def decide(self, obs: Observation) -> RuleDecision:
        return self._threshold_step(obs, "rho", obs.utilisation, self.theta_max,
                                    self.theta_min, self.step)


@dataclass
class LatRule(_Bounded):
    bound_s: float = 1.0
    xi_max: float = 1.2
    xi_min: float = 0.8
    step: int = 1

    def decide(self, obs: Observation) -> RuleDecision:
        return self._threshold_step(obs, "latency/bound", obs.latency_s / self.bound_s,
                                    self.xi_max, self.xi_min, self.step)


@dataclass
class PeakLoad(_Bounded):
    f_max: float = 2.0

    def decide(self, obs: Observation) -> RuleDecision:
        return RuleDecision(Config(self.n_max, self.f_max), "peak load: always the maximum")


@dataclass
class DS2(_Bounded):
    """Defaults are Flink's autoscaler options (AutoScalerOptions): target.utilization
    0.7, target.utilization.boundary 0.3, scale-down.max-factor 0.6, and
    scale-up.grace-period 1 h (no scale-down within it after a scale-up). The grace
    period is counted in control steps of ``control_step_s``."""

    target_utilisation: float = 0.7
    utilisation_boundary: float = 0.3
    scale_down_max_factor: float = 0.6
    grace_period_s: float = 3600.0
    control_step_s: float = 2.0
    _since_scale_up_s: float = field(default=math.inf, repr=False)

    def state(self) -> dict[str, Any]:
        # JSON has no infinity: None is "no scale-up seen yet".
        since = self._since_scale_up_s
        return {"since_scale_up_s": since if math.isfinite(since) else None}

    def restore(self, state: dict[str, Any]) -> None:
        since = state.get("since_scale_up_s")
        self._since_scale_up_s = math.inf if since is None else float(since)

    def true_rate(self, obs: Observation) -> float | None:
        """Records one worker processes per second of busy time."""
        busy = obs.workers * obs.utilisation
        return obs.throughput / busy if busy > 0 and obs.throughput > 0 else None

    def target(self, obs: Observation) -> int | None:
        per_worker = self.true_rate(obs)
        if per_worker is None:
            return None
        return self._clamp(math.ceil(obs.rate / (per_worker * self.target_utilisation)))

    def decide(self, obs: Observation) -> RuleDecision:
        n = obs.workers
        self._since_scale_up_s += self.control_step_s
        per_worker, want = self.true_rate(obs), self.target(obs)
        hold = Config(n, obs.freq_ghz)
        if per_worker is None or want is None:
            return RuleDecision(hold, "no busy time measured: hold")
        capacity = per_worker * n
        low = obs.rate / (self.target_utilisation + self.utilisation_boundary)
        high_util = self.target_utilisation - self.utilisation_boundary
        high = obs.rate / high_util if high_util > 0 else math.inf
        if low <= capacity <= high:
            return RuleDecision(hold, f"capacity {capacity:.0f}/s within [{low:.0f}, "
                                      f"{high:.0f}]: hold")
        if want > n:
            self._since_scale_up_s = 0.0
            return RuleDecision(Config(want, obs.freq_ghz), f"target {want} > {n}: scale up")
        if want < n:
            if self._since_scale_up_s < self.grace_period_s:
                return RuleDecision(hold, f"target {want} < {n}, but within the "
                                          f"{self.grace_period_s:.0f}s grace after a scale-up")
            floor = math.ceil(n * (1 - self.scale_down_max_factor))
            chosen = self._clamp(max(want, floor))
            return RuleDecision(Config(chosen, obs.freq_ghz),
                                f"target {want} < {n}: scale down to {chosen}")
        return RuleDecision(hold, f"target {want} = current")


@dataclass
class SPL(_Bounded):
    congestion_threshold: float = 0.1
    sensitivity: float = 0.9
    memory: dict[int, tuple[float, bool]] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        return {"memory": [[n, tp, congested] for n, (tp, congested) in self.memory.items()]}

    def restore(self, state: dict[str, Any]) -> None:
        self.memory = {int(n): (float(tp), bool(congested))
                       for n, tp, congested in state.get("memory", [])}

    def decide(self, obs: Observation) -> RuleDecision:
        n, tp = obs.workers, obs.throughput
        congested = obs.congestion > self.congestion_threshold
        seen = self.memory.get(n)
        if seen is not None and abs(tp - seen[0]) > (1 - self.sensitivity) * seen[0]:
            self.memory.clear()  # the workload changed: past outcomes no longer hold
        self.memory[n] = (tp, congested)
        hold = RuleDecision(Config(n, obs.freq_ghz), "")
        if congested:
            above = self.memory.get(n + 1)
            if n + 1 > self.n_max:
                return RuleDecision(hold.chosen, "congested, already at the maximum level")
            if above is not None and above[0] * self.sensitivity < tp:
                return RuleDecision(hold.chosen, f"congested, but level {n + 1} did not "
                                                 "raise throughput before")
            return RuleDecision(Config(n + 1, obs.freq_ghz),
                                f"congestion {obs.congestion:.2f} > {self.congestion_threshold}")
        below = self.memory.get(n - 1)
        if n - 1 < self.n_min:
            return RuleDecision(hold.chosen, "not congested, already at the minimum level")
        if below is not None and (below[1] or below[0] < self.sensitivity * tp):
            return RuleDecision(hold.chosen, f"level {n - 1} was congested or slower before")
        return RuleDecision(Config(n - 1, obs.freq_ghz),
                            f"congestion {obs.congestion:.2f} <= {self.congestion_threshold}")
