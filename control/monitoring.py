"""Monitored and derived metrics of one control step (thesis Tables 6.1–6.2, §6.2.1).

From what a step measured — the arrival times, and per key group the tuples seen and
their total computation time — it derives the arrival rate and the coefficient of
variation of inter-arrival times, p_k and T_k per key group, T (Eq. 6.2), per-worker
utilisation (Eqs. 6.1–6.4) under a routing table, and c_s of the computation times.
Pure Python.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from control import sysmodel as sm


@dataclass(frozen=True)
class StepMetrics:
    rate: float  # arrivals per second
    ca2: float  # squared coefficient of variation of inter-arrival times
    p: tuple[float, ...]  # key-group frequencies (sum to 1)
    t: tuple[float, ...]  # mean computation time per key group (s)
    comp_time: float  # T = sum p_k T_k (Eq. 6.2)
    cs2: float  # squared coefficient of variation of computation times
    utilisation: tuple[float, ...]  # rho_i per worker (Eq. 6.4)
    latency_s: float | None  # measured mean response time, if the sink reported it

    @property
    def waiting_s(self) -> float | None:
        """Measured waiting time W_Q = R_Q - T (Eq. 6.8), when latency was measured."""
        return None if self.latency_s is None else max(self.latency_s - self.comp_time, 0.0)

    @property
    def max_utilisation(self) -> float:
        return max(self.utilisation) if self.utilisation else 0.0


def step_metrics(arrival_times: Sequence[float], group_counts: Sequence[int],
                 group_busy_s: Sequence[float], routing: Sequence[int], workers: int,
                 service_times: Sequence[float] = (), latency_s: float | None = None
                 ) -> StepMetrics:
    """Derive a step's metrics; ``service_times`` (samples) gives c_s when available."""
    if len(arrival_times) < 2:
        raise ValueError("need at least two arrivals in a step")
    if not (len(group_counts) == len(group_busy_s) == len(routing)):
        raise ValueError("group_counts, group_busy_s and routing need one entry per group")
    gaps = [b - a for a, b in zip(arrival_times, arrival_times[1:])]
    t_a = sum(gaps) / len(gaps)
    ca = sm.coefficient_of_variation(gaps)
    total = sum(group_counts)
    p = tuple(c / total if total else 0.0 for c in group_counts)
    t = tuple(busy / c if c else 0.0 for c, busy in zip(group_counts, group_busy_s))
    rho = tuple(sm.worker_utilisation(t_a, p, t, routing, i) for i in range(workers))
    cs = sm.coefficient_of_variation(service_times)
    return StepMetrics(rate=1.0 / t_a, ca2=ca * ca, p=p, t=t,
                       comp_time=sm.operator_computation_time(p, t), cs2=cs * cs,
                       utilisation=rho, latency_s=latency_s)
