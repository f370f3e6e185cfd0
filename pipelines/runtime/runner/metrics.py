"""The runner's metrics: one :class:`~pipelines.runtime.bus.MetricsRecord` per micro-batch.

Spark reports a batch in two places that arrive on different threads: the sink's commit
(``query.LatencySink``, in ``foreachBatch``) and the query's progress (a listener event
~0.1 s later). :class:`BatchMetrics` joins them into a record on the listener thread,
which must stay cheap, and a monitor thread adds what needs Spark's REST API (which
executor ran each key group, task times, state bytes), checks the batch against the
routing table and publishes the record. Per-group task times are also the load the
planners balance (thesis §6.4.3's key weight p_k·T_k, measured).
"""
from __future__ import annotations

import collections
import json
import queue
import statistics
import sys
from datetime import datetime
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

from pipelines.runtime import connectors
from pipelines.runtime.elastic import migration as elastic
from pipelines.runtime.elastic import placement
from pipelines.runtime.host import power
from pipelines.runtime.bus import MetricsRecord, RunnerBus, RunnerEvent
from pipelines.runtime.spec.definition import PipelineSpec

LOAD_WINDOW = 5  # batches over which a group's load is averaged


class BatchClock(Protocol):
    """What the metrics need of the runner at each batch (``runner.Runner``)."""

    t0: float
    workers: int
    freq_ghz: float

    def frequency_label(self) -> str: ...


def iso_to_epoch(stamp: str) -> float:
    """Spark's progress timestamp ('2026-11-22T03:04:18.123Z') as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def source_offset(raw: Any) -> int | None:
    """Our source's offset JSON ('{"offset": 123}') as an int; batch 0 has none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 0 if raw is not None else None
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:  # e.g. no latest offset reported yet at batch 0
        return None
    return int(doc["offset"]) if isinstance(doc, dict) and "offset" in doc else None


def parsed_offset(raw: Any) -> Any:
    """An offset's JSON text parsed (None if it is not JSON), anything else as it is:
    what ``source_offset`` and ``source_field`` read, parsed once for both."""
    if isinstance(raw, str) and raw.strip():
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None
    return raw


