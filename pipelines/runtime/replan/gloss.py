"""Live re-plan: change a running pipeline's key groups (its plan) without downtime.

Gloss (Rajadurai, Wong, Bosboom, Amarasinghe, ASPLOS 2018), mapped onto Structured
Streaming (Spark pins the number of state partitions per checkpoint, so a new key-group
count needs a new query with a new checkpoint):

* **Asynchronous state transfer (§6.2).** The old query keeps running; its state after
  its last committed micro-batch N is read with Spark's state data source
  (``format("statestore")``, ``batchId`` N) and written as a snapshot. No drain, no
  extra bookkeeping: Spark's per-batch state checkpoint is the consistent cut. Seamless
  does this, and the new query's first batch (the snapshot merged into the new key
  groups, ``query.keyed_aggregate``), in a ``nice 19`` process of its own
  (``reseed.py``): inside the run's application both took executor slots for seconds
  and stretched the old query's batches sixfold. On a processing-time trigger the
  transfer runs only between the old query's batches (``reseed.TransferGate``): at idle
  priority beside them it still doubled their task time.
* **Concurrent start (§5, §6.1).** The new query (new checkpoint, the new
  ``spark.sql.shuffle.partitions``) resumes the seeded checkpoint in the same
  application beside the old one and reads the deterministic source on from where its
  first batch ended. Both read the same epochs: the source's planned batch ends are
  shared (``source.py``, ``plan_dir``).
* **Taking turns.** Both queries' processing-time triggers fire at the same instants
  (Spark aligns them to multiples of the interval), so the new query's catch-up batches
  started with every batch of the old one and stretched it (NEXMark Q5: 1.5 s to
  2.5 s). On such a trigger, each batch of the new query is planned only once the old
  one has written its batch of the interval (``source.wait_for_forwarded``), until it
  reaches the forwarded end; the hand-over batch after that is left to it, the old query
  waiting for it (``Arbiter.begin``) rather than computing the same range beside it.
* **Adaptive merging (§7.2).** The output arbiter (:class:`Arbiter`) forwards each
  source range exactly once: a batch is claimed once computed, and the range that
  starts where the forwarded output ends goes to the generation that finishes it first
  (the old one waits briefly for a candidate on the same range). The old query is
  stopped once the new one has forwarded. While the new one is behind, the old one is
  throttled the way Gloss halves its cores (§7.2: its duty cycle halves every
  ``THROTTLE_STEP_S``), capped so that it still commits a batch well within every
  second (its output must not stop).
* **Stop-and-copy (§4.1)**, the baseline: stop the old query first, then the snapshot
  (in the run's application: every executor is free) and the new query, whose first
  batch loads it while the source holds; no output while that happens.
* **Metrics (§9.1)**, :func:`gloss_metrics`: downtime = buckets with no output while
  input arrives; throughput-disrupted time = buckets whose output is below the mean of
  the previous 100 s. Gloss' buckets are 1 s; ours are at least 1 s and twice the run's
  median commit interval (:func:`bucket_width`: a micro-batch run whose batches take
  1.4 s leaves some 1-s buckets empty in steady state), and "below the mean" allows one
  batch's worth (``DISRUPTED_SHARE``; the strict count is reported beside it).

The run's output is numbered by **epoch** (one per forwarded batch, ``output/batch-
<epoch>.parquet``); ``generations.json`` in the run directory says which batches of which
generation's checkpoint each epoch is, for the verifier (``verify.py``).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMES = ("seamless", "stop-restart")
GENERATIONS_FILE = "generations.json"
CATCH_UP_TIMEOUT_S = 300.0  # the new generation must have caught up by then
THROTTLE_AFTER_S = 5.0  # overlap before the old generation is first throttled
THROTTLE_STEP_S = 5.0  # its duty cycle halves again after each further step
THROTTLE_PERIOD_CAP_S = 0.8  # batch + pause never longer: it keeps output every second
RESERVE_WAIT_S = 10.0  # the longest a candidate ahead waits for the range before its own
HANDOVER_WAIT_S = 0.5  # the old generation's wait for a candidate on the same range
# Once the candidate has computed the last forwarded range, the old generation does not
# compute the next one beside it: it waits for the candidate's (at least this long, or
# this many times the candidate's last batch) and computes it only if that lapses.
HANDOVER_ALONE_MIN_S = 1.0
HANDOVER_ALONE_FACTOR = 2.0
POOL_FORWARDING, POOL_CATCHING_UP = "forwarding", "catching-up"  # fairscheduler.xml
SETTLE_S = 10.0  # measured after the switch, so that a late dip is counted
BASELINE_S = 100.0  # Gloss §9.1: "full throughput" = mean of the previous 100 s
RECENT_BATCHES = 5
# A state transfer is gated to the forwarded query's idle time only where its batches
# leave at least this share of the trigger interval idle: batches run back to back leave
# a gated transfer only the instants between a commit and the next start, too little to
# end before the re-plan's deadline (docs/benchmarks.md, "gated state transfer").
# Ungated, it runs beside the batches at idle priority, as on a pipeline with no trigger.
GATE_IDLE_MIN = 0.2


class ReplanError(Exception):
    """A re-plan that cannot be done (the message says why)."""


REPLAY_MARGIN_S = 5.0  # replayed beyond the state horizon (records' event-time jitter)
# Where a seamless re-plan replays a dataflow pipeline's state horizon: in the run's
# application (the new query starts at the replay's first record beside the old one,
# Gloss' concurrent start, §6.1) or in a transfer process first (``reseed.py``).
REPLAY_IN = ("auto", "application", "process")
# ``auto`` replays in the application up to this many seconds of the source's schedule.
# Measured (NEXMark Q5, 1,000 events/s, 1-s trigger, 2 cores): its replay (a 20-s
# horizon and the margin: 25,000 events) took about 3 s in the run's application after a
# stop; in a transfer process, which runs only on the CPU the run leaves, 230-270 s with
# its JVM start, all of it inside the re-plan's measured window.
REPLAY_IN_APPLICATION_MAX_S = 120.0


def replays_in_process(spec: Any, start: int, replay_from: int, where: str = "auto"
                       ) -> bool:
    """Whether a seamless re-plan of a dataflow pipeline replays the records from
    ``replay_from`` up to ``start`` in a transfer process (``where``: one of
    ``REPLAY_IN``) rather than in the run's application."""
    if where not in REPLAY_IN:
        raise ReplanError(f"replay_in must be one of {', '.join(REPLAY_IN)}")
    if where != "auto":
        return where == "process"
    time_of, _ = offset_times(spec)
    return time_of(start) - time_of(replay_from) > REPLAY_IN_APPLICATION_MAX_S


