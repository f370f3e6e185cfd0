"""Measure one worker's capacity for a pipeline on this machine, so that nothing that
depends on speed (a test's rate step, a demo's peak, a benchmark's bound) assumes how
fast the machine is.

One runner with one 1-core executor runs the pipeline under a ramp of rates; the
control loop's batch model (``control.live.BatchModel``: D = o + c·N, the micro-batch
form of the service time in Kingman's formula, thesis Eq. 6.9, with the batch overhead
as the service time) is fitted by least squares to the batches after Spark's warm-up.
Capacity is 1/c records/s; o is the fixed cost of a micro-batch.

After a burst that fills the keyed state and a low level that covers Spark's warm-up,
the rate alternates between a low level, where a batch is little more than its fixed
cost, and a high one, where records dominate it. The fit uses each batch's real size,
so an overloaded batch is as good a point as any and gives the slope its leverage,
while the drained low batches pin the intercept (at one rate alone, o and c cannot be
told apart, and batch jitter hides the slope).

    cal = load_or_calibrate(path, master_url, work_dir, redis_url, definition)
    cal.capacity_rps, cal.overhead_s
"""
from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.runtime.runner.harness import HarnessError, RunnerProcess

# (records/s, seconds). A burst first fills the keyed state (a record's cost grows with
# the state: ~7 µs at 1M keys against ~2 µs at 100K on this machine), then the low level
# covers the controller's warm-up batches, which are slower per record and would
# steepen the slope, and the draining of the burst.
RAMP: tuple[tuple[float, int], ...] = ((150_000.0, 7), (5_000.0, 30))
# Then the rate alternates, low long enough for a slow machine to drain what the high
# level left, high short enough not to bury it: until the fit has its batches and at
# least MIN_CYCLES cycles have passed. Two cycles gave the fit 25 batches here (o 1.15 s,
# c 14.2 µs; three gave 45 batches, o 1.07 s, c 14.4 µs), and each cycle is 28 s more
# of every calibration. Since batches got cheaper (o ~0.65 s), one cycle gives 38
# batches (o 0.63 s, c 13.5 µs, against two cycles' 50 batches, o 0.70 s, c 14.5 µs,
# 2026-12-07), three times MIN_FIT_BATCHES; the fit still waits for those where a slow
# machine has fewer. A climb through ever higher rates (up to 160K/s)
# and one level held after it did not work on a busy machine: with one core kept busy
# the climb left a backlog of millions of records, every batch after the warm-up held
# 300K-1.7M of them, and the intercept (o, 4.6 s) was extrapolated far from any batch.
ALTERNATE: tuple[tuple[float, int], ...] = ((5_000.0, 20), (80_000.0, 8))
MIN_CYCLES = 1
ALTERNATIONS = 40
# A pipeline that reads a Redis stream is calibrated on a scratch stream of its own,
# which a feeder in this process fills at these rates: no burst (a stream's reader
# costs ~140 µs of CPU a record here, against ~7 µs for the keyed state, so the state's
# size hardly moves the slope, and a publisher makes ~20K entries/s, not 150K), then
# low and high alternating. High for 6 s at 16K/s leaves ~100K entries that one worker
# (~8K/s measured by bench sources) drains within the low phase.
STREAM_RAMP: tuple[tuple[float, int], ...] = ((500.0, 30),)
STREAM_ALTERNATE: tuple[tuple[float, int], ...] = ((500.0, 24), (16_000.0, 6))
# Batches past the warm-up the least-squares fit waits for.
MIN_FIT_BATCHES = 12
# The fit's batches must differ in size by this much (standard deviation over the mean)
# to separate the per-record cost from the fixed cost.
MIN_SPREAD = 0.25
# How long the calibration may take before it gives up (the schedule alternates as long).
CALIBRATION_TIMEOUT_S = 900.0
# A stored calibration older than this is measured again (the machine may have changed).
MAX_AGE_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Calibration:
    """One worker's measured micro-batch model for one pipeline shape."""
    overhead_s: float          # o: a micro-batch's fixed cost on one worker
    cost_per_record_s: float   # c: each input record's cost on one worker
    capacity_rps: float        # 1 / c
    batches: int               # batches the fit used
    measured_at: float         # epoch seconds
    shape: str                 # hash of the pipeline without its rate
    # Seconds from the query's start to the end of its first batch (JVM and Python
    # workers warming up): 7 s here and 28 s with one core kept busy, so this is
    # measured, not derived from o.
    first_batch_s: float

    def batch_s(self, rate: float) -> float:
        """Steady batch duration of one worker at ``rate`` (D* = o / (1 - rate·c))."""
        rho = min(rate * self.cost_per_record_s, 0.99)
        return self.overhead_s / (1.0 - rho)

    def warmup_s(self, rate: float) -> float:
        """Seconds from a run's start to the end of the controller's warm-up
        (``control.live.WARMUP_BATCHES``) at a steady ``rate``: the measured first
        batch, then the model's batches. Not the calibration's own warm-up, which
        drains the burst that fills the state (it took 85 s where a run at the demo's
        low rate ended its warm-up at 51 s)."""
        from control.live import WARMUP_BATCHES

        return self.first_batch_s + (WARMUP_BATCHES - 1) * self.batch_s(rate)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepPlan:
    """A rate step around one worker's measured capacity that an MPC policy must answer
    by scaling 1 -> 2 workers and back: what the seeded demo and the closed-loop test
    run, derived from the calibration so that it holds on a slow machine and a fast one.

    Low is 10 % of one worker's capacity: its modelled p95 (1 + q)·o/(1 - rho) is
    2.2·o. High is 110 %, above one worker's capacity: one worker saturates, two run at
    utilisation 0.55 (modelled p95 4.3·o). The bound lies between, at one worker's
    modelled p95 at utilisation 0.6 (4.9·o); so the model wants two workers exactly
    while high.

    Why the margins: the calibration's per-record cost is an estimate. With one core
    kept busy it came out 1.4x what the live run then measured (its overloaded batches
    cost more per record than the live run's), so that a step to 90 % of the measured
    capacity was served by one worker at utilisation 0.63, under a bound set at 0.7,
    and the MPC rightly kept one worker. With 110 % and a bound at 0.6, one worker
    violates the bound as long as the live cost is within 1.8x of the calibrated one.
    """
    low_rps: float
    high_rps: float
    up_at_s: int
    down_at_s: int
    bound_ms: int

    def rate(self, cycles: int = 1, rest_s: int = 0) -> dict[str, Any]:
        """A step schedule: low, high from up_at to down_at, low; ``cycles`` times,
        each further cycle ``rest_s`` after the previous one fell."""
        steps: list[list[float]] = [[0, round(self.low_rps)]]
        start = 0
        for _ in range(cycles):
            steps += [[start + self.up_at_s, round(self.high_rps)],
                      [start + self.down_at_s, round(self.low_rps)]]
            start += self.down_at_s + rest_s - self.up_at_s
        return {"kind": "step", "steps": steps}


    def feeder_cycle(self, rest_s: int) -> tuple[dict[str, Any], int]:
        """The step as a feeder repeats it for runs that start at any time: ``rest_s``
        at low, then high as long as the step's high phase; the schedule and its
        length in seconds."""
        high_s = self.down_at_s - self.up_at_s
        return ({"kind": "step", "steps": [[0, round(self.low_rps)],
                                           [rest_s, round(self.high_rps)],
                                           [rest_s + high_s, round(self.low_rps)]]},
                rest_s + high_s)


