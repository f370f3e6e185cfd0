"""The runner: one long-lived Python process per Run, the PySpark driver of that run.

It starts a SparkSession on the cluster manager, compiles the pipeline definition into
a streaming query, publishes one metrics record per micro-batch, executes commands
between micro-batches and acknowledges each, and heartbeats. It never
imports Django: the control plane talks to it only through Redis (``bus.py``).

    python -m pipelines.runtime.runner CONFIG.json

CONFIG keys: run_id, bus_key, redis_url, master_url, checkpoint_dir, definition, t0 (optional),
initial_workers, max_workers, executor_memory; elastic runtime: planner, tau,
migration_schedule, gap_batches (defaults for reconfigurations), locality_wait (Spark's
``spark.locality.wait``), enforce_placement (false: the table only follows where Spark
ran each group — Spark's default behaviour, the benchmarks' baseline).

The elastic runtime (issue 6; ``elastic.py``, ``placement.py``): key groups live where
the runner's routing table says; reconfigurations (workers up/down, group moves,
rebalancing, CPU frequency) run one at a time on their own thread and change the
placement only between micro-batches, paced by the planners' schedules.

Exit codes: 0 stopped on request, 1 failed (a ``failed`` event says why), 2 bad config.
"""
from __future__ import annotations

import collections
import json
import os
import queue
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
from pipelines.runtime.bus import RECONFIGURATIONS, RunnerEvent
from pipelines.runtime import definition, elastic, frequency, placement, power
from pipelines.runtime.session import (
    EXECUTOR_WAIT_S,
    EXTRA_EXECUTOR_WAIT_S,
    apply_run_conf,
    build_session,
)

# PySpark (and the modules that import it) are imported lazily: the first heartbeat
# must not wait for seconds of imports on a loaded machine.



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
    planner: str = "ding-table"
    tau: float = 0.2
    migration_schedule: str = "batched"
    gap_batches: int = 0
    locality_wait: str | None = None
    enforce_placement: bool = True  # False: Spark places groups itself (the baseline)

    @classmethod
    def load(cls, path: str) -> RunnerConfig:
        raw = json.loads(Path(path).read_text())
        known = set(cls.__dataclass_fields__)
        cfg = cls(**{k: v for k, v in raw.items() if k in known})
        if not 1 <= cfg.initial_workers <= cfg.max_workers:
            raise ValueError("need 1 <= initial_workers <= max_workers")
        from pipelines.runtime.elastic import PLANNERS, STRATEGIES

        if cfg.planner not in PLANNERS or cfg.migration_schedule not in STRATEGIES:
            raise ValueError(f"planner must be one of {PLANNERS}, migration_schedule one "
                             f"of {STRATEGIES}")
        return cfg


def _iso_to_epoch(stamp: str) -> float:
    """Spark's progress timestamp ('2026-11-22T03:04:18.123Z') as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _offset(raw: Any) -> int | None:
    """Our source's offset JSON ('{"offset": 123}') as an int; batch 0 has none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 0 if raw is not None else None
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:  # e.g. no latest offset reported yet at batch 0
        return None
    return int(doc["offset"]) if isinstance(doc, dict) and "offset" in doc else None


