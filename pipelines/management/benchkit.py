"""What the product benchmarks (``bench_push``, ``bench_start``, ``bench_load``) share:
their operator, a free loopback port, the product's processes started with their logs
(and the embedded cluster under them), and waiting for daphne to listen."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

PASSWORD = "bench-pass-123"


def bench_operator() -> User:
    """Migrate the benchmark's database and return its operator (password PASSWORD)."""
    call_command("migrate", interactive=False, verbosity=0)
    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True,
                                                                       "is_superuser": True})
    user.set_password(PASSWORD)
    user.save()
    return user


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_logged(commands: dict[str, list[str]], logs: Path,
                 env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start each command in its own session (so that it can be ended as a group),
    its output in ``logs/<name>.log``."""
    from pipelines.management.processes import set_priority

    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, cmd in commands.items():
        procs.append(subprocess.Popen(cmd, cwd=settings.BASE_DIR, start_new_session=True,
                                      stdout=open(logs / f"{name}.log", "wb"),
                                      stderr=subprocess.STDOUT,
                                      env=dict(os.environ, **(env or {}))))
        set_priority(name, procs[-1].pid)
    return procs


def wait_port(port: int, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise CommandError(f"daphne did not start; see {log}")


def wait_ended(runs: Any, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until every run of the queryset ``runs`` has ended."""
    from pipelines.models import TERMINAL_STATUSES

    deadline = time.monotonic() + timeout_s
    while (runs.exclude(status__in=TERMINAL_STATUSES).exists()
           and time.monotonic() < deadline):
        time.sleep(0.5)


@dataclass
class Product:
    """The product's processes as ``up`` starts them, on the embedded Spark cluster."""

    port: int
    logs: Path
    cluster: Any
    procs: list[subprocess.Popen]

    def stop(self) -> None:
        """The processes (as groups), then the standby runners (the reconciler, while it
        lived, could start one after they were stopped), then the cluster."""
        from pipelines import launch
        from pipelines.runtime.cluster import standalone as cluster

        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            proc.wait(timeout=30)
        launch.stop_standbys()
        cluster.stop(self.cluster)


def start_product(out: Any) -> Product:
    """Start the embedded Spark cluster and the product's processes on a free port, and
    wait for daphne; ``out`` (a command's stdout) is told what is happening."""
    from pipelines.management.processes import end_on_sigterm, product_processes
    from pipelines.runtime.cluster import standalone as cluster

    end_on_sigterm()  # a killed benchmark leaves no runner or cluster behind
    var = Path(settings.VAR_DIR)
    logs = var / "bench-logs"
    port = free_port()
    out.write("starting the embedded Spark cluster and the product's processes…")
    info = cluster.start(Path(settings.SPARK_DIR))
    procs = start_logged(product_processes(port, var, f"bench-{port}@%h"), logs,
                         {"SPARK_MASTER_URL": info.master_url})
    product = Product(port=port, logs=logs, cluster=info, procs=procs)
    try:
        wait_port(port, logs / "web.log")
    except BaseException:
        product.stop()
        raise
    return product


def session_headers(user: User, port: int) -> dict[str, str]:
    """Headers of a browser tab logged in as ``user`` (a session in the database, as a
    login makes one) on the product at ``port``: what a WebSocket viewer presents."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}",
            "Origin": f"http://127.0.0.1:{port}"}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Viewer:
    """One WebSocket viewer of a run page: what it received, and when."""

    url: str
    latencies_ms: list[float] = field(default_factory=list)
    batches: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    opened: bool = False  # its snapshot arrived: pushes from now on reach it


async def _watch(headers: dict[str, str], viewer: Viewer, until: threading.Event) -> None:
    import websockets

    try:
        async with websockets.connect(viewer.url, additional_headers=headers,
                                      max_size=2 ** 24, open_timeout=120) as socket:
            while not until.is_set():
                try:
                    raw = await asyncio.wait_for(socket.recv(), timeout=1.0)
                except TimeoutError:
                    continue
                received = time.time()
                message = json.loads(raw)
                if message.get("kind") == "snapshot":
                    viewer.opened = True
                if message.get("kind") != "metrics":
                    continue
                for sample in message["samples"]:
                    viewer.batches.add(int(sample["batch_id"]))
                    if sample.get("written_at"):
                        viewer.latencies_ms.append((received - sample["written_at"]) * 1000)
    except Exception as exc:  # noqa: BLE001 - reported as the viewer's failure
        viewer.errors.append(f"{type(exc).__name__}: {exc}")


class Viewers:
    """WebSocket viewers of run pages (``urls``: one per viewer, or ``count`` of the one
    url), on a thread and event loop of their own."""

    def __init__(self, urls: str | Sequence[str], headers: dict[str, str],
                 count: int | None = None) -> None:
        if isinstance(urls, str):
            urls = [urls] * (count or 1)
        self.viewers = [Viewer(url) for url in urls]
        self.until = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(headers,), daemon=True)

    def _run(self, headers: dict[str, str]) -> None:
        async def main() -> None:
            await asyncio.gather(*(_watch(headers, v, self.until) for v in self.viewers))

        asyncio.run(main())

    def __enter__(self) -> Viewers:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.until.set()
        self.thread.join(timeout=60)

    def wait_open(self, timeout_s: float) -> float:
        """Until every viewer has its snapshot (returns the seconds waited); CommandError
        when one failed or the time is up."""
        started = time.monotonic()
        deadline = started + timeout_s
        while not all(v.opened for v in self.viewers):
            errors = [e for v in self.viewers for e in v.errors]
            if errors or time.monotonic() > deadline:
                opened = sum(v.opened for v in self.viewers)
                raise CommandError(f"{opened} of {len(self.viewers)} viewers connected "
                                   f"within {timeout_s:.0f} s; errors: {errors[:3]}")
            time.sleep(0.2)
        return time.monotonic() - started

    def latencies(self) -> list[float]:
        return [ms for v in self.viewers for ms in v.latencies_ms]
