"""Where each key group's state lives, and what each group costs.

A *key group* is a state partition of the keyed operator (``spark.sql.shuffle.partitions``
= G). Spark itself keeps a group where its state store was last loaded: the driver's
``StateStoreCoordinator`` records, per state-store provider, the executor that reported
it active, and the stateful RDD asks the coordinator for each partition's preferred
location. Reporting another executor for a provider *between* micro-batches therefore
moves that group's task — and the reload of its state from the checkpoint, the backing
store — to that executor in the next batch (Megaphone's "configuration update", seed
003 §3.3; thesis §6.4.2's backing-store migration).

Three independent views, so a placement is never only believed:

* ``StateStoreCoordinatorView``: the routing table as the driver holds it (``getLocation``);
* ``SparkRest.stateful_tasks``: the executor that actually ran each group's task in a
  batch (the driver's REST API), with its duration, records and failures;
* ``group_state``: the bytes a group's reload reads from the checkpoint (latest snapshot
  plus the deltas/changelogs after it), i.e. the state a migration of that group moves.

This module never imports Django; the py4j pieces take the live SparkSession's objects.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXECUTOR_TAG = "executor_"  # ExecutorCacheTaskLocation's string form: executor_<host>_<id>
DEFAULT_STORE = "default"


def parse_location(text: str | None) -> tuple[str, str] | None:
    """``executor_<host>_<id>`` -> (host, executor id); anything else -> None."""
    if not text or not text.startswith(EXECUTOR_TAG):
        return None
    host, _, executor = text[len(EXECUTOR_TAG):].rpartition("_")
    return (host, executor) if host and executor else None


def state_root(checkpoint: Path | str) -> str:
    """The state root exactly as Spark qualifies it: ``file:<abs path>/state``
    (``file:///…`` or a bare path name different providers)."""
    return f"file:{Path(checkpoint).resolve()}/state"


def state_stores(checkpoint: Path | str) -> list[tuple[int, str]]:
    """Every (stateful operator id, store name) of a query, read from its checkpoint's
    ``state/<operator>/0/`` (an aggregation has the ``default`` store; a stream–stream
    join four, one directory each). Empty before the first batch commits."""
    root = Path(checkpoint) / "state"
    found: list[tuple[int, str]] = []
    try:
        operators = sorted(int(d.name) for d in root.iterdir() if d.name.isdigit())
    except OSError:
        return found
    for op in operators:
        part = root / str(op) / "0"
        try:
            entries = list(part.iterdir())
        except OSError:
            continue
        if any(_FILE_RE.match(e.name) for e in entries):
            found.append((op, DEFAULT_STORE))
        found.extend((op, e.name) for e in sorted(entries, key=lambda e: e.name)
                     if e.is_dir() and e.name != "SSTs" and not e.name.startswith("_"))
    return found


class StateStoreCoordinatorView:
    """Read and set the driver's state-store locations of a query's key groups.

    Key group g is partition g of *every* stateful operator (all share
    ``spark.sql.shuffle.partitions``): pinning g pins each operator's store for that
    partition, so a group's whole state moves together. The stores are found in the
    checkpoint once the first batch wrote them (until then: operator 0's default)."""

    def __init__(self, spark: Any, query_run_id: str, checkpoint: Path | str,
                 groups: int) -> None:
        self.jvm = spark.sparkContext._jvm
        self.coordinator = spark._jsparkSession.streams().stateStoreCoordinator()
        self.pkg = self.jvm.org.apache.spark.sql.execution.streaming.state
        self.run_uuid = self.jvm.java.util.UUID.fromString(query_run_id)
        self.checkpoint = Path(checkpoint)
        self.root = state_root(checkpoint)
        self.groups = groups
        self.stores: list[tuple[int, str]] = []
        self._providers: list[list[Any]] = []  # per store, per group
        self._discovered = False
        self._empty_seq = self.jvm.PythonUtils.toSeq([])
        self._refresh()

    def _refresh(self) -> None:
        if self._discovered:
            return  # a query's stores never change once written
        found = state_stores(self.checkpoint)
        self._discovered = bool(found)
        stores = found or [(0, DEFAULT_STORE)]
        if stores == self.stores:
            return
        self.stores = stores
        self._providers = [
            [self.pkg.StateStoreProviderId(self.pkg.StateStoreId(self.root, op, g, name),
                                           self.run_uuid) for g in range(self.groups)]
            for op, name in stores]

    def location(self, group: int) -> str | None:
        """Executor id the coordinator holds for ``group`` (None before its first batch):
        the first store's (a group's stores are pinned together)."""
        self._refresh()
        opt = self.coordinator.getLocation(self._providers[0][group])
        parsed = parse_location(opt.get() if opt.isDefined() else None)
        return parsed[1] if parsed else None

    def locations(self) -> list[str | None]:
        return [self.location(g) for g in range(self.groups)]

    def pin(self, group: int, executor: str, host: str) -> None:
        """Make ``executor`` the active instance of every store of ``group``: its next
        tasks prefer it."""
        self._refresh()
        for providers in self._providers:
            self.coordinator.reportActiveInstance(providers[group], host, executor,
                                                  self._empty_seq)


# ----------------------------------------------------------------------------- REST
@dataclass(frozen=True)
class TaskRecord:
    """One group's task in one batch, as the driver's status store saw it."""

    group: int
    executor: str
    duration_ms: int
    run_ms: int
    records: int  # shuffle records read: partially aggregated rows of the group
    locality: str
    status: str
    attempt: int
    host: str = ""  # the executor's host, as Spark's status store names it


@dataclass
class BatchTasks:
    batch_id: int
    tasks: dict[int, TaskRecord] = field(default_factory=dict)  # group -> successful task
    failed_tasks: int = 0
    stage_attempts: int = 0
    # Task run time summed over every stage of the batch (source read, partial
    # aggregation, the stateful stage): the executors' measured busy time.
    run_ms_total: int = 0


class SparkRest:
    """The driver UI's REST API (``/api/v1``) of the runner's own application.

    The job of batch ``b`` carries ``batch = b`` in its description (set by the stream
    execution); its stage with G tasks that reads a shuffle is the stateful stage.
    """

    BATCH_RE = re.compile(r"\bbatch = (\d+)\b")

    def __init__(self, ui_url: str, app_id: str, timeout_s: float = 5.0) -> None:
        self.base = f"{ui_url.rstrip('/')}/api/v1/applications/{app_id}"
        self.timeout_s = timeout_s
        self._job_batches: dict[int, int] = {}  # job id -> batch id (cache)

    def get(self, path: str) -> Any:
        """GET one resource; a timeout is retried once with a longer wait (the driver's
        UI answers slowly while the first batches compile)."""
        try:
            with urllib.request.urlopen(f"{self.base}/{path}", timeout=self.timeout_s) as r:
                return json.loads(r.read())
        except TimeoutError:
            with urllib.request.urlopen(f"{self.base}/{path}",
                                        timeout=self.timeout_s * 4) as r:
                return json.loads(r.read())

    def executors(self) -> list[dict[str, Any]]:
        """Active executors (driver excluded) with host, failed/completed task counts."""
        return [e for e in self.get("executors") if e.get("id") != "driver"]

    def jobs_of_batch(self, batch_id: int, job_ids: Sequence[int]) -> list[dict[str, Any]]:
        out = []
        for job_id in sorted(job_ids, reverse=True):
            known = self._job_batches.get(job_id)
            if known is not None and known < batch_id:
                break  # job ids grow with batches: everything older is older
            job = self.get(f"jobs/{job_id}")
            m = self.BATCH_RE.search(job.get("description") or "")
            self._job_batches[job_id] = int(m.group(1)) if m else -1
            if m and int(m.group(1)) == batch_id:
                out.append(job)
        if len(self._job_batches) > 4096:  # bounded: forget the oldest half
            for k in sorted(self._job_batches)[:2048]:
                del self._job_batches[k]
        return out

    def stateful_tasks(self, batch_id: int, job_ids: Sequence[int], groups: int,
                       keyed: bool = True) -> BatchTasks:
        """Per group, the successful task of the batch's stateful stage; with ``keyed``
        False (a pipeline without a stateful operator: no group to find) only the
        failed-task count, from the batch's jobs.

        Every request is served by the driver, which shares the machine with the
        executors: each asks for no more than it uses (stage summaries without their
        task data; only the stateful stage's task list)."""
        result = BatchTasks(batch_id)
        for job in self.jobs_of_batch(batch_id, job_ids):
            result.failed_tasks += int(job.get("numFailedTasks") or 0)
            if not keyed:
                continue
            for stage_id in job.get("stageIds") or []:
                try:
                    attempts = self.get(f"stages/{stage_id}?details=false")
                except urllib.error.HTTPError:
                    continue  # skipped stage (its shuffle output was reused)
                for stage in attempts:
                    result.run_ms_total += int(stage.get("executorRunTime") or 0)
                    if stage.get("numTasks") != groups or not stage.get("shuffleReadRecords") \
                            and not stage.get("shuffleReadBytes"):
                        continue
                    result.stage_attempts += 1
                    tasks = self.get(f"stages/{stage_id}/{stage['attemptId']}/taskList"
                                     f"?length={groups * 4}")
                    for t in tasks:
                        if t.get("status") != "SUCCESS":
                            continue
                        metrics = t.get("taskMetrics") or {}
                        shuffle = metrics.get("shuffleReadMetrics") or {}
                        result.tasks[int(t["index"])] = TaskRecord(
                            group=int(t["index"]), executor=str(t["executorId"]),
                            duration_ms=int(t.get("duration") or 0),
                            run_ms=int(metrics.get("executorRunTime") or 0),
                            records=int(shuffle.get("recordsRead") or 0),
                            locality=str(t.get("taskLocality") or ""),
                            status=str(t["status"]), attempt=int(t.get("attempt") or 0),
                            host=str(t.get("host") or ""))
        return result


def wait_for_rest(rest: SparkRest, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            rest.get("executors")
            return True
        except OSError:
            time.sleep(0.2)
    return False


# ----------------------------------------------------------------------- state files
@dataclass(frozen=True)
class GroupState:
    """What reloading one group's latest state reads from the checkpoint."""

    group: int
    version: int  # latest committed state version found (0 = none yet)
    bytes_to_load: int  # snapshot (+ its SST files) + every delta/changelog after it
    snapshot_version: int  # 0 = no snapshot yet: the whole delta chain is replayed
    keys_at_snapshot: int | None  # RocksDB snapshots record their key count


_FILE_RE = re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(delta|snapshot|changelog|zip)$")
_zip_cache: dict[tuple[str, float], tuple[int, int | None]] = {}


def _rocksdb_snapshot(path: Path, sst_dir: Path) -> tuple[int, int | None]:
    """Bytes a RocksDB snapshot (``<v>.zip`` + the SST files it lists) loads, and its
    key count. Cached per (file, mtime): snapshots are immutable once written."""
    key = (str(path), path.stat().st_mtime)
    if key in _zip_cache:
        return _zip_cache[key]
    total, keys = path.stat().st_size, None
    try:
        with zipfile.ZipFile(path) as z:
            text = z.read("metadata").decode()
        meta = json.loads(text.split("\n", 1)[1] if text.startswith("v") else text)
        for sst in meta.get("sstFiles", []):
            size = sst.get("sizeBytes")
            if size is None and (sst_dir / sst.get("dfsSstFileName", "")).exists():
                size = (sst_dir / sst["dfsSstFileName"]).stat().st_size
            total += int(size or 0)
        keys = meta.get("numKeys")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        pass  # a snapshot being written: count the zip alone this time
    if len(_zip_cache) > 10_000:
        _zip_cache.clear()
    _zip_cache[key] = (total, keys)
    return total, keys


def group_state(checkpoint: Path | str, group: int, operator_id: int = 0,
                store: str = DEFAULT_STORE) -> GroupState:
    """Reload cost of one store of ``group`` in the HDFS (``<v>.delta``/``<v>.snapshot``)
    or RocksDB (``<v>.changelog``/``<v>.zip`` + ``SSTs/``) layout of a Spark 4
    checkpoint."""
    directory = Path(checkpoint) / "state" / str(operator_id) / str(group)
    if store != DEFAULT_STORE:
        directory = directory / store
    deltas: dict[int, int] = {}
    snapshots: dict[int, tuple[int, int | None]] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return GroupState(group, 0, 0, 0, None)
    for entry in entries:
        m = _FILE_RE.match(entry.name)
        if not m:
            continue
        version, kind = int(m.group(1)), m.group(2)
        try:
            if kind in ("delta", "changelog"):
                deltas[version] = entry.stat().st_size
            elif kind == "snapshot":
                snapshots[version] = (entry.stat().st_size, None)
            else:
                snapshots[version] = _rocksdb_snapshot(entry, directory / "SSTs")
        except OSError:
            continue  # removed by maintenance while we listed
    latest = max([*deltas, *snapshots], default=0)
    base = max((v for v in snapshots if v <= latest), default=0)
    size, keys = snapshots.get(base, (0, None))
    size += sum(b for v, b in deltas.items() if base < v <= latest)
    return GroupState(group, latest, int(size), base, keys)


def state_bytes(checkpoint: Path | str, groups: int) -> list[int]:
    """Per key group, what reloading it reads: the sum over every stateful operator's
    stores (a group moves whole)."""
    per_operator = operator_state_bytes(checkpoint, groups)
    if not per_operator:
        return [group_state(checkpoint, g).bytes_to_load for g in range(groups)]
    return [sum(op.bytes[g] for op in per_operator) for g in range(groups)]


@dataclass(frozen=True)
class OperatorState:
    operator_id: int  # Spark's stateful operator id (0: the one nearest the sink)
    spark_name: str  # e.g. symmetricHashJoin, stateStoreSave ("" before its metadata)
    bytes: list[int]  # per key group: what reloading it reads


def operator_name(checkpoint: Path | str, operator_id: int) -> str:
    """The operator's name in its state metadata: ``state/<op>/_metadata/metadata``
    (v1), or per batch under ``_metadata/v2/`` (transformWithState)."""
    meta = Path(checkpoint) / "state" / str(operator_id) / "_metadata"
    try:
        v2 = sorted((p for p in (meta / "v2").iterdir() if p.name.isdigit()),
                    key=lambda p: int(p.name)) if (meta / "v2").is_dir() else []
        path = v2[-1] if v2 else meta / "metadata"
        lines = path.read_text().splitlines()
        doc = json.loads(next(ln for ln in lines if ln.startswith("{")))
        return str(doc["operatorInfo"]["operatorName"])
    except (OSError, StopIteration, ValueError, KeyError, TypeError):
        return ""


def operator_state_bytes(checkpoint: Path | str, groups: int) -> list[OperatorState]:
    """Per stateful operator, the bytes each key group's stores of it reload."""
    by_op: dict[int, list[int]] = {}
    for op, name in state_stores(checkpoint):
        sizes = by_op.setdefault(op, [0] * groups)
        for g in range(groups):
            sizes[g] += group_state(checkpoint, g, op, name).bytes_to_load
    return [OperatorState(op, operator_name(checkpoint, op), sizes)
            for op, sizes in sorted(by_op.items())]


# Spark's names of the state operators each dataflow node type compiles to.
SPARK_OPERATOR_NAMES = {"join": ("symmetricHashJoin",),
                        "window_aggregate": ("stateStoreSave",),
                        "window_top": ("stateStoreSave",),
                        "keyed_aggregate": ("stateStoreSave",),
                        "moving_mean": ("transformWithStateInPandasExec",
                                        "transformWithStateExec"),
                        "hft_window": ("transformWithStateInPandasExec",
                                       "transformWithStateExec")}


def operator_labels(nodes: Sequence[tuple[str, str]], operators: Sequence[OperatorState]
                    ) -> list[str]:
    """A name per Spark state operator: the dataflow node it runs (``nodes``: the
    stateful nodes' (id, type), inputs first). Spark numbers stateful operators from
    the sink down, so in a chain operator 0 is the last node; where the count or a
    name does not fit that, the label is Spark's own."""
    ordered = list(reversed(nodes))
    fits = len(ordered) == len(operators) and all(
        not op.spark_name or op.spark_name in SPARK_OPERATOR_NAMES.get(kind, ())
        for op, (_id, kind) in zip(operators, ordered, strict=True))
    if fits:
        return [node_id for node_id, _kind in ordered]
    return [f"operator {op.operator_id} ({op.spark_name or 'state'})" for op in operators]
