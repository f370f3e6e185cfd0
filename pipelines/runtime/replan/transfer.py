"""A seamless re-plan's state transfer in a process of its own, at the lowest CPU
priority (``python -m pipelines.runtime.replan.transfer JOB.json``).

Gloss (Rajadurai et al., ASPLOS 2018) §6.2 transfers state asynchronously so the old
instance keeps its pace. Inside the run's Spark application that is not possible on a
small cluster: the snapshot read and the new query's first batch (which loads the
snapshot into the new key groups) take executor slots and CPU for seconds, and the old
query's batches stretch from 0.65 s to 4 s (measured at 650 K keys on 2 cores). Spark
cannot lower a task's OS priority, but a process can lower its own: this one runs
``nice 19`` under Linux's ``SCHED_IDLE`` with a one-core local Spark, so it takes only
the CPU the run leaves idle. On a machine that other work keeps busy that can starve it
(Spark fails a Python worker that has not connected back within 10 s): the runner then
raises it to ``LOW`` (``raise_priority``) or runs it again at ``LOW``. (Where the kernel
shares the CPU between sessions first, autogroup with every process in the root CPU
group, this process's own session gets a session's share whatever its priority:
measured in docs/benchmarks.md, 2026-12-06.)

It reads the old query's state after batch N (``replan.write_snapshot``), then runs the
new generation's query (the run's pipeline with the new key groups, ``query.Seed``) on
its new checkpoint: its first batch merges the snapshot and the records scheduled
meanwhile, from N's end, into the new layout; further batches catch up until it is
within ``LEVEL_S`` of the source. The run's application then resumes that checkpoint
(Spark resumes any query from its checkpoint), so the new generation starts there with
its state in place and only seconds behind.

A dataflow pipeline has no snapshot: its new generation replays the records of its
state horizon (``replan.replay_start``) in its first batches, ending at ``first_ends``.

JOB keys: spec (the definition), cores (its local Spark's; default 1), t0, plan_dir,
old_checkpoint, batch, start (the first record the new generation reads), first_ends (a
replay's), key (the key field), agg, window (true for an HFT window), snapshot (none for
a replay), checkpoint, result (a JSON file written at the end: rows (of the snapshot;
none for a replay), snapshot_s, seed_s, end, batches).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipelines.runtime import connectors
from pipelines.runtime.spec import definition
from pipelines.runtime.host import procs
from pipelines.runtime.replan import gloss as replan

IDLE = "idle"  # nice 19 under SCHED_IDLE: only CPU that nothing else wants
LOW = "low"  # nice 10 under the normal scheduler: a small share, never starved
PRIORITIES = {IDLE: 19, LOW: 10}
# A transfer at idle priority that got less than STARVED_SHARE of one core over
# STARVED_WINDOW_S is starving (the machine has no idle CPU): it is raised to LOW. One
# that progresses on idle CPU keeps its priority, however long it takes.
STARVED_WINDOW_S = 15.0
STARVED_SHARE = 0.1
LEVEL_S = 2.0  # handed to the run's application once this close to the source's schedule
CATCH_UP_S = 60.0  # or after this long catching up here (the run's query does the rest)
GAINING = 0.8  # or once a batch ends less than 20 % closer than the one before


def reseed(job: dict[str, Any]) -> dict[str, Any]:
    from pipelines.runtime.query.compiler import Seed, build_stream
    from pipelines.runtime.query.session import apply_run_conf, build_session

    connectors.register_connections(job.get("connections"))
    spec = definition.validate(job["spec"])
    # No UI: this driver lives seconds and must not take the next UI port or CPU.
    os.environ["PYSPARK_SUBMIT_ARGS"] = "--conf spark.ui.enabled=false pyspark-shell"
    # One core unless the runner gates it (``TransferGate``): a gated transfer runs only
    # while the run's query waits for its trigger, when every core is idle, so it uses
    # them all (its snapshot read and seeding batch split over the key groups).
    cores = max(1, int(job.get("cores") or 1))
    spark = build_session(f"local[{cores}]", "streamwise-reseed", cores, "1g")
    spark.sparkContext.setLogLevel("ERROR")
    apply_run_conf(spark, spec)
    # RocksDB then uploads the seeded state as files at the commit: the run's
    # executors open them, instead of replaying a changelog of every key (CPU the old
    # query needs).
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                   "false")
    checkpoint = Path(job["checkpoint"])
    snapshot = Path(job["snapshot"]) if job.get("snapshot") else None
    began = time.perf_counter()
    rows: int | None = None  # a dataflow pipeline's state is rebuilt by a replay
    if snapshot is not None and job.get("window"):
        rows = replan.write_window_snapshot(spark, Path(job["old_checkpoint"]),
                                            int(job["batch"]), job["key"], snapshot)
    elif snapshot is not None:
        rows = replan.write_snapshot(spark, Path(job["old_checkpoint"]), int(job["batch"]),
                                     job["key"], job["agg"], snapshot)
    snapshot_s = time.perf_counter() - began
    seeded = time.perf_counter()
    stream = build_stream(spark, spec, float(job["t0"]), Path(job["plan_dir"]),
                          Seed(int(job["start"]), snapshot, None,
                               tuple(job.get("first_ends") or ())))
    level = threading.Event()
    handover_after: list[int] = []  # the batch after whose commit the run takes over
    lags: list[int] = []  # records behind the schedule after each batch
    t0 = float(job["t0"])
    schedule = connectors.offset_clock(spec, t0)

    def on_batch(batch_df: Any, batch_id: int) -> None:
        # The updates are the old generation's to emit: run (the state must advance),
        # not kept. Then: is this generation within LEVEL_S of the source's schedule?
        batch_df.write.format("noop").mode("overwrite").save()
        now = time.time() - t0
        behind = schedule.records_by(now) - replan.batch_end(checkpoint, batch_id)
        # Hand over when close, when no longer gaining (a busy machine leaves this
        # process too little CPU to catch up: the run's query does it faster), or late.
        if (behind <= schedule.records_by(now) - schedule.records_by(now - LEVEL_S)
                or (lags and behind > GAINING * lags[-1])
                or time.perf_counter() - seeded > CATCH_UP_S) and not level.is_set():
            handover_after.append(batch_id)
            level.set()
        lags.append(behind)

    # The first batch holds the snapshot and what the source has scheduled since N;
    # later ones catch up, ending on planned boundaries (source.py).
    query = (stream.writeStream.foreachBatch(on_batch).outputMode(spec.output_mode)
             .option("checkpointLocation", str(checkpoint)).start())

    def failed() -> replan.ReplanError:
        return replan.ReplanError(f"seeding the new key groups failed: {query.exception()}")

    while not level.wait(0.2):
        if not query.isActive:
            raise failed()
    # The decision is taken inside the batch, before Spark commits it: stopping now
    # could abort that commit (a slow first batch would leave nothing seeded).
    def committed() -> int:
        last = replan.last_committed(checkpoint)
        return -1 if last is None else last

    while committed() < handover_after[0]:
        if not query.isActive:
            raise failed()
        time.sleep(0.05)
    # The batch that may have started since is re-run by the run's query: Spark replays
    # a logged but uncommitted batch with the same offsets.
    query.stop()
    last = replan.last_committed(checkpoint)
    if last is None:
        raise replan.ReplanError("seeding the new key groups committed no batch")
    end = replan.batch_end(checkpoint, last)
    spark.stop()
    return {"rows": rows, "snapshot_s": round(snapshot_s, 2),
            "seed_s": round(time.perf_counter() - seeded, 2), "end": end,
            "batches": last + 1}


# The longest the gate keeps a transfer stopped at a time: a forwarded query whose batches
# run back to back (its trigger leaves no idle time) still lets the transfer progress.
GATE_HOLD_MAX_S = 2.0


class TransferGate:
    """Runs a transfer only while the forwarded query waits for its next trigger.

    Measured on 2 cores (keyed count, 1 M keys, 1,000 records/s, 1-s trigger): with the
    transfer at idle priority beside it, the old query's batches took 1.0-1.7 s instead
    of 0.65 s, their task time doubled as well, although the machine still had a
    quarter of a core idle (shared caches and memory, or the hypervisor: idle priority
    only orders the run queue). Gloss (§6.2) transfers state on capacity the running
    instance does not use; on a triggered query that capacity is the time between a
    batch's commit and the next trigger. So the runner stops the transfer's process
    group (SIGSTOP, as ``frequency.py`` duty-cycles executors) when the forwarded query
    begins a batch (``hold``) and continues it when that batch is committed
    (``release``), never for longer than ``hold_max_s`` at a time. The throttle's
    watchdog (``frequency.tell_watchdog``) continues the group should the runner die
    while it holds it."""

    def __init__(self, pgid: int, hold_max_s: float = GATE_HOLD_MAX_S) -> None:
        from pipelines.runtime.host import frequency

        self.pgid, self.hold_max_s = pgid, hold_max_s
        self.watchdog = frequency.tell_watchdog(None, [-pgid])
        self.lock = threading.Lock()
        self.held_since: float | None = None
        self.closed = False
        self.holds = 0
        self.held_s = 0.0  # the transfer's time stopped, for the re-plan's report

    def hold(self) -> None:
        """The forwarded query begins a batch: stop the transfer."""
        with self.lock:
            if self.closed or self.held_since is not None or not self._signal(signal.SIGSTOP):
                return
            self.held_since = time.monotonic()
            self.holds += 1
            timer = threading.Timer(self.hold_max_s, self._expire, args=(self.holds,))
            timer.daemon = True
            timer.start()

    def release(self) -> None:
        """The forwarded query committed its batch: continue the transfer."""
        with self.lock:
            self._continue()

    def close(self) -> None:
        """Continue the transfer for good (it ends, or is ended, running)."""
        from pipelines.runtime.host import frequency

        with self.lock:
            self._continue()
            self.closed = True
        frequency.end_watchdog(self.watchdog)
        self.watchdog = None

    def end(self) -> None:
        """End the transfer (a runner leaving at once): continued, then killed."""
        self.close()
        self._signal(signal.SIGKILL)

    def _expire(self, hold: int) -> None:
        with self.lock:
            if self.holds == hold:
                self._continue()

    def _continue(self) -> None:
        if self.held_since is None:
            return
        self.held_s += time.monotonic() - self.held_since
        self.held_since = None
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> bool:
        try:
            os.killpg(self.pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):  # ended meanwhile
            return False


class StarvationWatch:
    """Whether a transfer's processes (``pid`` and every process under it: its JVM and
    the JVM's Python workers) are starving: less than ``STARVED_SHARE`` of a core over
    the last ``STARVED_WINDOW_S`` (call ``starved()`` as often as you like).
    ``stopped_s``: the seconds the transfer has been held stopped so far
    (``TransferGate.held_s``); a transfer that was stopped is not starving then: the
    share counts the time it could run. (Without it, a gated transfer read as starving
    and was raised out of idle priority: 2 of 10 in a benchmark run.)"""

    def __init__(self, pid: int, window_s: float = STARVED_WINDOW_S,
                 share: float = STARVED_SHARE) -> None:
        self.pid, self.window_s, self.share = pid, window_s, share
        self.since, self.cpu = time.monotonic(), procs.tree_cpu_s([pid])
        self.stopped = 0.0

    def starved(self, stopped_s: float = 0.0) -> bool:
        now = time.monotonic()
        if now - self.since < self.window_s:
            return False
        cpu = procs.tree_cpu_s([self.pid])
        could_run = (now - self.since) - max(stopped_s - self.stopped, 0.0)
        # A process that ended unwaited takes its CPU time with it: never below 0.
        used = max(cpu - self.cpu, 0.0)
        self.since, self.cpu, self.stopped = now, cpu, stopped_s
        # Less than a second free to run in the window: too little to tell.
        return could_run >= 1.0 and used / could_run < self.share


def raise_priority(pid: int) -> int:
    """Move every thread of a transfer (``pid``, its JVM, the JVM's Python workers) from
    idle to ``LOW`` priority; how many threads moved. Linux keeps scheduling per thread,
    so each is set; without the privilege to raise priority (not root, no
    CAP_SYS_NICE) nothing moves and 0 is returned."""
    moved = 0
    for process in procs.tree_pids([pid]):
        try:
            tids = [int(t.name) for t in Path(f"/proc/{process}/task").iterdir()]
        except (OSError, ValueError):  # ended meanwhile
            continue
        for tid in tids:
            try:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, PRIORITIES[LOW])
                moved += 1
            except (AttributeError, OSError):
                continue
    return moved


def set_own_priority(priority: str) -> None:
    """Lower this process (and what it starts later: the JVM inherits it) to
    ``priority``."""
    os.setpriority(os.PRIO_PROCESS, 0, PRIORITIES[priority])
    if priority != IDLE:
        return
    # SCHED_IDLE runs it only on a CPU nothing else wants (nice 19 alone still takes a
    # share and preempts on wake-ups).
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: nice 19 only
        pass


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pipelines.runtime.replan.transfer",
                                 description="a seamless re-plan's state transfer")
    ap.add_argument("--priority", choices=sorted(PRIORITIES), default=IDLE)
    ap.add_argument("job", type=Path, help="the job's JSON file (written by the runner)")
    args = ap.parse_args(argv)
    set_own_priority(args.priority)
    job = json.loads(args.job.read_text())
    result = reseed(job)
    tmp = Path(job["result"] + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, job["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