class Runner:
    def __init__(self, cfg: RunnerConfig, bus: busmod.RunBus,
                 session: Any = None, standby_id: str | None = None) -> None:
        self.cfg = cfg
        self.bus = bus
        self.adopted_session = session  # a standby's warm SparkSession, if adopted
        self.standby_id = standby_id
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
        self.f_max_ghz = self.freq_ghz
        self.actuator: Any = None
        self.spark: Any = None
        self.query: Any = None
        self.executors: Any = None
        self.sink: Any = None
        self.coord: Any = None
        self.rest: Any = None
        self.routing = elastic.RoutingTable(self.spec.key_groups)
        self.placed_for: dict[int, list[str | None]] = {}  # batch -> table it ran under
        self.hosts: dict[str, str] = {}
        self.decommission_due: list[str] = []
        self.monitor_queue: queue.Queue = queue.Queue()
        self.reconfig_queue: queue.Queue = queue.Queue()
        self.group_ms: collections.deque = collections.deque(maxlen=LOAD_WINDOW)
        self.group_bytes: list[int] = [0] * self.spec.key_groups
        self.last_ran_on: dict[int, str] = {}
        self.releasing_at_start: set[str] = set()
        # The schedule's clock starts when the query starts (set in _start_query)
        # unless the config pins it, e.g. to replay a run's schedule after a restart.
        self.t0 = cfg.t0 or 0.0

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.checkpoint_dir)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        self.bus.publish_event(RunnerEvent.RUNNER_STARTED, pid=os.getpid())
        # Commands are read from the start, so a stop sent while the session is still
        # starting is honoured as soon as the session is up (before any query starts).
        threading.Thread(target=self._command_loop, name="commands", daemon=True).start()
        self._start_session()
        if self.stop_event.is_set():
            self._shutdown()
            return
        self._start_query()
        threading.Thread(target=self._monitor_loop, name="monitor", daemon=True).start()
        threading.Thread(target=self._reconfig_loop, name="reconfigure", daemon=True).start()
        while not self.stop_event.wait(0.5):
            if not self.query.isActive:
                exc = self.query.exception()
                raise RuntimeError(f"streaming query ended: {exc}" if exc else
                                   "streaming query ended without a stop request")
        self._shutdown()

    def _start_session(self) -> None:
        cfg = self.cfg
        if self.adopted_session is not None:
            # A standby runner's warm session (pipelines.runtime.standby): its JVM,
            # executor and Python workers are up and have run a micro-batch already.
            self.spark = self.adopted_session
        else:
            self.spark = build_session(cfg.master_url, f"streamwise-run-{cfg.run_id}",
                                       cfg.max_workers, cfg.executor_memory,
                                       cfg.locality_wait)
        apply_run_conf(self.spark, self.spec)
        self.spark.sparkContext.setLogLevel("WARN")
        from pipelines.runtime.executors import ExecutorControl

        self.executors = ExecutorControl(self.spark)
        sc = self.spark.sparkContext
        self.rest = placement.SparkRest(sc.uiWebUrl, sc.applicationId)
        # Spark's REST API initialises lazily on its first request (~2 s here): warm it
        # while the executors start, not when the first batch's metrics need it.
        threading.Thread(target=self._warm_rest, name="warm-rest", daemon=True).start()
        self.bus.publish_event(RunnerEvent.SESSION_STARTED, app_id=sc.applicationId,
                               spark_ui=sc.uiWebUrl, max_workers=self.cfg.max_workers,
                               standby=self.standby_id)
        # Standalone launches spark.cores.max executors at once. Wait for the initial
        # ones (and briefly for the rest, which register at about the same time), then
        # decommission the extras while there is no state to lose, without waiting for
        # them to exit (~5 s): a decommissioning executor gets no new task, so the query
        # can start at once (it was 5 of the ~20 s from Start to the first batch).
        initial = self.cfg.initial_workers
        if self.adopted_session is not None:
            # The standby kept one executor and a target of one: raise it if needed.
            self.executors.request_total(initial)
        launched = initial if self.adopted_session is not None else self.cfg.max_workers
        keep, extras = self.executors.keep_first(initial, launched, EXECUTOR_WAIT_S,
                                                 EXTRA_EXECUTOR_WAIT_S,
                                                 f"streamwise: start with {initial} workers")
        self.releasing_at_start = set(extras)
        self.workers = len(keep)
        self.bus.publish_event(RunnerEvent.EXECUTORS_READY, executors=keep, released=extras,
                               max_workers=self.cfg.max_workers)
        if self.adopted_session is None:  # a standby's executor has run two batches
            threading.Thread(target=self._warm_executors, args=(len(keep),),
                             name="warm-python", daemon=True).start()
        self.actuator = frequency.choose_actuator(sc.applicationId, self.f_max_ghz)

    def _warm_executors(self, n: int) -> None:
        from pipelines.runtime.source import warm_up

        started = time.perf_counter()
        try:
            sc = self.spark.sparkContext
            sc.setJobDescription("streamwise: warm up the executors' Python")
            sc.parallelize(range(n), n).mapPartitions(warm_up).collect()
            print(f"executors warmed in {time.perf_counter() - started:.1f}s", flush=True)
        except Exception as exc:  # only a warm-up: the first batch pays it otherwise
            print(f"executor warm-up failed: {exc!r}", file=sys.stderr, flush=True)

    def _warm_rest(self) -> None:
        try:
            self.rest.executors()
        except Exception as exc:  # only a warm-up: the monitor reports real failures
            print(f"REST warm-up failed: {exc!r}", file=sys.stderr, flush=True)

    def _executors_now(self) -> list[str]:
        """Registered executors, less the extras released at start that are still
        exiting (they run no task and hold no state)."""
        return [e for e in self.executors.ids() if e not in self.releasing_at_start]

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

        checkpoint = self._checkpoint()
        self.sink = LatencySink(self._on_commit,
                                output_dir=self.run_dir / "output" if self.spec.keep_output
                                else None,
                                between_batches=self._between_batches)
        self.t0 = self.cfg.t0 or time.time()
        # The verifier needs the schedule clock the records were generated against.
        (self.run_dir / "t0").write_text(json.dumps({"t0": self.t0}))
        self.spark.streams.addListener(MetricsListener(self))
        built = time.perf_counter()
        stream = build_stream(self.spark, self.spec, self.t0)
        print(f"stream built in {time.perf_counter() - built:.1f}s", flush=True)
        writer = (stream.writeStream.foreachBatch(self.sink).outputMode(self.spec.output_mode)
                  .option("checkpointLocation", str(checkpoint))
                  .queryName(f"run_{self.cfg.run_id}"))
        if self.spec.trigger_ms:
            writer = writer.trigger(processingTime=f"{self.spec.trigger_ms} milliseconds")
        self.query = writer.start()
        self.coord = placement.StateStoreCoordinatorView(
            self.spark, str(self.query.runId), checkpoint, self.spec.key_groups)
        self.phase = "running"
        self.bus.publish_event(RunnerEvent.QUERY_STARTED, query_id=str(self.query.id),
                               query_run_id=str(self.query.runId), workers=self.workers,
                               t0=self.t0, key_groups=self.spec.key_groups,
                               state_store=self.spec.state_store,
                               frequency_source=self._frequency_label(),
                               frequencies=list(self.actuator.frequencies()))

    def _shutdown(self) -> None:
        self.phase = "stopping"
        self.routing.abort("the run is stopping")
        if self.actuator is not None:
            self.actuator.restore()  # never leave executors stopped or a CPU capped
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:  # stopping a failed query can raise; we are leaving anyway
                pass
        if self.spark is not None:
            self.spark.stop()
        self.end_heartbeat()
        self.bus.publish_event(RunnerEvent.STOPPED, reason=self.stop_reason, batches=self.batches)

    def end_heartbeat(self) -> None:
        """Clear the heartbeat for good *before* the final event, so no heartbeat of
        this runner can be seen after the control plane learns it ended."""
        with self.heartbeat_lock:
            self.phase = "stopped"
            self.bus.clear_heartbeat()

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop_event.set()
        self.reconfig_queue.put(None)

    # ------------------------------------------------------- between micro-batches
    def _between_batches(self, batch_id: int) -> None:
        """In the sink, after batch ``batch_id`` wrote its output and before the next
        batch can start: repair, migration step, decommission, then enforce the table."""
        started = time.perf_counter()
        alive = self._executors_now()
        if (batch_id == 0 or all(e is None for e in self.routing.table)
                or not self.cfg.enforce_placement):
            self.routing.adopt(self.coord.locations())  # Spark's own placement
        repaired = self.routing.repair(alive)
        if repaired and batch_id > 0:
            self.bus.publish_event(RunnerEvent.GROUPS_REASSIGNED, groups=repaired,
                                   reason="their executor is gone", after_batch=batch_id)
        step = self.routing.due_moves(batch_id)
        if step is not None:
            self.bus.publish_event(RunnerEvent.MIGRATION_STEP_APPLIED, after_batch=batch_id,
                                   step=step.index, moves=step.moves, bytes=step.bytes,
                                   migration_id=self.routing.active.id
                                   if self.routing.active else None)
        if self.decommission_due:
            victims, self.decommission_due = self.decommission_due, []
            owned = set(self.routing.snapshot())
            for victim in victims:
                if victim in owned:  # never kill an executor that still holds state
                    self.bus.publish_event(RunnerEvent.DECOMMISSION_REFUSED, executor=victim,
                                           reason="it still owns key groups")
                    continue
                self.executors.decommission(victim, "streamwise: scale down after "
                                            "migrating its key groups away")
        table = self.routing.snapshot()
        repinned = 0
        for g, owner in enumerate(table):
            if not self.cfg.enforce_placement:
                break
            if owner is not None and self.coord.location(g) != owner:
                self.coord.pin(g, owner, self._host(owner))
                repinned += 1
        self.placed_for[batch_id + 1] = table
        for old in [b for b in self.placed_for if b < batch_id - 20]:
            del self.placed_for[old]
        self.boundary_ms = round((time.perf_counter() - started) * 1000, 1)
        self.repinned = repinned

    def _host(self, executor: str) -> str:
        if executor not in self.hosts:
            try:
                for e in self.rest.executors():
                    self.hosts[str(e["id"])] = str(e["hostPort"]).rsplit(":", 1)[0]
            except OSError:
                pass
        return self.hosts.get(executor, "127.0.0.1")

    # -------------------------------------------------------------------- metrics
    def _on_commit(self, commit: Any) -> None:
        self.commits[commit.batch_id] = commit
        # Bounded: progress events normally arrive ~0.1 s after the commit.
        for old in [b for b in self.commits if b < commit.batch_id - 50]:
            self.commits.pop(old, None)

    def on_progress(self, progress: Any) -> None:
        """Called from the listener: join Spark's progress with the sink's commit and
        hand the record to the monitor thread (the listener must stay cheap)."""
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
        state_rows = sum(int(op.numRowsTotal) for op in progress.stateOperators)
        source = progress.sources[0] if progress.sources else None
        self.batches += 1
        self.monitor_queue.put({
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
            "state_rows": state_rows,
            # Spark's own account of the batch, for cross-checks (pipelines.bench):
            "trigger_started_at": _iso_to_epoch(progress.timestamp),
            "durations_ms": {k: int(v) for k, v in progress.durationMs.items()},
            "source_start": _offset(source.startOffset) if source else None,
            "source_end": _offset(source.endOffset) if source else None,
            # Records the source had available (scheduled by now): arrivals and backlog.
            "source_latest": _offset(getattr(source, "latestOffset", None)) if source else None,
            "boundary_ms": getattr(self, "boundary_ms", None),
            "repinned": getattr(self, "repinned", 0),
        })

    def _monitor_loop(self) -> None:
        """Per batch: which executor ran each key group (REST), the groups' load and
        state bytes, drift from the routing table, migration-step verification; then
        publish the batch's metrics record."""
        job_group = str(self.query.runId)
        tracker = self.spark.sparkContext.statusTracker()
        while self.phase != "stopped":
            try:
                record = self.monitor_queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._enrich(record, tracker, job_group)
            except Exception as exc:  # a REST hiccup must not cost the batch's metrics
                record["monitor_error"] = f"{type(exc).__name__}: {exc}"[:300]
            reading = self.meter.read(record["workers"], self.freq_ghz)
            record.update(frequency_ghz=self.freq_ghz, frequency_source=self._frequency_label(),
                          power_w=reading.watts, power_source=reading.source)
            try:
                self.bus.publish_metrics(record)
            except Exception as exc:
                print(f"metrics publish failed: {exc!r}", file=sys.stderr, flush=True)

    def _enrich(self, record: dict[str, Any], tracker: Any, job_group: str) -> None:
        batch = record["batch_id"]
        groups = self.spec.key_groups
        tasks = self.rest.stateful_tasks(batch, tracker.getJobIdsForGroup(job_group), groups)
        ran_on = {g: t.executor for g, t in tasks.tasks.items()}
        task_ms = {g: t.run_ms for g, t in tasks.tasks.items()}
        table = self.placed_for.get(batch) or self.routing.snapshot()
        drifted = [g for g, e in ran_on.items() if table[g] is not None and table[g] != e]
        self.group_bytes = placement.state_bytes(self.run_dir / "checkpoint", groups)
        if len(task_ms) == groups:
            self.group_ms.append([task_ms[g] for g in range(groups)])
        # Groups whose task ran on another executor than in the previous batch: planned
        # moves plus any Spark made by itself (each one reloads state).
        previous = self.last_ran_on
        group_moves = sum(1 for g, e in ran_on.items() if g in previous and previous[g] != e)
        self.last_ran_on = {**previous, **ran_on}
        active = self.routing.active
        record.update({
            "placement": table,
            "ran_on": [ran_on.get(g) for g in range(groups)],
            "drift": len(drifted),
            "group_moves": group_moves,
            "group_ms": [task_ms.get(g) for g in range(groups)],
            "group_records": [tasks.tasks[g].records if g in tasks.tasks else None
                              for g in range(groups)],
            "group_bytes": self.group_bytes,
            "failed_tasks": tasks.failed_tasks,
            "migration": ({"id": active.id, "reason": active.reason,
                           "strategy": active.strategy, "steps": len(active.steps),
                           "applied": active.next_step} if active is not None
                          and not active.done.is_set() else None),
        })
        if drifted:
            self.bus.publish_event(RunnerEvent.PLACEMENT_DRIFT, batch_id=batch, groups=drifted,
                                   ran_on={str(g): ran_on[g] for g in drifted},
                                   table={str(g): table[g] for g in drifted})
        for migration, step in self.routing.record_batch(batch, ran_on, task_ms,
                                                         record["batch_duration_ms"]):
            self.bus.publish_event(RunnerEvent.MIGRATION_STEP, migration_id=migration.id,
                                   steps=len(migration.steps), **step.as_dict())
            if migration.done.is_set():
                self.bus.publish_event(RunnerEvent.MIGRATION_DONE, **migration.summary())

    def loads(self) -> list[float]:
        """Per-group load: mean task run time over the last batches (thesis §6.4.3's
        key weight p_k·T_k, measured); uniform before the first full batch."""
        if not self.group_ms:
            return [1.0] * self.spec.key_groups
        cols = list(zip(*self.group_ms, strict=True))
        return [max(sum(c) / len(c), 1.0) for c in cols]

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat_loop(self) -> None:
        while self.phase != "stopped":
            try:
                if self.executors is not None and self.phase == "running":
                    self.workers = len(self._executors_now())
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
                self._dispatch(cmd)

    def _dispatch(self, cmd: dict[str, Any]) -> None:
        """``stop`` is executed at once; reconfigurations queue for the reconfiguration
        thread, so one runs at a time and a long migration never delays a stop."""
        name, args, cid = cmd.get("name"), cmd.get("args") or {}, cmd.get("id", "")
        if name == "stop":
            self.bus.ack(cid, True, "stopping after the current micro-batch")
            self.request_stop(args.get("reason") or "stop requested")
        elif name not in RECONFIGURATIONS:
            self.bus.ack(cid, False, f"unknown command {name!r} (known: stop, "
                         f"{', '.join(RECONFIGURATIONS)})")
        elif self.phase != "running" and self.query is None:
            self.bus.ack(cid, False, f"cannot {name} while {self.phase}")
        else:
            self.reconfig_queue.put(cmd)

    def _reconfig_loop(self) -> None:
        while not self.stop_event.is_set():
            cmd = self.reconfig_queue.get()
            if cmd is None:
                break
            name, args, cid = cmd.get("name"), cmd.get("args") or {}, cmd.get("id", "")
            try:
                ok, message, payload = getattr(self, f"_cmd_{name}")(args)
            except elastic.ElasticError as exc:
                ok, message, payload = False, str(exc), {}
            except Exception as exc:
                traceback.print_exc()
                ok, message, payload = False, f"{type(exc).__name__}: {exc}", {}
            self.bus.ack(cid, ok, message, **payload)

    # Each _cmd_* returns (ok, message, payload for the acknowledgement).
    def _options(self, args: dict[str, Any]) -> tuple[str, int, str, float]:
        schedule = args.get("schedule", self.cfg.migration_schedule)
        gap = args.get("gap_batches", self.cfg.gap_batches)
        planner = args.get("planner", self.cfg.planner)
        tau = args.get("tau", self.cfg.tau)
        if schedule not in elastic.STRATEGIES:
            raise elastic.ElasticError(f"schedule must be one of "
                                       f"{', '.join(elastic.STRATEGIES)}, got {schedule!r}")
        if not isinstance(gap, int) or not 0 <= gap <= 100:
            raise elastic.ElasticError(f"gap_batches must be a whole number 0..100, got {gap!r}")
        if planner not in elastic.PLANNERS:
            raise elastic.ElasticError(f"planner must be one of {', '.join(elastic.PLANNERS)}")
        if not isinstance(tau, (int, float)) or not 0 <= tau <= 10:
            raise elastic.ElasticError(f"tau must be a number 0..10, got {tau!r}")
        return schedule, gap, planner, float(tau)

    def _migrate(self, target: list[str], reason: str, schedule: str,
                 gap: int) -> elastic.Migration:
        """Start a paced migration to ``target`` and wait for it (verified or failed)."""
        current = self.routing.snapshot()
        if any(e is None for e in current):
            raise elastic.ElasticError("the first micro-batch has not placed every group yet")
        steps = elastic.plan_steps([str(e) for e in current], target, schedule,
                                   self.group_bytes)
        migration = elastic.Migration(reason=reason, strategy=schedule, gap_batches=gap,
                                      target=list(target), steps=steps)
        self.routing.start(migration)
        self.bus.publish_event(RunnerEvent.MIGRATION_STARTED, migration_id=migration.id,
                               reason=reason, strategy=schedule, gap_batches=gap,
                               steps=len(steps), groups=migration.groups_moved,
                               bytes=migration.bytes_moved, target=target)
        deadline = time.monotonic() + MIGRATION_TIMEOUT_S
        while not migration.done.wait(0.25):
            if self.stop_event.is_set() or time.monotonic() > deadline:
                self.routing.abort("stopped" if self.stop_event.is_set() else
                                   f"not finished after {MIGRATION_TIMEOUT_S:.0f}s")
                break
        if not migration.steps:
            self.bus.publish_event(RunnerEvent.MIGRATION_DONE, **migration.summary())
        return migration

    def _cmd_set_workers(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        n = args.get("workers")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.cfg.max_workers:
            return False, (f"workers must be a whole number in 1..{self.cfg.max_workers} (the "
                           f"policy's maximum), got {n!r}"), {}
        if n > self.spec.key_groups:
            return False, (f"{n} workers but only {self.spec.key_groups} key groups: every "
                           "worker must own at least one group"), {}
        mode = args.get("mode", "planned")
        if mode not in ("planned", "kill"):
            return False, f"mode must be 'planned' or 'kill', got {mode!r}", {}
        schedule, gap, planner, tau = self._options(args)
        started = time.time()
        before = self._executors_now()
        if mode == "kill":
            return self._set_workers_spark_default(n, before, started)
        migration = None
        if n > len(before):
            self.executors.request_total(n)
            deadline = time.monotonic() + EXECUTOR_WAIT_S
            while len(ids := self._executors_now()) < n and time.monotonic() < deadline:
                time.sleep(0.25)
            if len(ids) < n:
                return False, (f"asked for {n} workers, {len(ids)} registered after "
                               f"{EXECUTOR_WAIT_S:.0f}s"), {"workers": len(ids)}
            self.workers = len(ids)
            new = [e for e in ids if e not in before]
            target, info = elastic.plan_target(self.routing.snapshot(), self.loads(),
                                               self.group_bytes, n, new, planner, tau)
            migration = self._migrate(target, f"scale up to {n} workers", schedule, gap)
            released: list[str] = []
        elif n < len(before):
            target, info = elastic.plan_target(self.routing.snapshot(), self.loads(),
                                               self.group_bytes, n, [], planner, tau)
            migration = self._migrate(target, f"scale down to {n} workers", schedule, gap)
            if not migration.done.is_set() or migration.failed:
                return False, (f"scale down to {n} stopped: migration {migration.id} "
                               f"{migration.failed or 'did not finish'}"), \
                    {"migration": migration.summary()}
            keep = set(target)
            released = [e for e in before if e not in keep][:len(before) - n]
            assert not set(released) & keep, "never decommission an executor holding state"
            self.decommission_due = released
        else:
            target, info, released = self.routing.snapshot(), {}, []
        ids = self.executors.wait_for(n, EXECUTOR_WAIT_S, exact=True)
        self.workers = len(ids)
        ok = len(ids) == n and (migration is None or not migration.failed)
        summary = migration.summary() if migration else None
        message = (f"{len(before)} -> {len(ids)} workers"
                   + (f"; {summary['groups_moved']} groups moved in {summary['steps']} "
                      f"{schedule} steps, verified={summary['verified']}" if summary else "")
                   if ok else f"asked for {n} workers, {len(ids)} registered after "
                   f"{EXECUTOR_WAIT_S:.0f}s" + (f"; {migration.failed}" if migration
                                                  and migration.failed else ""))
        payload = {"workers": len(ids), "executors": ids, "released": released,
                   "took_s": round(time.time() - started, 2), "plan": info,
                   "migration": summary, "mode": "planned"}
        self.bus.publish_event(RunnerEvent.WORKERS_CHANGED, workers=len(ids), requested=n,
                               executors=ids, released=released, mode="planned")
        return ok, message, payload

    def _set_workers_spark_default(self, n: int, before: list[str],
                                   started: float) -> tuple[bool, str, dict[str, Any]]:
        """The baseline (no planned migration): scale up by raising the target only
        (a new executor gets state only if Spark's scheduler moves some by itself);
        scale down by killing the newest executors at once, mid-batch or not, as a
        cluster manager or dynamic allocation would."""
        released: list[str] = []
        if n > len(before):
            self.executors.request_total(n)
        elif n < len(before):
            released = list(reversed(before))[:len(before) - n]
            self.executors.kill(released)
        ids = self.executors.wait_for(n, EXECUTOR_WAIT_S, exact=True)
        self.workers = len(ids)
        self.bus.publish_event(RunnerEvent.WORKERS_CHANGED, workers=len(ids), requested=n,
                               executors=ids, released=released, mode="kill")
        return len(ids) == n, f"{len(before)} -> {len(ids)} workers (Spark default: no " \
            "planned migration)", {"workers": len(ids), "executors": ids,
                                   "released": released, "mode": "kill",
                                   "took_s": round(time.time() - started, 2)}

    def _cmd_move_groups(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        moves = args.get("moves")
        if not isinstance(moves, dict) or not moves:
            return False, "moves must be an object {group: executor id}", {}
        schedule, gap, _planner, _tau = self._options(args)
        alive = set(self._executors_now())
        target = [str(e) for e in self.routing.snapshot()]
        for group, executor in moves.items():
            try:
                g = int(group)
            except ValueError:
                return False, f"group {group!r} is not a number", {}
            if not 0 <= g < self.spec.key_groups:
                return False, f"group {g} is outside 0..{self.spec.key_groups - 1}", {}
            if str(executor) not in alive:
                return False, (f"executor {executor!r} is not registered (have "
                               f"{', '.join(sorted(alive))})"), {}
            target[g] = str(executor)
        migration = self._migrate(target, f"move {len(moves)} groups", schedule, gap)
        summary = migration.summary()
        ok = migration.done.is_set() and not migration.failed
        return ok, (f"{summary['groups_moved']} groups moved in {summary['steps']} {schedule}"
                    f" steps, verified={summary['verified']}" if ok else
                    f"migration {migration.id} failed: {migration.failed}"), \
            {"migration": summary, "placement": self.routing.snapshot()}

    def _cmd_rebalance(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        schedule, gap, planner, tau = self._options(args)
        # Over every registered executor: one that holds no group yet (e.g. added
        # without a planned migration) is where a rebalance should put some.
        current = [str(e) for e in self.routing.snapshot()]
        alive = self._executors_now()
        empty = [e for e in alive if e not in current]
        workers = min(len(set(current) | set(alive)), self.spec.key_groups)
        target, info = elastic.plan_target(current, self.loads(), self.group_bytes,
                                           workers, empty, planner, tau)
        migration = self._migrate(target, f"rebalance ({info['planner']}, tau {tau})",
                                  schedule, gap)
        summary = migration.summary()
        ok = migration.done.is_set() and not migration.failed
        return ok, (f"rebalanced: {summary['groups_moved']} groups moved in "
                    f"{summary['steps']} {schedule} steps" if ok else
                    f"migration {migration.id} failed: {migration.failed}"), \
            {"migration": summary, "plan": info, "placement": self.routing.snapshot()}

    def _cmd_set_frequency(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        ghz = args.get("ghz")
        if not isinstance(ghz, (int, float)) or isinstance(ghz, bool) or ghz <= 0:
            return False, f"ghz must be a positive number, got {ghz!r}", {}
        try:
            applied = self.actuator.set(float(ghz))
        except frequency.FrequencyError as exc:
            return False, str(exc), {}
        self.freq_ghz = applied
        label = self._frequency_label()
        self.bus.publish_event(RunnerEvent.FREQUENCY_CHANGED, ghz=applied, requested=ghz,
                               source=label)
        return True, f"CPU frequency {applied} GHz ({label})", {"ghz": applied,
                                                                 "source": label}

    def _frequency_label(self) -> str:
        """Where the reported frequency comes from: the DVFS actuator or the emulation
        when one is active, else the read-only reading (cpufreq/cpuinfo/nominal)."""
        if isinstance(self.actuator, frequency.DutyCycleThrottle) and self.actuator.duty < 1:
            return "emulated"
        if isinstance(self.actuator, frequency.CpufreqActuator) and self.actuator._saved:
            return "cpufreq"
        return self.freq_source


MIGRATION_TIMEOUT_S = 600.0
LOAD_WINDOW = 5  # batches over which a group's load is averaged


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--standby":
        return standby_main(argv[1])
    if len(argv) != 1:
        print("usage: python -m pipelines.runtime.runner CONFIG.json\n"
              "       python -m pipelines.runtime.runner --standby STANDBY.json",
              file=sys.stderr)
        return 2
    return run_main(argv[0])


def run_main(config_path: str, session: Any = None, standby_id: str | None = None) -> int:
    """Run one run from its config file (in a standby: on the standby's session)."""
    try:
        cfg = RunnerConfig.load(config_path)
        runner_bus = busmod.RunBus(busmod.connect(cfg.redis_url), cfg.bus_key)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: bad runner config {config_path}: {exc}", file=sys.stderr)
        return 2
    runner_bus.heartbeat(pid=os.getpid(), phase="starting", batches=0, workers=0)
    try:
        runner = Runner(cfg, runner_bus, session=session, standby_id=standby_id)
    except definition.DefinitionError as exc:
        runner_bus.publish_event(RunnerEvent.FAILED, reason=f"invalid definition: {exc}")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: runner.request_stop("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: runner.request_stop("SIGINT"))
    try:
        runner.run()
        return 0
    except BaseException as exc:
        traceback.print_exc()
        runner.end_heartbeat()
        runner_bus.publish_event(RunnerEvent.FAILED, reason=f"{type(exc).__name__}: {exc}"[:2000])
        if runner.spark is not None:
            try:
                runner.spark.stop()
            except Exception:
                pass
        return 1
    finally:
        runner.stop_event.set()
        runner.end_heartbeat()


def standby_main(standby_path: str) -> int:
    """A standby runner (pipelines.runtime.standby): warm up, offer itself, and run the
    run that adopts it."""
    from pipelines.runtime import standby as sb

    try:
        cfg = sb.StandbyConfig.load(standby_path)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: bad standby config {standby_path}: {exc}", file=sys.stderr)
        return 2
    node = sb.Standby(cfg)
    signal.signal(signal.SIGTERM, lambda *_: node.stop.set())
    signal.signal(signal.SIGINT, lambda *_: node.stop.set())
    try:
        config_path = node.serve()
    except BaseException:
        traceback.print_exc()
        node.close()
        return 1
    if config_path is None:
        print(f"standby {cfg.standby_id} withdrawn", flush=True)
        node.close()
        return 0
    node.r.delete(sb.alive_key(cfg.standby_id))
    # From here on this process is the run's runner: its log is the run's runner.log
    # (the JVM's own output stays in the standby's log, named there).
    run_log = Path(config_path).with_name("runner.log")
    print(f"standby {cfg.standby_id} adopted by {config_path}; runner log {run_log}",
          flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(run_log, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    print(f"adopted standby {cfg.standby_id} (app {node.offer.app_id if node.offer else '?'}"
          f"); Spark's own log: {Path(standby_path).with_name('standby.log')}", flush=True)
    return run_main(config_path, session=node.spark, standby_id=cfg.standby_id)


if __name__ == "__main__":
    sys.exit(main())
