"""Executor (worker) control for a running application, through the driver's JVM.

Facts this relies on (measured on pyspark 4.3, standalone cluster on 127.0.0.1):

* ``requestTotalExecutors(n, 0, emptyMap)`` raises the target; lowering it kills nothing.
* ``spark.cores.max`` is launched at application start, so a run starts with its
  maximum and releases down to its initial size before the query starts.
* Graceful scale-down is ``schedulerBackend.decommissionExecutor(id, info, true, false)``
  with the decommission settings the runner enables; the executor exits in ~6 s.

``start_scaling``/``scale_to`` release the newest executors; they are used before the
query starts, when no executor holds state. Once a query runs, the runner first
migrates an executor's key groups away and then decommissions exactly that executor
(``reconfigure.Reconfigurer.cmd_set_workers``); ``kill`` is Spark's blunt default, kept as the
benchmarks' baseline.
"""
from __future__ import annotations

import time
from typing import Any


class ExecutorControl:
    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext
        self.jsc = self.sc._jsc.sc()
        self.jvm = self.sc._jvm

    def ids(self) -> list[str]:
        """Executors registered with the driver now (the driver itself excluded)."""
        joined = self.jsc.getExecutorIds().mkString(",")
        ids = [x for x in joined.split(",") if x]
        return sorted(ids, key=lambda x: (len(x), x))

    def request_total(self, n: int) -> bool:
        return bool(self.jsc.requestTotalExecutors(n, 0, self.jvm.PythonUtils.toScalaMap({})))

    def decommission(self, executor_id: str, reason: str) -> bool:
        info_cls = self.jvm.org.apache.spark.scheduler.ExecutorDecommissionInfo
        info = info_cls.apply(reason, self.jvm.scala.Option.apply(None))
        backend = self.jsc.schedulerBackend()
        return bool(backend.decommissionExecutor(executor_id, info, True, False))

    def kill(self, executor_ids: list[str]) -> bool:
        """Kill executors at once (running tasks fail, their state reloads elsewhere);
        the target total drops with them so the cluster does not replace them."""
        return bool(self.jsc.killExecutors(self.jvm.PythonUtils.toSeq(executor_ids)))

    def wait_for(self, n: int, timeout_s: float, exact: bool = False) -> list[str]:
        """Wait until at least ``n`` (or exactly ``n``) executors are registered."""
        deadline = time.monotonic() + timeout_s
        while True:
            ids = self.ids()
            if (len(ids) == n) if exact else (len(ids) >= n):
                return ids
            if time.monotonic() >= deadline:
                return ids
            time.sleep(0.25)

    def keep_first(self, initial: int, launched: int, first_wait_s: float,
                   rest_wait_s: float, reason: str) -> tuple[list[str], list[str]]:
        """Before a query runs (no executor holds state yet): wait for the first
        ``initial`` executors, then briefly for the rest of the ``launched`` ones
        (standalone registers them at about the same time), and decommission the extras
        without waiting for them to exit: a decommissioning executor gets no new task.
        Returns (kept, released); fewer than ``initial`` are kept if no more came in time.
        """
        ids = self.wait_for(initial, first_wait_s)
        if not ids:
            raise RuntimeError(f"no executor registered within {first_wait_s:.0f}s; "
                               "is the Spark worker up and does it have free cores?")
        if launched > initial:
            ids = self.wait_for(launched, rest_wait_s)
        keep, extras = ids[:initial], ids[initial:]
        for extra in reversed(extras):
            self.decommission(extra, reason)
        return keep, extras

    def trim_to(self, n: int, timeout_s: float, reason: str) -> list[str]:
        """Before a query runs: decommission every executor past the first ``n``, those
        that register late too, until exactly ``n`` are registered (or ``timeout_s``
        passes; returns the ids then). Standalone launches ``spark.cores.max`` executors
        at the application's start and a lower target kills none of them: on a loaded
        machine some register after ``keep_first`` stopped waiting for them, and a
        standby offered "one executor" with three (CI saw a run adopt it so)."""
        self.request_total(n)
        asked: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while True:
            ids = self.ids()
            if len(ids) == n or time.monotonic() >= deadline:
                return ids
            for extra in ids[n:]:
                if extra not in asked:
                    self.decommission(extra, reason)
                    asked.add(extra)
            time.sleep(0.25)

    def start_scaling(self, n: int) -> tuple[list[str], list[str]]:
        """Ask for ``n`` executors now without waiting: raise the target, or decommission
        the newest extras. Returns (executors before, executors decommissioned)."""
        before = self.ids()
        if n > len(before):
            self.request_total(n)
            return before, []
        return before, [v for v in reversed(before[n:])
                        if self.decommission(v, f"streamwise: scale to {n} workers")]

    def scale_to(self, n: int, timeout_s: float = 60.0) -> tuple[list[str], list[str]]:
        """Reach ``n`` executors; returns (executors now, executors decommissioned)."""
        _before, released = self.start_scaling(n)
        return self.wait_for(n, timeout_s, exact=True), released
