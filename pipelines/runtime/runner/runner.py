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
ran each group — Spark's default behaviour, the benchmarks' baseline); driver_host (the
address executors on other hosts reach the driver at; default ``$SPARK_DRIVER_HOST`` or
loopback).

This module is the runner's lifecycle (session, query, heartbeat, command intake, stop);
its other concerns live beside it:

* ``runner.metrics.BatchMetrics`` — one ``bus.MetricsRecord`` per micro-batch (Spark's
  progress joined with the sink's commit, per-group placement and load from the REST API);
* ``elastic.reconfigure.Reconfigurer`` — the elastic runtime's commands (workers
  up/down, group moves, rebalancing, CPU frequency), one at a time on their own thread,
  changing the placement only between micro-batches, paced by the planners' schedules
  (``elastic.migration``, ``elastic.placement``);
* ``runner.handover.ReplanHandover`` — a live re-plan: the next query generation
  started beside this one and the output handed over to it.

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
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

from pipelines.runtime import bus as busmod
from pipelines.runtime import connectors
from pipelines.runtime.spec import definition
from pipelines.runtime.elastic import migration as elastic
from pipelines.runtime.host import frequency
from pipelines.runtime.elastic import placement
from pipelines.runtime.host import power
from pipelines.runtime.replan import gloss as replan
from pipelines.runtime.runner.handover import ReplanHandover
from pipelines.runtime.runner.metrics import BatchMetrics
from pipelines.runtime.bus import RECONFIGURATIONS, RunnerEvent
from pipelines.runtime.elastic.reconfigure import Reconfigurer
from pipelines.runtime.query.session import (
    EXECUTOR_WAIT_S,
    EXTRA_EXECUTOR_WAIT_S,
    apply_run_conf,
    build_session,
    set_locality_wait,
)

# PySpark (and the modules that import it) are imported lazily: the first heartbeat
# must not wait for seconds of imports on a loaded machine.

# Where a traceback's frames are Streamwise's or PySpark's, not an operator author's.
_PRODUCT_FRAMES = (f"{os.sep}pyspark{os.sep}", f"{os.sep}pyspark.zip{os.sep}",
                   f"{os.sep}pipelines{os.sep}runtime{os.sep}")


def query_failure(text: str, who: str = "a Python operator",
                  ended: str = "streaming query ended") -> str:
    """Why a streaming query ended, as the run page and the audit show it: where a
    Python operator raised (a package's, or the product's), the exception and the
    frames of the code outside Streamwise and PySpark first (what the operator's author
    needs), then Spark's own account. Spark's simplified Python traceback is the part
    between "Traceback (most recent call last):" and the exception's line."""
    # The last traceback is the innermost: a batch's sink (foreachBatch, in the
    # driver) reports the Python worker's traceback after its own.
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return f"{ended}: {text}"
    lines = text[start:].splitlines()[1:]
    frames: list[tuple[str, str]] = []
    i = 0
    while i < len(lines) and lines[i].startswith("  File "):
        frame, code = lines[i].strip(), ""
        i += 1
        while i < len(lines) and lines[i].startswith("    "):
            if not code and lines[i].strip().strip("^~ "):  # (not 3.11's carets)
                code = lines[i].strip()
            i += 1
        frames.append((frame, code))
    error = lines[i].strip() if i < len(lines) else "an exception"
    user = [f for f in frames if not any(part in f[0] for part in _PRODUCT_FRAMES)]
    shown = user or frames
    where = "\n".join(f"  {frame}" + (f"\n    {code}" if code else "")
                      for frame, code in reversed(shown))
    whose = "user code" if user else "Streamwise's own code"
    return (f"{who} raised {error}\n{whose}, innermost frame first:\n{where}"
            f"\n\n{ended}: {text}")