def offset_times(spec: Any) -> tuple[Callable[[int], float], Callable[[float], int]]:
    """How a source's offsets map to its records' emission times (seconds) and back:
    the generators' schedule (times from the run's start), a Redis stream's entry IDs
    (the server's clock). ReplanError for a source whose offsets carry no time (a
    JetStream sequence: the replay's start cannot be found from a time)."""
    if spec.source_type == "redis_stream":
        from pipelines.runtime.connectors import redis_stream as rs

        return rs.emit_seconds, lambda t: max(0, int(t * 1000)) << rs.SEQ_BITS
    if spec.source_type not in ("generator", "nexmark"):
        raise ReplanError(f"a {spec.source_type} source's offsets carry no time, so the "
                          "replay that rebuilds a dataflow pipeline's state has no start")
    import numpy as np

    schedule = spec.schedule()
    return (lambda n: float(schedule.emission_times(np.array([n], dtype=np.int64))[0]),
            schedule.records_by)


def replan_refusal(spec: Any) -> str | None:
    """Why this pipeline cannot be re-planned live yet, or None."""
    if spec.graph is not None:
        horizon, why = spec.graph.state_horizon(spec.watermark_s)
        if horizon is None:
            return (f"a dataflow pipeline's state is rebuilt by replaying its recent "
                    f"records, and here that has no bound: {why}")
        if spec.graph.stateful:
            try:
                offset_times(spec)
            except ReplanError as exc:
                return str(exc)
        return None
    if spec.stateful.type not in ("keyed_aggregate", "hft_window"):
        return (f"re-plan covers keyed aggregates and HFT windows so far; "
                f"{spec.stateful.type} has no state hand-over yet")
    return None


def replay_start(spec: Any, start: int, t0: float) -> int:
    """The first record a re-planned dataflow pipeline's new generation reads: its state
    at ``start`` (every window, join buffer and watermark) depends only on records whose
    event time lies within the graph's state horizon before ``start``'s, and the
    generators' event times follow their order (event time = scheduled emission time),
    so replaying from there rebuilds the state exactly (Gloss §6.2 transfers state; a
    deterministic, replayable source lets the new instance derive it instead)."""
    horizon, why = spec.graph.state_horizon(spec.watermark_s)
    if horizon is None:
        raise ReplanError(why)
    from pipelines.runtime import connectors

    time_of, offset_by = offset_times(spec)
    at = time_of(start)
    first = connectors.start_offset(spec)  # (a stream read from its end at the start)
    return max(first, min(start, offset_by(at - horizon - REPLAY_MARGIN_S)))