def step_plan(cal: Calibration) -> StepPlan:
    from control.live import LATENCY_QUANTILE, WARMUP_BATCHES

    low, high = 0.10 * cal.capacity_rps, 1.10 * cal.capacity_rps
    bound_ms = int(round(1000 * (1 + LATENCY_QUANTILE) * cal.overhead_s / 0.4, -2))
    # The controller decides nothing on the first WARMUP_BATCHES batches: the first
    # batch (JVM and Python workers warm up) and the warm-up at low come first.
    # The step comes shortly before the warm-up ends (the calibration's first batch, then
    # its model's batches at low), so that the first window the controller reads already
    # holds high batches; much earlier, the saturated batches would only lengthen the
    # warm-up (it counts batches).
    up_at = int(max(15 + (WARMUP_BATCHES + 3) * cal.batch_s(low), 0.9 * cal.warmup_s(low)))
    # While high: the first high batches on one worker, the decision, an executor's
    # start and the migration of half the key groups (batches of ~2·o, the state
    # reloads), then a few steps on two. Measured: the decision came at the first
    # control step after the step and two workers 18-27 s (quiet) to 33 s (one core
    # kept busy) after it; the phase is 52 s at o = 1.28 s. Should the fall come first
    # on a slower machine, the decided scale-up still completes and the fall scales
    # back (the control loop waits for a pending reconfiguration).
    down_at = up_at + int(25 + 4 * cal.batch_s(0.55 * cal.capacity_rps) + 12 * cal.overhead_s)
    return StepPlan(low, high, up_at, down_at, bound_ms)


