"""The closed loop's controller for a live Spark run (pure Python, no Django).

One :class:`LiveController` per run carries the thesis' control loop (ch. 6, Fig. 6.2):
**monitor** (the runner's per-batch records since the last tick, ``observe``) →
**forecast** (the strategy's forecaster) → **decide** (an MPC strategy of
``control.strategies.mpc`` or a rule of ``control.strategies.rules``) under the policy's
hard limits → a :class:`LiveDecision`, which the caller applies (Celery on the product,
the bus in the benchmark) and stores.

Model on Spark (micro-batches; ours, documented in ``sysmodel.MicroBatchModel``): a batch
of N input records on n workers at frequency f takes D = o + c·N·f_max/(n·f); ``o`` and
``c`` are re-fitted every tick by least squares over the recent batches (batches with
failed tasks or a migration step are left out). Then rho = lambda·c/n at f_max, and the
p95 latency is (1 + 0.95)·o/(1-rho)·e, with e the feedback factor of Eq. 6.10 (measured
over predicted latency, last three steps). Power is the runner's modelled Eq. 6.11, so a
prediction and the chart speak of the same watts.

Inputs: rule strategies and DS2 read the workers' measured busy time (task
times per key group, ``measured_busy``) and the source's backlog; the fitted model only
where a prediction is needed (the MPC's horizon, pipelines without keyed tasks).

Hard limits: the worker range and the power budget. MPC strategies never see an
over-budget configuration as affordable (``MpcProblem.power_budget_w``); rules and static
strategies are clamped to the nearest configuration within the budget. When no
configuration meets both the budget and the latency bound, the budget is kept, the best
remaining configuration is chosen and the decision carries an alert.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from control import fleet
from control import forecasting as fc
from control import sysmodel as sm
from control.planning import PlanningError
from control.planning import migration as planners
from control.strategies import RULES, STATICS, STRATEGIES, mpc, rules
from control.strategies.controller import MpcController
from control.strategies.mpc import Config, TransitionModel

MPC_STRATEGIES = tuple(sorted(mpc.THESIS_STRATEGIES))
RULE_STRATEGIES = RULES
STATIC_STRATEGIES = STATICS
LIVE_STRATEGIES = MPC_STRATEGIES + RULE_STRATEGIES + STATIC_STRATEGIES
LATENCY_QUANTILE = 0.95
FIT_WINDOW = 40  # batches used to fit o and c
SPREAD_FOR_SLOPE = 0.25  # std/mean of batch sizes needed to fit a slope
MIN_R2 = 0.5  # share of the batch-time variance a fitted line must explain
# A fitted o below this share of the fastest batch would mean that batch ran at rho > 0.7;
# such a line comes from a drifting run (warm-up), not from the load.
MIN_OVERHEAD_SHARE = 0.3
# The first batches of a run pay Spark's start-up (JIT, Python workers, first state
# loads: 5-15 s each here), and the next ones are still slower per record, with larger
# batches from the backlog the slow ones left: measured here, batch time kept falling for
# ~20 batches (p95 3.1 s -> 1.9 s at one rate). Deciding on them scales for a spike that
# is already over, and fitting them reads the warm-up trend as a steep per-record cost
# (o ~0.2 s, 2 workers predicted 5x faster). Both wait for WARMUP_BATCHES.
WARMUP_BATCHES = 20
# Transitions measured per kind that the MPC's transition cost takes the median of.
TRANSITION_SAMPLES = 5
# Eq. 6.10's factor is learned only from steady steps (no backlog of more than two
# batches' input) and kept within these bounds: a step that drains a backlog measures
# the drain, not the model's steady state, and would teach a factor of 10-30.
FEEDBACK_LIMITS = (0.25, 4.0)
# Lat-Power's beta (Eq. 6.16) on this platform, where the thesis' Table 7.2 has 0.5: its
# power term counts n + 3 cores (the emitter, collector and controller shared the
# machine-wide frequency), so a P-state step of one or two workers saved 2.5-4x what it
# saves here, where only the executors' cores change frequency. At 0.5 no step down
# ever paid for its switching cost (gamma 0.4) on 1-2 workers: the closed-loop benchmark
# saw Lat-Power hold f_max for every step. The thesis' tuning rule (sec. 7.2.3) scales
# the weights to the platform. Measured in the closed-loop benchmark (3 seeds, one
# machine, one calibration): at 1.0 Lat-Power walked down to the lowest P-state at
# 30 % load, where one worker's p95 sits at the bound, then scaled out at that clock;
# the 1 M-key migration then ran through the peak at 60 % of f_max for ~110 s, with no
# frequency change possible behind it (median 9 latency violations vs Lat-Node's 5). At
# 0.75 it steps down at light load less far, mostly once it has 2 workers, and back up
# before the bound (median 7 vs 5, 16 W vs 21 W modelled); one run in three still
# scaled out at a low clock. A policy's own beta wins.
LAT_POWER_BETA = 0.75
# Key-group rebalancing (thesis §6.4, Fig. 6.2's "rebalance" box): when the busiest
# worker carries more than (1 + threshold) x the mean keyed load, Ding's routing-table
# planner is asked for the least state to move under a cap of (1 + threshold/2) x mean;
# the plan is sent only if it lowers the imbalance by IMBALANCE_GAIN, and not again
# within REBALANCE_COOLDOWN_STEPS (a migration's first batches are not steady load).
# A policy sets ``rebalance_threshold`` (0 turns it off).
REBALANCE_THRESHOLD = 0.3
IMBALANCE_GAIN = 0.1
REBALANCE_COOLDOWN_STEPS = 5
# How its moves are paced (Megaphone, Hoffmann et al., VLDB 2019, §3.3).
REBALANCE_SCHEDULE = "batched"
# LiveController.to_state's format: a state of another version starts a fresh controller.
STATE_VERSION = 1


class LoopError(ValueError):
    """A policy or parameter the loop cannot run with; one line, naming the field."""


@dataclass(frozen=True)
class LoopPolicy:
    strategy: str
    latency_bound_s: float
    min_workers: int
    max_workers: int
    freqs_ghz: tuple[float, ...]  # settable frequencies; the largest is f_max
    power: sm.PowerModel
    power_budget_w: float | None = None
    throughput_floor: float = 0.0
    control_step_s: float = 2.0
    params: dict[str, Any] = field(default_factory=dict)
    violation_steps: int = 3  # QoS alert after this many violating steps in a row

    @property
    def f_max(self) -> float:
        return max(self.freqs_ghz)


@dataclass
class StepObservation:
    """The monitor's view of one control step (thesis Tables 6.1–6.2 on Spark)."""

    batches: int
    rate: float  # arrivals/s: growth of the source's available offset
    throughput: float  # records/s committed by the sink
    latency_s: float | None  # mean per-batch p95 latency
    batch_s: float | None  # mean batch duration
    workers: int
    freq_ghz: float
    power_w: float | None
    backlog: int  # records available but not yet read
    failed_tasks: int
    # Whether power_w was read (RAPL): a modelled power is the model the prediction
    # uses, and its error against itself says nothing.
    power_measured: bool = False
    # Mean busy fraction of the workers over the step, from the keyed tasks' measured
    # times (None: the runner reported no per-group task times).
    busy: float | None = None


