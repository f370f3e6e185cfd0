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
its two other concerns live beside it, each on its own thread:

* ``batch_metrics.BatchMetrics`` — one ``bus.MetricsRecord`` per micro-batch (Spark's
  progress joined with the sink's commit, per-group placement and load from the REST API);
* ``reconfigure.Reconfigurer`` — the elastic runtime's commands (workers up/down, group
  moves, rebalancing, CPU frequency), one at a time, changing the placement only between
  micro-batches, paced by the planners' schedules (``elastic.py``, ``placement.py``).

Exit codes: 0 stopped on request, 1 failed (a ``failed`` event says why), 2 bad config.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.runtime import bus as busmod
from pipelines.runtime.spec import definition
from pipelines.runtime.elastic import migration as elastic
from pipelines.runtime.host import frequency
from pipelines.runtime.elastic import placement
from pipelines.runtime.host import power
from pipelines.runtime.replan import gloss as replan
from pipelines.runtime.runner.metrics import BatchMetrics
from pipelines.runtime.bus import RECONFIGURATIONS, RunnerEvent
from pipelines.runtime.elastic.reconfigure import Reconfigurer
from pipelines.runtime.query.session import (
    EXECUTOR_WAIT_S,
    EXTRA_EXECUTOR_WAIT_S,
    PROJECT_ROOT,
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
    driver_host: str | None = None  # where executors reach the driver (session.driver_host)

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
    def __init__(self, cfg: RunnerConfig, bus: busmod.RunBus,
                 session: Any = None, standby_id: str | None = None) -> None:
        self.cfg = cfg
        self.bus = bus
        self.adopted_session = session  # a standby's warm SparkSession, if adopted
        self.standby_id = standby_id
        self.spec = definition.validate(cfg.definition)
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
                                            self.run_dir / "checkpoint")
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
                raise RuntimeError(f"streaming query ended: {exc}" if exc else
                                   "streaming query ended without a stop request")
        self._shutdown()

    def _start_session(self) -> None:
        cfg = self.cfg
        if self.adopted_session is not None:
            # A standby runner's warm session (pipelines.runtime.runner.standby): its JVM,
            # executor and Python workers are up and have run a micro-batch already.
            self.spark = self.adopted_session
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
        self.spark.streams.addListener(MetricsListener(self.metrics.on_progress))
        assert checkpoint == self.generation.checkpoint
        self._start_generation(self.generation, self.spec)
        self.generation.adopted = True
        self._write_pe_plan(self.spec, self.generation)
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

    def _start_generation(self, gen: replan.Generation, spec: definition.PipelineSpec,
                          seed: Any = None) -> None:
        """Start ``gen``'s query: its sink forwards what the arbiter lets through."""
        from pipelines.runtime.query.compiler import LatencySink, build_stream

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
                               begin=begin)
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
    def replan(self, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        """A live re-plan to ``args['key_groups']`` (``replan.py``): ``seamless``
        (Gloss' adaptive hand-over) or ``stop-restart`` (stop-and-copy)."""
        scheme = args.get("scheme") or "seamless"
        if scheme not in replan.SCHEMES:
            return False, f"scheme must be one of {', '.join(replan.SCHEMES)}", {}
        replay_in = args.get("replay_in") or "auto"
        if replay_in not in replan.REPLAY_IN:
            return False, f"replay_in must be one of {', '.join(replan.REPLAY_IN)}", {}
        refusal = replan.replan_refusal(self.spec)
        if refusal:
            return False, refusal, {}
        try:
            groups = int(args.get("key_groups", self.spec.key_groups))
            doc = {**self.spec.raw, "key_groups": groups}
            if args.get("plan") is not None:  # a new grouping of the Python operators
                doc["plan"] = args["plan"]
            new_spec = definition.validate(doc)
        except (TypeError, ValueError) as exc:
            return False, f"{'plan' if args.get('plan') is not None else 'key_groups'}: "\
                f"{exc}", {}
        old = self.generation
        if replan.last_committed(old.checkpoint) is None:
            return False, "the query has not committed a batch yet: nothing to hand over", {}
        number = max(self.arbiter.generations) + 1
        gdir = self.run_dir / f"gen-{number}"
        t_request = time.time()
        self.bus.publish_event(RunnerEvent.REPLAN_STARTED, scheme=scheme, generation=number,
                               from_groups=old.key_groups, to_groups=groups)
        self.replanning = True
        new = replan.Generation(number, groups, gdir / "checkpoint")
        sc = self.spark.sparkContext
        # The snapshot's jobs, and the new query's until its first batch sets its own
        # (its stream thread inherits this thread's local properties), yield the
        # executors to the forwarding query (session.py, fairscheduler.xml).
        sc.setLocalProperty("spark.scheduler.pool", replan.POOL_CATCHING_UP)
        try:
            facts = self._hand_over(old, new, new_spec, scheme, gdir, replay_in)
        except Exception as exc:
            self._abandon(new)
            if scheme == "stop-restart" or not (old.query and old.query.isActive):
                self.replanning = False
                raise  # the old query is gone: the run cannot go on
            old.pause_s = 0.0
            self.replanning = False
            reason = f"{type(exc).__name__}: {exc}"[:500]
            self.bus.publish_event(RunnerEvent.REPLAN_FAILED, generation=number,
                                   reason=reason)
            return False, f"re-plan abandoned, generation {old.number} goes on: {reason}", {}
        finally:
            sc.setLocalProperty("spark.scheduler.pool", None)
        self.replanning = False
        t_switch = facts["switched_at"]
        # Measure the span the way Gloss §9.1 does, SETTLE_S past the switch.
        self.stop_event.wait(max(0.0, t_switch + replan.SETTLE_S - time.time()))
        schedule = self.spec.schedule()
        measured = replan.gloss_metrics(list(self.metrics.history), t_request,
                                        t_switch + replan.SETTLE_S,
                                        lambda t: schedule.records_by(t - self.t0),
                                        baseline_from=self.last_replan_end,
                                        trigger_s=self.spec.trigger_ms / 1000.0)
        self.last_replan_end = t_switch + replan.SETTLE_S
        summary = {"scheme": scheme, "generation": number, "from_groups": old.key_groups,
                   "to_groups": groups, "requested_at": t_request, **facts,
                   **measured.as_dict()}
        if new_spec.pe_plan is not None and args.get("plan") is not None:
            summary["plan"] = new_spec.pe_plan.as_dict()
        self.bus.publish_event(RunnerEvent.REPLAN_DONE, **summary)
        what = (f"{len(new_spec.pe_plan.pes)} PE(s)" if "plan" in summary and new_spec.pe_plan
                else f"{old.key_groups} -> {groups} key groups")
        message = (f"re-planned {what} ({scheme}): "
                   f"downtime {measured.downtime_s} s, disrupted {measured.disrupted_s} s, "
                   f"overlap {facts['overlap_s']:.1f} s")
        return True, message, summary

    def _hand_over(self, old: replan.Generation, new: replan.Generation,
                   spec: definition.PipelineSpec, scheme: str, gdir: Path,
                   replay_in: str = "auto") -> dict[str, Any]:
        from pipelines.runtime.query.compiler import Seed

        started = time.time()
        if scheme == "stop-restart":
            # Gloss §4.1: no output from here until the new query's. Its batch in
            # flight, if forwarded, is written first (else its range would be lost).
            self.arbiter.retire(old)
            self._stop_written(old)
        import shutil

        shutil.rmtree(gdir, ignore_errors=True)
        gdir.mkdir(parents=True)
        batch = replan.last_committed(old.checkpoint)
        assert batch is not None
        forwarded = self.arbiter.last_forwarded.get(old.number)
        if scheme == "stop-restart" and forwarded is not None and forwarded < batch:
            # A batch it ran after being retired was discarded but committed: hand over
            # the state at the end of what was forwarded, or that range would be lost.
            batch = forwarded
        start = replan.batch_end(old.checkpoint, batch)
        new.start = start
        snap = time.perf_counter()
        transfer: dict[str, Any] = {}
        if spec.graph is not None:
            # No snapshot: the new generation replays the records its state depends on.
            new.start = replan.replay_start(spec, start, self.t0)
            seed = Seed(new.start, None, None,
                        replan.replay_ends(old.checkpoint, batch,
                                           self.arbiter.forwarded_end, new.start))
            rows = start - new.start
            if scheme == "seamless" and replan.replays_in_process(spec, start, new.start,
                                                                  replay_in):
                transfer = self._reseed(spec, old, batch, seed, new, gdir)
            # Else the new query replays in this application, beside the old one.
        elif scheme == "seamless":
            seed = Seed(start, gdir / "snapshot", None)
            transfer = self._reseed(spec, old, batch, seed, new, gdir)
            rows = transfer["rows"]
        elif spec.stateful.type == "hft_window":
            op = spec.stateful
            rows = replan.write_window_snapshot(self.spark, old.checkpoint, batch, op.key,
                                                gdir / "snapshot")
            seed = Seed(start, gdir / "snapshot", None, self._up_to_forwarded(start))
        else:
            op = spec.stateful
            rows = replan.write_snapshot(self.spark, old.checkpoint, batch, op.key, op.agg,
                                         gdir / "snapshot")
            seed = Seed(start, gdir / "snapshot", gdir / "hold",
                        self._up_to_forwarded(start))
        snapshot_s = transfer.get("snapshot_s", time.perf_counter() - snap)
        # A watermark's output (windows closing) depends on where the batch before began:
        # a dataflow generation takes over only after a batch aligned with the old one's.
        if scheme == "seamless" and spec.trigger_ms:
            # Its batches take turns with the old query's (source.wait_for_forwarded).
            seed = dataclasses.replace(seed, gate=gdir / "gate.json")
        self.arbiter.propose(new, aligned=spec.graph is not None, gate=seed.gate,
                             trigger_s=spec.trigger_ms / 1000.0)
        self.spark.conf.set("spark.sql.shuffle.partitions", str(new.key_groups))
        if seed.gate is not None:
            # Started in the old query's idle time too: a query's start (its analysis
            # and first planning on this driver, its source's Python worker) took CPU
            # from the old query's batch when it fell inside one.
            from pipelines.runtime.query.source import wait_for_forwarded

            wait_for_forwarded(seed.gate, new.start)
        self._start_generation(new, spec, seed)
        new_started = time.time()
        deadline = new_started + replan.CATCH_UP_TIMEOUT_S
        while not self.arbiter.switched.wait(0.2):
            if self.stop_event.is_set():
                raise replan.ReplanError("the run is stopping")
            if not new.query.isActive:
                exc = new.query.exception()
                raise replan.ReplanError(f"the new query ended: {exc}")
            if time.time() > deadline:
                raise replan.ReplanError(f"the new query had not caught up after "
                                         f"{replan.CATCH_UP_TIMEOUT_S:.0f} s")
            if scheme == "seamless":
                old.pause_s = replan.throttle_pause(time.time() - new_started, old.batch_s)
        old.pause_s = 0.0
        switched_at = self.arbiter.switched_at or time.time()
        self.bus.publish_event(RunnerEvent.REPLAN_SWITCHED, generation=new.number,
                               key_groups=new.key_groups, epoch=self.arbiter.last_epoch,
                               after_batch=new.first_batch)
        if scheme == "seamless":
            try:
                self._stop_written(old)
            except replan.ReplanError as exc:  # the new query forwards already: go on
                print(f"re-plan: {exc}", file=sys.stderr, flush=True)
                old.query.stop()
        self._adopt(new, spec)
        return {"snapshot_batch": batch, "snapshot_rows": rows,
                "snapshot_s": round(snapshot_s, 2), "start_offset": start,
                "transfer_s": round(new_started - started, 2),
                "replayed": spec.graph is not None,
                # Where the new generation's state was built: a transfer process, or
                # this application (a replay here, or stop-and-restart's snapshot).
                "state_built_in": "process" if transfer else "application",
                "seed_s": transfer.get("seed_s"),
                # The transfer's time stopped while the forwarded query ran its batches.
                "transfer_gated_s": transfer.get("gated_s"),
                # Whether it ran only in the forwarded query's idle time (measured
                # beforehand: ``_gates_transfer``).
                "transfer_gated": "gated_s" in transfer,
                "overlap_from": new_started if scheme == "seamless" else started,
                "overlap_to": switched_at,
                "overlap_s": round(switched_at - new_started, 2)
                if scheme == "seamless" else 0.0,
                "catch_up_s": round(switched_at - new_started, 2),
                "switched_at": switched_at, "discarded_batches": self.arbiter.discarded,
                # Whether the new query computed the hand-over batch alone, the old one
                # waiting for it (replan.Arbiter.begin).
                "handed_over_alone": self.arbiter.yielded > 0}

    def _up_to_forwarded(self, start: int) -> tuple[int, ...]:
        """After a stop whose last forwarded batch was not committed, the new generation
        re-reads that range as one batch (discarded), so that its next begins where the
        forwarded output ends (a batch covering both would be neither forwarded nor
        waited for)."""
        end = self.arbiter.forwarded_end
        return (end,) if end is not None and end > start else ()

    def _reseed(self, spec: definition.PipelineSpec, old: replan.Generation, batch: int,
                seed: Any, new: replan.Generation, gdir: Path) -> dict[str, Any]:
        """Snapshot the old state and seed the new checkpoint with it in a process of its
        own at idle priority (``reseed.py``), while the old query runs on at full pace;
        the new query then resumes that checkpoint here.

        Idle priority can starve on a machine that other work keeps busy: Spark gives a
        Python worker it spawns 10 s to connect back (not configurable), and a transfer
        may make no progress at all. So a transfer that starves (``StarvationWatch``) is
        raised to ``reseed.LOW`` priority, and one that failed at idle priority is tried
        once more at low priority from scratch."""
        import shutil

        from pipelines.runtime.replan import transfer as reseed

        # Gated, it runs only between the run's batches: on every core of this machine.
        # Ungated, on one at idle priority beside the run's query.
        gated = self._gates_transfer(old)
        cores = (os.cpu_count() or 1) if gated else 1
        job = {"spec": spec.raw, "cores": cores, "t0": self.t0,
               "plan_dir": str(self.run_dir / "source-plan"),
               "old_checkpoint": str(old.checkpoint), "batch": batch, "start": seed.start,
               "first_ends": list(seed.first_ends),
               "snapshot": str(seed.snapshot) if seed.snapshot else None,
               "checkpoint": str(new.checkpoint),
               "result": str(gdir / "reseed-result.json")}
        if spec.graph is None:
            job.update(key=spec.stateful.key, agg=spec.stateful.agg,
                       window=spec.stateful.type == "hft_window")
        (gdir / "reseed-job.json").write_text(json.dumps(job))
        try:
            return self._reseed_once(gdir, old, reseed.IDLE, gated)
        except _TransferFailed as exc:  # not a timeout: that one had been raised already
            if self.stop_event.is_set() or not (old.query and old.query.isActive):
                raise
            print(f"re-plan: the state transfer at idle priority failed ({exc}); trying "
                  "again at low priority", file=sys.stderr, flush=True)
        shutil.rmtree(new.checkpoint, ignore_errors=True)
        if seed.snapshot:
            shutil.rmtree(seed.snapshot, ignore_errors=True)
        return self._reseed_once(gdir, old, reseed.LOW, gated)

    def _gates_transfer(self, forwarded: replan.Generation) -> bool:
        """Whether a state transfer runs only between the forwarded query's batches
        (``reseed.TransferGate``): on a processing-time trigger whose interval its
        recent batches left partly idle (``replan.GATE_IDLE_MIN``, measured);
        back-to-back batches leave no time to run in."""
        trigger_s = self.spec.trigger_ms / 1000
        return trigger_s > 0 and forwarded.leaves_idle_time(trigger_s)

    def _reseed_once(self, gdir: Path, old: replan.Generation,
                     priority: str, gated: bool) -> dict[str, Any]:
        import subprocess

        from pipelines.runtime.replan import transfer as reseed

        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        with open(gdir / "reseed.log", "ab") as log:
            log.write(f"{TRANSFER_LOG_MARK} {priority} priority\n".encode())
            log.flush()
            # A session of its own: its JVM and Python workers end with it.
            proc = subprocess.Popen([sys.executable, "-m", "pipelines.runtime.replan.transfer",
                                     "--priority", priority, str(gdir / "reseed-job.json")],
                                    cwd=PROJECT_ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + replan.CATCH_UP_TIMEOUT_S
        watch = reseed.StarvationWatch(proc.pid) if priority == reseed.IDLE else None
        # Its own session: the process group is the transfer's (its JVM, Python workers).
        gate = reseed.TransferGate(proc.pid) if gated else None
        self.transfer_gate = gate
        try:
            while proc.poll() is None:
                if self.stop_event.wait(0.2) or time.monotonic() > deadline:
                    raise replan.ReplanError("the run is stopping" if self.stop_event.is_set()
                                             else "the state transfer took longer than "
                                             f"{replan.CATCH_UP_TIMEOUT_S:.0f} s")
                if not (old.query and old.query.isActive):
                    raise replan.ReplanError("the old query ended during the transfer")
                if watch is not None and watch.starved(gate.held_s if gate else 0.0):
                    watch = None
                    raised = reseed.raise_priority(proc.pid)
                    print(f"re-plan: the state transfer got less than "
                          f"{reseed.STARVED_SHARE:.0%} of a core for "
                          f"{reseed.STARVED_WINDOW_S:.0f} s at idle priority; raised "
                          f"{raised} threads to low priority", file=sys.stderr, flush=True)
        finally:
            self.transfer_gate = None
            if gate is not None:
                gate.close()
            # The whole session: a JVM or Python worker left behind would take the CPU
            # the run needs.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if proc.returncode != 0:
            text = (gdir / "reseed.log").read_text(errors="replace")
            tail = text.rsplit(TRANSFER_LOG_MARK, 1)[-1].strip().splitlines()[1:]
            errors = [ln for ln in tail if "Error" in ln or "Exception" in ln] or tail
            raise _TransferFailed(f"the state transfer failed: {errors[-1][:300]}"
                                  if errors else "the state transfer failed")
        result = json.loads((gdir / "reseed-result.json").read_text())
        if gate is not None:
            result.update(gated_s=round(gate.held_s, 1), gate_holds=gate.holds)
        return result

    def _write_pe_plan(self, spec: definition.PipelineSpec, gen: replan.Generation) -> None:
        """The Python operators' PEs the forwarding query runs (``pe-plan.json``, read by
        the run's "Optimise plan" page with the profile its PEs write beside it)."""
        if spec.pe_plan is None or not spec.pe_plan.pes:
            return
        doc = {"generation": gen.number, "since": time.time(), **spec.pe_plan.as_dict()}
        tmp = self.run_dir / "pe-plan.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.run_dir / "pe-plan.json")

    def _adopt(self, new: replan.Generation, spec: definition.PipelineSpec) -> None:
        """The new generation is the run's query: placement, metrics and commands act
        on it from its next batch."""
        self._write_pe_plan(spec, new)
        self.routing.abort("the query was re-planned")
        routing = elastic.RoutingTable(spec.key_groups)
        self.metrics.adopt(spec, routing, new.checkpoint)
        self.reconfig.spec, self.reconfig.routing = spec, routing
        self.spec, self.routing = spec, routing
        self.coord = placement.StateStoreCoordinatorView(
            self.spark, str(new.query.runId), new.checkpoint, spec.key_groups)
        old, self.query, self.sink, self.generation = (self.generation, new.query,
                                                       new.sink, new)
        old.adopted = False
        new.adopted = True

    def _stop_written(self, gen: replan.Generation) -> None:
        """Stop ``gen``'s query once the output it was forwarding is written."""
        if not self.arbiter.wait_written(gen, replan.CATCH_UP_TIMEOUT_S):
            raise replan.ReplanError(f"generation {gen.number}'s forwarded batch was not "
                                     f"written within {replan.CATCH_UP_TIMEOUT_S:.0f} s")
        # ... and reported: a stopped query's last progress event never comes, and the
        # run's metrics (and the re-plan's own measurement) would miss that batch.
        last = self.arbiter.last_forwarded.get(gen.number)
        deadline = time.monotonic() + REPORT_WAIT_S
        while (last is not None and self.metrics.reported.get(gen.number, -1) < last
               and time.monotonic() < deadline):
            time.sleep(0.05)
        gen.query.stop()

    def _abandon(self, new: replan.Generation) -> None:
        self.arbiter.withdraw(new)
        if new.query is not None:
            try:
                new.query.stop()
            except Exception:  # a failed query can raise on stop; it is gone either way
                pass

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
        if self.spark is not None:
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


class _TransferFailed(replan.ReplanError):
    """A seamless re-plan's state-transfer process ended with an error."""


# Heads each attempt's part of reseed.log: a failure is read from its own attempt's lines.
TRANSFER_LOG_MARK = "--- state transfer at"


# How long a generation about to be stopped may take to report its last forwarded batch
# (Spark's progress event comes ~0.1 s after the sink returns).
REPORT_WAIT_S = 5.0
# After SIGTERM a runner is gone within this long (Runner.terminate).
SIGTERM_EXIT_S = 8.0


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
    signal.signal(signal.SIGTERM, lambda *_: runner.terminate())
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

    signal.signal(signal.SIGTERM, withdraw)
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