def source_field(raw: Any, name: str) -> float | None:
    """Another field of a source's reported offset (a Redis stream's
    ``entries_added``, ``behind_s``: ``broker_source``), None where absent."""
    if not raw or not isinstance(raw, (str, dict)):
        return None
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return None
    value = doc.get(name) if isinstance(doc, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


class BatchMetrics:
    """Builds, enriches and publishes each micro-batch's metrics record."""

    def __init__(self, spec: PipelineSpec, bus: RunnerBus, checkpoint: Path,
                 routing: elastic.RoutingTable, clock: BatchClock) -> None:
        self.spec = spec
        # The input's reach in offsets: a generator's schedule, a broker's newest entry.
        self.schedule = connectors.offset_clock(spec, lambda: clock.t0)
        # A broker's entries that did not convert, so far (None: the generator's never fail).
        self.dead_letters = connectors.dead_letter_counter(spec)
        self.bus = bus
        self.checkpoint = checkpoint
        self.routing = routing
        self.clock = clock
        self.meter = power.PowerMeter()
        self.batches = 0
        self.commits: dict[int, Any] = {}
        self.last_commit_at: float | None = None
        self.queue: queue.Queue[MetricsRecord] = queue.Queue()
        # The table each batch ran under (set between batches by the reconfigurer).
        self.placed_for: dict[int, list[str | None]] = {}
        self.group_ms: collections.deque[list[int]] = collections.deque(maxlen=LOAD_WINDOW)
        self.group_bytes: list[int] = [0] * spec.key_groups
        # The stateful operators (id, type), inputs first: what the state is named by.
        self.stateful_nodes = ([(n.id, n.type) for n in spec.graph.stateful]
                               if spec.graph is not None else
                               [(spec.stateful.type, spec.stateful.type)])
        self.last_ran_on: dict[int, str] = {}
        self.boundary_ms: float | None = None  # the last between-batches pause
        self.repinned = 0
        # For stall detection (progress_facts): what the query has read, how long
        # its recent batches took.
        self.last_source_end = 0
        self.batch_s: collections.deque[float] = collections.deque(maxlen=20)
        # Query run id -> generation (a live re-plan runs two queries for a while).
        self.generation_of: dict[str, int] = {}
        self.reported: dict[int, int] = {}  # generation -> its last batch with a record
        # The forwarded batches (commit time, records, p95 ms, Spark's trigger start),
        # for a re-plan's Gloss metrics (replan.gloss_metrics: 100 s before it and its
        # span).
        self.history: collections.deque[tuple[float, int, float | None, float]] = (
            collections.deque(maxlen=5000))

    def adopt(self, spec: PipelineSpec, routing: elastic.RoutingTable,
              checkpoint: Path) -> None:
        """A re-plan's new generation is the run's query from now on."""
        self.spec, self.routing, self.checkpoint = spec, routing, checkpoint
        self.placed_for = {}
        self.group_ms.clear()
        self.group_bytes = [0] * spec.key_groups
        self.last_ran_on = {}

    # ------------------------------------------------------------ listener thread
    def on_commit(self, commit: Any) -> None:
        """From the sink: a forwarded batch's commit (time, output rows)."""
        self.commits[(commit.generation, commit.batch_id)] = commit
        # Bounded: progress events normally arrive ~0.1 s after the commit.
        if len(self.commits) > 100:
            for stale in sorted(self.commits)[:-50]:
                self.commits.pop(stale, None)

    def on_progress(self, progress: Any) -> MetricsRecord | None:
        """From the listener: join Spark's progress with the sink's commit and queue
        the record for the monitor thread (the listener must stay cheap)."""
        from pipelines.runtime.query.compiler import latency_quantiles
        from pipelines.runtime.query.source import OBSERVATION

        generation = self.generation_of.get(str(progress.runId), 0)
        commit = self.commits.pop((generation, progress.batchId), None)
        if commit is None:  # not forwarded (the other generation's during a re-plan)
            return None
        row = progress.observedMetrics.get(OBSERVATION)
        observed = row.asDict() if row is not None else {}
        records = int(observed.get("records") or 0)
        interval = (commit.committed_at - self.last_commit_at) if self.last_commit_at else None
        self.last_commit_at = commit.committed_at
        lat = latency_quantiles(observed, commit.committed_at)
        source = next((src for src in progress.sources
                       if source_offset(src.endOffset) is not None),
                      progress.sources[0] if progress.sources else None)
        latest = parsed_offset(getattr(source, "latestOffset", None)) if source else None
        self.batches += 1
        record: MetricsRecord = {
            "batch_id": commit.epoch if commit.epoch is not None else progress.batchId,
            "spark_batch_id": progress.batchId,
            "generation": generation,
            "job_group": str(progress.runId),
            "t": commit.committed_at,
            "input_rows": int(progress.numInputRows),
            "records": records,
            "output_rows": commit.output_rows,
            "input_rate": float(progress.inputRowsPerSecond or 0.0),
            "processed_rate": float(progress.processedRowsPerSecond or 0.0),
            "scheduled_rate": self.schedule.rate_at(commit.committed_at - self.clock.t0),
            "output_rate": (records / interval) if interval else None,
            "batch_duration_ms": int(progress.durationMs.get("triggerExecution", 0)),
            "latency_p50_ms": lat["p50"], "latency_p95_ms": lat["p95"],
            "latency_p99_ms": lat["p99"], "latency_max_ms": lat["max"],
            "workers": self.clock.workers,
            "state_rows": sum(int(op.numRowsTotal) for op in progress.stateOperators),
            # Spark's own account of the batch, for cross-checks (pipelines.runtime.bench.sink):
            "trigger_started_at": iso_to_epoch(progress.timestamp),
            "durations_ms": {k: int(v) for k, v in progress.durationMs.items()},
            "source_start": source_offset(source.startOffset) if source else None,
            "source_end": source_offset(source.endOffset) if source else None,
            "source_latest": source_offset(latest) if source else None,
            # Where offsets do not count records (a Redis stream's packed IDs): the
            # records the source was ever given, and the seconds its newest is ahead
            # of the batch's end (control.live counts arrivals and backlog by these).
            "source_arrived": source_field(latest, "entries_added") if source else None,
            "source_behind_s": source_field(latest, "behind_s") if source else None,
            "boundary_ms": self.boundary_ms,
            "repinned": self.repinned,
            # Filled in by the monitor thread when it publishes:
            "frequency_ghz": 0.0, "frequency_source": "", "power_w": None,
            "power_source": "",
        }
        if record["source_end"] is not None:
            self.last_source_end = record["source_end"]
        self.batch_s.append(record["batch_duration_ms"] / 1000.0)
        self.history.append((commit.committed_at, records, lat["p95"],
                             record["trigger_started_at"]))
        self.reported[generation] = max(self.reported.get(generation, -1), progress.batchId)
        self.queue.put(record)
        return record

    def progress_facts(self, now: float) -> dict[str, Any]:
        """What the control plane judges a stall by (``pipelines.tasks``), for the
        heartbeat: when the last batch committed, whether the source has scheduled input
        the query has not read, and the median time of the recent batches. Empty before
        the first batch (a query's first batch is its slowest)."""
        if not self.batches or self.last_commit_at is None:
            return {}
        return {"last_batch_at": self.last_commit_at,
                "input_waiting": self.schedule.records_by(now - self.clock.t0)
                > self.last_source_end,
                "expected_batch_s": statistics.median(list(self.batch_s))}

    # ------------------------------------------------------------- monitor thread
    def monitor(self, rest: placement.SparkRest, tracker: Any, job_group: str,
                alive: Callable[[], bool]) -> None:
        """Per batch while ``alive()`` (until the runner has stopped): which executor ran each key group (REST), the
        groups' load and state bytes, drift from the routing table, migration-step
        verification; then the power reading; then publish the record."""
        while alive():
            try:
                record = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                group = record.get("job_group") or job_group
                self.enrich(record, rest.stateful_tasks(
                    record["spark_batch_id"], tracker.getJobIdsForGroup(group),
                    self.spec.key_groups, keyed=self.spec.keyed_state))
            except Exception as exc:  # a REST hiccup must not cost the batch's metrics
                record["monitor_error"] = f"{type(exc).__name__}: {exc}"[:300]
            reading = self.meter.read(record["workers"], self.clock.freq_ghz)
            record.update(frequency_ghz=self.clock.freq_ghz,
                          frequency_source=self.clock.frequency_label(),
                          power_w=reading.watts, power_source=reading.source)
            try:
                self.bus.publish_metrics(record)
            except Exception as exc:
                print(f"metrics publish failed: {exc!r}", file=sys.stderr, flush=True)

    def enrich(self, record: MetricsRecord, tasks: placement.BatchTasks) -> None:
        """Add the batch's per-group placement and load (its stateful ``tasks``)."""
        batch = record["spark_batch_id"]
        groups = self.spec.key_groups
        ran_on = {g: t.executor for g, t in tasks.tasks.items()}
        task_ms = {g: t.run_ms for g, t in tasks.tasks.items()}
        table = self.placed_for.get(batch) or self.routing.snapshot()
        drifted = [g for g, e in ran_on.items() if table[g] is not None and table[g] != e]
        operator_bytes = self._state_sizes()
        if len(task_ms) == groups:
            self.group_ms.append([task_ms[g] for g in range(groups)])
        record.update({
            "placement": table,
            "ran_on": [ran_on.get(g) for g in range(groups)],
            "drift": len(drifted),
            "group_moves": self._moves(ran_on),
            "group_ms": [task_ms.get(g) for g in range(groups)],
            "task_ms_total": tasks.run_ms_total,
            "group_records": [tasks.tasks[g].records if g in tasks.tasks else None
                              for g in range(groups)],
            "group_bytes": self.group_bytes,
            "operator_bytes": operator_bytes,
            "failed_tasks": tasks.failed_tasks,
            "dead_letters": self.dead_letters() if self.dead_letters else None,
            # Where each executor that ran a group lives: the placement card names it.
            "executor_hosts": {t.executor: t.host for t in tasks.tasks.values() if t.host},
            "migration": self._migration_now(),
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

    def _state_sizes(self) -> list[dict[str, Any]]:
        """Each stateful operator's state per key group, named by its node; the groups'
        totals kept in ``group_bytes`` (what migrations are paced by)."""
        groups = self.spec.key_groups
        operators = placement.operator_state_bytes(self.checkpoint, groups)
        self.group_bytes = ([sum(op.bytes[g] for op in operators) for g in range(groups)]
                            if operators else placement.state_bytes(self.checkpoint, groups))
        labels = placement.operator_labels(self.stateful_nodes, operators)
        return [{"operator": label, "bytes": op.bytes}
                for label, op in zip(labels, operators, strict=True)]

    def _moves(self, ran_on: dict[int, str]) -> int:
        """Groups whose task ran on another executor than in the previous batch: planned
        moves plus any Spark made by itself (each one reloads state)."""
        previous = self.last_ran_on
        moved = sum(1 for g, e in ran_on.items() if g in previous and previous[g] != e)
        self.last_ran_on = {**previous, **ran_on}
        return moved

    def _migration_now(self) -> dict[str, Any] | None:
        """The migration under way, as the batch's record names it."""
        active = self.routing.active
        if active is None or active.done.is_set():
            return None
        return {"id": active.id, "reason": active.reason, "strategy": active.strategy,
                "steps": len(active.steps), "applied": active.next_step}

    def loads(self) -> list[float]:
        """Per-group load: mean task run time over the last batches (thesis §6.4.3's
        key weight p_k·T_k, measured); uniform before the first full batch."""
        if not self.group_ms:
            return [1.0] * self.spec.key_groups
        cols = list(zip(*self.group_ms, strict=True))
        return [max(sum(c) / len(c), 1.0) for c in cols]
