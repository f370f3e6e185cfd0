"""Model-predictive control of (workers n, frequency f) — thesis §5.4.3 and §6.3.

J = sum_{i=0..h-1} L(i),  L(i) = Q(q~(tau+i)) + R(u(tau+i)) + S(u(tau+i) - u(tau+i-1))
(Eq. 6.12) with:

* Q: throughput ``alpha * T_S`` (Eq. 6.13), latency ``alpha * exp(R_Q / delta)``
  (Eq. 6.14), or throughput ``alpha * exp(rho)`` (Eq. 7.1);
* R: ``beta * n`` (Eq. 6.15) or ``beta * P`` (Eq. 6.16), P in the artifact's units
  (n + extra)·f·V(f)² (``PowerModel.cost_units``): Table 7.2's weights are tuned for
  them, and the watts' calibration C_eff must not change a decision (the power budget
  is in watts);
* S: ``gamma * ||Delta u||^2`` (Eq. 6.17) with f in integer steps of ``f_step`` GHz, so
  one frequency step weighs like one worker (the artifact's (f - f_min) * 10).

Latency model (``latency_model``): ``kingman`` — Eq. 6.8/6.9, R_Q = T + e·W_Q (the
thesis' record-at-a-time operator); ``microbatch`` — the control library's
``sysmodel.MicroBatchModel`` for a micro-batch engine (Spark): the q-quantile latency
(1+q)·o/(1-rho)·e with o the batch overhead, rho = lambda·T/n and e the feedback factor
(Eq. 6.10 applied to the whole latency: a micro-batch's records all wait).

Transition cost (``transition``; ours, beside the thesis' S term, which prices a change
only by its size): on a keyed micro-batch engine a change of workers has a latency of
its own — a new executor must register, and the state of the key groups that move is
reloaded on their new executor while the batches that carry the move run slower. With
``TransitionModel.seconds(n, n')`` = X (executor start when scaling up, plus seconds per
byte of state times the state that moves, |n' - n| / max(n, n') of it under a balanced
layout), the step a change lands in has latency R + X. What the bound is about is a
violation, so the change costs the latency cost it adds above the bound:
Q(max(R + X, delta)/delta) - Q(max(R, delta)/delta) (``transition_qos``): nothing while
R + X stays within the bound (a scale-down at low load is free), the full marginal cost
once R is over it. Because Q is exponential, the same move costs less before latency
has climbed: the controller moves before a peak, or not at all for a short one. Only
latency QoS is priced this way; without measurements (``transition`` None or zero) the
thesis' objective is unchanged.

Power budget (``power_budget_w``): a hard constraint. A configuration whose modelled power
exceeds it costs ``OVER_BUDGET`` · (1 + relative excess) in R, above any QoS cost (even
saturation), so it is chosen only when every configuration is over budget — and then the
one least over it.

Configurations with rho >= 1 have no finite Kingman latency; the thesis does not say how
to cost them. Here they cost ``INFEASIBLE`` times rho (so a less overloaded one ranks
first by a margin no resource cost can outweigh) — finite, so every solver always returns
a plan, and an operator sees a saturated prediction instead of no decision. Saturation
must also cost more than any configuration that is *not* saturated, however slow:
exp(R_Q/delta) alone passes INFEASIBLE at R_Q/delta ~ 21 (a near-saturated plan with a
large feedback factor), and the controller then preferred the saturated plan — it scaled
a live run *down* under a rate step. So past ``LATENCY_EXP_CAP`` the latency cost keeps
rising but stays below 2·alpha·e^cap (``latency_qos``), and saturation costs
alpha·e^cap·(2 + rho) on top of INFEASIBLE·rho.

Three exact solvers return the same optimum:

* ``exhaustive``: every sequence, O((N|F|)^h) (reference for tests);
* ``bnb``: the thesis' Branch & Bound over the evolution tree (§6.3.2): a node is
  expanded only while its cumulative cost is below the best complete path (exact since
  every L > 0);
* ``dp``: the step cost depends only on u(tau+i) and u(tau+i-1), so J is a shortest
  path through h layers of N|F| configurations: O(h (N|F|)^2), vectorised.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from control import sysmodel as sm

INFEASIBLE = 1e9
LATENCY_EXP_CAP = 20.0
OVER_BUDGET = 1e15
QOS_KINDS = ("throughput", "latency", "throughput_exp")
LATENCY_MODELS = ("kingman", "microbatch")
RESOURCE_KINDS = ("node", "power")


def latency_qos(alpha: float, ratio: Any) -> Any:
    """Eq. 6.14's alpha·exp(R_Q/delta) up to ``LATENCY_EXP_CAP``; past it
    alpha·e^cap·(2 - cap/x): continuous, still increasing, and below 2·alpha·e^cap, which
    ``saturated_qos`` exceeds. Works on floats and numpy arrays."""
    x = np.maximum(ratio, 0.0)
    capped = np.minimum(x, LATENCY_EXP_CAP)
    beyond = 2.0 - LATENCY_EXP_CAP / np.maximum(x, LATENCY_EXP_CAP)
    out = alpha * np.where(x <= LATENCY_EXP_CAP, np.exp(capped),
                           math.exp(LATENCY_EXP_CAP) * beyond)
    return float(out) if np.ndim(out) == 0 else out


def saturated_qos(alpha: float, rho: Any) -> Any:
    """rho >= 1: above every unsaturated latency cost, and a less overloaded plan first."""
    return INFEASIBLE * rho + alpha * math.exp(LATENCY_EXP_CAP) * (2.0 + rho)


@dataclass(frozen=True)
class Config:
    workers: int
    freq_ghz: float


@dataclass(frozen=True)
class TransitionModel:
    """What one change of workers costs in time (measured by the live runtime; see the
    module docstring)."""

    executor_start_s: float = 0.0  # a requested executor registers and takes tasks
    reload_s_per_byte: float = 0.0  # extra batch time per byte of state moved
    state_bytes: float = 0.0  # the keyed state held now

    def moved_bytes(self, n_from: int, n_to: int) -> float:
        """State a balanced layout moves from n to n' workers: |n' - n| / max(n, n')."""
        if n_from == n_to:
            return 0.0
        return self.state_bytes * abs(n_to - n_from) / max(n_from, n_to)

    def seconds(self, n_from: int, n_to: int) -> float:
        if n_from == n_to:
            return 0.0
        start = self.executor_start_s if n_to > n_from else 0.0
        return start + self.reload_s_per_byte * self.moved_bytes(n_from, n_to)


@dataclass(frozen=True)
class MpcProblem:
    """Everything one control step needs. Rates are tuples/s; times in seconds."""

    worker_options: tuple[int, ...]
    freq_options: tuple[float, ...]
    current: Config
    rate_forecast: tuple[float, ...]  # one arrival rate per horizon step
    comp_time_s: float  # T measured at f_measured (Eq. 6.2)
    f_measured: float
    ca2: float = 1.0
    cs2: float = 1.0
    feedback: float = 1.0  # e of Eq. 6.10
    qos: str = "latency"
    resource: str = "node"
    latency_bound_s: float = 1.0  # delta of Eq. 6.14
    alpha: float = 2.0
    beta: float = 0.5
    gamma: float = 0.4
    f_step: float = 0.1
    time_unit_s: float = 1e-6  # Eq. 6.13's T_S is costed in this unit
    utilisation_margin: float = 1.0  # the artifact uses 0.95: rho = T_S^id/(0.95 T_A)
    power: sm.PowerModel = field(default_factory=sm.power_model)
    latency_model: str = "kingman"
    batch_overhead_s: float = 0.0  # microbatch: o, the fixed cost of one batch
    latency_quantile: float = 0.95  # microbatch: which latency quantile is predicted
    power_budget_w: float | None = None  # hard constraint (see the module docstring)
    transition: TransitionModel | None = None  # ours: a change's own latency
    transition_weight: float = 1.0  # 0: the thesis' objective; >1 fears reloads more

    @property
    def horizon(self) -> int:
        return len(self.rate_forecast)

    def configs(self) -> list[Config]:
        return [Config(n, f) for n in self.worker_options for f in self.freq_options]

    def config_at(self, j: int) -> Config:
        """Configuration j of the grid (workers major, frequency minor)."""
        n_f = len(self.freq_options)
        return Config(self.worker_options[j // n_f], self.freq_options[j % n_f])

    def grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Workers and frequencies of every configuration, as arrays (same order)."""
        n = np.repeat(np.asarray(self.worker_options, dtype=float), len(self.freq_options))
        f = np.tile(np.asarray(self.freq_options, dtype=float), len(self.worker_options))
        return n, f

    def validate(self) -> None:
        if self.qos not in QOS_KINDS or self.resource not in RESOURCE_KINDS:
            raise ValueError(f"qos must be one of {QOS_KINDS}, resource one of "
                             f"{RESOURCE_KINDS}")
        if self.latency_model not in LATENCY_MODELS:
            raise ValueError(f"latency_model must be one of {LATENCY_MODELS}")
        if not self.rate_forecast or any(r < 0 for r in self.rate_forecast):
            raise ValueError("rate_forecast needs h >= 1 non-negative rates")
        if not self.worker_options or min(self.worker_options) < 1:
            raise ValueError("worker_options must be whole numbers >= 1")
        if not self.freq_options or min(self.freq_options) <= 0:
            raise ValueError("freq_options must be > 0 GHz")
        if self.comp_time_s <= 0 or self.f_measured <= 0:
            raise ValueError("comp_time_s and f_measured must be > 0")


@dataclass(frozen=True)
class StepPrediction:
    workers: int
    freq_ghz: float
    rate: float
    utilisation: float
    throughput: float
    latency_s: float
    power_w: float
    qos_cost: float
    resource_cost: float
    switching_cost: float
    transition_cost: float = 0.0  # ours: the change's own latency (module docstring)

    @property
    def cost(self) -> float:
        return self.qos_cost + self.resource_cost + self.switching_cost + self.transition_cost


@dataclass
class Decision:
    """A decision record: serialisable (``as_dict``) and stored as-is by the control app."""

    solver: str
    chosen: Config
    cost: float
    trajectory: list[StepPrediction]
    nodes_explored: int
    nodes_total: int
    solve_time_s: float

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types; a saturated prediction (infinite latency) becomes null."""
        d = asdict(self)
        for step, pred in zip(d["trajectory"], self.trajectory):
            step["cost"] = pred.cost
            for key, value in step.items():
                if isinstance(value, float) and not math.isfinite(value):
                    step[key] = None
        return d


# ----------------------------------------------------------------------- step costs
def predict(problem: MpcProblem, u: Config, rate: float) -> tuple[float, float, float,
                                                                   float, float]:
    """(utilisation, throughput, latency, power, qos cost) of ``u`` at ``rate``."""
    t = sm.scaled_computation_time(problem.comp_time_s, problem.f_measured, u.freq_ghz)
    t_s_ideal = sm.ideal_service_time(t, u.workers)  # Eq. 6.7
    t_a = 1.0 / rate if rate > 0 else math.inf
    rho = 0.0 if math.isinf(t_a) else t_s_ideal / (problem.utilisation_margin * t_a)
    t_s = sm.effective_service_time(t_a, t_s_ideal)  # Eq. 6.6
    throughput = 0.0 if math.isinf(t_s) else 1.0 / t_s
    if rho >= sm.SATURATED:
        latency = math.inf
    elif problem.latency_model == "microbatch":
        latency = problem.feedback * (1.0 + problem.latency_quantile) \
            * problem.batch_overhead_s / (1.0 - rho)
    elif math.isinf(t_a):
        latency = t
    else:
        latency = t + problem.feedback * sm.kingman_waiting_time(
            t_s_ideal, problem.utilisation_margin * t_a, problem.ca2, problem.cs2)
    power = problem.power.power(u.workers, u.freq_ghz)
    if rho >= sm.SATURATED:
        qos = saturated_qos(problem.alpha, rho)
    elif problem.qos == "throughput":
        qos = problem.alpha * (t_s if math.isfinite(t_s) else t_s_ideal) / problem.time_unit_s
    elif problem.qos == "throughput_exp":
        qos = problem.alpha * math.exp(rho)
    else:
        qos = latency_qos(problem.alpha, latency / problem.latency_bound_s)
    return rho, throughput, latency, power, qos


def resource_cost(problem: MpcProblem, u: Config) -> float:
    power = problem.power.power(u.workers, u.freq_ghz)
    budget = problem.power_budget_w
    if budget is not None and power > budget:
        return OVER_BUDGET * (1.0 + (power - budget) / budget)
    if problem.resource == "node":
        return problem.beta * u.workers  # Eq. 6.15
    return problem.beta * problem.power.cost_units(u.workers, u.freq_ghz)  # Eq. 6.16


def switching_cost(problem: MpcProblem, prev: Config, u: Config) -> float:
    """Eq. 6.17 with f in integer steps of f_step GHz."""
    dn = u.workers - prev.workers
    df = (u.freq_ghz - prev.freq_ghz) / problem.f_step
    return problem.gamma * (dn * dn + df * df)


def evaluate(problem: MpcProblem, path: list[Config]) -> list[StepPrediction]:
    """Predictions and cost terms along a plan (shared by every solver's record)."""
    out, prev = [], problem.current
    for rate, u in zip(problem.rate_forecast, path):
        rho, tp, lat, pw, qos = predict(problem, u, rate)
        out.append(StepPrediction(u.workers, u.freq_ghz, rate, rho, tp, lat, pw, qos,
                                  resource_cost(problem, u), switching_cost(problem, prev, u),
                                  transition_cost(problem, prev, u, lat)))
        prev = u
    return out


def transition_qos(alpha: float, latency_s: Any, extra_s: Any, bound_s: float) -> Any:
    """Q(max(R + X, delta)/delta) - Q(max(R, delta)/delta): the latency cost a change's X
    seconds add above the bound in the step it lands in (0 where R is not finite:
    saturation is priced already)."""
    r = np.asarray(latency_s, dtype=float)
    finite = np.isfinite(r)
    r = np.where(finite, r, 0.0)
    out = np.where(finite, latency_qos(alpha, np.maximum(r + extra_s, bound_s) / bound_s)
                   - latency_qos(alpha, np.maximum(r, bound_s) / bound_s), 0.0)
    return float(out) if np.ndim(out) == 0 else out


def transition_cost(problem: MpcProblem, prev: Config, u: Config, latency_s: float) -> float:
    if problem.transition is None or problem.qos != "latency":
        return 0.0
    extra = problem.transition.seconds(prev.workers, u.workers)
    if extra <= 0:
        return 0.0
    return problem.transition_weight * transition_qos(problem.alpha, latency_s, extra,
                                                      problem.latency_bound_s)


# -------------------------------------------------------------------------- solvers
def stage_costs(problem: MpcProblem) -> np.ndarray:
    """Q + R for every grid configuration at every horizon step (h x K), vectorised.

    The same formulas as ``predict``/``resource_cost`` (checked equal in the tests)."""
    return _stage_tables(problem)[0]


def _stage_tables(problem: MpcProblem) -> tuple[np.ndarray, np.ndarray]:
    """Q + R (h x K) and the predicted latency (h x K; inf when saturated, NaN for
    throughput QoS) of every configuration at every step."""
    n, f = problem.grid()
    v = np.tile([problem.power.voltage(fv) for fv in problem.freq_options],
                len(problem.worker_options))
    pm = problem.power
    units = (n + pm.extra_cores) * f * v * v  # PowerModel.cost_units
    power = pm.static_w + pm.c_eff * units
    resource = problem.beta * (n if problem.resource == "node" else units)
    if problem.power_budget_w is not None:
        budget = problem.power_budget_w
        resource = np.where(power > budget, OVER_BUDGET * (1.0 + (power - budget) / budget),
                            resource)
    t = problem.comp_time_s * problem.f_measured / f  # T(f)
    t_s_ideal = t / n  # Eq. 6.7
    rates = np.asarray(problem.rate_forecast, dtype=float)[:, None]
    latency = np.full((len(rates), len(n)), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_a = np.where(rates > 0, 1.0 / rates, np.inf)
        rho = np.where(np.isinf(t_a), 0.0, t_s_ideal / (problem.utilisation_margin * t_a))
        if problem.qos == "throughput":
            t_s = np.maximum(t_a, t_s_ideal)
            qos = problem.alpha * np.where(np.isinf(t_s), t_s_ideal, t_s) / problem.time_unit_s
        elif problem.qos == "throughput_exp":
            qos = problem.alpha * np.exp(rho)
        else:
            if problem.latency_model == "microbatch":
                latency = problem.feedback * (1.0 + problem.latency_quantile) \
                    * problem.batch_overhead_s / (1.0 - rho)
            else:
                wq = rho / (1.0 - rho) * (problem.ca2 + problem.cs2) / 2.0 * t_s_ideal
                latency = t + problem.feedback * np.where(np.isinf(t_a), 0.0, wq)
            qos = latency_qos(problem.alpha, latency / problem.latency_bound_s)
            latency = np.where(rho >= sm.SATURATED, np.inf, latency)
        qos = np.where(rho >= sm.SATURATED, saturated_qos(problem.alpha, rho), qos)
    return qos + resource[None, :], latency


def _step_tables(problem: MpcProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-step stage costs Q+R (h x K); the cost of each step's move from the previous
    configuration, S plus the transition's (h x K x K; layer 0 unused); the cost of the
    first step's move from the current configuration (K)."""
    stage, latency = _stage_tables(problem)
    h = stage.shape[0]
    n, f = problem.grid()
    f = f / problem.f_step
    switch = problem.gamma * ((n[:, None] - n[None, :]) ** 2 + (f[:, None] - f[None, :]) ** 2)
    cur = problem.current
    from_current = problem.gamma * ((n - cur.workers) ** 2
                                    + (f - cur.freq_ghz / problem.f_step) ** 2)
    moves = np.broadcast_to(switch, (h, *switch.shape))
    tr = problem.transition
    weight = problem.transition_weight
    if tr is not None and problem.qos == "latency" and weight > 0:
        extra = np.array([[tr.seconds(int(a), int(b)) for b in n] for a in n])
        if extra.any():
            moves = switch[None, :, :] + weight * np.stack([
                transition_qos(problem.alpha, latency[i][None, :], extra,
                               problem.latency_bound_s) for i in range(h)])
        first = np.array([tr.seconds(cur.workers, int(b)) for b in n])
        if first.any():
            from_current = from_current + weight * transition_qos(
                problem.alpha, latency[0], first, problem.latency_bound_s)
    return stage, moves, from_current


def _tree_size(k: int, h: int) -> int:
    return sum(k ** i for i in range(1, h + 1))


def _record(problem: MpcProblem, solver: str, path: list[int], explored: int,
            started: float) -> Decision:
    plan = [problem.config_at(j) for j in path]
    trajectory = evaluate(problem, plan)
    k = len(problem.worker_options) * len(problem.freq_options)
    return Decision(solver=solver, chosen=plan[0], cost=sum(s.cost for s in trajectory),
                    trajectory=trajectory, nodes_explored=explored,
                    nodes_total=_tree_size(k, problem.horizon),
                    solve_time_s=time.perf_counter() - started)


def solve_exhaustive(problem: MpcProblem) -> Decision:
    started = time.perf_counter()
    stage, switch, from_current = _step_tables(problem)
    k = stage.shape[1]
    best, best_path = math.inf, None
    for seq in itertools.product(range(k), repeat=problem.horizon):
        cost = from_current[seq[0]] + stage[0, seq[0]]
        for i in range(1, len(seq)):
            cost += switch[i, seq[i - 1], seq[i]] + stage[i, seq[i]]
        if cost < best:
            best, best_path = cost, seq
    assert best_path is not None
    return _record(problem, "exhaustive", list(best_path), _tree_size(k, problem.horizon),
                   started)


def solve_bnb(problem: MpcProblem) -> Decision:
    """Depth-first Branch & Bound (§6.3.2): prune a node whose cumulative cost already
    reaches the best complete plan. Children are visited cheapest step first, which
    finds a good incumbent early (the bound, not the order, makes it exact)."""
    started = time.perf_counter()
    stage, switch, from_current = _step_tables(problem)
    h = problem.horizon
    best = [math.inf]
    best_path: list[int] = []
    explored = [0]

    def expand(depth: int, prev: int | None, cost: float, path: list[int]) -> None:
        step = (from_current if prev is None else switch[depth, prev]) + stage[depth]
        for j in np.argsort(step, kind="stable"):
            explored[0] += 1
            c = cost + step[j]
            if c >= best[0]:
                break  # sorted: every later child costs at least as much
            if depth == h - 1:
                best[0] = c
                best_path[:] = path + [int(j)]
            else:
                expand(depth + 1, int(j), c, path + [int(j)])

    expand(0, None, 0.0, [])
    return _record(problem, "bnb", best_path, explored[0], started)


def solve_dp(problem: MpcProblem) -> Decision:
    """Shortest path through h layers (vectorised min-plus products)."""
    started = time.perf_counter()
    stage, switch, from_current = _step_tables(problem)
    h, k = problem.horizon, stage.shape[1]
    dist = from_current + stage[0]
    back = np.empty((h, k), dtype=np.int64)
    for i in range(1, h):
        total = dist[:, None] + switch[i]  # rows: previous, cols: next
        back[i] = np.argmin(total, axis=0)
        dist = total[back[i], np.arange(k)] + stage[i]
    j = int(np.argmin(dist))
    path = [j]
    for i in range(h - 1, 0, -1):
        j = int(back[i, j])
        path.append(j)
    path.reverse()
    return _record(problem, "dp", path, h * k * k, started)


SOLVERS = {"exhaustive": solve_exhaustive, "bnb": solve_bnb, "dp": solve_dp}


def decide(problem: MpcProblem, solver: str = "dp") -> Decision:
    problem.validate()
    try:
        return SOLVERS[solver](problem)
    except KeyError:
        raise ValueError(f"solver must be one of {sorted(SOLVERS)}") from None


def strategy_freqs(strategy: str, freqs: tuple[float, ...]) -> tuple[float, ...]:
    """The *-Node strategies run at the maximum frequency only (§7.2.3); the *-Power
    ones choose among all P-states."""
    return (max(freqs),) if strategy.endswith("-node") else freqs


# Table 7.2 (shared memory, random-walk workload): beta = 0.5, gamma = 0.4 ("Sw").
THESIS_STRATEGIES: dict[str, dict[str, Any]] = {
    "th-node": {"qos": "throughput", "resource": "node", "alpha": 200.0},
    "th-power": {"qos": "throughput", "resource": "power", "alpha": 200.0},
    "lat-node": {"qos": "latency", "resource": "node", "alpha": 2.0},
    "lat-power": {"qos": "latency", "resource": "power", "alpha": 2.0},
}