def replay_ends(checkpoint: Path, batch: int, forwarded_end: int | None,
                replay_from: int) -> tuple[int, ...]:
    """Where a replay's first batches end: at the old generation's batch before its last
    committed one (``batch``), at that batch's end, and at the end of what it forwarded
    if that is further (stop-and-restart after an uncommitted batch). Its batches then
    end where the old one's did, so at the hand-over both have the same watermark and
    have emitted the same windows: a watermark's output depends on the batch before."""
    ends = [batch_end(checkpoint, batch - 1)] if batch > 0 else []
    ends.append(batch_end(checkpoint, batch))
    if forwarded_end is not None:
        ends.append(forwarded_end)
    return tuple(sorted({e for e in ends if e > replay_from}))


# ------------------------------------------------------------------ offsets
def generator_offset(offsets_text: str) -> int | None:
    """Our source's offset in one entry of a checkpoint's offset log (its source lines
    follow a version and a metadata line; a seeded generation also has the snapshot's
    file-source line, ``{"logOffset": …}``)."""
    lines = [ln for ln in offsets_text.splitlines() if ln.strip()]
    for line in lines[2:]:
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:  # "-" for a source without an offset yet
            continue
        if isinstance(doc, dict) and "offset" in doc:
            return int(doc["offset"])
    return None


def last_committed(checkpoint: Path) -> int | None:
    commits = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    return max(commits) if commits else None


def batch_end(checkpoint: Path, batch: int) -> int:
    end = generator_offset((checkpoint / "offsets" / str(batch)).read_text())
    if end is None:
        raise ReplanError(f"batch {batch} of {checkpoint} has no source offset")
    return end


