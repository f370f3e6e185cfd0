"""NEXMark on this machine: per query, the sustainable rate on 1 and 2 executors with
Streamwise and with the same query as plain PySpark, in the same run.

    python -m pipelines.nexmark bench [--queries Q0,Q1,...] [--workers 1,2] [--step-s 10]

(``pipelines.nexmark``'s CLI hands ``bench`` to this module: the runtime sits above the
pure NEXMark library.)

**Sustainable rate** (the issue's definition): the highest constant rate whose p95
latency stays under 2x the unloaded p95 with no growing backlog. Each configuration is
one run over a staircase of constant rates — ``--start`` events/s for ``--unloaded-s``
(Spark warms up in it), then ``--climb-from`` x executors events/s and x√2 every ``--step-s``
seconds — stopped at the first step that is not sustainable.
A step is judged on its batches after the first quarter of the step: median per-batch
p95 ≤ 2x the unloaded p95, and the backlog (records due by now but not yet read) at the
step's end no more than ``BACKLOG_S`` seconds of input above its level at the step's
start. With √2 steps, the step two below the sustainable rate is half of it: its p95 is
"p95 at half".

**Unloaded p95**: the lowest step p95 so far — the unloaded step's (its last
``--step-s`` seconds) or a climbing step's. A stateful query's first batches start state
stores and Python workers (a join's first batch takes 13-17 s here, Q5 x2's first
climbing step once had a p95 of 26 s against 4.7 s three steps later), so a step whose
p95 is the lowest yet is taken as the floor and judged on its backlog only. Each step is
judged against the floor as of its end: the staircase decides as it climbs.

**CPU per 1,000 events**: the CPU seconds (user + system, from ``/proc``) of the
system's process trees — the driver (runner or plain application, with its JVM and
Python workers) and the executors (with their Python workers) — per step, divided by the
records the step's batches read. Compared over the steps both systems held, this
resolves Streamwise's overhead much finer than a √2 step of the staircase. The embedded
master and worker daemons are the same for both and not counted.

**Streamwise**: the real runner (``runner.py``: key-group placement, per-batch metrics
from Spark's task list, the latency sink, the control bus), output not kept.
**Plain PySpark**: a bare Spark application on the same cluster with the same executors
running the same DataFrame plan (``dataflow_spark.build_dataflow``: the compiler only
emits DataFrame operations) into Spark's ``noop`` sink, latency read from the same
observation in Spark's own progress events — what a Spark engineer would write without
Streamwise. The difference is Streamwise's runtime overhead. Both stamp a batch's end at
the same instant: when its write ends (Streamwise's sink; plain: the progress event's
trigger start plus its phases before the offset commit, not the event's late arrival).

Latency is per record: scheduled emission -> the end of the batch that read it. Rates are
events/s of NEXMark events (all types). Q4 and Q6 bound their join by the longest
auction at the staircase's lowest rate (a run passes through it). Numbers come from one
run per configuration on a noisy 2-core machine: read the ratios.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipelines.nexmark import queries
from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.spec import definition
from pipelines.runtime.runner.harness import HarnessError, RunnerProcess
from pipelines.runtime.host.procs import tree_cpu_s

BACKLOG_S = 1.0  # a step's backlog may grow by at most this many seconds of its input
WARM_FRACTION = 0.25  # the first quarter of a step: the rate change settling
MAX_STEPS = 18
# A step that no batch has ended in this long after its end failed: the query is stuck
# (seen: Q7 on two 1 GiB executors at 36,204 events/s, a batch ran an executor out of
# heap and the query never finished another).
STALL_S = 90.0
EXECUTOR_MEMORY = "1g"  # both systems' executors (the runner's default is 512m)
ROOT = Path(__file__).resolve().parents[3]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Batch:
    t: float  # seconds since t0 when the batch ended
    p95_ms: float | None
    backlog: int  # records due but not read when the batch was planned
    rows: int
    durations_ms: dict[str, int] | None = None  # Spark's account of the batch's time
    lag_ms: float | None = None  # plain: how long after the batch's end its event came


@dataclass
class Step:
    rate: float
    p95_ms: float | None = None  # median over the step's batches (after the warm-up)
    backlog_growth: int = 0
    batches: int = 0
    sustainable: bool = False
    rows: int = 0  # records read by the batches that ended in the step
    cpu_s: float | None = None  # CPU seconds of both process trees during the step


@dataclass
class Result:
    query: str
    system: str  # streamwise | plain
    workers: int
    unloaded_p95_ms: float | None = None
    sustainable_rate: float | None = None
    p95_at_half_ms: float | None = None
    steps: list[Step] = field(default_factory=list)
    capped: bool = False  # every step held: the rate is at least this
    error: str | None = None
    rep: int = 0  # which repetition of the configuration (--repeat)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Result:
        """A result as ``--json`` wrote it."""
        return cls(**{**doc, "steps": [Step(**s) for s in doc.get("steps", [])]})


def staircase(start: float, step_s: int, steps: int = MAX_STEPS,
              climb_from: float | None = None, unloaded_s: int | None = None
              ) -> list[list[float]]:
    """``[[at_s, rate], ...]``: ``start`` events/s for ``unloaded_s`` (default
    ``step_s``; Spark's first batches start Python workers, so the unloaded step may
    need longer), then x√2 every ``step_s`` — from ``climb_from`` when given: the steps
    far below what any query sustains here tell nothing and cost a minute per run."""
    base = start if climb_from is None else climb_from / math.sqrt(2)
    first = step_s if unloaded_s is None else unloaded_s
    return [[0, round(start, 1)]] + [[int(first + (k - 1) * step_s),
                                      round(base * math.sqrt(2) ** k, 1)]
                                     for k in range(1, steps)]


def span(stairs: list[list[float]], step_s: int, k: int) -> tuple[float, float]:
    """Step ``k``'s seconds: from its start to the next step's (the last: ``step_s``)."""
    at = stairs[k][0]
    return at, stairs[k + 1][0] if k + 1 < len(stairs) else at + step_s


def judge(stairs: list[list[float]], step_s: int, batches: list[Batch],
          unloaded_p95: float | None, k: int) -> Step:
    at, end = span(stairs, step_s, k)
    rate = stairs[k][1]
    # The unloaded step holds Spark's warm-up (the first batches start Python workers
    # and state stores: 13-17 s for a join's first batch here): judged on its last
    # step_s seconds only.
    lo = max(at, end - step_s) if k == 0 else at + WARM_FRACTION * (end - at)
    hi = end
    inside = [b for b in batches if lo < b.t <= hi]
    step = Step(rate=rate, batches=len(inside),
                rows=sum(b.rows for b in batches if at < b.t <= end))
    p95s = [b.p95_ms for b in inside if b.p95_ms is not None]
    if not inside or not p95s:
        return step
    step.p95_ms = round(statistics.median(p95s), 1)
    before = [b for b in batches if b.t <= lo]
    start_backlog = before[-1].backlog if before else inside[0].backlog
    step.backlog_growth = inside[-1].backlog - start_backlog
    step.sustainable = holds(step, unloaded_p95 if unloaded_p95 is not None
                             else step.p95_ms)
    return step


def holds(step: Step, floor: float | None) -> bool:
    """A step's verdict: p95 within 2x the floor, backlog grown by at most ``BACKLOG_S``
    seconds of its input."""
    return (step.p95_ms is not None and floor is not None and step.p95_ms <= 2 * floor
            and step.backlog_growth <= BACKLOG_S * step.rate)


def rejudge(result: Result) -> None:
    """Judge recorded steps again by the rule ``Staircase`` applies as they end (the
    lowest p95 so far as the floor): results saved by an earlier rule (the floor from
    the first two steps only) read the same as new ones. The rule is never laxer, so the
    steps recorded up to the old first failure are enough."""
    floor: float | None = None
    for k, step in enumerate(result.steps):
        if k == 0:
            floor, step.sustainable = step.p95_ms, True
            continue
        if step.p95_ms is not None and (floor is None or step.p95_ms < floor):
            floor = step.p95_ms
        step.sustainable = holds(step, floor)
        if not step.sustainable:
            break
    result.steps = result.steps[:k + 1] if result.steps else []
    result.unloaded_p95_ms = floor
    result.sustainable_rate = result.p95_at_half_ms = None
    result.capped = False
    summarise(result)


def summarise(result: Result) -> None:
    """The sustainable rate: the last step before the first one that is not (the
    unloaded step counts); p95 at half: the step at half of it (two √2-steps below)."""
    first_bad = next((i for i, s in enumerate(result.steps) if not s.sustainable),
                     len(result.steps))
    if first_bad == 0:
        return
    result.sustainable_rate = result.steps[first_bad - 1].rate
    result.capped = first_bad == len(result.steps) == MAX_STEPS
    if first_bad == 1 and len(result.steps) > 1 \
            and result.steps[1].rate > math.sqrt(2) * result.steps[0].rate * 1.01:
        # Between the unloaded step and the first climbing one: not measured.
        result.sustainable_rate = None
        result.error = result.error or (f"not sustainable at {result.steps[1].rate:.0f}/s,"
                                        " the first climbing step: lower --climb-from")
        return
    half = result.sustainable_rate / 2
    result.p95_at_half_ms = next((s.p95_ms for s in result.steps[:first_bad]
                                  if abs(s.rate - half) <= 0.01 * half), None)


def bench_doc(query: str, stairs: list[list[float]], workers: int) -> dict[str, Any]:
    doc = queries.definition(query, stairs[0][1], key_groups=max(4, 2 * workers),
                             keep_output=False)
    for node in doc["nodes"]:
        if node["type"] == "nexmark":
            node["rate"] = {"kind": "step", "steps": stairs}
    return doc


class Staircase:
    """Feeds batches in, judges each step once it is over, says when to stop.
    ``cpu_s`` (optional) reads the CPU seconds spent so far by the system under test."""

    def __init__(self, result: Result, stairs: list[list[float]], step_s: int,
                 cpu_s: Callable[[], float] | None = None) -> None:
        self.result, self.stairs, self.step_s = result, stairs, step_s
        self.batches: list[Batch] = []
        self.cpu_s = cpu_s
        self._cpu_mark: float | None = None
        self._seen_at: float | None = None  # time.monotonic() when the last batch came

    def stalled(self) -> bool:
        """True, with the current step judged not sustainable, once no batch has ended
        for ``STALL_S`` seconds past that step's end (the run's clock is read off the
        last batch: ``t`` then, plus the time since it came)."""
        k = len(self.result.steps)
        if self._seen_at is None or k >= len(self.stairs):
            return False
        now_s = self.batches[-1].t + time.monotonic() - self._seen_at
        if now_s <= span(self.stairs, self.step_s, k)[1] + STALL_S:
            return False
        self.result.steps.append(Step(rate=self.stairs[k][1]))
        log(f"  {self.result.system:<10} {self.result.query} x{self.result.workers}: "
            f"{self.stairs[k][1]:>8.0f}/s no batch ended for {STALL_S:.0f} s -> NOT "
            "sustainable (stuck)")
        return True

    def add(self, batch: Batch) -> bool:
        """Record a batch; False once a step failed or the staircase is over."""
        self.batches.append(batch)
        self._seen_at = time.monotonic()
        while len(self.result.steps) < len(self.stairs):
            k = len(self.result.steps)
            if batch.t <= span(self.stairs, self.step_s, k)[1]:
                return True
            unloaded = self.result.unloaded_p95_ms
            step = judge(self.stairs, self.step_s, self.batches, unloaded, k)
            if k == 0:  # Spark's warm-up: nothing to judge yet
                self.result.unloaded_p95_ms = step.p95_ms
                step.sustainable = True
            elif step.p95_ms is not None and (unloaded is None or step.p95_ms < unloaded):
                # Lower than every step before: those were still warming up (see the
                # module's docstring); this one is the floor and is judged on its backlog.
                self.result.unloaded_p95_ms = step.p95_ms
                step = judge(self.stairs, self.step_s, self.batches, step.p95_ms, k)
            if self.cpu_s is not None:
                now = self.cpu_s()
                if self._cpu_mark is not None:
                    step.cpu_s = round(now - self._cpu_mark, 2)
                self._cpu_mark = now
            self.result.steps.append(step)
            log(f"  {self.result.system:<10} {self.result.query} x{self.result.workers}: "
                f"{step.rate:>8.0f}/s p95 {step.p95_ms} ms, backlog {step.backlog_growth:+d}"
                f" -> {'ok' if step.sustainable else 'NOT sustainable'}")
            if not step.sustainable:
                return False
        return False

    @property
    def deadline_s(self) -> float:
        return span(self.stairs, self.step_s, len(self.stairs) - 1)[1] + 5


def cpu_reader(driver: Callable[[], subprocess.Popen | None],
               worker_pid: int | None) -> Callable[[], float] | None:
    """Reads the CPU seconds of the driver's tree and the executors' (the worker daemon's
    children: one application runs at a time), or None without a worker pid."""
    if worker_pid is None:
        return None

    def read() -> float:
        proc = driver()
        roots = [worker_pid] + ([proc.pid] if proc is not None else [])
        return tree_cpu_s(roots, exclude_roots=(worker_pid,))
    return read


def run_streamwise(master: str, work: Path, redis_url: str, query: str, workers: int,
                   stairs: list[list[float]], step_s: int,
                   worker_pid: int | None = None, rep: int = 0) -> Result:
    result = Result(query, "streamwise", workers, rep=rep)
    doc = bench_doc(query, stairs, workers)
    run = RunnerProcess(work / f"sw-{query}-{workers}-{rep}", master, doc, redis_url,
                        token=f"nxb{query}{workers}r{rep}", max_workers=workers,
                        initial_workers=workers, executor_memory=EXECUTOR_MEMORY)
    watch = Staircase(result, stairs, step_s,
                      cpu_reader(lambda: run.proc, worker_pid))
    with run:
        seen = 0
        go = True
        while go:
            run.poll(1000)
            for m in run.metrics[seen:]:
                due, end = m.get("source_latest"), m.get("source_end")
                batch = Batch(t=m["t"] - run.t0, p95_ms=m.get("latency_p95_ms"),
                              backlog=max(0, (due or 0) - (end or 0)),
                              rows=m["input_rows"], durations_ms=m.get("durations_ms"))
                go = watch.add(batch) and go
            seen = len(run.metrics)
            if run.metrics and run.metrics[-1]["t"] - run.t0 > watch.deadline_s \
                    or watch.stalled():
                break
    summarise(result)
    return result


def run_plain(master: str, work: Path, query: str, workers: int,
              stairs: list[list[float]], step_s: int,
              worker_pid: int | None = None, rep: int = 0) -> Result:
    result = Result(query, "plain", workers, rep=rep)
    doc = bench_doc(query, stairs, workers)
    where = work / f"plain-{query}-{workers}-{rep}"
    where.mkdir(parents=True, exist_ok=True)
    (where / "doc.json").write_text(json.dumps(doc))
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.runtime.bench.nexmark",
                             "_plain", master, str(where), str(workers)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=open(where / "spark.log", "ab"),
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    watch = Staircase(result, stairs, step_s, cpu_reader(lambda: proc, worker_pid))
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:  # a thread, so that a stuck query is noticed (watch.stalled)
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, name="plain-batches", daemon=True).start()
    try:
        while not watch.stalled():
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            batch = Batch(**json.loads(line))
            if not watch.add(batch) or batch.t > watch.deadline_s:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode not in (0, -signal.SIGTERM, 143) and not result.steps:
        result.error = f"plain PySpark exited {proc.returncode} (see {where}/spark.log)"
    summarise(result)
    return result


def plain_main(master: str, where: Path, workers: int) -> int:
    """The plain PySpark application: the query into ``noop``; one JSON line per batch."""
    from pyspark.sql.streaming import StreamingQueryListener

    from pipelines.runtime.runner.metrics import iso_to_epoch
    from pipelines.runtime.query.dataflow_spark import build_dataflow
    from pipelines.runtime.query.session import apply_run_conf, build_session
    from pipelines.runtime.query.source import OBSERVATION

    spec = definition.validate(json.loads((where / "doc.json").read_text()))
    spark = build_session(master, "nexmark-plain", workers, EXECUTOR_MEMORY)
    apply_run_conf(spark, spec)
    deadline = time.time() + 120
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < workers:
        if time.time() > deadline:
            print(f"only some of {workers} executors registered", file=sys.stderr)
            return 1
        time.sleep(0.25)
    t0 = time.time()

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            # The batch's records are written when Spark's addBatch ends: the trigger's
            # start plus its phases but the offset commit that follows — the instant
            # Streamwise's sink stamps. Not the time this event arrives, which the
            # listener bus delivers later the busier the driver is.
            took = p.durationMs
            now = iso_to_epoch(p.timestamp) + (int(took.get("triggerExecution", 0))
                                               - int(took.get("commitOffsets", 0))) / 1000
            source = p.sources[0] if p.sources else None
            end = json.loads(source.endOffset).get("offset", 0) if source else 0
            due = json.loads(source.latestOffset).get("offset", 0) \
                if source and source.latestOffset else end
            obs = p.observedMetrics.get(OBSERVATION)
            p95 = None
            if obs is not None and obs["records"] and obs["q"] is not None:
                p95 = round((now - obs["q"][1]) * 1000.0, 1)
            print(json.dumps({"t": now - t0, "p95_ms": p95, "backlog": max(0, due - end),
                              "lag_ms": round((time.time() - now) * 1000.0, 1),
                              "rows": int(p.numInputRows),
                              "durations_ms": {k: int(v) for k, v in p.durationMs.items()}}),
                  flush=True)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Progress())
    writer = (build_dataflow(spark, spec, t0, where / "plan").writeStream.format("noop")
              .outputMode(spec.output_mode)
              .option("checkpointLocation", str(where / "checkpoint")))
    if spec.trigger_ms:
        writer = writer.trigger(processingTime=f"{spec.trigger_ms} milliseconds")
    q = writer.start()
    signal.signal(signal.SIGTERM, lambda *_: q.stop())
    try:
        q.awaitTermination()
    finally:
        spark.stop()
    return 0


def cpu_per_1k(sw: Result, plain: Result) -> tuple[float, float] | None:
    """CPU ms per 1,000 events read, Streamwise and plain, over the climbing steps both
    held (the same rates: the same input)."""
    held = {s.rate for s in plain.steps[1:] if s.sustainable}
    pairs = [(a, b) for a in sw.steps[1:] if a.sustainable and a.rate in held
             for b in plain.steps[1:] if b.rate == a.rate]
    if any(a.cpu_s is None or b.cpu_s is None for a, b in pairs):
        return None
    rows_sw, rows_plain = sum(a.rows for a, _ in pairs), sum(b.rows for _, b in pairs)
    if not pairs or not rows_sw or not rows_plain:
        return None
    return (round(sum(a.cpu_s or 0 for a, _ in pairs) * 1e6 / rows_sw, 1),
            round(sum(b.cpu_s or 0 for _, b in pairs) * 1e6 / rows_plain, 1))


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(float(statistics.median(known)), 1) if known else None


def _cell(values: list[float | None]) -> str:
    """The median, with every run's value after it when there was more than one."""
    middle = _median(values)
    if len(values) < 2:
        return str(middle or "—")
    runs = ", ".join("—" if v is None else f"{v:.0f}" for v in values)
    return f"{middle or '—'} ({runs})"