@dataclass
class LiveDecision:
    step: int
    t: float
    strategy: str
    inputs: dict[str, Any]
    chosen: dict[str, Any]
    current: dict[str, Any]
    action: str  # hold | scale | frequency | scale+frequency | rebalance
    predictions: list[dict[str, Any]]
    cost: dict[str, Any]
    solve_ms: float
    reason: str
    alerts: list[str]
    model_error: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


def action_of(current_workers: int, current_ghz: float, workers: int, ghz: float) -> str:
    """What a change of configuration is: scale, frequency, scale+frequency or hold."""
    return "+".join(a for a, changed in (
        ("scale", workers != current_workers),
        ("frequency", not math.isclose(ghz, current_ghz, abs_tol=1e-6))) if changed) \
        or "hold"


def replan_target(workers: int, key_groups: int, limit: int = 1024) -> int:
    """The key groups a re-plan gives a run that wants ``workers`` but has fewer groups
    (a worker without a group idles): twice as many as now, at least the workers."""
    return min(limit, max(workers, 2 * key_groups))


def reconfiguration_commands(current: dict[str, Any], chosen: dict[str, Any], action: str,
                             rebalance: dict[str, Any] | None,
                             key_groups: int | None = None,
                             planner: dict[str, Any] | None = None,
                             ) -> list[tuple[str, dict[str, Any]]]:
    """The runner commands that carry out a decision, in the order they must run: a live
    re-plan first when the decision wants more workers than the run has key groups
    (``key_groups``; runtime/replan.py), then workers (the runner re-plans the placement
    for them), then the frequency, or a rebalance's moves. ``current`` is the decision's
    own (a read-only frequency already snapped to a settable one), so a rounding
    difference never becomes a command. ``planner``: the decision's migration planner
    and its options (``migration_planner`` of the decision's inputs), for set_workers."""
    commands: list[tuple[str, dict[str, Any]]] = []
    if key_groups is not None and chosen["workers"] > key_groups:
        commands.append(("replan", {"key_groups": replan_target(chosen["workers"],
                                                                key_groups),
                                    "scheme": "seamless"}))
    if chosen["workers"] != current["workers"]:
        commands.append(("set_workers", {"workers": chosen["workers"], **(planner or {})}))
    if not math.isclose(chosen["freq_ghz"], current["freq_ghz"], abs_tol=1e-6):
        commands.append(("set_frequency", {"ghz": chosen["freq_ghz"]}))
    if action == "rebalance" and rebalance:
        # Exactly the moves the decision shows (the runner would re-plan on its own,
        # slightly different load window), paced one batch of groups per step.
        commands.append(("move_groups", {"moves": rebalance["moves"],
                                         "schedule": REBALANCE_SCHEDULE}))
    return commands


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN/inf become None (a saturated prediction has no finite latency)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def _num(params: dict[str, Any], key: str, default: float, *, low: float,
         high: float | None = None, whole: bool = False, open_low: bool = False) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LoopError(f"{key}: must be a number, got {value!r}")
    if whole and int(value) != value:
        raise LoopError(f"{key}: must be a whole number, got {value}")
    if (value <= low) if open_low else (value < low):
        raise LoopError(f"{key}: must be {'>' if open_low else '>='} {low:g}, got {value:g}")
    if high is not None and value > high:
        raise LoopError(f"{key}: must be <= {high:g}, got {value:g}")
    return value


PARAMS: dict[str, tuple[str, ...]] = {
    **{s: ("horizon", "switching", "alpha", "beta", "gamma", "forecaster",
           "transition_weight") for s in MPC_STRATEGIES},
    "th-rule": ("theta_max", "theta_min"),
    "lat-rule": ("xi_max", "xi_min"),
    "spl": ("congestion_threshold", "sensitivity"),
    "peak-load": (), "ds2": ("target_utilisation",),
    "static-min": (), "static-max": (),
}
COMMON_PARAMS = ("violation_steps", "rebalance_threshold", "migration_planner", "mtm_gamma",
                 "warmup_batches")
# How a change of workers places the key groups: Ding's single-step optimum on the
# routing table, or its MTM look-ahead (Ding §4, Def. 4.1, on a table) with the
# transition matrix estimated from the run's own history of worker counts.
MIGRATION_PLANNERS = ("ding-table", "mtm-table")
# History of worker counts kept for the MTM estimate (control steps).
HISTORY_STEPS = 2000