# ---------------------------------------------------------------- generations
@dataclass
class Generation:
    """One query of the run: gen 0 is the one the run started with."""

    number: int
    key_groups: int
    checkpoint: Path
    start: int = 0  # the source offset it read from
    epoch_offset: int | None = None  # epoch = batch + epoch_offset once forwarded
    first_batch: int | None = None  # its first forwarded batch
    last_batch: int | None = None  # its last forwarded batch, once retired
    query: Any = None
    sink: Any = None
    adopted: bool = False  # the runner's placement and metrics act on it
    pause_s: float = 0.0  # the throttle: a pause after each of its batches
    batch_s: float = 0.0  # its last batch's duration (for the throttle)
    # Its last few batches' durations: whether its trigger leaves idle time between
    # them (``leaves_idle_time``), where a gated state transfer runs.
    recent_batch_s: list[float] = field(default_factory=list)
    # Batches its current query began (its sink was called), and how often its query
    # was started again after failing to start its Python workers (runner.py).
    batches_begun: int = 0
    restarts: int = 0
    # What its query was started with (the definition, query.Seed), for a restart.
    spec: Any = None
    seed: Any = None

    def record_batch(self, seconds: float) -> None:
        self.batch_s = seconds
        self.recent_batch_s = [*self.recent_batch_s[-(RECENT_BATCHES - 1):], seconds]

    def leaves_idle_time(self, trigger_s: float) -> bool:
        """Whether its recent batches (median) left at least ``GATE_IDLE_MIN`` of its
        trigger interval idle; True before any batch was measured."""
        if not self.recent_batch_s:
            return True
        ordered = sorted(self.recent_batch_s)
        median = ordered[len(ordered) // 2]
        return median <= (1 - GATE_IDLE_MIN) * trigger_s
    _ends: dict[int, int] = field(default_factory=dict)

    def batch_range(self, batch: int) -> tuple[int, int]:
        """The source records ``[start, end)`` batch ``batch`` read (its offset log is
        written before the batch runs)."""
        end = batch_end(self.checkpoint, batch)
        if batch == 0:
            start = self.start
        elif batch - 1 in self._ends:
            start = self._ends[batch - 1]
        else:
            start = batch_end(self.checkpoint, batch - 1)
        self._ends[batch] = end
        for old in [b for b in self._ends if b < batch - 4]:
            del self._ends[old]
        return start, end

    def ledger(self, run_dir: Path) -> dict[str, Any]:
        return {"generation": self.number, "key_groups": self.key_groups,
                "checkpoint": os.path.relpath(self.checkpoint, run_dir),
                "start": self.start, "epoch_offset": self.epoch_offset,
                "first_batch": self.first_batch, "last_batch": self.last_batch}


class Arbiter:
    """Forwards each source range to the run's output exactly once (Gloss §7.2,
    adaptive merging; the epoch-aligned sources make the ranges identical).

    A batch is claimed once it is computed, before its output is written
    (``query.LatencySink``): the range that starts where the forwarded output ends goes
    to whichever generation finishes it first, so the hand-over costs no batch of
    either query. The candidate's batches that start before the forwarded end (it is
    catching up) are discarded; one that starts past it (the candidate got ahead of a
    throttled old query) waits, at most ``RESERVE_WAIT_S``, for the old one to forward
    the range before it. When the old generation finishes a range the candidate is
    computing too, it waits for it (``HANDOVER_WAIT_S``, longer after each miss): its
    output is ready, so the wait is the small difference between the two, and without
    it the old query, warm and first, would win every race. A generation is stopped
    once its forwarded batches are written (``wait_written``)."""

    def __init__(self, run_dir: Path, first: Generation) -> None:
        self.run_dir = run_dir
        self.cond = threading.Condition()
        first.epoch_offset, first.first_batch = 0, 0
        self.generations: dict[int, Generation] = {first.number: first}
        self.active = first.number
        self.candidate: int | None = None
        self.candidate_range: tuple[int, int] | None = None  # the batch it is computing
        self.aligned = False  # the candidate takes over only after a batch aligned...
        self.candidate_prev: int | None = None  # ... with the old one's: their starts
        self.forwarded_from: int | None = None  # the start of the last forwarded range
        self.misses = 0  # the old one's waits for the candidate that ended in vain
        self.forwarded_end: int | None = None
        self.last_epoch = -1
        self.switched = threading.Event()
        self.switched_at: float | None = None
        self.discarded = 0  # batches run but not forwarded (the overlap's duplicates)
        # Forwarded batches still being written, per generation: a generation is
        # stopped only once its forwarded output is all written (wait_written).
        self.writing: dict[int, set[int]] = {}
        self.retired: set[int] = set()
        self.last_forwarded: dict[int, int] = {}  # generation -> its last forwarded batch
        # The candidate's last computed range and how long it took (begin to claim):
        # whether the old generation leaves it the hand-over batch alone (begin).
        self.candidate_last: tuple[int, int] | None = None
        self.candidate_began: float | None = None
        self.candidate_batch_s = 0.0
        self.yielded = 0  # hand-over batches the old generation left to the candidate
        # The candidate's turns (source.wait_for_forwarded): a file it reads, rewritten
        # whenever a forwarded batch is written; None without a candidate to gate.
        self.gate: Path | None = None
        self.gate_trigger_s = 0.0
        self.written_at = 0.0  # when the last forwarded batch was written

    def begin(self, gen: Generation, batch: int) -> bool:
        """``gen`` starts computing ``batch`` (its offsets are logged by then); False:
        it need not compute it (nothing of it will be forwarded, and it does not run
        again). Once the candidate has computed the range the forwarded output ends with
        (and, aligned, the one before it began where the forwarded one did), its next
        batch is the hand-over: the forwarding generation waits for it instead of
        computing the same range beside it, which on 2 cores stretched both (NEXMark Q5
        on a 3-s trigger: 1.0 s to 2.2 s, a disrupted second or three per re-plan), and
        computes it only if the candidate has not forwarded it in time."""
        start, end = gen.batch_range(batch)
        with self.cond:
            if gen.number == self.candidate:
                self.candidate_range = (start, end)
                self.candidate_began = time.monotonic()
                return True
            if gen.number != self.active:
                # Switched away from (it is being stopped): discarded whatever it does.
                return gen.number in self.retired
            if not self._candidate_ready(start):
                return True
            deadline = time.monotonic() + max(
                HANDOVER_ALONE_MIN_S, HANDOVER_ALONE_FACTOR * self.candidate_batch_s)
            while self.active == gen.number and self.candidate is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                self.cond.wait(left)
            if self.active != gen.number:
                self.yielded += 1
                return False
            return True

    def _candidate_ready(self, start: int) -> bool:
        """Whether the candidate's next batch hands over the range from ``start``."""
        last = self.candidate_last
        return (self.candidate is not None and last is not None
                and start == self.forwarded_end == last[1]
                and (not self.aligned or last[0] == self.forwarded_from))

    def pool_for(self, gen: Generation) -> str:
        """The Spark scheduler pool of ``gen``'s next batch (``fairscheduler.xml``): the
        forwarding generation's tasks get a free executor slot first, so a candidate
        catching up neither queues nor stretches the batches the run's output waits for
        (Gloss §7.2: the new instance catches up on the capacity the old one leaves)."""
        with self.cond:
            return POOL_FORWARDING if gen.number == self.active else POOL_CATCHING_UP

    def claim(self, gen: Generation, batch: int) -> int | None:
        """The epoch to forward ``gen``'s computed batch as, or None to discard it."""
        start, end = gen.batch_range(batch)
        with self.cond:
            if gen.number in self.retired:
                return self._discard()
            if gen.number == self.candidate:
                self.candidate_range = None
                self.candidate_last = (start, end)
                if self.candidate_began is not None:
                    self.candidate_batch_s = time.monotonic() - self.candidate_began
                deadline = time.monotonic() + RESERVE_WAIT_S
                while (self.candidate == gen.number and self.forwarded_end is not None
                       and self.forwarded_end < start):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                previous, self.candidate_prev = self.candidate_prev, start
                if (self.candidate == gen.number and self.forwarded_end is not None
                        and start == self.forwarded_end < end
                        and (not self.aligned or previous == self.forwarded_from)):
                    return self._switch(gen, batch, start, end)
                return self._discard()
            if gen.number != self.active:
                return self._discard()
            if self.candidate is not None and self.candidate_range == (start, end):
                deadline = time.monotonic() + HANDOVER_WAIT_S * (1 + self.misses)
                while self.active == gen.number and self.candidate_range == (start, end):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.misses += 1
                        break
                    self.cond.wait(left)
                if gen.number != self.active:  # the candidate took this range over
                    return self._discard()
            epoch = batch + (gen.epoch_offset or 0)
            self.forwarded_from, self.forwarded_end = start, end
            self.last_epoch = max(self.last_epoch, epoch)
            self.writing.setdefault(gen.number, set()).add(batch)
            self.last_forwarded[gen.number] = batch
            self.cond.notify_all()
            return epoch

    def _discard(self) -> None:
        self.discarded += 1
        self.cond.notify_all()
        return None

    def _switch(self, gen: Generation, batch: int, start: int, end: int) -> int:
        old = self.generations[self.active]
        old.last_batch = self.last_epoch - (old.epoch_offset or 0)
        gen.epoch_offset = self.last_epoch + 1 - batch
        gen.first_batch = batch
        self.active, self.candidate, self.candidate_range = gen.number, None, None
        self._open_gate()
        self.forwarded_from, self.forwarded_end = start, end
        self.last_epoch += 1
        self.switched_at = time.time()
        self.writing.setdefault(gen.number, set()).add(batch)
        self.last_forwarded[gen.number] = batch
        self.save()
        self.switched.set()
        self.cond.notify_all()
        return self.last_epoch

    def written(self, gen: Generation, batch: int) -> None:
        """``gen``'s forwarded batch ``batch`` is written (its sink returned)."""
        with self.cond:
            self.writing.get(gen.number, set()).discard(batch)
            if gen.number == self.active:
                self.written_at = time.time()
                self._write_gate()
            self.cond.notify_all()

    def _write_gate(self) -> None:
        if self.gate is None or self.candidate is None:
            return
        doc = {"committed_at": self.written_at, "forwarded_end": self.forwarded_end,
               "trigger_s": self.gate_trigger_s}
        tmp = self.gate.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.gate)

    def _open_gate(self) -> None:
        """The candidate plans its batches freely from now on (it forwards, or the
        re-plan ended)."""
        if self.gate is not None:
            self.gate.unlink(missing_ok=True)
            self.gate = None

    def retire(self, gen: Generation) -> None:
        """Forward nothing more of ``gen`` (stop-and-restart: before it is stopped)."""
        with self.cond:
            self.retired.add(gen.number)

    def wait_written(self, gen: Generation, timeout_s: float) -> bool:
        """Wait until every forwarded batch of ``gen`` is written (True), or time out."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.writing.get(gen.number):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def propose(self, gen: Generation, aligned: bool = False, gate: Path | None = None,
                trigger_s: float = 0.0) -> None:
        """``gen`` takes over once it offers the batch the forwarded output ends at
        (``aligned``: and its batch before began where the forwarded one before did).
        ``gate``: the file by which its batches take turns with the forwarded ones on
        a ``trigger_s`` processing-time trigger (``source.wait_for_forwarded``)."""
        with self.cond:
            self.generations[gen.number] = gen
            self.candidate, self.candidate_range, self.misses = gen.number, None, 0
            self.aligned, self.candidate_prev = aligned, None
            self.candidate_last, self.candidate_began = None, None
            self.candidate_batch_s, self.yielded = 0.0, 0
            self.switched.clear()
            self.switched_at = None
            self.discarded = 0
            self._open_gate()
            if gate is not None and trigger_s > 0:
                self.gate, self.gate_trigger_s = gate, trigger_s
                self._write_gate()

    def withdraw(self, gen: Generation) -> None:
        with self.cond:
            if self.candidate == gen.number:
                self.candidate, self.candidate_range = None, None
                self._open_gate()
                self.cond.notify_all()
            self.generations.pop(gen.number, None)

    def save(self) -> None:
        """``generations.json``: which batches of which checkpoint each epoch is."""
        doc = {"generations": [g.ledger(self.run_dir) for g in
                               sorted(self.generations.values(), key=lambda g: g.number)
                               if g.first_batch is not None]}
        tmp = self.run_dir / (GENERATIONS_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.run_dir / GENERATIONS_FILE)


# ------------------------------------------------------------------ snapshot
# The state buffers the optimiser keeps per aggregate: the ones its output does not use
# are pruned from the plan, so the state holds only these (in this order).
STATE_BUFFERS = {"count": ("w",), "sum": ("w", "s"), "mean": ("w", "s"), "max": ("w", "m")}


def _read_state(spark: Any, checkpoint: Path, batch: int, **options: str) -> Any:
    """Operator 0's state after ``batch`` (Spark's state data source)."""
    return (spark.read.format("statestore").option("batchId", batch)
            .option("operatorId", 0).options(**options).load(str(checkpoint)))


def _write_rows(rows: Any, out: Path) -> list[Path]:
    """Write a snapshot's rows as Parquet in ``out`` (replacing it); its files."""
    shutil.rmtree(out, ignore_errors=True)
    rows.write.parquet(str(out))
    return [p for p in out.iterdir() if p.suffix == ".parquet"]


