"""A Strategy Lab scenario calibrated from a real run: the simulator in micro-batch mode
with the batch model the live loop fits (D = o + c·x, x = N·f_max/(n·f); ``control.live``
``BatchModel``, ours, see ``sysmodel.MicroBatchModel``) over the run's own batches, and
the run's measured arrival rate as the workload trace. A comparison built this way speaks
in the run's units (seconds of batch time, records/s, the run's frequencies and worker
range), so a policy made from it can steer a live run; an uncalibrated comparison is in
the thesis' units (a 1.5 ms bound, tuples of 0.5 ms).

What is measured and what stays modelled: o, c and the rates are measured (the fit is
over every batch past the warm-up without failed tasks or a migration step, not only the
last ``FIT_WINDOW``); key skew, migration cost and power stay the simulator's models.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from control.live import WARMUP_BATCHES, BatchModel
from control.sim.workloads import ScenarioError

# Fewer batches than this past the warm-up say too little about o and c.
MIN_BATCHES = 12
# Lab runs are bounded (the form's steps field): a longer run is summarised.
MAX_STEPS = 10_000


@dataclass(frozen=True)
class RunFit:
    """What a run measured, in the simulator's terms."""

    run: int
    overhead_s: float  # o: a batch's fixed cost
    cost_per_record_s: float  # c: one record on one worker at f_max
    slope_measured: bool  # False: the run saw one rate, c is an upper bound
    batches: int  # batches the fit used
    rates: list[float]  # arrivals/s per step of step_s
    step_s: float
    freqs_ghz: list[float]
    f_max: float

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.pop("rates")
        return doc


def _rate_of(batch: Mapping[str, Any]) -> float | None:
    """The arrival rate while the batch was collected: the generator's schedule when the
    source reports it, else Spark's inputRowsPerSecond."""
    for key in ("scheduled_rate", "input_rate"):
        value = batch.get(key)
        if value is not None and math.isfinite(float(value)) and float(value) >= 0:
            return float(value)
    return None


def fit_run(run: int, batches: Sequence[Mapping[str, Any]], step_s: float,
            freqs_ghz: Sequence[float] = ()) -> RunFit:
    """Fit o and c over the run's batches (``t`` in seconds, ``batch_id``, ``input_rows``,
    ``batch_duration_ms``, ``workers``, ``frequency_ghz``, rates) and bucket its arrival
    rate into steps of ``step_s``. Raises ``ScenarioError`` with the reason when the run
    cannot calibrate a comparison."""
    if step_s <= 0:
        raise ScenarioError("step_s: must be > 0")
    ordered = sorted(batches, key=lambda b: float(b["t"]))
    freqs = sorted({float(f) for f in freqs_ghz if f and float(f) > 0}
                   | {float(b["frequency_ghz"]) for b in ordered if b.get("frequency_ghz")})
    if not freqs:
        raise ScenarioError(f"run {run}: no batch reports its CPU frequency")
    f_max = max(freqs)
    steady = [b for b in ordered if int(b.get("batch_id") or 0) >= WARMUP_BATCHES
              and not b.get("failed_tasks") and not b.get("migration")]
    model = BatchModel(history=deque(maxlen=max(len(steady), 1)))
    for b in steady:
        model.add(int(b.get("input_rows") or 0), (b.get("batch_duration_ms") or 0) / 1000.0,
                  int(b.get("workers") or 0), float(b.get("frequency_ghz") or 0), f_max)
    if len(model.history) < MIN_BATCHES:
        raise ScenarioError(
            f"run {run}: {len(model.history)} batches past its first {WARMUP_BATCHES} "
            f"(without failures or migration steps); a calibration needs {MIN_BATCHES}")
    model.fit()
    rates = _step_rates(ordered, step_s)
    if not any(rates):
        raise ScenarioError(f"run {run}: its batches report no arrival rate")
    return RunFit(run=run, overhead_s=model.overhead_s, cost_per_record_s=model.cost_s,
                  slope_measured=model.slope_measured, batches=len(model.history),
                  rates=rates, step_s=step_s, freqs_ghz=freqs, f_max=f_max)


def _step_rates(ordered: Sequence[Mapping[str, Any]], step_s: float) -> list[float]:
    """The batches' arrival rates, averaged per control step of ``step_s``."""
    t0 = float(ordered[0]["t"])
    span = float(ordered[-1]["t"]) - t0
    steps = min(int(span // step_s) + 1, MAX_STEPS)
    buckets: list[list[float]] = [[] for _ in range(steps)]
    for b in ordered:
        rate = _rate_of(b)
        i = int((float(b["t"]) - t0) // step_s)
        if rate is not None and i < steps:
            buckets[i].append(rate)
    rates: list[float] = []
    for values in buckets:
        # A step in which no batch committed (one batch can outlast a step) carries the
        # rate of the step before it.
        rates.append(statistics.fmean(values) if values else (rates[-1] if rates else 0.0))
    return rates


def apply_fit(scenario: dict[str, Any], fit: RunFit, latency_bound_ms: float,
              min_workers: int, max_workers: int, initial_workers: int) -> dict[str, Any]:
    """``scenario`` (a Lab document) with the run's workload, batch model, frequencies,
    bound and worker range; the fit is recorded under ``calibrated_from``."""
    out = dict(scenario)
    workload = dict(out.get("workload", {}))
    workload["rate"] = {"kind": "trace", "rates": fit.rates, "seconds_per_value": fit.step_s}
    # Service times are per record at the top frequency (the simulator's convention).
    workload["service"] = {"mean_ms": fit.cost_per_record_s * 1000.0}
    out["workload"] = workload
    out["steps"], out["step_s"] = len(fit.rates), fit.step_s
    out["qos"] = {**out.get("qos", {}), "latency_bound_ms": latency_bound_ms}
    system = dict(out.get("system", {}))
    system.update(mode="microbatch", batch_overhead_s=fit.overhead_s, freqs_ghz=fit.freqs_ghz,
                  min_workers=min_workers, max_workers=max_workers,
                  initial_workers=min(max(initial_workers, min_workers), max_workers))
    out["system"] = system
    out["calibrated_from"] = fit.to_json()
    return out
