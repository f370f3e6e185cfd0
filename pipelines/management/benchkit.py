"""What the product benchmarks (``bench_push``, ``bench_start``, ``bench_load``) share:
their operator, a free loopback port, the product's processes started with their logs
(and the embedded cluster under them), and waiting for daphne to listen."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
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
    logs.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(cmd, cwd=settings.BASE_DIR, start_new_session=True,
                             stdout=open(logs / f"{name}.log", "wb"),
                             stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
            for name, cmd in commands.items()]


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