def _rows_in(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def write_window_snapshot(spark: Any, checkpoint: Path, batch: int, key: str,
                          out: Path) -> int:
    """The HFT window operator's state after ``batch`` (its ValueState ``window``: the
    symbol's count and last quotes) as Parquet rows, the new query's ``initialState``."""
    from pyspark.sql import functions as F

    state = _read_state(spark, checkpoint, batch, stateVarName="window")
    rows = state.select(F.col("key")[key].cast("long").alias(key), "value.*")
    return _rows_in(_write_rows(rows, out))


def write_snapshot(spark: Any, checkpoint: Path, batch: int, key: str, agg: str,
                   out: Path) -> int:
    """The keyed aggregate's state after ``batch`` as Parquet rows (key, w, s, m):
    Spark's state data source reads the checkpoint's state store at that batch; the
    value buffer is (records, sum, max) (``query.keyed_aggregate``) less what the
    aggregate ``agg`` does not use (then 0, never read)."""
    from pyspark.sql import functions as F

    state = _read_state(spark, checkpoint, batch)
    fields = state.schema["value"].dataType.fields
    names = ("w", "s", "m") if len(fields) == 3 else STATE_BUFFERS[agg]
    if len(fields) == 2 and [f.dataType.typeName() for f in fields].count("long") == 1:
        # The two buffers' order follows the plan, not the aggregation: a sum's state
        # held (s, w) where a mean's held (w, s) (the output's column order differs).
        # The record count is the one long buffer.
        names = tuple("w" if f.dataType.typeName() == "long" else names[1] for f in fields)
    if len(names) != len(fields):
        raise ReplanError(f"the state of {checkpoint} has {len(fields)} value columns; a "
                          f"{agg} aggregate keeps {len(names)}")
    # The buffers are all named after their function ("sum", "sum", "max"), which
    # Spark cannot tell apart by name: rename them by position with a struct cast.
    renamed = ",".join(f"{n}:{f.dataType.simpleString()}" for n, f in zip(names, fields))
    rows = state.select(F.col("key")[key].alias(key),
                        F.col("value").cast(f"struct<{renamed}>").alias("v"))
    rows = rows.select(F.col(key).cast("long"), F.col("v.w").cast("long").alias("w"),
                       *[F.col(f"v.{c}").cast("double").alias(c) if c in names
                         else F.lit(0.0).alias(c) for c in ("s", "m")])
    files = _write_rows(rows, out)
    if not files:  # an empty state: one empty file still makes the seeding batch happen
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({key: pa.array([], pa.int64()), "w": pa.array([], pa.int64()),
                                 "s": pa.array([], pa.float64()),
                                 "m": pa.array([], pa.float64())}), out / "empty.parquet")
    return _rows_in(files)


