"""Standby runners: a runner process whose Spark application is already up and warm,
waiting for the next run to adopt it.

From Start to the first chart point, a cold runner took ~27 s on the 2-core test
machine (bench_start): ~9 s for the driver's JVM and SparkContext, 3-4 s for the
executors, ~5 s before the query's first trigger and ~8 s for batch 0 itself (class
loading and JIT on the driver and executor, the executor's Python workers, state-store
code). A bare SparkSession with a one-row job took 13-15 s there. A second query on the
same session reached its first batch in ~3 s: nearly all of that cost is paid once per
application. So a standby pays it before anyone clicks Start: it builds the session
(``runner.build_session``), keeps one executor (decommissions the rest of
``spark.cores.max``), runs two micro-batches of a small keyed count through the real
source and sink, and then offers itself on Redis. ``start_run`` claims a fitting offer
(``fits``) and hands it the run's config; the standby becomes that run's runner (same
process, same pid, the run's SQL confs applied) and its log continues in the run's
``runner.log``. A standby configured to serve more than one run (``StandbyConfig.runs``:
the test harness's pool, the product's ``STANDBY_RUNS``, 1 by default so that no run
shares an application with an earlier one) goes back to waiting after a run that
stopped cleanly, its session reset (``Standby.reset``: no query, no listener, one
executor), so a series of short runs pays the application's start once. What it
cannot change (``spark.cores.max``, executor memory, the cluster) decides whether it
fits; a run it does not fit gets a cold runner as before. A run's own
``spark.locality.wait`` is set on the live context (``session.set_locality_wait``) and
the reset puts Spark's default back.

Redis contract (no Django here):

* ``READY_KEY``: a list of JSON offers (``Offer``); a claim is an atomic LPOP.
* ``alive_key(id)``: set with a TTL while the standby process lives (from its start,
  before its session is up), so the control plane counts the standbys still warming.
* ``config_key(id)``: the claimed standby BLPOPs the path of its run's config here.
* ``serving_key(id)``: set with a TTL while it serves a run after which it offers
  itself again.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.runtime import bus as busmod
from pipelines.runtime.spec import definition

READY_KEY = "streamwise:standby:ready"
ALIVE_TTL_S = 10
ALIVE_EVERY_S = 3.0
# An offer nobody claimed for this long is withdrawn and the standby ends (the
# control plane starts a fresh one): a long-lived idle application only holds memory.
MAX_IDLE_S = 6 * 3600.0

# Two micro-batches of the demo pipeline (filter, map, keyed count) at a small constant
# rate, through the real source and sink: loads and compiles what a run's first batch
# would otherwise pay for.
WARM_UP_DEFINITION: dict[str, Any] = {
    **definition.DEMO_DEFINITION,
    "source": {**definition.DEMO_DEFINITION["source"],
               "rate": {"kind": "constant", "records_per_s": 2000}},
}
WARM_UP_BATCHES = 2
# How long a standby waits for its executors to come to exactly one (the extras
# decommissioned and exited: ~6 s each here, longer on a loaded machine) before it
# gives up rather than offer more than it promises.
ONE_EXECUTOR_WAIT_S = 180.0


def alive_key(standby_id: str) -> str:
    return f"streamwise:standby:{standby_id}:alive"


def serving_key(standby_id: str) -> str:
    """Set with a TTL while a standby serves a run it will outlive (``runs`` > 1): the
    control plane counts it as a standby to come, not as one to replace."""
    return f"streamwise:standby:{standby_id}:serving"


def config_key(standby_id: str) -> str:
    return f"streamwise:standby:{standby_id}:config"


@dataclass(frozen=True)
class StandbyConfig:
    standby_id: str
    redis_url: str
    master_url: str
    work_dir: str
    max_workers: int = 4
    executor_memory: str = "512m"
    # Where it offers itself: the control plane's list, or a harness pool's own
    # (harness.StandbyPool), whose standbys no run of the control plane may claim.
    ready_key: str = READY_KEY
    # How many runs it serves one after another (see the module's docstring).
    runs: int = 1

    @classmethod
    def load(cls, path: str | Path) -> StandbyConfig:
        raw = json.loads(Path(path).read_text())
        cfg = cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})
        if cfg.max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        if cfg.runs < 1:
            raise ValueError("runs must be >= 1")
        return cfg


@dataclass(frozen=True)
class Offer:
    """A warm standby, as the control plane sees it on ``READY_KEY``."""
    standby_id: str
    pid: int
    master_url: str
    max_workers: int
    executor_memory: str
    app_id: str
    ready_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Offer:
        return cls(**json.loads(text))


def fits(offer: Offer, run_config: dict[str, Any]) -> str | None:
    """Why ``offer`` cannot serve a run with this runner config, or None if it can."""
    if offer.master_url != run_config.get("master_url"):
        return f"it runs on {offer.master_url}"
    wanted = int(run_config.get("max_workers", 2))
    if wanted > offer.max_workers:
        return f"the policy allows {wanted} workers, the standby's application {offer.max_workers}"
    memory = run_config.get("executor_memory", "512m")
    if memory != offer.executor_memory:
        return f"executor memory {memory} (the standby's: {offer.executor_memory})"
    return None


def warm_up(spark: Any, work_dir: Path) -> float:
    """Run WARM_UP_BATCHES micro-batches of WARM_UP_DEFINITION; returns the seconds."""
    from pipelines.runtime.query.compiler import LatencySink, build_stream
    from pipelines.runtime.query.session import apply_run_conf

    started = time.perf_counter()
    spec = definition.validate(WARM_UP_DEFINITION)
    apply_run_conf(spark, spec)
    committed: list[int] = []
    checkpoint = work_dir / "warm-up-checkpoint"
    shutil.rmtree(checkpoint, ignore_errors=True)
    query = (build_stream(spark, spec, time.time()).writeStream
             .foreachBatch(LatencySink(lambda c: committed.append(c.batch_id)))
             .outputMode(spec.output_mode).option("checkpointLocation", str(checkpoint))
             .queryName("streamwise_standby_warm_up").start())
    try:
        deadline = time.monotonic() + 300
        while len(committed) < WARM_UP_BATCHES:
            if not query.isActive:
                raise RuntimeError(f"warm-up query ended: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError("warm-up query made no progress in 300 s")
            time.sleep(0.1)
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    return time.perf_counter() - started


class Standby:
    """The standby's life before adoption: warm up, offer, wait for a run."""

    def __init__(self, cfg: StandbyConfig) -> None:
        self.cfg = cfg
        self.r = busmod.connect(cfg.redis_url)
        self.stop = threading.Event()
        self.adopted = threading.Event()
        self.spark: Any = None
        self.offer: Offer | None = None

    def _keep_set(self, key: str, ended: threading.Event) -> None:
        """Set ``key`` (this pid, a TTL) every ALIVE_EVERY_S from a thread, until ``ended``
        or ``self.stop`` is set; then delete it."""
        def loop() -> None:
            while not (ended.is_set() or self.stop.is_set()):
                try:
                    self.r.set(key, os.getpid(), ex=ALIVE_TTL_S)
                except Exception as exc:  # Redis away for a moment: the TTL tells the rest
                    print(f"standby heartbeat failed: {exc!r}", flush=True)
                ended.wait(ALIVE_EVERY_S)
            try:
                self.r.delete(key)
            except Exception:  # its TTL ends it
                pass

        threading.Thread(target=loop, name=key.rsplit(":", 1)[-1], daemon=True).start()

    def serve(self) -> str | None:
        """Warm up, offer, and return the path of the adopting run's config (None: the
        standby was stopped or idle too long, and withdrew its offer)."""
        from pipelines.runtime.elastic.executors import ExecutorControl
        from pipelines.runtime.query.session import (
            EXECUTOR_WAIT_S,
            EXTRA_EXECUTOR_WAIT_S,
            build_session,
        )

        cfg = self.cfg
        self._keep_set(alive_key(cfg.standby_id), self.adopted)
        started = time.perf_counter()
        self.spark = build_session(cfg.master_url, f"streamwise-standby-{cfg.standby_id}",
                                   cfg.max_workers, cfg.executor_memory)
        self.spark.sparkContext.setLogLevel("WARN")
        executors = ExecutorControl(self.spark)
        executors.keep_first(1, cfg.max_workers, EXECUTOR_WAIT_S, EXTRA_EXECUTOR_WAIT_S,
                             "streamwise standby: keep one executor")
        executors.request_total(1)
        warm_s = warm_up(self.spark, Path(cfg.work_dir))
        self._one_executor(executors)
        print(f"standby {cfg.standby_id} warm after {time.perf_counter() - started:.1f}s "
              f"(warm-up {warm_s:.1f}s), app {self.spark.sparkContext.applicationId}",
              flush=True)
        return self._offer_and_wait()

    def serve_again(self) -> str | None:
        """After a run that stopped cleanly on this standby's session: reset the session,
        offer it again and wait for the next run, as ``serve`` does."""
        started = time.perf_counter()
        self.reset()
        self.adopted.clear()
        self._keep_set(alive_key(self.cfg.standby_id), self.adopted)
        print(f"standby {self.cfg.standby_id} reset in {time.perf_counter() - started:.1f}s",
              flush=True)
        return self._offer_and_wait()

    def reset(self) -> None:
        """Leave the session as ``serve`` leaves it: no streaming query, no streaming
        listener (the run's ``Runner._shutdown`` removed its own), one executor and a
        target of one, Spark's default locality wait. A run's SQL confs stay: every run
        sets its own (``apply_run_conf``)."""
        from pipelines.runtime.elastic.executors import ExecutorControl
        from pipelines.runtime.query.session import set_locality_wait

        for query in self.spark.streams.active:
            query.stop()
        set_locality_wait(self.spark, None)
        self.spark.catalog.clearCache()
        self._one_executor(ExecutorControl(self.spark))

    def _one_executor(self, executors: Any) -> None:
        """Exactly one executor registered, the rest (late ones too) decommissioned and
        gone: what an offer promises a run (its first ``initial_workers`` are there)."""
        ids = executors.trim_to(1, ONE_EXECUTOR_WAIT_S, "streamwise standby: keep one executor")
        if len(ids) != 1:
            raise RuntimeError(f"the standby's executors did not come to one within "
                               f"{ONE_EXECUTOR_WAIT_S:g} s: {ids}")

    def _offer_and_wait(self) -> str | None:
        cfg = self.cfg
        self.offer = Offer(cfg.standby_id, os.getpid(), cfg.master_url, cfg.max_workers,
                           cfg.executor_memory, self.spark.sparkContext.applicationId,
                           time.time())
        offer_json = self.offer.to_json()
        self.r.rpush(cfg.ready_key, offer_json)
        print(f"standby {cfg.standby_id} ready, app {self.offer.app_id}", flush=True)
        idle_until = time.monotonic() + MAX_IDLE_S
        jsc = self.spark.sparkContext._jsc.sc()
        while True:
            got = self.r.blpop([config_key(cfg.standby_id)], timeout=2)
            if got:
                self.adopted.set()
                return got[1]
            if jsc.isStopped():
                self.r.lrem(cfg.ready_key, 1, offer_json)
                raise RuntimeError("the standby's Spark application ended (cluster gone?)")
            if self.stop.is_set() or time.monotonic() > idle_until:
                if self.r.lrem(cfg.ready_key, 1, offer_json):
                    return None
                # Already claimed: the run's config is on its way.
                got = self.r.blpop([config_key(cfg.standby_id)], timeout=10)
                if got and not self.stop.is_set():
                    self.adopted.set()
                    return got[1]
                return None

    def serving(self, done: threading.Event) -> None:
        """Keep ``serving_key`` set until ``done``: a run it will outlive is under way."""
        self._keep_set(serving_key(self.cfg.standby_id), done)

    def close(self) -> None:
        self.stop.set()
        try:
            self.r.delete(alive_key(self.cfg.standby_id))
        except Exception:
            pass
        if self.spark is not None and not self.adopted.is_set():
            self.spark.stop()