def table(results: list[Result]) -> str:
    """One row per query and executor count: medians over the repetitions (each run's
    value in brackets), the rate ratio of the medians, CPU per 1,000 events paired run
    by run; then every configuration's ratios, sorted, with their medians."""
    runs: dict[tuple[str, str, int], list[Result]] = {}
    for r in sorted(results, key=lambda r: r.rep):
        runs.setdefault((r.query, r.system, r.workers), []).append(r)
    lines = ["| query | workers | Streamwise sustainable (ev/s) | plain PySpark (ev/s) | "
             "Streamwise / plain | unloaded p95 SW / plain (ms) | p95 at half SW / plain (ms) "
             "| CPU ms per 1k events SW / plain | CPU SW / plain |",
             "|---|---|---|---|---|---|---|---|---|"]
    rate_ratios: list[float] = []
    cpu_ratios: list[float] = []
    for (query, system, workers), sws in sorted(runs.items()):
        if system != "streamwise":
            continue
        plains = runs.get((query, "plain", workers), [])
        sw_rate = _median([r.sustainable_rate for r in sws])
        plain_rate = _median([r.sustainable_rate for r in plains])
        ratio = "—"
        if sw_rate and plain_rate:
            rate_ratios.append(round(sw_rate / plain_rate, 2))
            ratio = f"{sw_rate / plain_rate:.2f}"
        cpus = [c for a, b in zip(sws, plains) if (c := cpu_per_1k(a, b)) and c[1]]
        cpu_cells = "— | —"
        if cpus:
            sw_cpu = _median([c[0] for c in cpus])
            plain_cpu = _median([c[1] for c in cpus])
            cpu_ratio = statistics.median(c[0] / c[1] for c in cpus)
            cpu_ratios.append(round(cpu_ratio, 2))
            cpu_cells = f"{sw_cpu} / {plain_cpu} | {cpu_ratio:.2f}"
        lines.append(
            f"| {query} | {workers} | {_cell([r.sustainable_rate for r in sws])} | "
            f"{_cell([r.sustainable_rate for r in plains]) if plains else '—'} | {ratio} | "
            f"{_median([r.unloaded_p95_ms for r in sws])} / "
            f"{_median([r.unloaded_p95_ms for r in plains])} | "
            f"{_median([r.p95_at_half_ms for r in sws])} / "
            f"{_median([r.p95_at_half_ms for r in plains])} | {cpu_cells} |")
    for name, ratios in (("rate", rate_ratios), ("CPU", cpu_ratios)):
        if ratios:
            lines.append(f"\n{name} ratios Streamwise / plain, sorted: "
                         f"{', '.join(f'{x:.2f}' for x in sorted(ratios))}; median "
                         f"{statistics.median(ratios):.2f}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipelines.nexmark bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", default=",".join(queries.QUERIES))
    ap.add_argument("--workers", default="1,2", help="executor counts (1-core each)")
    ap.add_argument("--start", type=float, default=100.0,
                    help="the first (unloaded) step, events/s")
    ap.add_argument("--climb-from", type=float, default=1600.0,
                    help="the first step above the unloaded one, events/s per executor "
                    "(then x√2)")
    ap.add_argument("--step-s", type=int, default=8, help="whole seconds per step")
    ap.add_argument("--unloaded-s", type=int, default=32,
                    help="whole seconds of the unloaded step: Spark warms up in it, and "
                    "its last --step-s seconds give the unloaded p95")
    ap.add_argument("--systems", default="streamwise,plain")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration (the "
                    "table shows medians; the systems' order alternates between runs)")
    ap.add_argument("--render", type=Path, nargs="+", metavar="JSON", default=None,
                    help="print the table of results saved with --json, run nothing")
    return ap