# ------------------------------------------------------------------- metrics
@dataclass
class GlossMetrics:
    """One re-plan measured as Gloss §9.1 does, in buckets of output records."""

    downtime_s: float  # buckets with no output while input arrived, in seconds
    disrupted_s: float  # 1-s buckets below DISRUPTED_SHARE of the baseline throughput
    disrupted_strict_s: float  # 1-s buckets below the baseline itself (Gloss' wording)
    bucket_s: float  # the downtime bucket (1 s, or more for a slower micro-batch cadence)
    baseline_rate: float  # the mean output rate of the previous 100 s (records/s)
    buckets: int  # buckets measured: request .. switch + SETTLE_S
    worst_p95_ms: float | None
    down_at_s: list[float] = field(default_factory=list)  # down buckets, from the request
    # Disrupted 1-s buckets, seconds from the request: which phase (transfer, overlap,
    # after the switch) the disruption falls in.
    disrupted_at_s: list[int] = field(default_factory=list)
    # The same count over the baseline window itself, per second of it: the metric's
    # noise floor on a steady run (0 when the 1-s rates of steady output are smooth).
    baseline_disrupted_share: float = 0.0
    # The share of the baseline window the old configuration spent running batches (the
    # sum of their durations over the window): Gloss' workloads load the old
    # configuration to about 70 % of its capacity (§9.1). None without batch starts.
    baseline_busy_share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# A bucket counts as disrupted below this share of the baseline: one micro-batch more or