def start_failure(exc: BaseException) -> str:
    """Why a run could not build or start its query: where user code (a pipeline
    module's ``build``) raised, the exception and the user code's frames, innermost
    first; otherwise the exception's own line."""
    import sysconfig

    library = (sysconfig.get_paths()["stdlib"], *(f"{os.sep}{name}{os.sep}" for name in (
        "pyspark", "py4j", "pandas", "numpy", "pyarrow", "redis", "nats")))
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not any(part in f.filename for part in _PRODUCT_FRAMES)
            and not f.filename.startswith(library[0]) and not any(
                part in f.filename for part in library[1:])]
    error = "".join(traceback.format_exception_only(exc)).strip()
    if not user:
        return error
    where = "\n".join(f'  File "{f.filename}", line {f.lineno}, in {f.name}'
                      + (f"\n    {f.line}" if f.line else "") for f in reversed(user))
    return f"user code raised {error}\nuser code, innermost frame first:\n{where}"


# What Spark's ``PythonWorkerFactory`` says when a Python worker it started did not
# connect back within its 10 s (``Runner.restart_if_python_failed_to_start``).
PYTHON_START_FAILURES = ("Python worker failed to connect back",
                         "waiting for the Python worker to connect back")
QUERY_START_RETRIES = 2



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
    driver_host: str | None = None  # where executors reach the driver (session.driver_host)
    # The connections the definition names: name -> {kind, url, password}. Only in the
    # private runner.json (0600), never on a command line or in a log.
    connections: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> RunnerConfig:
        raw = json.loads(Path(path).read_text())
        known = set(cls.__dataclass_fields__)
        cfg = cls(**{k: v for k, v in raw.items() if k in known})
        if not 1 <= cfg.initial_workers <= cfg.max_workers:
            raise ValueError("need 1 <= initial_workers <= max_workers")
        from pipelines.runtime.elastic.migration import PLANNERS, STRATEGIES

        if cfg.planner not in PLANNERS or cfg.migration_schedule not in STRATEGIES:
            raise ValueError(f"planner must be one of {PLANNERS}, migration_schedule one "
                             f"of {STRATEGIES}")
        return cfg


