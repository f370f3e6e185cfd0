"""Launching runner processes and talking to them (control-plane side)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings

from pipelines.runtime import bus as busmod
from pipelines.runtime import cluster


class LaunchError(RuntimeError):
    pass


def run_bus(run: Any) -> busmod.RunBus:
    return busmod.RunBus(busmod.connect(settings.REDIS_URL), run.bus_key)


def master_url() -> str:
    """The cluster manager URL: the embedded standalone master unless configured."""
    if settings.SPARK_MASTER_URL != "embedded":
        return settings.SPARK_MASTER_URL
    info = cluster.load(Path(settings.SPARK_DIR))
    if info is None:
        raise LaunchError("the embedded Spark cluster is not running (no "
                          f"{settings.SPARK_DIR}/cluster.json); start the product with "
                          "`make run` or set SPARK_MASTER_URL")
    try:
        cluster.master_json(info.master_web)
    except OSError as exc:
        raise LaunchError(f"the embedded Spark master at {info.master_web} does not "
                          f"answer ({exc}); restart the product") from exc
    return info.master_url


def spawn_detached(args: list[str], log_path: Path, cwd: Path, env: dict[str, str]) -> int:
    """Start ``args`` in its own session, not as our child (double fork), so the runner
    outlives a worker restart and never lingers as our zombie. Returns its pid."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # intermediate child: start the runner, report its pid, vanish
        try:
            os.close(read_fd)
            os.setsid()
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                        close_fds=True)
            os.write(write_fd, str(proc.pid).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd) as r:
        text = r.read()
    if not text:
        raise LaunchError(f"runner did not start; see {log_path}")
    return int(text)


def launch_runner(config: dict[str, Any], checkpoint_dir: Path) -> int:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = checkpoint_dir / "runner.json"
    cfg_path.write_text(json.dumps(config, indent=1))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the runner has no Django
    return spawn_detached([sys.executable, "-m", RUNNER_MODULE, str(cfg_path)],
                          checkpoint_dir / "runner.log", Path(settings.BASE_DIR), env)


RUNNER_MODULE = "pipelines.runtime.runner"


def process_state(pid: int | None) -> str:
    """'alive', 'gone' or 'zombie' for a runner pid on this machine.

    A pid whose command line is not a runner's counts as gone: pids are reused, and
    we only ever signal processes we started.
    """
    if not pid:
        return "gone"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return "zombie"
    return "alive" if RUNNER_MODULE.encode() in cmdline else "gone"


def tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