# less in a bucket moves it by a batch's worth, which is not a disruption.
DISRUPTED_SHARE = 0.75


def bucket_width(commit_times: Sequence[float]) -> float:
    """Gloss buckets by 1 s because its output leaves at barriers many times a second.
    A micro-batch run commits every batch interval; a 1-s bucket then is empty now and
    then in steady state. The bucket is twice the median interval between commits
    (at least 1 s, rounded up to half seconds), so only a real gap leaves one empty."""
    gaps = sorted(b - a for a, b in zip(commit_times, commit_times[1:]))
    if not gaps:
        return 1.0
    median = gaps[len(gaps) // 2]
    return max(1.0, math.ceil(2 * median * 2) / 2)


def throughput_per_second(batches: Sequence[tuple[float, int, float | None]],
                          t_from: float, t_to: float, trigger_s: float = 0.0) -> list[float]:
    """Records processed in each 1-s bucket from ``t_from`` (up to ``t_to`` and the last
    commit). ``batches``: (commit time, records, start time or None); each batch's
    records are spread evenly over the time it ran (from its start, or else from the
    previous commit). The start is Spark's trigger start (``batch_metrics``): a batch
    runs from there, planning included, and the next trigger starts as soon as the batch
    before is committed, so a steady run has a steady rate at 1-s resolution (from the
    sink's start instead, each batch's planning read as time without throughput: on a
    steady keyed count over 1 M keys at 1,000 records/s, 2 cores, 9 of 124 seconds fell
    below ¾ of the mean that way, 5 from the trigger start). A stop shows as the seconds
    in which no query ran, however large the batch after it.

    A pipeline on a processing-time trigger (``trigger_s`` > 0) waits for it after each
    batch by design: a batch's records are spread from the previous commit when its
    trigger fired within ``trigger_s`` of it (the query was pacing, not stalled), and
    from ``trigger_s`` before its start otherwise. Spread from its start only, a
    0.4-s batch on a 1-s trigger left a 1-s bucket between two batches short of one
    batch's records whenever the next batch ran longer."""
    done = sorted(batches, key=lambda b: b[0])
    last = min(t_to, done[-1][0]) if done else t_from
    n = max(0, math.floor(last - t_from))
    rates = [0.0] * n
    previous: float | None = None
    for commit, records, started in done:
        a = started if started is not None else previous
        if started is not None and previous is not None and trigger_s > 0:
            a = min(started, max(previous, started - trigger_s))
        previous = commit
        if a is None or commit <= a or commit <= t_from or a >= t_from + n:
            continue
        per_s = records / (commit - a)
        for i in range(max(0, math.floor(a - t_from)), min(n, math.ceil(commit - t_from))):
            lo, hi = max(a, t_from + i), min(commit, t_from + i + 1)
            if hi > lo:
                rates[i] += per_s * (hi - lo)
    return rates


def gloss_metrics(batches: Sequence[tuple[Any, ...]], t_request: float,
                  t_end: float, input_by: Callable[[float], int],
                  baseline_from: float | None = None,
                  trigger_s: float = 0.0) -> GlossMetrics:
    """``batches``: the run's forwarded batches as (commit time, records, p95 ms[, start
    time]); ``input_by(t)``: records the source had scheduled by time t. From ``t_request`` to
    ``t_end``:

    * downtime: buckets (:func:`bucket_width`) in which no batch committed while input
      arrived;
    * throughput-disrupted time: 1-s buckets whose throughput
      (:func:`throughput_per_second`) is below ``DISRUPTED_SHARE`` of the mean rate of
      the ``BASELINE_S`` before the request (of the history there is, and not before
      ``baseline_from``: the end of the previous re-plan's measurement). Counting whole
      batches into buckets instead made a steady run "disrupted" whenever a bucket held
      one batch fewer than the last (half the buckets at a 0.95-s cadence): the
      records are spread over the time their batch ran (``trigger_s``: the pipeline's
      processing-time trigger, :func:`throughput_per_second`)."""
    since = max(t_request - BASELINE_S, baseline_from or 0.0)
    before = [(b[0], b[1]) for b in batches if since <= b[0] < t_request]
    # At least two triggers: a steady run on one commits once per trigger, the width
    # its own commits give (a re-plan requested right after another one's measurement
    # has too few commits before it to say, and its 1-s default read a 2-s trigger's
    # steady output as 10-20 s of downtime).
    width = max(bucket_width([t for t, _ in before]), 2 * trigger_s)
    # Whole buckets only: the span is measured at t_end, so a last bucket reaching past
    # it has not seen the commits due in its remainder (it read as downtime).
    n = max(1, math.floor((t_end - t_request) / width))
    counts, worst = _bucket_records(batches, t_request, width, n)
    baseline = _baseline_rate(before)
    down_at = [round(i * width, 1) for i, c in enumerate(counts) if c == 0
               and input_by(t_request + (i + 1) * width) > input_by(t_request + i * width)]
    spread = [(b[0], b[1], b[3] if len(b) > 3 else None) for b in batches]
    rates = throughput_per_second(spread, t_request, t_end, trigger_s)
    disrupted_at = [i for i, r in enumerate(rates) if r < DISRUPTED_SHARE * baseline]
    steady = throughput_per_second(spread, since, t_request, trigger_s) if before else []
    steady_low = sum(1 for r in steady if r < DISRUPTED_SHARE * baseline)
    return GlossMetrics(
        downtime_s=len(down_at) * width,
        disrupted_s=float(len(disrupted_at)), disrupted_at_s=disrupted_at,
        disrupted_strict_s=float(sum(1 for r in rates if r < baseline)),
        bucket_s=width, baseline_rate=round(baseline, 1), buckets=n, down_at_s=down_at,
        baseline_disrupted_share=round(steady_low / len(steady), 3) if steady else 0.0,
        baseline_busy_share=_busy_share(batches, since, t_request),
        worst_p95_ms=round(worst, 1) if worst is not None else None)


def _bucket_records(batches: Sequence[tuple[Any, ...]], t_request: float, width: float,
                    n: int) -> tuple[list[int], float | None]:
    """Records committed in each of the ``n`` buckets from ``t_request``, and the
    worst p95 among their batches."""
    counts = [0] * n
    worst: float | None = None
    for t, records, p95, *_ in batches:
        i = math.floor((t - t_request) / width)
        if 0 <= i < n:
            counts[i] += records
            if p95 is not None:
                worst = p95 if worst is None else max(worst, p95)
    return counts, worst


def _baseline_rate(before: list[tuple[float, int]]) -> float:
    """Records/s over the batches before the request (the first one opens the span)."""
    if len(before) < 2:
        return 0.0
    span = before[-1][0] - before[0][0]
    return sum(r for _, r in before[1:]) / span if span > 0 else 0.0


def _busy_share(batches: Sequence[tuple[Any, ...]], since: float,
                t_request: float) -> float | None:
    """The share of the time before the request in which a batch ran (batches with a
    start time), or None."""
    ran = [(b[3], b[0]) for b in batches
           if len(b) > 3 and b[3] is not None and since <= b[3] and b[0] < t_request]
    window = (ran[-1][1] - ran[0][0]) if ran else 0.0
    if len(ran) < 2 or window <= 0:
        return None
    return round(sum(c - s for s, c in ran) / window, 3)


def throttle_pause(overlap_s: float, batch_s: float) -> float:
    """The old generation's pause after each batch while the new one catches up: its
    duty cycle halves every ``THROTTLE_STEP_S`` after ``THROTTLE_AFTER_S`` (Gloss
    §7.2 halves its cores), never stretching its period past ``THROTTLE_PERIOD_CAP_S``."""
    if overlap_s < THROTTLE_AFTER_S or batch_s <= 0:
        return 0.0
    halvings = 1 + int((overlap_s - THROTTLE_AFTER_S) // THROTTLE_STEP_S)
    pause = batch_s * (2 ** min(halvings, 10) - 1)
    return max(0.0, min(pause, THROTTLE_PERIOD_CAP_S - batch_s))
