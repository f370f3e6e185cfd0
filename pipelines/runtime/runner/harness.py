"""Drive one real runner process over the Redis bus, without the web app: what the
benchmarks and the runtime's Spark tests use (the product goes through Celery).

    with RunnerProcess(work, master_url, definition, redis_url, max_workers=2) as run:
        run.wait_batches(5)
        ack = run.command("set_workers", workers=2)
        ...
    # the runner is stopped (or terminated) on exit
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipelines.runtime import bus as busmod
from pipelines.runtime.host import secretfile
from pipelines.runtime.runner import standby as sb

ROOT = Path(__file__).resolve().parents[3]


class HarnessError(RuntimeError):
    pass


# A standby still warming ends its Spark application on SIGTERM (standby_main's
# withdraw, at most runner.SIGTERM_EXIT_S) before it is killed.
STANDBY_END_GRACE_S = 15.0


class StandbyPool:
    """Standby runners (``pipelines.runtime.runner.standby``) for a series of harness runs:
    the next ``RunnerProcess`` adopts a warm one instead of starting cold (the driver's
    JVM and SparkContext, an executor, the first micro-batch's class loading and Python
    workers: most of a short run's start, paid once per run otherwise). Its standbys
    offer themselves on the pool's own Redis lists, so the control plane never claims
    them.

    With ``runs_per_standby`` > 1 a standby serves that many runs one after another: a
    run that stopped cleanly gives it back (``RunnerProcess.stop``), reset to one
    executor and no query, and the next run adopts the same application. On the 2-core
    test machine a standby's own start took 42-200 s beside the other lane's tests
    (its warm-up 20-98 s of that): paid once per run, it was most of the Spark tests'
    start-up time and it took cores from the tests beside it.

    A new standby is started ``quiet_s`` after a run adopted the last one (or after a
    lent one was lost: a run terminated or failed, a standby that served its last run),
    not at once: the adopting run's own start (its first batch, a second executor)
    would otherwise compete with the warm-up for the cores. A run that comes sooner
    starts it at once and waits for it (a cold start beside a warm-up would pay both).
    A run the pool cannot serve (one it does not fit, or a standby that failed) starts
    cold, as without a pool."""

    def __init__(self, work: Path, master_url: str, redis_url: str, max_workers: int = 4,
                 executor_memory: str = "512m", quiet_s: float = 15.0,
                 runs_per_standby: int = 1) -> None:
        self.work = Path(work)
        self.master_url, self.redis_url = master_url, redis_url
        self.max_workers, self.executor_memory = max_workers, executor_memory
        self.quiet_s = quiet_s
        self.runs_per_standby = runs_per_standby
        self.key_prefix = f"streamwise:standby:pool:{uuid.uuid4().hex[:8]}"
        self.r = busmod.connect(redis_url)
        self._lock = threading.Lock()
        # Standbys warming or waiting for a run, oldest first: (id, process).
        self._idle: list[tuple[str, subprocess.Popen]] = []
        self._served: dict[str, int] = {}
        self._timer: threading.Timer | None = None
        self._closed = False
        self.adopted = 0
        self.reused = 0  # of the adopted: by a standby that had served a run before
        self.cold = 0

    def ready_key(self, standby_id: str) -> str:
        return f"{self.key_prefix}:{standby_id}:ready"

    def start(self) -> StandbyPool:
        self._launch()
        return self

    def _launch(self) -> None:
        with self._lock:
            if self._closed or self._idle:
                return
            standby_id = uuid.uuid4().hex[:12]
            work = self.work / standby_id
            work.mkdir(parents=True, exist_ok=True)
            cfg = sb.StandbyConfig(standby_id=standby_id,
                                   redis_url=busmod.public_url(self.redis_url),
                                   master_url=self.master_url, work_dir=str(work),
                                   max_workers=self.max_workers,
                                   executor_memory=self.executor_memory,
                                   ready_key=self.ready_key(standby_id),
                                   runs=self.runs_per_standby)
            secretfile.write_private(work / "standby.json",
                                     json.dumps(asdict(cfg), indent=1))
            proc = subprocess.Popen([sys.executable, "-m", "pipelines.runtime.runner",
                                     "--standby", str(work / "standby.json")], cwd=ROOT,
                                    stdout=open(work / "standby.log", "ab"),
                                    stderr=subprocess.STDOUT,
                                    env=_runner_env(self.redis_url))
            self._served[standby_id] = 0
            self._idle.append((standby_id, proc))

    def take(self, run_config: dict[str, Any], timeout_s: float = 300.0
             ) -> tuple[str, subprocess.Popen] | None:
        """The warm standby for a run with this config, once its offer is up (the
        standby id and its process), or None: start the run cold."""
        if self._timer is not None:
            # Runs in quick succession: start the next standby now and wait for it,
            # rather than start this run cold beside its warm-up.
            self._timer.cancel()
            self._timer = None
        self._launch()
        with self._lock:
            pending = self._idle[0] if self._idle else None
        if pending is None:  # closed
            self.cold += 1
            return None
        standby_id, proc = pending
        offer = sb.Offer(standby_id, proc.pid, self.master_url, self.max_workers,
                         self.executor_memory, "", 0.0)
        if sb.fits(offer, run_config) is not None:
            self.cold += 1  # kept for a run it fits
            return None
        with self._lock:
            self._idle.remove(pending)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            got = self.r.blpop([self.ready_key(standby_id)], timeout=1)
            if got is not None and sb.Offer.from_json(got[1]).standby_id == standby_id:
                self.adopted += 1
                self.reused += self._served[standby_id] > 0
                self._served[standby_id] += 1
                if self._served[standby_id] >= self.runs_per_standby:
                    self._launch_later()  # it ends with this run
                return standby_id, proc
        _end(proc, STANDBY_END_GRACE_S)
        self.cold += 1
        self._launch_later()
        return None

    def reusable(self, standby_id: str) -> bool:
        """Whether the standby serves another run after the one it serves now."""
        return self._served.get(standby_id, self.runs_per_standby) < self.runs_per_standby

    def give_back(self, standby_id: str, proc: subprocess.Popen) -> None:
        """A run on ``standby_id`` stopped cleanly: the standby resets its session and
        offers itself again, for the next run."""
        with self._lock:
            if not self._closed and proc.poll() is None:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                self._idle.insert(0, (standby_id, proc))
                return
        _end(proc, STANDBY_END_GRACE_S)

    def lost(self, standby_id: str) -> None:
        """A run on ``standby_id`` ended its process (terminated, failed, or its
        standby's last run): warm a new standby soon."""
        if self.reusable(standby_id):
            self._served[standby_id] = self.runs_per_standby
            self._launch_later()

    def _launch_later(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        timer = threading.Timer(self.quiet_s, self._launch)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def close(self) -> None:
        """End the standbys still warming or waiting (they withdraw their offers)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        if self._timer is not None:
            self._timer.cancel()
        for _standby_id, proc in idle:
            _end(proc, STANDBY_END_GRACE_S)
        for standby_id in self._served:
            self.r.delete(self.ready_key(standby_id))


def _runner_env(redis_url: str) -> dict[str, str]:
    """This process's environment, and the Redis password its runner.json leaves out."""
    return {**os.environ, **busmod.password_env(redis_url)}


def _end(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; nothing if it has ended already."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class RunnerProcess:
    # Set (e.g. by a test session) to start runs on its warm standbys.
    pool: StandbyPool | None = None
    # Every run this process started, for a report of where their time went
    # (``start_up``).
    started: list[RunnerProcess] = []

    def __init__(self, work: Path, master_url: str, definition: dict[str, Any],
                 redis_url: str, run_id: int = 990_002, token: str = "harness",
                 **config: Any) -> None:
        self.work = Path(work)
        self.bus_key = busmod.bus_key(run_id, token)
        self.bus = busmod.ControlBus(busmod.connect(redis_url), self.bus_key)
        self.config = {"run_id": run_id, "bus_key": self.bus_key, "redis_url": redis_url,
                       "master_url": master_url, "checkpoint_dir": str(self.work),
                       "definition": definition, **config}
        self.proc: subprocess.Popen | None = None
        # The pool and standby this run adopted, to give it back after a clean stop.
        self.standby: tuple[StandbyPool, str] | None = None
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._cursor = {busmod.metrics_key(self.bus_key): "0-0",
                        busmod.events_key(self.bus_key): "0-0"}

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> RunnerProcess:
        self.work.mkdir(parents=True, exist_ok=True)
        self.bus.reset()
        secretfile.write_private(self.work / "runner.json", json.dumps(
            {**self.config, "redis_url": busmod.public_url(self.config["redis_url"])},
            indent=1))
        self.started_at = time.time()
        self.warm = False
        RunnerProcess.started.append(self)
        pool = self.pool
        warm = pool.take(self.config) if pool is not None else None
        if pool is not None and warm is not None:
            standby_id, self.proc = warm
            self.warm = True
            self.standby = (pool, standby_id)
            pool.r.rpush(sb.config_key(standby_id), str(self.work / "runner.json"))
            return self
        log = open(self.work / "runner.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines.runtime.runner",
                                      str(self.work / "runner.json")], cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT,
                                     env=_runner_env(self.config["redis_url"]))
        return self

    def __enter__(self) -> RunnerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.stop()
        else:  # failing or being stopped (SIGTERM, Ctrl-C): no graceful 90 s
            self.terminate()

    def terminate(self, grace_s: float = 5.0) -> None:
        """End the runner fast: SIGTERM (it stops its query and leaves), SIGKILL after
        ``grace_s`` (its driver JVM exits with it; its executors with the cluster)."""
        if self.proc is not None:
            _end(self.proc, grace_s)
        self._release()

    def stop(self, timeout_s: float = 90.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._release()
            return
        self.bus.send_command("stop", reason="harness")
        if self.standby is not None and self.standby[0].reusable(self.standby[1]):
            # The standby stays up for the next run: the run's end is its last event.
            deadline = time.monotonic() + timeout_s
            while not any(e["type"] == "stopped" for e in self.events):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    break
                self.poll()
            else:
                pool, standby_id = self.standby
                self.standby = None
                # No longer this run's process: a later terminate() must not end it.
                proc, self.proc = self.proc, None
                pool.give_back(standby_id, proc)
                return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.poll(block_ms=10)
        self._release()

    def _release(self) -> None:
        """The adopted standby's process ended with this run: the pool warms another."""
        if self.standby is not None:
            pool, standby_id = self.standby
            self.standby = None
            pool.lost(standby_id)

    def start_up(self) -> dict[str, float | bool | None]:
        """Seconds from ``start`` to the Spark application (the driver's JVM and
        SparkContext, or a standby adopted), its executors, the query, and the first
        batch's commit (its metrics record); None for what has not happened."""
        def at(kind: str) -> float | None:
            e = next((e for e in self.events if e["type"] == kind), None)
            return None if e is None else e["t"] - self.started_at

        first = min((m["t"] for m in self.metrics if "t" in m), default=None)
        return {"warm": self.warm, "session_s": at("session_started"),
                "executors_s": at("executors_ready"), "query_s": at("query_started"),
                "first_batch_s": None if first is None else first - self.started_at}

    @property
    def t0(self) -> float:
        return float(self.event("query_started")["t0"])

    # ------------------------------------------------------------------ reading
    def poll(self, block_ms: int = 500) -> int:
        """Read new metrics and events; returns how many arrived."""
        got = 0
        for key, entries in self.bus.r.xread(self._cursor, block=block_ms) or []:
            self._cursor[key] = entries[-1][0]
            for _id, fields in entries:
                got += 1
                if "e" in fields:
                    self.events.append(json.loads(fields["e"]))
                else:
                    self.metrics.append(json.loads(fields["m"]))
        return got

    def _check_alive(self) -> None:
        failed = [e for e in self.events if e["type"] == "failed"]
        if failed:
            raise HarnessError(f"runner failed: {failed[0].get('reason')}")
        if self.proc is not None and self.proc.poll() is not None:
            raise HarnessError(f"runner exited with code {self.proc.returncode}; see "
                               f"{self.work / 'runner.log'}")

    def event(self, kind: str) -> dict[str, Any]:
        for e in self.events:
            if e["type"] == kind:
                return e
        raise HarnessError(f"no {kind} event")

    def wait_until(self, predicate: Any, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            self._check_alive()
            if time.monotonic() > deadline:
                raise HarnessError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            self.poll()

    def wait_batches(self, n: int, timeout_s: float = 240.0) -> list[dict[str, Any]]:
        """Wait until ``n`` more batches than now have been published."""
        target = len(self.metrics) + n
        self.wait_until(lambda: len(self.metrics) >= target, timeout_s, f"{n} more batches")
        return self.metrics[target - n:]

    def command(self, name: str, timeout_s: float = 300.0, **args: Any) -> dict[str, Any]:
        """Send a command and wait for its acknowledgement (reading metrics meanwhile)."""
        command_id = self.bus.send_command(name, **args)
        cursor = "0-0"

        def acked() -> dict[str, Any] | None:
            nonlocal cursor
            for entry_id, fields in self.bus.r.xrange(busmod.acks_key(self.bus_key),
                                                      min=f"({cursor}" if cursor != "0-0"
                                                      else "-"):
                cursor = entry_id
                ack = json.loads(fields["a"])
                if ack.get("command_id") == command_id:
                    return ack
            return None

        return self.wait_until(acked, timeout_s, f"the acknowledgement of {name}")


# ------------------------------------------------------ benchmark workloads
def keyed_count(keys: int, rate: float, groups: int, burst_records: int,
                state_store: str = "rocksdb", burst_rate: float = 150_000.0) -> dict[str, Any]:
    """Uniform keys; a burst first so the state holds ~(1-1/e)·keys of them."""
    burst_s = max(1, int(burst_records / burst_rate))
    return {"source": {"type": "generator", "seed": 21, "partitions": 2,
                       "rate": {"kind": "step", "steps": [[0, burst_rate], [burst_s, rate]]},
                       "keys": {"kind": "uniform", "n": keys}},
            "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count",
                           "field": "value"}],
            "sink": {"type": "latency", "keep_output": True},
            "key_groups": groups, "max_records_per_batch": 400_000, "state_store": state_store}


def wait_steady(run: RunnerProcess, rate: float, batches: int, timeout_s: float = 600) -> None:
    """Wait out the burst: until a batch reads no more than ~3 s of input at ``rate``
    (or 1.5 triggers' worth, on a processing-time trigger longer than 2 s)."""
    trigger_s = float(run.config["definition"].get("trigger_ms") or 0) / 1000
    most = rate * max(3.0, 1.5 * trigger_s)
    run.wait_until(lambda: run.metrics and run.metrics[-1]["input_rows"] <= most,
                   timeout_s, "the burst backlog to clear")
    run.wait_batches(batches)