def spread_ok(batches: list[dict[str, Any]]) -> bool:
    """Whether the batches' sizes differ enough to fit a slope."""
    sizes = [float(m["input_rows"]) for m in batches]
    return (len(sizes) >= 2
            and statistics.pstdev(sizes) >= MIN_SPREAD * statistics.fmean(sizes))


def describe(batches: list[dict[str, Any]]) -> str:
    """The batches as an error message lists them: records in seconds, each."""
    return ", ".join(f"{m['input_rows']} in {m['batch_duration_ms'] / 1000:.1f} s"
                     for m in batches) or "none"


def shape_of(definition: dict[str, Any]) -> str:
    """What the capacity depends on: the pipeline without its rate schedule."""
    doc = json.loads(json.dumps(definition))
    doc.get("source", {}).pop("rate", None)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _steps(ramp: tuple[tuple[float, int], ...], alternate: tuple[tuple[float, int], ...]
           ) -> dict[str, Any]:
    steps, t = [], 0
    for rate, seconds in ramp + alternate * ALTERNATIONS + ((alternate[0][0], 0),):
        steps.append([t, rate])
        t += seconds
    return {"kind": "step", "steps": steps}


def ramp_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """The pipeline under the calibration ramp (a per-second step schedule)."""
    doc = json.loads(json.dumps(definition))
    doc["source"]["rate"] = _steps(RAMP, ALTERNATE)
    return doc


def reads_a_stream(definition: dict[str, Any]) -> bool:
    return (definition.get("source") or {}).get("type") == "redis_stream"


@contextmanager
def ramp_source(definition: dict[str, Any], connections: dict[str, dict[str, str]] | None
                ) -> Iterator[tuple[dict[str, Any], tuple[tuple[float, int], ...],
                                    tuple[tuple[float, int], ...]]]:
    """The pipeline under the calibration ramp, with the ramp it runs: the generator's
    schedule, or for a Redis stream a scratch stream (``<stream>-calibration``, read
    from its start, removed after) that a feeder thread fills on the stream ramp."""
    if not reads_a_stream(definition):
        yield ramp_definition(definition), RAMP, ALTERNATE
        return
    import threading

    import redis

    from pipelines.runtime import connectors
    from pipelines.runtime.connectors import feed as feeder

    connectors.register_connections(connections)
    source = definition["source"]
    scratch = f"{source['stream']}-calibration"
    r = redis.Redis.from_url(connectors.server_url(source))
    r.delete(scratch)
    doc = json.loads(json.dumps(definition))
    doc["source"] = {k: v for k, v in source.items() if k not in ("start", "start_offset")}
    doc["source"]["stream"] = scratch
    feed = feeder.Feed(seed=17, rate=_steps(STREAM_RAMP, STREAM_ALTERNATE),
                       keys=source.get("keys") or {"kind": "uniform", "n": 1000})
    stop = threading.Event()
    thread = threading.Thread(target=feeder.publish, daemon=True, args=(
        feeder.RedisPublisher(r, scratch), scratch, feed),
        kwargs={"say": lambda _m: None, "stop": stop.is_set})
    thread.start()
    try:
        yield doc, STREAM_RAMP, STREAM_ALTERNATE
    finally:
        stop.set()
        thread.join(30)
        r.delete(scratch)


def calibrate(master_url: str, work: Path, redis_url: str, definition: dict[str, Any],
              progress: Callable[[str], None] = lambda _m: None,
              run_id: int = 990_007,
              connections: dict[str, dict[str, str]] | None = None) -> Calibration:
    """Run ``definition`` on one worker under the ramp and fit the batch model
    (``connections``: those its source names, for a stream's)."""
    with ramp_source(definition, connections) as (doc, ramp, alternate):
        return _calibrate(master_url, work, redis_url, definition, doc, ramp, alternate,
                          progress, run_id, connections)