class Runner:
    def __init__(self, cfg: RunnerConfig, bus: busmod.RunnerBus,
                 session: Any = None, standby_id: str | None = None,
                 keep_session: bool = False) -> None:
        self.cfg = cfg
        self.bus = bus
        self.adopted_session = session  # a standby's warm SparkSession, if adopted
        self.standby_id = standby_id
        # A standby that serves further runs keeps its session after this one
        # (standby.StandbyConfig.runs): the run's end stops its query, not Spark.
        self.keep_session = keep_session
        self.listener: Any = None
        # (a source that starts at the stream's end: that end, pinned for the run)
        self.spec = connectors.pin_start(definition.validate(cfg.definition),
                                         Path(cfg.checkpoint_dir))
        self.stop_event = threading.Event()
        # Ids of the commands received: a resend of the same request is not applied twice.
        self.commands_seen: set[str] = set()
        self.stop_reason = "stop requested"
        self.phase = "starting"
        self.heartbeat_lock = threading.Lock()
        self.workers = 0
        self.spark: Any = None
        self.query: Any = None
        self.executors: Any = None
        self.sink: Any = None
        self.coord: Any = None
        self.rest: Any = None
        self.releasing_at_start: set[str] = set()
        # The query generations (a live re-plan starts the next one beside the current
        # one) and the arbiter that forwards each input range's output once (replan.py).
        self.generation = replan.Generation(0, self.spec.key_groups,
                                            self.run_dir / "checkpoint",
                                            start=connectors.start_offset(self.spec))
        self.arbiter = replan.Arbiter(self.run_dir, self.generation)
        self.replanning = False
        # A seamless re-plan's state transfer, run only between the forwarded query's
        # batches (reseed.TransferGate; None: no transfer, or an untriggered pipeline).
        self.transfer_gate: Any = None
        self.last_replan_end: float | None = None
        routing = elastic.RoutingTable(self.spec.key_groups)
        self.metrics = BatchMetrics(self.spec, bus, self.run_dir / "checkpoint", routing, self)
        f_max_ghz, freq_source = power.read_frequency_ghz()
        self.reconfig = Reconfigurer(cfg, self.spec, bus, routing, self.metrics, self,
                                     f_max_ghz, freq_source)
        self.routing = routing
        self.handover = ReplanHandover(self)
        # The schedule's clock starts when the query starts (set in _start_query)
        # unless the config pins it, e.g. to replay a run's schedule after a restart.
        self.t0 = cfg.t0 or 0.0

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.checkpoint_dir)

    @property
    def freq_ghz(self) -> float:
        """The executors' CPU frequency now (set or read)."""
        return self.reconfig.freq_ghz

    def frequency_label(self) -> str:
        return self.reconfig.frequency_label()

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
        threading.Thread(target=self.metrics.monitor, name="monitor", daemon=True,
                         args=(self.rest, self.spark.sparkContext.statusTracker(),
                               str(self.query.runId), lambda: self.phase != "stopped"),
                         ).start()
        threading.Thread(target=self.reconfig.loop, name="reconfigure", daemon=True).start()
        while not self.stop_event.wait(0.5):
            if not self.query.isActive and not self.replanning:
                exc = self.query.exception()
                if self.restart_if_python_failed_to_start(self.generation, exc):
                    continue
                raise RuntimeError(query_failure(str(exc)) if exc else
                                   "streaming query ended without a stop request")
        self._shutdown()

    def _start_session(self) -> None:
        cfg = self.cfg
        if self.adopted_session is not None:
            # A standby runner's warm session (pipelines.runtime.runner.standby): its JVM,
            # executor and Python workers are up and have run a micro-batch already.
            self.spark = self.adopted_session
            if cfg.locality_wait is not None:
                set_locality_wait(self.spark, cfg.locality_wait)
        else:
            self.spark = build_session(cfg.master_url, f"streamwise-run-{cfg.run_id}",
                                       cfg.max_workers, cfg.executor_memory,
                                       cfg.locality_wait, cfg.driver_host)
        apply_run_conf(self.spark, self.spec)
        self.spark.sparkContext.setLogLevel("WARN")
        from pipelines.runtime.elastic.executors import ExecutorControl

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
        self.reconfig.actuator = frequency.choose_actuator(sc.applicationId,
                                                           self.reconfig.f_max_ghz)

    def _warm_executors(self, n: int) -> None:
        from pipelines.runtime.query.source import warm_up

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

    def executors_now(self) -> list[str]:
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
        from pipelines.runtime.runner.listener import MetricsListener

        checkpoint = self._checkpoint()
        self.t0 = self.cfg.t0 or time.time()
        # The verifier needs the schedule clock the records were generated against.
        (self.run_dir / "t0").write_text(json.dumps({"t0": self.t0}))
        self.listener = MetricsListener(self.metrics.on_progress)
        self.spark.streams.addListener(self.listener)
        assert checkpoint == self.generation.checkpoint
        self.start_generation(self.generation, self.spec)
        self.generation.adopted = True
        self.write_pe_plan(self.spec, self.generation)
        self.query = self.generation.query
        self.sink = self.generation.sink
        self.coord = placement.StateStoreCoordinatorView(
            self.spark, str(self.query.runId), checkpoint, self.spec.key_groups)
        self.phase = "running"
        self.bus.publish_event(RunnerEvent.QUERY_STARTED, query_id=str(self.query.id),
                               query_run_id=str(self.query.runId), workers=self.workers,
                               t0=self.t0, key_groups=self.spec.key_groups,
                               state_store=self.spec.state_store,
                               frequency_source=self.frequency_label(),
                               frequencies=list(self.reconfig.actuator.frequencies()))

    def restart_if_python_failed_to_start(self, gen: replan.Generation,
                                          exc: Any) -> bool:
        """Start ``gen``'s ended query again from its checkpoint if it ended because a
        Python worker Spark started for it on this driver did not connect back in time,
        before any batch of it began; False (nothing done) otherwise.

        Spark gives such a worker (a Python data source's reader, transformWithState's
        state schema) 10 s to connect back, hard-coded in ``PythonWorkerFactory``: on a
        machine other work keeps busy, a new interpreter importing pandas and pyarrow
        took longer, and the query ended at its start (seen with one core kept busy
        beside the suite's two lanes, at a re-plan's hand-over and at a run's start).
        No batch of it began, so nothing was forwarded: starting it again is Spark's
        own recovery (its offset log replays the batch it had planned), and a run
        should not end over it. At most ``QUERY_START_RETRIES`` times per generation."""
        text = str(exc or "")
        if (gen.batches_begun or gen.restarts >= QUERY_START_RETRIES
                or not any(m in text for m in PYTHON_START_FAILURES)
                or self.stop_event.is_set()):
            return False
        gen.restarts += 1
        print(f"generation {gen.number}'s query ended before its first batch, its Python "
              f"worker late to connect back; starting it again ({gen.restarts} of "
              f"{QUERY_START_RETRIES})", file=sys.stderr, flush=True)
        self.start_generation(gen, gen.spec, gen.seed)
        if gen is self.generation:  # the run's query: what acts on it follows the new one
            self.query, self.sink = gen.query, gen.sink
            self.coord = placement.StateStoreCoordinatorView(
                self.spark, str(gen.query.runId), gen.checkpoint, gen.spec.key_groups)
        self.bus.publish_event(RunnerEvent.QUERY_RESTARTED, generation=gen.number,
                               attempt=gen.restarts, query_run_id=str(gen.query.runId),
                               reason=text.splitlines()[0][:300] if text else "")
        return True

    def start_generation(self, gen: replan.Generation, spec: definition.PipelineSpec,
                          seed: Any = None) -> None:
        """Start ``gen``'s query: its sink forwards what the arbiter lets through."""
        from pipelines.runtime.query.compiler import LatencySink, build_stream

        gen.spec, gen.seed, gen.batches_begun = spec, seed, 0

        def claim(batch_id: int) -> int | None:
            if seed is not None and seed.hold is not None and batch_id == 0:
                # The snapshot loads in this batch; the source reads from the next one.
                seed.hold.touch()
            return self.arbiter.claim(gen, batch_id)

        def between_batches(batch_id: int) -> None:
            if gen.adopted:
                self.reconfig.between_batches(batch_id)
            if gen.pause_s > 0:  # throttled while a new generation catches up
                time.sleep(gen.pause_s)

        def on_commit(commit: Any) -> None:
            gen.record_batch(commit.committed_at - commit.started_at)
            self.arbiter.written(gen, commit.batch_id)
            gate = self.transfer_gate
            if gate is not None and gen.number == self.arbiter.active:
                gate.release()
            self.metrics.on_commit(commit)

        sc = self.spark.sparkContext

        def begin(batch_id: int) -> bool:
            gen.batches_begun += 1
            if not self.arbiter.begin(gen, batch_id):
                return False
            gate = self.transfer_gate
            if gate is not None and gen.number == self.arbiter.active:
                gate.hold()
            # foreachBatch runs on the query's stream thread: the batch's jobs, submitted
            # from here on, take this thread's pool (replan.Arbiter.pool_for).
            sc.setLocalProperty("spark.scheduler.pool", self.arbiter.pool_for(gen))
            return True

        gen.sink = LatencySink(on_commit,
                               output_dir=self.run_dir / "output" if spec.keep_output
                               else None,
                               between_batches=between_batches, claim=claim,
                               generation=gen.number,
                               begin=begin, writer=self._sink_writer(spec))
        built = time.perf_counter()
        stream = build_stream(self.spark, spec, self.t0, self.run_dir / "source-plan", seed)
        print(f"stream of generation {gen.number} built in "
              f"{time.perf_counter() - built:.1f}s", flush=True)
        writer = (stream.writeStream.foreachBatch(gen.sink).outputMode(spec.output_mode)
                  .option("checkpointLocation", str(gen.checkpoint))
                  .queryName(f"run_{self.cfg.run_id}" if gen.number == 0
                             else f"run_{self.cfg.run_id}_gen_{gen.number}"))
        if spec.trigger_ms:
            writer = writer.trigger(processingTime=f"{spec.trigger_ms} milliseconds")
        gen.query = writer.start()
        self.metrics.generation_of[str(gen.query.runId)] = gen.number

    # ------------------------------------------------------------------ re-plan
    def _sink_writer(self, spec: definition.PipelineSpec) -> Callable[[Any, int], Any] | None:
        """The pipeline's own sink, if it has one besides the latency sink
        (``connectors.SINKS``: a PostgreSQL table, a Parquet dataset), written once per
        output batch; the generations share it."""
        sink = connectors.sink_for_run(spec, self.t0)
        return sink.writer() if sink is not None else None

    def replan(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        """A live re-plan (``handover.ReplanHandover``)."""
        return self.handover.replan(args)

    def write_pe_plan(self, spec: definition.PipelineSpec, gen: replan.Generation) -> None:
        """The Python operators' PEs the forwarding query runs (``pe-plan.json``, read by
        the run's "Optimise plan" page with the profile its PEs write beside it)."""
        if spec.pe_plan is None or not spec.pe_plan.pes:
            return
        doc = {"generation": gen.number, "since": time.time(), **spec.pe_plan.as_dict()}
        tmp = self.run_dir / "pe-plan.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.run_dir / "pe-plan.json")

    def _shutdown(self) -> None:
        self.phase = "stopping"
        self.routing.abort("the run is stopping")
        if self.reconfig.actuator is not None:
            self.reconfig.actuator.restore()  # never leave executors stopped or a CPU capped
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:  # stopping a failed query can raise; we are leaving anyway
                pass
        if self.spark is not None and self.keep_session:
            if self.listener is not None:
                self.spark.streams.removeListener(self.listener)
        elif self.spark is not None:
            self.spark.stop()
        self.end_heartbeat()
        self.bus.publish_event(RunnerEvent.STOPPED, reason=self.stop_reason,
                               batches=self.metrics.batches)

    def end_heartbeat(self) -> None:
        """Clear the heartbeat for good *before* the final event, so no heartbeat of
        this runner can be seen after the control plane learns it ended."""
        with self.heartbeat_lock:
            self.phase = "stopped"
            self.bus.clear_heartbeat()

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop_event.set()
        self.reconfig.submit(None)

    def terminate(self) -> None:
        """SIGTERM: stop as on a stop command, but be gone within SIGTERM_EXIT_S whatever
        happens (the reconciler SIGKILLs a runner that is not, and a benchmark's cleanup
        waits no longer); past it, leave at once, executors continued and the end told."""
        if self.stop_event.is_set() and self.stop_reason == "SIGTERM":
            return  # a second SIGTERM: the first one's deadline stands
        self.request_stop("SIGTERM")
        timer = threading.Timer(SIGTERM_EXIT_S, self._exit_now)
        timer.daemon = True
        timer.start()

    def _exit_now(self) -> None:
        try:
            if self.reconfig.actuator is not None:
                self.reconfig.actuator.restore()
            gate = self.transfer_gate
            if gate is not None:  # a transfer under way: not left behind, stopped or not
                gate.end()
            self.end_heartbeat()
            self.bus.publish_event(RunnerEvent.STOPPED, batches=self.metrics.batches,
                                   reason=f"SIGTERM; the query had not stopped within "
                                          f"{SIGTERM_EXIT_S:g} s, so the runner left at once")
            self.bus.flush()
        finally:
            os._exit(0)

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat_loop(self) -> None:
        while self.phase != "stopped":
            try:
                if self.executors is not None and self.phase == "running":
                    self.workers = len(self.executors_now())
                with self.heartbeat_lock:
                    if self.phase == "stopped":
                        break
                    facts = (self.metrics.progress_facts(time.time())
                             if self.phase == "running" else {})
                    if self.reconfig.busy:
                        facts["reconfiguring"] = self.reconfig.busy
                    self.bus.heartbeat(pid=os.getpid(), phase=self.phase,
                                       batches=self.metrics.batches,
                                       workers=self.workers, **facts)
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
        if cid and cid in self.commands_seen:
            self.bus.ack(cid, False, f"{name} {cid} was received before; not applied again",
                         duplicate=True)
            return
        self.commands_seen.add(cid)
        late = busmod.expired(cmd)
        if name == "stop":
            self.bus.ack(cid, True, "stopping after the current micro-batch")
            self.request_stop(args.get("reason") or "stop requested")
        elif name not in RECONFIGURATIONS:
            self.bus.ack(cid, False, f"unknown command {name!r} (known: stop, "
                         f"{', '.join(RECONFIGURATIONS)})")
        elif late is not None:
            self.bus.ack(cid, False, f"{name} refused: it expired {late:.0f} s before the "
                         "runner received it", expired=True)
        elif self.phase != "running" and self.query is None:
            self.bus.ack(cid, False, f"cannot {name} while {self.phase}")
        else:
            self.reconfig.submit(cmd)



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


# After SIGTERM a runner is gone within this long (Runner.terminate).
SIGTERM_EXIT_S = 8.0


def run_main(config_path: str) -> int:
    """Run one run from its config file, on a session of its own."""
    rc, _ = _run_one(config_path, None, None, keep_session=False)
    return rc


def _run_one(config_path: str, session: Any, standby_id: str | None,
             keep_session: bool) -> tuple[int, bool]:
    """Run one run from its config file (in a standby: on the standby's session; with
    ``keep_session``, left up after a clean stop for the standby's next run): (exit
    code, whether the session is up for another run)."""
    try:
        cfg = RunnerConfig.load(config_path)
        connectors.CONNECTIONS.clear()  # (a standby's earlier run had its own)
        connectors.register_connections(cfg.connections)
        runner_bus = busmod.RunnerBus(busmod.connect(cfg.redis_url), cfg.bus_key)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: bad runner config {config_path}: {exc}", file=sys.stderr)
        return 2, False
    runner_bus.heartbeat(pid=os.getpid(), phase="starting", batches=0, workers=0)
    try:
        runner = Runner(cfg, runner_bus, session=session, standby_id=standby_id,
                        keep_session=keep_session)
    except definition.DefinitionError as exc:
        runner_bus.publish_event(RunnerEvent.FAILED, reason=f"invalid definition: {exc}")
        return 1, False
    signal.signal(signal.SIGTERM, lambda *_: runner.terminate())
    signal.signal(signal.SIGINT, lambda *_: runner.request_stop("SIGINT"))
    try:
        runner.run()
        # A signal's stop ends the process whatever its standby would serve next.
        return 0, keep_session and runner.stop_reason not in ("SIGTERM", "SIGINT")
    except BaseException as exc:
        traceback.print_exc()
        runner.end_heartbeat()
        runner_bus.publish_event(RunnerEvent.FAILED, reason=start_failure(exc)[:2000])
        if runner.spark is not None:
            try:
                runner.spark.stop()
            except Exception:
                pass
        return 1, False
    finally:
        runner.stop_event.set()
        runner.end_heartbeat()


def standby_main(standby_path: str) -> int:
    """A standby runner (pipelines.runtime.runner.standby): warm up, offer itself, and run the
    run that adopts it."""
    from pipelines.runtime.runner import standby as sb

    try:
        cfg = sb.StandbyConfig.load(standby_path)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: bad standby config {standby_path}: {exc}", file=sys.stderr)
        return 2
    node = sb.Standby(cfg)

    def withdraw(*_: object) -> None:
        # Its warm-up query may block (a cluster gone): gone within SIGTERM_EXIT_S anyway,
        # as a runner is. Adopted, it has the runner's own handler instead.
        node.stop.set()
        timer = threading.Timer(SIGTERM_EXIT_S, os._exit, args=(0,))
        timer.daemon = True
        timer.start()

    served = 0
    config_path = None
    while True:
        signal.signal(signal.SIGTERM, withdraw)
        signal.signal(signal.SIGINT, lambda *_: node.stop.set())
        try:
            config_path = node.serve() if served == 0 else node.serve_again()
        except BaseException:
            traceback.print_exc()
            node.close()
            return 1
        if config_path is None:
            print(f"standby {cfg.standby_id} withdrawn", flush=True)
            node.close()
            return 0
        served += 1
        rc, reusable = _adopted(node, standby_path, config_path, keep=served < cfg.runs)
        if not reusable:
            return rc
        # Back to the standby's own log until the next run adopts it.
        with open(Path(standby_path).with_name("standby.log"), "ab", buffering=0) as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        print(f"standby {cfg.standby_id} served run {served} of {cfg.runs} "
              f"({config_path})", flush=True)


def _adopted(node: Any, standby_path: str, config_path: str, keep: bool) -> tuple[int, bool]:
    """Run the adopting run on the standby's session: (exit code, whether the session
    is up for another run)."""
    from pipelines.runtime.runner import standby as sb

    cfg = node.cfg
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
    done = threading.Event()
    if keep:
        node.serving(done)
    try:
        rc, reusable = _run_one(config_path, node.spark, cfg.standby_id, keep)
    finally:
        done.set()
    sys.stdout.flush()
    sys.stderr.flush()
    return rc, reusable


if __name__ == "__main__":
    sys.exit(main())
