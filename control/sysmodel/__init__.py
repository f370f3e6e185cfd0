"""The system model Phi of the thesis (Eq. 5.1): throughput, latency and power of a
keyed operator with n workers at CPU frequency f. Pure Python, no Django.

Named ``sysmodel`` because ``control/models.py`` is the Django app's model module.
References are to the thesis (De Matteis, "Parallel Patterns for Adaptive Data Stream
Processing").
Times are in seconds unless a name says otherwise.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A utilisation at or above this is a bottleneck (thesis §6.2.1: rho_i >= 1 blocks
# the emitter through backpressure).
SATURATED = 1.0


# ------------------------------------------------------------ derived metrics (§6.2.1)
def worker_computation_time(p: Sequence[float], t: Sequence[float],
                            routing: Sequence[int], worker: int) -> float:
    """Eq. 6.1: T_W^i = sum_{k: m(k)=i} p_k T_k / sum_{k: m(k)=i} p_k."""
    num = sum(pk * tk for pk, tk, w in zip(p, t, routing) if w == worker)
    den = sum(pk for pk, w in zip(p, routing) if w == worker)
    return num / den if den > 0 else 0.0


def operator_computation_time(p: Sequence[float], t: Sequence[float]) -> float:
    """Eq. 6.2: T = sum_k p_k T_k."""
    return sum(pk * tk for pk, tk in zip(p, t))


def worker_interarrival_time(t_a: float, p: Sequence[float], routing: Sequence[int],
                             worker: int) -> float:
    """Eq. 6.3: T_A^i = T_A / sum_{k: m(k)=i} p_k (infinite for an idle worker)."""
    share = sum(pk for pk, w in zip(p, routing) if w == worker)
    return t_a / share if share > 0 else math.inf


def worker_utilisation(t_a: float, p: Sequence[float], t: Sequence[float],
                       routing: Sequence[int], worker: int) -> float:
    """Eq. 6.4: rho_i = T_W^i / T_A^i."""
    t_ai = worker_interarrival_time(t_a, p, routing, worker)
    return 0.0 if math.isinf(t_ai) else worker_computation_time(p, t, routing, worker) / t_ai


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """c = sigma / mean of a sample (0 for fewer than two samples or a zero mean)."""
    if len(samples) < 2:
        return 0.0
    mean = sum(samples) / len(samples)
    if mean == 0:
        return 0.0
    var = sum((x - mean) ** 2 for x in samples) / (len(samples) - 1)
    return math.sqrt(var) / mean


# --------------------------------------------------------------- throughput (§6.2.2)
def ideal_service_time_routed(t_a: float, p: Sequence[float], t: Sequence[float],
                              routing: Sequence[int], workers: int) -> float:
    """Eq. 6.5: T_S^id = T_W^b * sum_{k: m(k)=b} p_k with b the most utilised worker."""
    b = max(range(workers), key=lambda i: worker_utilisation(t_a, p, t, routing, i))
    share = sum(pk for pk, w in zip(p, routing) if w == b)
    return worker_computation_time(p, t, routing, b) * share


def ideal_service_time(t: float, workers: int) -> float:
    """Eq. 6.7: T_S^id = T / n when the rebalancer keeps the load balanced."""
    return t / workers


def effective_service_time(t_a: float, t_s_ideal: float) -> float:
    """Eq. 6.6: T_S = max(T_A, T_S^id); throughput is 1 / T_S."""
    return max(t_a, t_s_ideal)


def scaled_computation_time(t_measured: float, f_measured: float, f: float) -> float:
    """§6.2.2: computation time is inversely proportional to f (CPU-bound code):
    T(f) = T(f_measured) * f_measured / f."""
    return t_measured * f_measured / f


# ------------------------------------------------------------------ latency (§6.2.2)
def kingman_waiting_time(t_s_ideal: float, t_a: float, ca2: float, cs2: float) -> float:
    """Eq. 6.9 (Kingman, G/G/1): W_Q = rho/(1-rho) * (c_a^2 + c_s^2)/2 * T_S^id,
    rho = T_S^id / T_A. Infinite when rho >= 1 (the formula holds only below 1)."""
    rho = t_s_ideal / t_a
    if rho >= SATURATED:
        return math.inf
    return rho / (1.0 - rho) * (ca2 + cs2) / 2.0 * t_s_ideal


def feedback_factor(measured_wq: Sequence[float], predicted_wq: Sequence[float]) -> float:
    """Eq. 6.10: e = W_Q measured / W_Q predicted at the previous step. The artifact
    averages the last three ratios; pairs with a zero or infinite prediction are
    skipped, and with no usable pair the factor is 1."""
    ratios = [m / p for m, p in zip(measured_wq, predicted_wq)
              if p > 0 and math.isfinite(p) and math.isfinite(m)]
    return sum(ratios[-3:]) / len(ratios[-3:]) if ratios else 1.0


def response_time(t: float, t_s_ideal: float, t_a: float, ca2: float, cs2: float,
                  feedback: float = 1.0) -> float:
    """Eq. 6.8 with 6.10: R_Q = T + e * W_Q^K."""
    return t + feedback * kingman_waiting_time(t_s_ideal, t_a, ca2, cs2)


@dataclass(frozen=True)
class MicroBatchModel:
    """Latency of a micro-batch engine (Spark Structured Streaming), ours, not the thesis'.

    A batch that starts at s collects every record that arrived during the previous
    batch and takes D = overhead + records * cost / n to process (the per-record cost
    spread over n workers). In steady state the batch that arrives in a batch of
    duration D is processed in the next one, so D solves

        D = o + lambda * D * c / n   =>   D* = o / (1 - lambda c / n),

    stable only while lambda c / n < 1 (the same utilisation rho as Eq. 6.9). A record
    waits on average D/2 for its batch to start (arrivals uniform over the previous
    batch) and then D for it to finish: mean latency 1.5 D, and the worst record (the
    first of its batch) sees 2 D; the p-quantile is (1 + p) D.
    """

    overhead_s: float
    cost_per_record_s: float

    def utilisation(self, rate: float, workers: int) -> float:
        return rate * self.cost_per_record_s / workers

    def batch_duration(self, rate: float, workers: int) -> float:
        rho = self.utilisation(rate, workers)
        return math.inf if rho >= SATURATED else self.overhead_s / (1.0 - rho)

    def latency_quantile(self, rate: float, workers: int, q: float) -> float:
        return (1.0 + q) * self.batch_duration(rate, workers)

    def mean_latency(self, rate: float, workers: int) -> float:
        return 1.5 * self.batch_duration(rate, workers)


# -------------------------------------------------------------------- power (§6.2.2)
@dataclass(frozen=True)
class PowerModel:
    """Eq. 6.11: P = C_eff * n * f * V(f)^2 (+ an optional static part).

    The thesis gives no C_eff and no voltage table; only relative values matter for
    ranking configurations. ``voltages`` maps GHz to volts (interpolated linearly);
    ``extra_cores`` counts always-busy cores (the artifact uses n + 3: emitter,
    collector, controller)."""

    voltages: Mapping[float, float]
    c_eff: float = 1.0
    extra_cores: int = 0
    static_w: float = 0.0

    def voltage(self, f: float) -> float:
        points = sorted(self.voltages.items())
        if f <= points[0][0]:
            return points[0][1]
        for (f0, v0), (f1, v1) in zip(points, points[1:]):
            if f <= f1:
                return v0 + (v1 - v0) * (f - f0) / (f1 - f0)
        return points[-1][1]

    def power(self, workers: int, f: float) -> float:
        return self.static_w + self.c_eff * (workers + self.extra_cores) * f \
            * self.voltage(f) ** 2

    def cost_units(self, workers: int, f: float) -> float:
        """The dynamic part without C_eff, (n + extra)·f·V(f)², the artifact's power cost
        that Table 7.2's weights are tuned for: what an MPC prices, so that calibrating
        the watts (C_eff) never changes a decision."""
        return (workers + self.extra_cores) * f * self.voltage(f) ** 2


# The thesis' machine: 1.2-2.0 GHz in 0.1 GHz steps (9 P-states), TurboBoost off (§7.2).
THESIS_FREQUENCIES_GHZ = tuple(round(1.2 + 0.1 * i, 1) for i in range(9))
# An assumed linear V(f), 0.8 V at 1.2 GHz to 1.1 V at 2.0 GHz, flat outside (not a
# measurement; the thesis gives no voltage table).
ASSUMED_VOLTAGES = {1.2: 0.8, 2.0: 1.1}
# An assumed ~10 W per busy core at 2.0 GHz / 1.1 V (not a measurement: the thesis gives
# no C_eff). The one source of the modelled watts: the simulator, the Strategy Lab, the
# MPC's power budget and the live runner's "modelled" power all use ``power_model()``.
WATTS_PER_CORE_AT_2GHZ = 10.0
C_EFF_W = WATTS_PER_CORE_AT_2GHZ / (2.0 * 1.1**2)


def power_model(extra_cores: int = 0, static_w: float = 0.0) -> PowerModel:
    """Eq. 6.11 with the constants above: one model for simulation and live runs."""
    return PowerModel(ASSUMED_VOLTAGES, c_eff=C_EFF_W, extra_cores=extra_cores,
                      static_w=static_w)