def _calibrate(master_url: str, work: Path, redis_url: str, definition: dict[str, Any],
               doc: dict[str, Any], ramp: tuple[tuple[float, int], ...],
               alternate: tuple[tuple[float, int], ...],
               progress: Callable[[str], None], run_id: int,
               connections: dict[str, dict[str, str]] | None) -> Calibration:
    import numpy as np

    from control.live import MIN_R2, WARMUP_BATCHES

    ramp_s = (sum(s for _r, s in ramp)
              + MIN_CYCLES * sum(s for _r, s in alternate))
    where = " into a scratch stream" if reads_a_stream(definition) else ""
    progress(f"calibration: one worker under {', '.join(f'{r / 1000:g}K' for r, _s in ramp)}"
             f" records/s{where}, then {' / '.join(f'{r / 1000:g}K' for r, _s in alternate)}"
             f" alternating, at least {ramp_s} s and until {MIN_FIT_BATCHES} batches past "
             "the warm-up differ enough in size")

    def usable(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [m for m in metrics
                if m["batch_id"] >= WARMUP_BATCHES and not m.get("failed_tasks")
                and m["input_rows"] > 0]

    def enough(metrics: list[dict[str, Any]], t0: float) -> bool:
        used = usable(metrics)
        return (metrics[-1]["t"] > t0 + ramp_s
                and len(used) >= MIN_FIT_BATCHES and spread_ok(used))

    token = f"calib{int(time.time())}"
    # A fresh checkpoint each time (a runner refuses to resume one without its clock).
    run_dir = Path(work) / token
    extra = {"connections": connections} if connections else {}
    with RunnerProcess(run_dir, master_url, doc, redis_url, run_id=run_id, token=token,
                       max_workers=1, initial_workers=1, **extra) as run:
        try:
            # (t0 is known once the query has started, and metrics come only after.)
            run.wait_until(lambda: bool(run.metrics) and enough(run.metrics, run.t0),
                           CALIBRATION_TIMEOUT_S,
                           "the calibration ramp")
        except HarnessError as exc:
            raise HarnessError(f"{exc}; batches past the warm-up: "
                               f"{describe(usable(run.metrics))}") from exc
        used = usable(run.metrics)
        first_batch_s = run.metrics[0]["t"] - run.t0
    run.bus.reset()
    shutil.rmtree(run_dir, ignore_errors=True)  # its 1M-key state is of no further use
    x = np.array([m["input_rows"] for m in used], dtype=float)
    d = np.array([m["batch_duration_ms"] / 1000 for m in used], dtype=float)
    # Ordinary least squares over every batch past the warm-up. The live loop's model
    # also insists that o stays below the fastest batch (so that it never predicts a
    # batch faster than one seen); here jitter of +-0.1 s on ~0.6 s batches put the
    # line's intercept a few ms above the fastest one and refused a clear slope.
    if len(x) < 8 or not spread_ok(used):
        raise HarnessError(f"calibration: {len(x)} batches past the warm-up, of too "
                           f"similar sizes to fit a slope ({describe(used)})")
    slope, intercept = (float(v) for v in np.polyfit(x, d, 1))
    explained = 1.0 - float(np.var(d - (intercept + slope * x))) / max(float(np.var(d)),
                                                                     1e-12)
    if slope <= 0 or explained < MIN_R2:
        raise HarnessError(
            f"calibration: batch times did not follow the batch size over {len(x)} "
            f"batches (slope {slope * 1e6:.2f} µs per record, R² {explained:.2f})")
    overhead = max(intercept, 0.3 * float(d.min()))
    cal = Calibration(overhead_s=round(overhead, 4), cost_per_record_s=slope,
                      capacity_rps=round(1.0 / slope, 1), batches=len(used),
                      measured_at=time.time(), shape=shape_of(definition),
                      first_batch_s=round(first_batch_s, 1))
    progress(f"calibration: o = {cal.overhead_s:.2f} s per batch, c = "
             f"{cal.cost_per_record_s * 1e6:.1f} µs per record: one worker's capacity "
             f"{cal.capacity_rps:,.0f} records/s (measured, {cal.batches} batches); "
             f"the first batch ended {cal.first_batch_s:.0f} s after the query started")
    return cal


def load(path: Path, definition: dict[str, Any]) -> Calibration | None:
    """A stored calibration of this pipeline shape, if there is a recent one."""
    try:
        doc = json.loads(Path(path).read_text())
        cal = Calibration(**doc)
    except (OSError, ValueError, TypeError):
        return None
    if cal.shape != shape_of(definition) or time.time() - cal.measured_at > MAX_AGE_S:
        return None
    return cal


def load_or_calibrate(path: Path, master_url: str, work: Path, redis_url: str,
                      definition: dict[str, Any],
                      progress: Callable[[str], None] = lambda _m: None,
                      connections: dict[str, dict[str, str]] | None = None) -> Calibration:
    """The stored calibration, or a new one (stored at ``path``)."""
    cal = load(path, definition)
    if cal is not None:
        progress(f"calibration: one worker's capacity {cal.capacity_rps:,.0f} records/s, "
                 f"batch overhead {cal.overhead_s:.2f} s (measured "
                 f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(cal.measured_at))}, "
                 f"stored in {path})")
        return cal
    cal = calibrate(master_url, work, redis_url, definition, progress,
                    connections=connections)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_json(), indent=1))
    tmp.replace(path)
    return cal