def _checked(ap: argparse.ArgumentParser, args: argparse.Namespace
             ) -> tuple[list[str], list[int], list[str]]:
    """The queries, executor counts and systems asked for (``ap.error`` otherwise)."""
    chosen = [q.strip().upper() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in chosen if q not in queries.QUERIES]
    systems = [s for s in args.systems.split(",") if s]
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        workers = []
    if unknown or not chosen:
        ap.error(f"unknown query {', '.join(unknown)}; known: {', '.join(queries.QUERIES)}")
    if not workers or not all(1 <= w <= 2 for w in workers):
        ap.error("--workers takes 1 and/or 2 (this machine has 2 cores)")
    if not set(systems) <= {"streamwise", "plain"} or not systems:
        ap.error("--systems takes streamwise and/or plain")
    if not 1 <= args.repeat <= 20:
        ap.error("--repeat takes 1 to 20")
    if not 1 <= args.start <= args.climb_from <= 1_000_000 or not 4 <= args.step_s <= 600 \
            or not 4 <= args.unloaded_s <= 600:
        ap.error("need 1 <= --start <= --climb-from <= 1000000 and 4 <= --step-s, "
                 "--unloaded-s <= 600")
    return chosen, workers, systems


def _render(ap: argparse.ArgumentParser, paths: list[Path]) -> int:
    try:
        saved = [Result.from_dict(d) for path in paths for d in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError) as exc:
        ap.error(f"cannot read the saved results: {exc}")
    for result in saved:
        rejudge(result)
    print(table(saved))
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_plain"]:
        return plain_main(argv[1], Path(argv[2]), int(argv[3]))
    ap = parser()
    args = ap.parse_args(argv)
    if args.render:
        return _render(ap, args.render)
    chosen, workers, systems = _checked(ap, args)
    # Two executors climb from twice the rate: the steps below half of one executor's
    # capacity tell nothing there either.
    stairs_for = {w: staircase(args.start, args.step_s, climb_from=args.climb_from * w,
                               unloaded_s=args.unloaded_s) for w in workers}
    work = Path(tempfile.mkdtemp(prefix="streamwise-nexmark-bench-"))
    log(f"starting an embedded Spark cluster in {work} ...")
    info = cluster.start(work / "spark")
    results: list[Result] = []
    started = time.time()
    try:
        plan = [(rep, query, w, system) for rep in range(args.repeat) for query in chosen
                for w in workers
                for system in (systems if rep % 2 == 0 else systems[::-1])]
        for done, (rep, query, w, system) in enumerate(plan):
            log(f"[{done + 1}/{len(plan)}] {query} on {w} executor(s), {system}"
                f"{f', run {rep + 1} of {args.repeat}' if args.repeat > 1 else ''} ...")
            results.append(_one_run(info, work, args, query, w, system, stairs_for[w], rep))
            if args.json:
                args.json.write_text(json.dumps([asdict(x) for x in results], indent=1))
    finally:
        cluster.stop(info)
    print(table(results))
    print(f"\n{len(results)} runs in {time.time() - started:.0f} s; {args.repeat} run(s) "
          "per configuration (ratios compare runs minutes apart on one machine)")
    return 0


def _one_run(info: Any, work: Path, args: argparse.Namespace, query: str, workers: int,
             system: str, stairs: Any, rep: int) -> Result:
    try:
        if system == "streamwise":
            return run_streamwise(info.master_url, work, args.redis_url, query, workers,
                                  stairs, args.step_s, info.worker_pid, rep)
        return run_plain(info.master_url, work, query, workers, stairs, args.step_s,
                         info.worker_pid, rep)
    except HarnessError as exc:
        return Result(query, system, workers, error=str(exc), rep=rep)


if __name__ == "__main__":
    sys.exit(main())
