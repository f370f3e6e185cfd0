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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.runtime import bus as busmod

ROOT = Path(__file__).resolve().parents[2]


class HarnessError(RuntimeError):
    pass


class RunnerProcess:
    def __init__(self, work: Path, master_url: str, definition: dict[str, Any],
                 redis_url: str, run_id: int = 990_002, token: str = "harness",
                 **config: Any) -> None:
        self.work = Path(work)
        self.bus_key = busmod.bus_key(run_id, token)
        self.bus = busmod.RunBus(busmod.connect(redis_url), self.bus_key)
        self.config = {"run_id": run_id, "bus_key": self.bus_key, "redis_url": redis_url,
                       "master_url": master_url, "checkpoint_dir": str(self.work),
                       "definition": definition, **config}
        self.proc: subprocess.Popen | None = None
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._cursor = {busmod.metrics_key(self.bus_key): "0-0",
                        busmod.events_key(self.bus_key): "0-0"}

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> RunnerProcess:
        self.work.mkdir(parents=True, exist_ok=True)
        self.bus.reset()
        (self.work / "runner.json").write_text(json.dumps(self.config, indent=1))
        log = open(self.work / "runner.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines.runtime.runner",
                                      str(self.work / "runner.json")], cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT)
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
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 90.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.bus.send_command("stop", reason="harness")
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.poll(block_ms=10)

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