def check_params(strategy: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validate a policy's strategy parameters; raise :class:`LoopError` naming the key.
    The Policy form shows the message on its field."""
    if strategy not in LIVE_STRATEGIES:
        raise LoopError(f"strategy: one of {', '.join(LIVE_STRATEGIES)}")
    if not isinstance(params, dict):
        raise LoopError("parameters: must be a JSON object")
    unknown = sorted(set(params) - set(PARAMS[strategy]) - set(COMMON_PARAMS))
    if unknown:
        allowed = ", ".join(PARAMS[strategy] + COMMON_PARAMS) or "none"
        raise LoopError(f"{unknown[0]}: unknown for {strategy} (allowed: {allowed})")
    if strategy in MPC_STRATEGIES:
        _num(params, "horizon", 1, low=1, high=5, whole=True)
        for key, default in (("alpha", 2.0), ("beta", 0.5)):
            _num(params, key, default, low=0, open_low=True)
        _num(params, "gamma", 0.4, low=0, open_low=True)
        _num(params, "transition_weight", 1.0, low=0, high=100)
        if not isinstance(params.get("switching", True), bool):
            raise LoopError("switching: true (Sw, gamma > 0) or false (NoSw)")
        if params.get("forecaster", "holt") not in ("holt", "ma3", "last"):
            raise LoopError("forecaster: one of holt, ma3, last")
    elif strategy == "th-rule":
        hi = _num(params, "theta_max", 0.9, low=0, high=2, open_low=True)
        if _num(params, "theta_min", 0.8, low=0, high=2) >= hi:
            raise LoopError("theta_min: must be below theta_max")
    elif strategy == "lat-rule":
        hi = _num(params, "xi_max", 1.2, low=0, high=100, open_low=True)
        if _num(params, "xi_min", 0.8, low=0, high=100) >= hi:
            raise LoopError("xi_min: must be below xi_max")
    elif strategy == "spl":
        _num(params, "congestion_threshold", 0.1, low=0, high=1)
        _num(params, "sensitivity", 0.9, low=0, high=1, open_low=True)
    elif strategy == "ds2":
        _num(params, "target_utilisation", 0.7, low=0, high=1, open_low=True)
    _num(params, "violation_steps", 3, low=1, high=1000, whole=True)
    # Fewer warm-up batches for a pipeline whose batches settle sooner (a policy says so).
    _num(params, "warmup_batches", WARMUP_BATCHES, low=3, high=1000, whole=True)
    _num(params, "rebalance_threshold", REBALANCE_THRESHOLD, low=0, high=10)
    if params.get("migration_planner", "ding-table") not in MIGRATION_PLANNERS:
        raise LoopError(f"migration_planner: one of {', '.join(MIGRATION_PLANNERS)}")
    gamma = _num(params, "mtm_gamma", 0.8, low=0, high=1)
    if gamma >= 1:
        raise LoopError("mtm_gamma: must be below 1 (a discount)")
    return params


def estimate_mtm(history: list[int], lo: int, hi: int,
                 prior: float = 1.0) -> dict[int, dict[int, float]]:
    """Ding §4's Markov transition matrix of worker counts, estimated from a run's own
    configurations (ours): for each count n in lo..hi, how often the next *different*
    count was n'. A prior of ``prior`` changes, split between n - 1 and n + 1, lets a
    count the run has not left yet still look one step either way."""
    changes = [n for i, n in enumerate(history) if i == 0 or n != history[i - 1]]
    counts: dict[int, dict[int, float]] = {n: {} for n in range(lo, hi + 1)}
    for a, b in zip(changes, changes[1:]):
        if lo <= a <= hi and lo <= b <= hi:
            counts[a][b] = counts[a].get(b, 0.0) + 1.0
    for n, row in counts.items():
        neighbours = [m for m in (n - 1, n + 1) if lo <= m <= hi]
        for m in neighbours:
            row[m] = row.get(m, 0.0) + prior / len(neighbours)
    return {n: {m: c / sum(row.values()) for m, c in sorted(row.items())}
            for n, row in counts.items() if row}


# ------------------------------------------------------------------------- model
@dataclass
class BatchModel:
    """Online least-squares fit of D = o + c·x, x = N·f_max/(n·f) (see the module doc)."""

    history: deque = field(default_factory=lambda: deque(maxlen=FIT_WINDOW))
    overhead_s: float = 0.5
    cost_s: float = 1e-4  # per input record on one worker at f_max
    # Whether ``cost_s`` came from a regression over batches of different sizes: then
    # it is kept while the window has no such spread (a constant rate says nothing new
    # about the slope, only about the level).
    slope_measured: bool = False

    @staticmethod
    def work(records: int, workers: int, freq: float, f_max: float) -> float:
        """x = N·f_max/(n·f): a batch's records as one worker's records at f_max."""
        return records * f_max / (workers * freq)

    def duration(self, records: int, workers: int, freq: float, f_max: float) -> float:
        """D = o + c·x: the batch time the fitted model expects."""
        return self.overhead_s + self.cost_s * self.work(records, workers, freq, f_max)

    def add(self, records: int, duration_s: float, workers: int, freq: float,
            f_max: float) -> None:
        if records > 0 and duration_s > 0 and workers > 0 and freq > 0:
            self.history.append((self.work(records, workers, freq, f_max), duration_s))

    def fit(self) -> None:
        if not self.history:
            return
        x = np.array([h[0] for h in self.history])
        d = np.array([h[1] for h in self.history])
        floor = float(d.min())
        # A slope is only believed from batches of really different sizes (the rate or
        # the configuration changed) and when the line explains them: batch jitter
        # alone gives x a ~10 % spread that is uncorrelated with D (x follows the
        # previous batch's duration), and a line through it is noise.
        if len(x) >= 4 and x.std() > SPREAD_FOR_SLOPE * x.mean():
            slope, intercept = np.polyfit(x, d, 1)
            explained = 1.0 - float(np.var(d - (intercept + slope * x))) / max(
                float(np.var(d)), 1e-12)
            if (slope > 0 and MIN_OVERHEAD_SHARE * floor <= intercept <= floor
                    and explained >= MIN_R2):
                self.overhead_s, self.cost_s = float(intercept), float(slope)
                self.slope_measured = True
                return
        if self.slope_measured:
            # Keep the measured slope; re-level the overhead on the recent batches.
            level = float(np.mean(d - self.cost_s * x))
            if 0 < level <= floor:
                self.overhead_s = level
                return
        # No slope measured yet (a run that has only seen one rate): o and c cannot be
        # separated. The fastest batch is at most o plus its records' cost; take 95 % of
        # it as o, so c explains only the jitter. A larger share for c made a lightly
        # loaded run look half-busy (rho ~0.5 at 7 % of the measured capacity) and
        # scale up for nothing; a slope that is too small is corrected as soon as the
        # rate moves, because the window then has the spread to fit it.
        self.overhead_s = 0.95 * floor
        self.cost_s = max(float(np.mean((d - self.overhead_s) / x)), 1e-9)

    def utilisation(self, rate: float, workers: int, freq: float, f_max: float) -> float:
        return rate * self.cost_s * f_max / (workers * freq)

    def latency(self, rate: float, workers: int, freq: float, f_max: float,
                feedback: float = 1.0) -> float:
        rho = self.utilisation(rate, workers, freq, f_max)
        if rho >= sm.SATURATED:
            return math.inf
        return feedback * (1.0 + LATENCY_QUANTILE) * self.overhead_s / (1.0 - rho)

    def throughput(self, rate: float, workers: int, freq: float, f_max: float) -> float:
        return min(rate, workers * freq / (self.cost_s * f_max))


def pstate_step(freqs_ghz: tuple[float, ...], default: float = 0.1) -> float:
    """The smallest gap between two of the run's frequencies (P-states), in GHz: one
    step of Eq. 6.17's switching term; ``default`` for a run with one frequency."""
    levels = sorted(set(round(f, 6) for f in freqs_ghz))
    gaps = [b - a for a, b in zip(levels, levels[1:], strict=False)]
    return min(gaps) if gaps else default


def measured_busy(records: list[dict[str, Any]], previous: dict[str, Any] | None,
                  workers: int) -> float | None:
    """Mean busy fraction of ``workers`` over the step: the task time the executors spent
    on the step's batches over the step's wall time. Each batch's time is the run time
    of the tasks of all its stages (``task_ms_total``: reading the source, partial
    aggregation, the stateful stage; Spark's REST API, read by the runner); a record
    from an older runner has only the stateful stage's (``group_ms``), which leaves out
    the source's share and so never reads saturated. Measured, so it includes what the
    batch model counts as per-batch overhead inside tasks; idle workers count as 0. So
    it is not the model's rho = lambda * c / n: a light load reads well above it
    (0.71-0.74 at rho ~0.31 in the closed-loop benchmark: the tasks' per-batch work), and it
    tends to 1 while the load exceeds the workers' capacity (batches grow, the records'
    work dominates: 0.91 at the step above one worker's capacity)."""
    first = previous["t"] if previous is not None else \
        records[0]["t"] - (records[0].get("batch_duration_ms") or 0) / 1000.0
    span_ms = (records[-1]["t"] - first) * 1000.0
    busy_ms = 0.0
    seen = False
    for r in records:
        if r.get("task_ms_total"):
            seen = True
            busy_ms += float(r["task_ms_total"])
            continue
        times, ran_on = r.get("group_ms"), r.get("ran_on") or r.get("placement")
        if not times or not ran_on:
            continue
        seen = True
        busy_ms += sum(t for t, e in zip(times, ran_on, strict=False)
                       if t is not None and e is not None)
    if not seen or span_ms <= 0 or workers < 1:
        return None
    return min(busy_ms / (workers * span_ms), 1.0)


def observe(records: list[dict[str, Any]], previous: dict[str, Any] | None) -> StepObservation:
    """A control step's observation from the runner's metrics records since the last
    tick (``previous``: the last record of the step before, for rates)."""
    if not records:
        raise LoopError("no micro-batch in this control step")
    first = previous or records[0]
    last = records[-1]
    span = max(last["t"] - first["t"], 1e-6)
    counted = records if previous is not None else records[1:] or records
    powered = [r for r in records if r.get("power_w") is not None]
    workers = int(last.get("workers") or 1)
    rate = max(_arrival_rate(records, previous), 0.0)
    return StepObservation(
        batches=len(records), rate=rate,
        throughput=sum(r.get("records") or 0 for r in counted) / span,
        latency_s=_mean(records, "latency_p95_ms", 1000),
        batch_s=_mean(records, "batch_duration_ms", 1000),
        workers=workers, freq_ghz=float(last.get("frequency_ghz") or 0),
        power_w=_mean(records, "power_w"), backlog=_backlog(last, rate),
        failed_tasks=sum(r.get("failed_tasks") or 0 for r in records),
        power_measured=bool(powered) and all(r.get("power_source") == "measured"
                                             for r in powered),
        busy=measured_busy(records, previous, workers))


def _arrival_rate(records: list[dict[str, Any]], previous: dict[str, Any] | None) -> float:
    """Records/s the source made available over the step. Its available offset is read
    when a batch's trigger starts: its growth is measured over the same instants
    (commit times would add batch jitter); without it, the batches' own rates."""
    first, last = previous or records[0], records[-1]
    # A source whose offsets are not record counts reports its arrivals apart.
    field = "source_arrived" if last.get("source_arrived") is not None \
        and first.get("source_arrived") is not None else "source_latest"
    if previous is None or last.get(field) is None or first.get(field) is None \
            or (field == "source_latest" and last.get("source_behind_s") is not None):
        return statistics.fmean(r.get("scheduled_rate") or r.get("input_rate") or 0.0
                                for r in records)
    clock = "trigger_started_at" if last.get("trigger_started_at") and \
        first.get("trigger_started_at") else "t"
    return (last[field] - first[field]) / max(last[clock] - first[clock], 1e-6)


def _mean(records: list[dict[str, Any]], field: str, per: float = 1.0) -> float | None:
    """The mean of ``field`` over the records that carry it (a zero batch duration is
    none), divided by ``per``; None when none does."""
    values = [r[field] / per for r in records if r.get(field) is not None
              and (field != "batch_duration_ms" or r[field])]
    return statistics.fmean(values) if values else None


def _backlog(last: dict[str, Any], rate: float) -> int:
    """Records available but not read yet, when the last batch was planned: the
    offsets between (record counts), or, for a source whose offsets are time (a Redis
    stream's entry IDs), the seconds between at the arrival ``rate``."""
    if last.get("source_behind_s") is not None:
        return int(max(0.0, float(last["source_behind_s"])) * rate)
    if last.get("source_latest") is None or last.get("source_end") is None:
        return 0
    return int(last["source_latest"] - last["source_end"])


def keyed_imbalance(placement: list[str | None], loads: list[float]) -> float:
    """max/mean - 1 of the workers' keyed load (the sum of their groups' loads)."""
    per: dict[str, float] = {}
    for owner, load in zip(placement, loads, strict=True):
        if owner is not None:
            per[owner] = per.get(owner, 0.0) + load
    if len(per) < 2 or sum(per.values()) <= 0:
        return 0.0
    return max(per.values()) / statistics.fmean(per.values()) - 1.0


def plan_rebalance(records: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    """A key-group move plan for the step's batches, or None when the load is balanced
    within ``threshold``, the runner reported no per-group loads, a migration is under
    way, or no plan would improve the balance by IMBALANCE_GAIN."""
    last = records[-1]
    placement = last.get("placement")
    if threshold <= 0 or not placement or last.get("migration") or None in placement:
        return None
    groups = len(placement)
    loads = _group_loads(records, groups)
    if loads is None:
        return None
    now = keyed_imbalance(placement, loads)
    owners = sorted(set(placement))
    if now <= threshold or len(owners) < 2:
        return None
    index = {e: i for i, e in enumerate(owners)}
    sizes = last.get("group_bytes") or [1.0] * groups
    problem = planners.MigrationProblem(
        loads=tuple(loads), state_sizes=tuple(max(float(b or 0), 1.0) for b in sizes),
        current=tuple(index[e] for e in placement), target_workers=len(owners),
        tau=threshold / 2, nonempty=True)
    try:
        plan = planners.plan(problem, "ding-table")
    except PlanningError:
        return None
    target = [owners[i] for i in plan.assignment]
    after = keyed_imbalance(target, loads)
    if not plan.feasible or not plan.moved or now - after < IMBALANCE_GAIN:
        return None
    return {"moves": {str(g): target[g] for g in plan.moved}, "imbalance": now,
            "planned_imbalance": after, "state_bytes": plan.migration_cost,
            "planner": "ding-table", "tau": threshold / 2}


def _group_loads(records: list[dict[str, Any]], groups: int) -> list[float] | None:
    """Each key group's mean task time (ms, at least 1) over the step's batches outside
    a migration; None when a group has no measurement."""
    columns: list[list[float]] = [[] for _ in range(groups)]
    for r in records:
        times = r.get("group_ms")
        if not times or len(times) != groups or r.get("migration"):
            continue
        for g, t in enumerate(times):
            if t is not None:
                columns[g].append(t)
    if any(not c for c in columns):
        return None
    return [max(statistics.fmean(c), 1.0) for c in columns]


# ------------------------------------------------------------------ transitions
@dataclass
class TransitionMeter:
    """What a change of workers costs on this run, measured (priced by the MPC
    through ``mpc.TransitionModel``, ours): the time from a scale-up decision to the
    first batch on the new workers, and per migration the reload time over the bytes of
    state it moved. A moved group's state reloads on its new executor in the first batch
    it runs there: the reload time is the extra task time of the moved groups (their
    task time then, minus the batch before), summed per receiving executor (its one core
    reloads them in turn), the largest of these per batch. Where the runner reports no
    per-group task times, the batch time above the fitted model stands in. Medians of
    the last few."""

    executor_start_s: deque = field(default_factory=lambda: deque(maxlen=TRANSITION_SAMPLES))
    reload_s_per_byte: deque = field(default_factory=lambda: deque(maxlen=TRANSITION_SAMPLES))
    pending: list[float] | None = None  # [decided at t, workers wanted]
    migration: dict[str, Any] | None = None  # {"id", "excess_s", "bytes"} under way
    placement: list[Any] | None = None  # the previous batch's
    group_ms: list[Any] | None = None  # the previous batch's task time per group

    def scale_decided(self, t: float, workers: int) -> None:
        self.pending = [float(t), float(workers)]

    def observe(self, records: list[dict[str, Any]], model: BatchModel, f_max: float) -> None:
        for r in records:
            if self.pending is not None and int(r.get("workers") or 0) >= self.pending[1] \
                    and r["t"] >= self.pending[0]:
                self.executor_start_s.append(r["t"] - self.pending[0])
                self.pending = None
            running = r.get("migration")
            if self.migration is not None and (not running
                                               or running.get("id") != self.migration["id"]):
                self._finish()
            if running:
                if self.migration is None:
                    self.migration = {"id": running.get("id"), "excess_s": 0.0, "bytes": 0.0}
                moved = self._moved(r)
                sizes = r.get("group_bytes") or []
                self.migration["bytes"] += float(sum(sizes[g] or 0 for g in moved
                                                     if g < len(sizes)))
                self.migration["excess_s"] += self._reload_s(r, moved, model, f_max)
            self.placement = r.get("placement")
            self.group_ms = r.get("group_ms")

    def _moved(self, r: dict[str, Any]) -> list[int]:
        now = r.get("placement")
        if not now or not self.placement or len(now) != len(self.placement):
            return []
        return [g for g in range(len(now))
                if now[g] != self.placement[g] and self.placement[g] is not None]

    def _reload_s(self, r: dict[str, Any], moved: list[int], model: BatchModel,
                  f_max: float) -> float:
        now, before, placement = r.get("group_ms"), self.group_ms, r.get("placement")
        if now and before and placement and len(now) == len(before) == len(placement):
            per_receiver: dict[Any, float] = {}
            for g in moved:
                if now[g] is not None and before[g] is not None:
                    per_receiver[placement[g]] = per_receiver.get(placement[g], 0.0) + max(
                        now[g] - before[g], 0.0) / 1000.0
            return max(per_receiver.values(), default=0.0)
        predicted = model.duration(int(r.get("input_rows") or 0), int(r.get("workers") or 1),
                                   float(r.get("frequency_ghz") or f_max), f_max)
        return max((r.get("batch_duration_ms") or 0) / 1000.0 - predicted, 0.0)

    def _finish(self) -> None:
        done, self.migration = self.migration, None
        if done is not None and done["bytes"] >= 1.0:
            self.reload_s_per_byte.append(done["excess_s"] / done["bytes"])

    def model(self, state_bytes: float) -> TransitionModel:
        return TransitionModel(
            executor_start_s=statistics.median(self.executor_start_s)
            if self.executor_start_s else 0.0,
            reload_s_per_byte=statistics.median(self.reload_s_per_byte)
            if self.reload_s_per_byte else 0.0,
            state_bytes=max(float(state_bytes), 0.0))

    def to_state(self) -> dict[str, Any]:
        return {"executor_start_s": list(self.executor_start_s),
                "reload_s_per_byte": list(self.reload_s_per_byte), "pending": self.pending,
                "migration": self.migration, "placement": self.placement,
                "group_ms": self.group_ms}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> TransitionMeter:
        meter = cls()
        if state:
            meter.executor_start_s.extend(state.get("executor_start_s", []))
            meter.reload_s_per_byte.extend(state.get("reload_s_per_byte", []))
            meter.pending = state.get("pending")
            meter.migration = state.get("migration")
            meter.placement = state.get("placement")
            meter.group_ms = state.get("group_ms")
        return meter


# ---------------------------------------------------------------------- controller
@dataclass
class LiveController:
    policy: LoopPolicy
    model: BatchModel = field(default_factory=BatchModel)
    step_index: int = 0
    last_record: dict[str, Any] | None = None
    last_prediction: dict[str, float] | None = None
    errors: dict[str, list[float]] = field(
        default_factory=lambda: {"latency": [], "throughput": [], "power": []})
    violations: int = 0
    last_alerts: tuple[str, ...] = ()
    last_rebalance_step: int = -REBALANCE_COOLDOWN_STEPS
    _decider: Decider | None = None
    _mpc: MpcController | None = None
    _rule: Any = None
    _rates: deque = field(default_factory=lambda: deque(maxlen=3))
    transitions: TransitionMeter = field(default_factory=TransitionMeter)
    # Worker counts, one per control step: the MTM look-ahead's history.
    worker_history: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        p = self.policy
        check_params(p.strategy, p.params)
        if not 1 <= p.min_workers <= p.max_workers:
            raise LoopError("workers: need 1 <= min <= max")
        if not p.freqs_ghz or min(p.freqs_ghz) <= 0:
            raise LoopError("frequencies: need at least one positive frequency")
        if p.strategy not in STRATEGY_REGISTRY:
            raise LoopError(f"strategy: {p.strategy!r} has no controller (one of: "
                            f"{', '.join(STRATEGY_REGISTRY)})")
        self._decider = STRATEGY_REGISTRY[p.strategy].build(p)
        self._mpc = getattr(self._decider, "mpc", None)
        self._rule = getattr(self._decider, "rule", None)

    # ----------------------------------------------------------------- state
    def to_state(self) -> dict[str, Any]:
        """What this controller learned across steps, as JSON (Python's json: a saturated
        prediction stays Infinity). With the policy it rebuilds an equal controller
        (:meth:`from_state`); the product keeps it in Redis between ticks."""
        m = self.model
        return {"version": STATE_VERSION, "strategy": self.policy.strategy,
                "model": {"history": [list(h) for h in m.history], "overhead_s": m.overhead_s,
                          "cost_s": m.cost_s, "slope_measured": m.slope_measured},
                "step_index": self.step_index, "last_record": self.last_record,
                "last_prediction": self.last_prediction,
                "errors": {k: list(v) for k, v in self.errors.items()},
                "violations": self.violations, "last_alerts": list(self.last_alerts),
                "last_rebalance_step": self.last_rebalance_step, "rates": list(self._rates),
                "mpc": self._mpc.state() if self._mpc is not None else None,
                "rule": self._rule.state() if self._rule is not None else None,
                "transitions": self.transitions.to_state(),
                "worker_history": self.worker_history[-HISTORY_STEPS:]}

    @classmethod
    def from_state(cls, policy: LoopPolicy, state: dict[str, Any]) -> LiveController:
        """The controller :meth:`to_state` described, under ``policy`` (whose strategy
        must be the one the state was written for)."""
        if state.get("version") != STATE_VERSION or state.get("strategy") != policy.strategy:
            raise LoopError("controller state: written by another version or for another "
                            "strategy")
        ctl = cls(policy)
        model = state["model"]
        ctl.model.history.extend(tuple(h) for h in model["history"])
        ctl.model.overhead_s = float(model["overhead_s"])
        ctl.model.cost_s = float(model["cost_s"])
        ctl.model.slope_measured = bool(model["slope_measured"])
        ctl.step_index = int(state["step_index"])
        ctl.last_record = state["last_record"]
        ctl.last_prediction = state["last_prediction"]
        ctl.errors = {k: list(v) for k, v in state["errors"].items()}
        ctl.violations = int(state["violations"])
        ctl.last_alerts = tuple(state["last_alerts"])
        ctl.last_rebalance_step = int(state["last_rebalance_step"])
        ctl.transitions = TransitionMeter.from_state(state.get("transitions"))
        ctl.worker_history = [int(n) for n in state.get("worker_history", [])]
        ctl._rates.extend(state["rates"])
        if ctl._mpc is not None:
            ctl._mpc.restore(state["mpc"])
        if ctl._rule is not None:
            ctl._rule.restore(state["rule"])
        return ctl

    # --------------------------------------------------------------- helpers
    def power_of(self, c: Config) -> float:
        return self.policy.power.power(c.workers, c.freq_ghz)

    def _within_budget(self, wanted: Config) -> tuple[Config, str | None]:
        """Rules and statics: the nearest configuration within the budget (fewer
        workers or a lower frequency), or the least powerful one with an alert."""
        p = self.policy
        if p.power_budget_w is None or self.power_of(wanted) <= p.power_budget_w:
            return wanted, None
        for f in sorted((f for f in p.freqs_ghz if f <= wanted.freq_ghz), reverse=True):
            for n in range(wanted.workers, p.min_workers - 1, -1):
                if self.power_of(Config(n, f)) <= p.power_budget_w:
                    return Config(n, f), (f"power budget {p.power_budget_w:g} W: "
                                          f"{wanted.workers} workers at {wanted.freq_ghz} GHz "
                                          f"cut to {n} at {f} GHz")
        least = Config(p.min_workers, min(p.freqs_ghz))
        return least, (f"every configuration exceeds the power budget {p.power_budget_w:g} W; "
                       f"running the least powerful ({least.workers} at {least.freq_ghz} GHz)")

    def _predict(self, c: Config, rate: float, feedback: float) -> dict[str, float]:
        p = self.policy
        return {"workers": c.workers, "freq_ghz": c.freq_ghz, "rate": rate,
                "utilisation": self.model.utilisation(rate, c.workers, c.freq_ghz, p.f_max),
                "latency_s": self.model.latency(rate, c.workers, c.freq_ghz, p.f_max, feedback),
                "throughput": self.model.throughput(rate, c.workers, c.freq_ghz, p.f_max),
                "power_w": self.power_of(c)}

    @property
    def warmup(self) -> int:
        """Batches the controller neither decides on nor fits (``warmup_batches``)."""
        return int(self.policy.params.get("warmup_batches", WARMUP_BATCHES))

    def violation_curve(self, rate: float, freq_ghz: float, feedback: float
                        ) -> dict[str, float]:
        """The modelled cost of QoS violations (``control.fleet.violation_cost``) at each
        number of workers the policy allows, at ``rate`` and ``freq_ghz``: what the fleet's
        arbiter weighs one run's claim to a core against another's. Keys are strings (the
        decision is stored as JSON)."""
        p = self.policy
        out = {}
        for n in range(p.min_workers, p.max_workers + 1):
            latency = self.model.latency(rate, n, freq_ghz, p.f_max, feedback)
            throughput = self.model.throughput(rate, n, freq_ghz, p.f_max)
            out[str(n)] = round(fleet.violation_cost(
                latency, p.latency_bound_s, throughput, p.throughput_floor, rate,
                self.model.utilisation(rate, n, freq_ghz, p.f_max)), 6)
        return out

    def _bound_alerts(self, chosen: Config, rate: float, feedback: float) -> list[str]:
        """Say when the limits, not the strategy, keep the latency bound from being met."""
        p = self.policy
        if self.model.latency(rate, chosen.workers, chosen.freq_ghz, p.f_max,
                              feedback) <= p.latency_bound_s:
            return []
        meets = [Config(n, f) for n in range(p.min_workers, p.max_workers + 1)
                 for f in p.freqs_ghz
                 if self.model.latency(rate, n, f, p.f_max, feedback) <= p.latency_bound_s]
        if not meets:
            return [f"no configuration up to {p.max_workers} workers meets the latency bound "
                    f"{p.latency_bound_s * 1000:.0f} ms at {rate:.0f} records/s (modelled)"]
        affordable = [c for c in meets if p.power_budget_w is None
                      or self.power_of(c) <= p.power_budget_w]
        if not affordable:
            return [f"the power budget {p.power_budget_w:g} W keeps the latency bound from "
                    "being met (modelled); keeping the budget"]
        return []

    def _score(self, obs: StepObservation) -> dict[str, Any]:
        """Measured vs what the last step predicted for this one (model feedback). Power
        is scored only when it was measured: a modelled reading is the prediction's own
        model, and its "error" would be about 0 %."""
        out: dict[str, Any] = {}
        pred = self.last_prediction
        if pred is None:
            return out
        for key, measured in (("latency", obs.latency_s), ("throughput", obs.throughput),
                              ("power", obs.power_w)):
            predicted = pred.get({"latency": "latency_s", "throughput": "throughput",
                                  "power": "power_w"}[key])
            if key == "power" and not obs.power_measured:
                out[key] = {"predicted": predicted, "measured": None, "modelled": measured}
                continue
            out[key] = {"predicted": predicted, "measured": measured}
            if measured and predicted is not None and math.isfinite(predicted) and measured > 0:
                self.errors[key].append(abs(predicted - measured) / measured * 100.0)
        return out

    def mape(self) -> dict[str, float | None]:
        return {k: (statistics.fmean(v) if v else None) for k, v in self.errors.items()}

    # ------------------------------------------------------------------- step
    def step(self, records: list[dict[str, Any]], current: Config) -> LiveDecision:
        """One control step over the batches committed since the last one: learn from
        them (model), decide (the strategy's :class:`Decider`), guard (alerts), then
        rebalance if the configuration holds, and record the decision."""
        p = self.policy
        # A read-only frequency (cpuinfo: 2.596 GHz) is the settable one nearest to it
        # (2.6): a rounding difference is not a frequency change.
        current = Config(current.workers,
                         min(p.freqs_ghz, key=lambda f: abs(f - current.freq_ghz)))
        obs, scored = self._learn(records, current)
        self.step_index += 1
        started = time.perf_counter()
        rate = max(obs.rate, 1e-9)
        if records[-1].get("batch_id", self.warmup) < self.warmup:
            return self._warming_up(records, obs, current, rate, started)
        transition = self.transitions.model(sum(b or 0 for b in
                                                records[-1].get("group_bytes") or []))
        ctx = StepContext(records=records, obs=obs, current=current, rate=rate,
                          transition=transition)
        assert self._decider is not None
        choice = self._decider.decide(self, ctx)
        alerts = choice.alerts + self._bound_alerts(choice.chosen, rate, choice.feedback)
        solve_ms = (time.perf_counter() - started) * 1000.0
        self.last_prediction = dict(choice.predictions[0])
        alerts, violated = self._guard(obs, alerts)
        action = action_of(current.workers, current.freq_ghz, choice.chosen.workers,
                           choice.chosen.freq_ghz)
        action, reason, rebalance = self._rebalance(ctx, action, choice.reason)
        if choice.chosen.workers > current.workers:
            self.transitions.scale_decided(records[-1]["t"], choice.chosen.workers)
        self.worker_history = (self.worker_history + [current.workers])[-HISTORY_STEPS:]
        return self._record(ctx, choice, action, reason, alerts, solve_ms, scored,
                            violated, rebalance)

    def _learn(self, records: list[dict[str, Any]], current: Config
               ) -> tuple[StepObservation, dict[str, Any]]:
        """Monitor and fit: the step's observation, the batch model re-fitted on its
        steady batches, the transitions measured, the last prediction scored."""
        p = self.policy
        obs = observe(records, self.last_record)
        self.last_record = records[-1]
        for r in records:
            if (not r.get("failed_tasks") and not r.get("migration")
                    and r.get("batch_id", 0) >= self.warmup):
                self.model.add(int(r.get("input_rows") or 0),
                               (r.get("batch_duration_ms") or 0) / 1000.0,
                               int(r.get("workers") or current.workers),
                               float(r.get("frequency_ghz") or current.freq_ghz), p.f_max)
        self.model.fit()
        self.transitions.observe(records, self.model, p.f_max)
        return obs, self._score(obs)

    def _warming_up(self, records: list[dict[str, Any]], obs: StepObservation,
                    current: Config, rate: float, started: float) -> LiveDecision:
        prediction = self._predict(current, rate, 1.0)
        self.last_prediction = None
        here = {"workers": current.workers, "freq_ghz": current.freq_ghz}
        return LiveDecision(
            step=self.step_index, t=records[-1]["t"], strategy=self.policy.strategy,
            inputs={**asdict(obs), "warming_up": True}, chosen=dict(here), current=here,
            action="hold", predictions=[prediction], cost={},
            solve_ms=(time.perf_counter() - started) * 1000.0,
            reason=f"warming up: no decision on the first {self.warmup} batches",
            alerts=[], model_error={"last": {}, "mape": self.mape()})

    def _guard(self, obs: StepObservation, alerts: list[str]) -> tuple[list[str], bool]:
        """QoS violations: the measured p95 over the bound (or throughput under the
        floor) for violation_steps steps in a row raises one alert per streak; an alert
        is raised when it appears, not again on every step while it holds."""
        p = self.policy
        violated = ((obs.latency_s is not None and obs.latency_s > p.latency_bound_s)
                    or (p.throughput_floor > 0 and obs.throughput < p.throughput_floor))
        self.violations = self.violations + 1 if violated else 0
        k = int(p.params.get("violation_steps", p.violation_steps))
        if self.violations == k:
            alerts = alerts + [f"QoS violated for {k} consecutive steps: p95 "
                               f"{(obs.latency_s or 0) * 1000:.0f} ms (bound "
                               f"{p.latency_bound_s * 1000:.0f} ms), throughput "
                               f"{obs.throughput:.0f}/s (floor {p.throughput_floor:g})"]
        fresh = [a for a in alerts if a not in self.last_alerts]
        self.last_alerts = tuple(alerts)
        return fresh, violated

    def _rebalance(self, ctx: StepContext, action: str, reason: str
                   ) -> tuple[str, str, dict[str, Any] | None]:
        """Scaling re-plans the placement itself (the runner's planned set_workers);
        when the configuration holds, an imbalanced placement is the remaining lever,
        unless moving the state would itself break a bound the run meets now."""
        p, obs = self.policy, ctx.obs
        if (action != "hold"
                or self.step_index - self.last_rebalance_step < REBALANCE_COOLDOWN_STEPS):
            return action, reason, None
        threshold = float(p.params.get("rebalance_threshold", REBALANCE_THRESHOLD))
        rebalance = plan_rebalance(ctx.records, threshold)
        if rebalance is None:
            return action, reason, None
        # The moves' own cost (measured reload time per byte).
        cost_s = ctx.transition.reload_s_per_byte * float(rebalance.get("state_bytes") or 0)
        if obs.latency_s is not None and obs.latency_s <= p.latency_bound_s < \
                obs.latency_s + cost_s:
            return action, (reason + f"; rebalance deferred: moving "
                            f"{rebalance['state_bytes'] / 1e6:.1f} MB of state costs "
                            f"~{cost_s:.1f} s of latency (measured), over the bound the "
                            "run meets now"), None
        self.last_rebalance_step = self.step_index
        return "rebalance", (reason + f"; keyed load imbalance {rebalance['imbalance']:.0%} > "
                             f"{threshold:.0%}: move {len(rebalance['moves'])} groups "
                             f"(planned {rebalance['planned_imbalance']:.0%})"), rebalance

    def _migration_planner(self, current: Config, chosen: Config) -> dict[str, Any] | None:
        """The MTM look-ahead's planner and transition matrix for a scaling decision, if
        the policy asks for it."""
        p = self.policy
        if chosen.workers == current.workers or \
                p.params.get("migration_planner") != "mtm-table":
            return None
        mtm = estimate_mtm(self.worker_history + [chosen.workers], p.min_workers,
                           p.max_workers)
        return {"planner": "mtm-table", "mtm_gamma": float(p.params.get("mtm_gamma", 0.8)),
                "mtm": {str(n): {str(m): q for m, q in row.items()}
                        for n, row in mtm.items()}}

    def _record(self, ctx: StepContext, choice: Choice, action: str, reason: str,
                alerts: list[str], solve_ms: float, scored: dict[str, Any], violated: bool,
                rebalance: dict[str, Any] | None) -> LiveDecision:
        p, obs, current, transition = self.policy, ctx.obs, ctx.current, ctx.transition
        chosen = choice.chosen
        priced = {**asdict(transition),
                  "seconds_one_up": transition.seconds(current.workers, current.workers + 1),
                  "executor_starts_measured": len(self.transitions.executor_start_s),
                  "migrations_measured": len(self.transitions.reload_s_per_byte)}
        return LiveDecision(
            step=self.step_index, t=ctx.records[-1]["t"], strategy=p.strategy,
            inputs={**asdict(obs), "overhead_s": self.model.overhead_s, "transition": priced,
                    "cost_per_record_s": self.model.cost_s, "feedback": choice.feedback,
                    "utilisation": self.model.utilisation(ctx.rate, current.workers,
                                                          current.freq_ghz, p.f_max),
                    "forecast": choice.predictions[0]["rate"], "violating": violated,
                    "rebalance": rebalance,
                    "migration_planner": self._migration_planner(current, chosen),
                    "violation_by_workers": self.violation_curve(
                        choice.predictions[0]["rate"], chosen.freq_ghz, choice.feedback)},
            chosen={"workers": chosen.workers, "freq_ghz": chosen.freq_ghz},
            current={"workers": current.workers, "freq_ghz": current.freq_ghz},
            action=action, predictions=choice.predictions, cost=choice.cost,
            solve_ms=solve_ms, reason=reason, alerts=alerts,
            model_error={"last": scored, "mape": self.mape()})


# ------------------------------------------------------------------ the deciders
@dataclass
class StepContext:
    """What one step decides on (``LiveController.step``)."""

    records: list[dict[str, Any]]
    obs: StepObservation
    current: Config
    rate: float
    transition: TransitionModel


@dataclass
class Choice:
    """A decider's answer: the configuration, its predictions and cost, why."""

    chosen: Config
    predictions: list[dict[str, Any]]
    reason: str
    cost: dict[str, Any] = field(default_factory=dict)
    alerts: list[str] = field(default_factory=list)
    feedback: float = 1.0  # the MPC's measured/predicted latency factor (Eq. 6.10)


class Decider(Protocol):
    def decide(self, ctl: LiveController, ctx: StepContext) -> Choice: ...


@dataclass
class MpcDecider:
    """An MPC strategy of the thesis (Table 7.2) over the fitted batch model."""

    mpc: MpcController

    def decide(self, ctl: LiveController, ctx: StepContext) -> Choice:
        p, obs, current = ctl.policy, ctx.obs, ctx.current
        self.mpc.params["batch_overhead_s"] = ctl.model.overhead_s
        self.mpc.params["transition"] = ctx.transition
        cost_here = ctl.model.cost_s * p.f_max / current.freq_ghz
        per_batch = obs.throughput * (obs.batch_s or 0.0)
        steady = obs.backlog <= 2 * max(per_batch, 1.0)
        decision = self.mpc.step(current, ctx.rate, cost_here, 1.0, 1.0,
                                 obs.latency_s if steady else None)
        trajectory = decision.trajectory
        predictions = [dict(workers=s.workers, freq_ghz=s.freq_ghz, rate=s.rate,
                            utilisation=s.utilisation, latency_s=s.latency_s,
                            throughput=s.throughput, power_w=s.power_w,
                            qos_cost=s.qos_cost, resource_cost=s.resource_cost,
                            switching_cost=s.switching_cost,
                            transition_cost=s.transition_cost) for s in trajectory]
        cost = {"total": decision.cost, "nodes_explored": decision.nodes_explored,
                "nodes_total": decision.nodes_total,
                **{k: sum(getattr(s, f"{k}_cost") for s in trajectory)
                   for k in ("qos", "resource", "switching", "transition")}}
        alerts = []
        if ctl.power_of(decision.chosen) > (p.power_budget_w or math.inf):
            alerts.append(ctl._within_budget(decision.chosen)[1] or "over the power budget")
        return Choice(decision.chosen, predictions,
                      f"{p.strategy} h={len(trajectory)}: least cost {decision.cost:.4g} "
                      f"over {decision.nodes_total} plans", cost, alerts, self.mpc.feedback)


@dataclass
class RuleDecider:
    """A reactive rule (``control.strategies.rules``) on the measured busy time (the
    fitted model only for pipelines without keyed tasks), clamped to the budget."""

    rule: Any

    def decide(self, ctl: LiveController, ctx: StepContext) -> Choice:
        p, obs, current, rate = ctl.policy, ctx.obs, ctx.current, ctx.rate
        ctl._rates.append(rate)
        util = obs.busy if obs.busy is not None else ctl.model.utilisation(
            rate, current.workers, current.freq_ghz, p.f_max)
        ruled = self.rule.decide(rules.Observation(
            rate=rate, throughput=obs.throughput, utilisation=util,
            latency_s=obs.latency_s if obs.latency_s is not None else 0.0,
            workers=current.workers, freq_ghz=p.f_max,
            congestion=min(obs.backlog / max(rate * p.control_step_s, 1.0), 1.0)))
        return _clamped(ctl, ctx, ruled.chosen, f"{p.strategy}: {ruled.reason}")


class StaticDecider:
    """A static baseline: always the minimum or the maximum workers at f_max."""

    def decide(self, ctl: LiveController, ctx: StepContext) -> Choice:
        p = ctl.policy
        ctl._rates.append(ctx.rate)
        n = p.max_workers if p.strategy == "static-max" else p.min_workers
        return _clamped(ctl, ctx, Config(n, p.f_max),
                        f"static: always {n} workers at {p.f_max} GHz")


def _clamped(ctl: LiveController, ctx: StepContext, wanted: Config, reason: str) -> Choice:
    chosen, clamp = ctl._within_budget(wanted)
    return Choice(chosen, [ctl._predict(chosen, ctx.rate, 1.0)], reason,
                  alerts=[clamp] if clamp else [])


def _build_mpc(p: LoopPolicy) -> Decider:
    params = p.params
    switching = params.get("switching", True)
    forecaster = {"holt": fc.Holt, "ma3": fc.MovingAverage3,
                  "last": fc.LastValue}[params.get("forecaster", "holt")]()
    mpc_params: dict[str, Any] = {
        "latency_bound_s": p.latency_bound_s, "power": p.power,
        "latency_model": "microbatch", "latency_quantile": LATENCY_QUANTILE,
        "power_budget_w": p.power_budget_w,
        "gamma": float(params.get("gamma", 0.4)) if switching else 0.0}
    if p.strategy == "lat-power":
        mpc_params["beta"] = LAT_POWER_BETA
    for key in ("alpha", "beta", "transition_weight"):
        if key in params:
            mpc_params[key] = float(params[key])
    # Eq. 6.17 counts a frequency change in P-state steps: the run's own spacing (the
    # thesis' machines were 0.1 GHz apart; emulated P-states here are 10 % of f_max
    # apart, and counted at 0.1 GHz one P-state down would cost 2.45^2 = 6 times one
    # worker more).
    mpc_params["f_step"] = pstate_step(p.freqs_ghz)
    return MpcDecider(MpcController(
        strategy=p.strategy, horizon=int(params.get("horizon", 1)) if switching else 1,
        solver="dp", params=mpc_params,
        worker_options=tuple(range(p.min_workers, p.max_workers + 1)),
        freq_options=tuple(sorted(p.freqs_ghz)), forecaster=forecaster,
        feedback_limits=FEEDBACK_LIMITS))


def _rule_builder(make: Callable[[LoopPolicy, dict[str, Any], dict[str, int]], Any]
                  ) -> Callable[[LoopPolicy], Decider]:
    def build(p: LoopPolicy) -> Decider:
        return RuleDecider(make(p, p.params, {"n_min": p.min_workers,
                                              "n_max": p.max_workers}))
    return build


_RULE_MAKERS: dict[str, Callable[[LoopPolicy, dict[str, Any], dict[str, int]], Any]] = {
    "th-rule": lambda p, q, b: rules.ThRule(theta_max=q.get("theta_max", 0.9),
                                            theta_min=q.get("theta_min", 0.8), **b),
    "lat-rule": lambda p, q, b: rules.LatRule(bound_s=p.latency_bound_s,
                                              xi_max=q.get("xi_max", 1.2),
                                              xi_min=q.get("xi_min", 0.8), **b),
    "spl": lambda p, q, b: rules.SPL(congestion_threshold=q.get("congestion_threshold", 0.1),
                                     sensitivity=q.get("sensitivity", 0.9), **b),
    "peak-load": lambda p, q, b: rules.PeakLoad(f_max=p.f_max, **b),
    "ds2": lambda p, q, b: rules.DS2(control_step_s=p.control_step_s,
                                     target_utilisation=q.get("target_utilisation", 0.7),
                                     **b),
}


@dataclass(frozen=True)
class LiveStrategy:
    """A strategy a live run can be steered by: what it does, and its decider."""

    name: str
    description: str
    build: Callable[[LoopPolicy], Decider]


def _registry() -> dict[str, LiveStrategy]:
    builders: dict[str, Callable[[LoopPolicy], Decider]] = {
        **{name: _build_mpc for name in MPC_STRATEGIES},
        **{name: _rule_builder(make) for name, make in _RULE_MAKERS.items()},
        **{name: (lambda p: StaticDecider()) for name in STATIC_STRATEGIES}}
    return {name: LiveStrategy(name, STRATEGIES[name], build)
            for name, build in builders.items()}


# Every strategy the closed loop runs (all of control.strategies.STRATEGIES but
# "manual"), listed and built from here.
STRATEGY_REGISTRY = _registry()
