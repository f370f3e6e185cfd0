"""What the browser benchmarks (``bench_push``, ``bench_start``) share: their operator,
a free loopback port, the product's processes started with their logs, and waiting
for daphne to listen."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

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
