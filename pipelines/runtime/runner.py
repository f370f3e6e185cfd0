"""The runner: one long-lived Python process per Run, the PySpark driver of that run.

It starts a SparkSession on the cluster manager, compiles the pipeline definition into
a streaming query, publishes one metrics record per micro-batch, executes commands
between micro-batches and acknowledges each, and heartbeats (DESIGN.md §2). It never
imports Django: the control plane talks to it only through Redis (``bus.py``).

    python -m pipelines.runtime.runner CONFIG.json

CONFIG keys: run_id, bus_key, redis_url, master_url, checkpoint_dir, definition, t0 (optional),
initial_workers, max_workers, executor_memory.

Exit codes: 0 stopped on request, 1 failed (a ``failed`` event says why), 2 bad config.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.runtime import bus as busmod
from pipelines.runtime import definition, power

# PySpark (and the modules that import it) are imported lazily: the first heartbeat
# must not wait for seconds of imports on a loaded machine.

PROJECT_ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_WAIT_S = 90.0


@dataclass
class RunnerConfig:
    run_id: int
    bus_key: str
    redis_url: str
    master_url: str
    checkpoint_dir: str
    definition: dict[str, Any]
    initial_workers: int = 1
    max_workers: int = 2
    executor_memory: str = "512m"
    t0: float | None = None

    @classmethod
    def load(cls, path: str) -> RunnerConfig:
        raw = json.loads(Path(path).read_text())
        known = set(cls.__dataclass_fields__)
        cfg = cls(**{k: v for k, v in raw.items() if k in known})
        if not 1 <= cfg.initial_workers <= cfg.max_workers:
            raise ValueError("need 1 <= initial_workers <= max_workers")
        return cfg


def _iso_to_epoch(stamp: str) -> float:
    """Spark's progress timestamp ('2026-11-22T03:04:18.123Z') as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _offset(raw: Any) -> int | None:
    """Our source's offset JSON ('{"offset": 123}') as an int; batch 0 has none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 0 if raw is not None else None
    doc = json.loads(raw) if isinstance(raw, str) else raw
    return int(doc["offset"]) if isinstance(doc, dict) and "offset" in doc else None


class Runner:
    def __init__(self, cfg: RunnerConfig, bus: busmod.RunBus) -> None:
        self.cfg = cfg
        self.bus = bus
        self.spec = definition.validate(cfg.definition)
        self.schedule = self.spec.schedule()
        self.stop_event = threading.Event()
        self.stop_reason = "stop requested"
        self.phase = "starting"
        self.heartbeat_lock = threading.Lock()
        self.batches = 0
        self.workers = 0
        self.commits: dict[int, Any] = {}
        self.last_commit_at: float | None = None
        self.meter = power.PowerMeter()
        self.freq_ghz, self.freq_source = power.read_frequency_ghz()
        self.spark: Any = None
        self.query: Any = None
        self.executors: Any = None
        self.sink: Any = None
        # The schedule's clock starts when the query starts (set in _start_query)
        # unless the config pins it, e.g. to replay a run's schedule after a restart.
        self.t0 = cfg.t0 or 0.0

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        self.bus.publish_event("runner_started", pid=os.getpid())
        # Commands are read from the start, so a stop sent while the session is still
        # starting is honoured as soon as the session is up (before any query starts).
        threading.Thread(target=self._command_loop, name="commands", daemon=True).start()
        self._start_session()
        if self.stop_event.is_set():
            self._shutdown()
            return
        self._start_query()
        while not self.stop_event.wait(0.5):
            if not self.query.isActive:
                exc = self.query.exception()
                raise RuntimeError(f"streaming query ended: {exc}" if exc else
                                   "streaming query ended without a stop request")
        self._shutdown()

    def _start_session(self) -> None:
        from pyspark.sql import SparkSession

        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cfg = self.cfg
        builder = (
            SparkSession.builder.master(cfg.master_url)
            .appName(f"streamwise-run-{cfg.run_id}")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.cores.max", str(cfg.max_workers))
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", cfg.executor_memory)
            .config("spark.pyspark.python", sys.executable)
            .config("spark.executorEnv.PYTHONPATH", str(PROJECT_ROOT))
            .config("spark.executorEnv.STREAMWISE_DATA_ROOT", str(definition.data_root()))
            .config("spark.sql.shuffle.partitions", str(self.spec.key_groups))
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
            .config("spark.decommission.enabled", "true")
            .config("spark.storage.decommission.enabled", "true")
            .config("spark.storage.decommission.shuffleBlocks.enabled", "true")
            .config("spark.storage.decommission.replicationReattemptInterval", "5s")
            .config("spark.standalone.executorRemoveDelayOnDisconnection", "0s")
        )
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("WARN")
        from pipelines.runtime.executors import ExecutorControl

        self.executors = ExecutorControl(self.spark)
        sc = self.spark.sparkContext
        self.bus.publish_event("session_started", app_id=sc.applicationId,
                               spark_ui=sc.uiWebUrl, max_workers=self.cfg.max_workers)
        # Standalone launches spark.cores.max executors at once: wait for them, then
        # release down to the initial size while there is no state to lose.
        ids = self.executors.wait_for(self.cfg.max_workers, EXECUTOR_WAIT_S)
        if not ids:
            raise RuntimeError(f"no executor registered within {EXECUTOR_WAIT_S:.0f}s; "
                               "is the Spark worker up and does it have free cores?")
        if len(ids) > self.cfg.initial_workers:
            ids, _ = self.executors.scale_to(self.cfg.initial_workers)
        self.workers = len(ids)

    def _checkpoint(self) -> Path:
        """The query's checkpoint; an existing one is resumed only with a pinned clock.

        Resuming replays the source from the checkpointed offsets, whose records were
        scheduled against the original run's clock: with a new clock their emission
        times would lie in the future (negative latency, no input until it catches up).
        """
        path = Path(self.cfg.checkpoint_dir) / "checkpoint"
        if (path / "offsets").exists() and self.cfg.t0 is None:
            raise RuntimeError(f"checkpoint {path} already has offsets; a new run needs a "
                               "fresh checkpoint (or pin t0 in the config to resume it)")
        return path

    def _start_query(self) -> None:
        from pipelines.runtime.listener import MetricsListener
        from pipelines.runtime.query import LatencySink, build_stream

        self.sink = LatencySink(self._on_commit)
        self.t0 = self.cfg.t0 or time.time()
        self.spark.streams.addListener(MetricsListener(self))
        stream = build_stream(self.spark, self.spec, self.t0)
        writer = (stream.writeStream.foreachBatch(self.sink).outputMode("update")
                  .option("checkpointLocation", str(self._checkpoint()))
                  .queryName(f"run_{self.cfg.run_id}"))
        if self.spec.trigger_ms:
            writer = writer.trigger(processingTime=f"{self.spec.trigger_ms} milliseconds")
        self.query = writer.start()
        self.phase = "running"
        self.bus.publish_event("query_started", query_id=str(self.query.id),
                               query_run_id=str(self.query.runId), workers=self.workers,
                               t0=self.t0, key_groups=self.spec.key_groups)

    def _shutdown(self) -> None:
        self.phase = "stopping"
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:  # stopping a failed query can raise; we are leaving anyway
                pass
        if self.spark is not None:
            self.spark.stop()
        self.end_heartbeat()
        self.bus.publish_event("stopped", reason=self.stop_reason, batches=self.batches)

    def end_heartbeat(self) -> None:
        """Clear the heartbeat for good *before* the final event, so no heartbeat of
        this runner can be seen after the control plane learns it ended."""
        with self.heartbeat_lock:
            self.phase = "stopped"
            self.bus.clear_heartbeat()

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop_event.set()

    # -------------------------------------------------------------------- metrics
    def _on_commit(self, commit: Any) -> None:
        self.commits[commit.batch_id] = commit
        # Bounded: progress events normally arrive ~0.1 s after the commit.
        for old in [b for b in self.commits if b < commit.batch_id - 50]:
            self.commits.pop(old, None)

    def on_progress(self, progress: Any) -> None:
        """Called from the listener: join Spark's progress with the sink's commit."""
        from pipelines.runtime.query import OBSERVATION, latency_quantiles

        commit = self.commits.pop(progress.batchId, None)
        if commit is None:
            return
        row = progress.observedMetrics.get(OBSERVATION)
        observed = row.asDict() if row is not None else {}
        records = int(observed.get("records") or 0)
        interval = (commit.committed_at - self.last_commit_at) if self.last_commit_at else None
        self.last_commit_at = commit.committed_at
        lat = latency_quantiles(observed, commit.committed_at)
        reading = self.meter.read(self.workers, self.freq_ghz)
        state_rows = sum(int(op.numRowsTotal) for op in progress.stateOperators)
        source = progress.sources[0] if progress.sources else None
        self.batches += 1
        self.bus.publish_metrics({
            "batch_id": progress.batchId,
            "t": commit.committed_at,
            "input_rows": int(progress.numInputRows),
            "records": records,
            "output_rows": commit.output_rows,
            "input_rate": float(progress.inputRowsPerSecond or 0.0),
            "processed_rate": float(progress.processedRowsPerSecond or 0.0),
            "scheduled_rate": self.schedule.rate_at(commit.committed_at - self.t0),
            "output_rate": (records / interval) if interval else None,
            "batch_duration_ms": int(progress.durationMs.get("triggerExecution", 0)),
            "latency_p50_ms": lat["p50"], "latency_p95_ms": lat["p95"],
            "latency_p99_ms": lat["p99"], "latency_max_ms": lat["max"],
            "workers": self.workers,
            "frequency_ghz": self.freq_ghz, "frequency_source": self.freq_source,
            "power_w": reading.watts, "power_source": reading.source,
            "state_rows": state_rows,
            # Spark's own account of the batch, for cross-checks (pipelines.bench):
            "trigger_started_at": _iso_to_epoch(progress.timestamp),
            "durations_ms": {k: int(v) for k, v in progress.durationMs.items()},
            "source_start": _offset(source.startOffset) if source else None,
            "source_end": _offset(source.endOffset) if source else None,
        })

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat_loop(self) -> None:
        while self.phase != "stopped":
            try:
                if self.executors is not None and self.phase == "running":
                    self.workers = len(self.executors.ids())
                with self.heartbeat_lock:
                    if self.phase == "stopped":
                        break
                    self.bus.heartbeat(pid=os.getpid(), phase=self.phase,
                                       batches=self.batches, workers=self.workers)
            except Exception as exc:  # Redis blip: the TTL gives us a few tries
                print(f"heartbeat failed: {exc}", file=sys.stderr, flush=True)
            time.sleep(busmod.HEARTBEAT_EVERY_S)

    # ------------------------------------------------------------------- commands
    def _command_loop(self) -> None:
        last = "0-0"  # commands sent before the runner was up are still executed
        while not self.stop_event.is_set():
            try:
                commands = self.bus.read_commands(last, block_ms=1000)
            except Exception as exc:
                print(f"command read failed: {exc}", file=sys.stderr, flush=True)
                time.sleep(1)
                continue
            for entry_id, cmd in commands:
                last = entry_id
                self._execute(cmd)

    def _execute(self, cmd: dict[str, Any]) -> None:
        name, args, cid = cmd.get("name"), cmd.get("args") or {}, cmd.get("id", "")
        try:
            if name == "stop":
                self.bus.ack(cid, True, "stopping after the current micro-batch")
                self.request_stop(args.get("reason") or "stop requested")
            elif name == "set_workers" and self.phase != "running":
                self.bus.ack(cid, False, f"cannot set workers while {self.phase}")
            elif name == "set_workers":
                self._set_workers(cid, args)
            else:
                self.bus.ack(cid, False, f"unknown command {name!r}")
        except Exception as exc:
            self.bus.ack(cid, False, f"{type(exc).__name__}: {exc}")

    def _set_workers(self, cid: str, args: dict[str, Any]) -> None:
        n = args.get("workers")
        if not isinstance(n, int) or not 1 <= n <= self.cfg.max_workers:
            self.bus.ack(cid, False, f"workers must be a whole number in 1..{self.cfg.max_workers}"
                         f" (the policy's maximum), got {n!r}")
            return
        assert self.sink is not None
        started = time.time()
        # Between micro-batches: the sink holds this lock while it writes a batch.
        with self.sink.batch_lock:
            before, released = self.executors.start_scaling(n)
        ids = self.executors.wait_for(n, EXECUTOR_WAIT_S, exact=True)
        self.workers = len(ids)
        ok = len(ids) == n
        self.bus.ack(cid, ok, (f"{len(before)} -> {len(ids)} workers" if ok else
                               f"asked for {n} workers, {len(ids)} registered after "
                               f"{EXECUTOR_WAIT_S:.0f}s"),
                     workers=len(ids), executors=ids, released=released,
                     took_s=round(time.time() - started, 2))
        self.bus.publish_event("workers_changed", workers=len(ids), requested=n,
                               executors=ids, released=released)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipelines.runtime.runner CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = RunnerConfig.load(argv[0])
        runner_bus = busmod.RunBus(busmod.connect(cfg.redis_url), cfg.bus_key)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: bad runner config {argv[0]}: {exc}", file=sys.stderr)
        return 2
    runner_bus.heartbeat(pid=os.getpid(), phase="starting", batches=0, workers=0)
    try:
        runner = Runner(cfg, runner_bus)
    except definition.DefinitionError as exc:
        runner_bus.publish_event("failed", reason=f"invalid definition: {exc}")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: runner.request_stop("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: runner.request_stop("SIGINT"))
    try:
        runner.run()
        return 0
    except BaseException as exc:
        traceback.print_exc()
        runner.end_heartbeat()
        runner_bus.publish_event("failed", reason=f"{type(exc).__name__}: {exc}"[:2000])
        if runner.spark is not None:
            try:
                runner.spark.stop()
            except Exception:
                pass
        return 1
    finally:
        runner.stop_event.set()
        runner.end_heartbeat()


if __name__ == "__main__":
    sys.exit(main())
