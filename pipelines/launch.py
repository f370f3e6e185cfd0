"""Launching runner processes and talking to them (control-plane side)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.conf import settings

from pipelines.runtime import bus as busmod
from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.host import priority, secretfile
from pipelines.runtime.runner import standby as sb


class LaunchError(RuntimeError):
    pass


def run_bus(run: Any) -> busmod.ControlBus:
    """The control plane's side of ``run``'s bus."""
    return busmod.ControlBus(busmod.connect(settings.REDIS_URL), run.bus_key)


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
            priority.lower_session()  # the data plane's (host.priority), for the runner
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


def write_runner_config(config: dict[str, Any], checkpoint_dir: Path) -> Path:
    """runner.json, private, with the Redis URL's password left out (the runner's
    environment carries it: ``_runner_env``)."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = checkpoint_dir / "runner.json"
    config = {**config, "redis_url": busmod.public_url(config["redis_url"])}
    secretfile.write_private(cfg_path, json.dumps(config, indent=1))
    return cfg_path


def launch_runner(config: dict[str, Any], checkpoint_dir: Path) -> int:
    cfg_path = write_runner_config(config, checkpoint_dir)
    return spawn_detached([sys.executable, "-m", RUNNER_MODULE, str(cfg_path)],
                          checkpoint_dir / "runner.log", Path(settings.BASE_DIR),
                          _runner_env())


RUNNER_MODULE = "pipelines.runtime.runner"
STANDBY_SPAWN_LOCK = "streamwise:standby:spawning"


def _runner_env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP=settings.SPARK_DRIVER_HOST,
               SPARK_DRIVER_HOST=settings.SPARK_DRIVER_HOST, PYTHONUNBUFFERED="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the runner has no Django
    env.update(busmod.password_env(settings.REDIS_URL))
    if settings.SPARK_MASTER_URL == "embedded":
        # The embedded cluster's shared secret (spark.authenticate); for another cluster
        # SPARK_AUTH_SECRET_FILE comes from the environment, if that cluster has one.
        env[cluster.SECRET_ENV] = str(Path(settings.SPARK_DIR) / cluster.SECRET_FILE)
    return env


def launch_standby(master: str) -> tuple[str, int]:
    """Start a standby runner on ``master``; returns (standby id, pid)."""
    standby_id = uuid.uuid4().hex[:12]
    work = Path(settings.STANDBY_ROOT) / standby_id
    work.mkdir(parents=True, exist_ok=True)
    cfg = sb.StandbyConfig(standby_id=standby_id,
                           redis_url=busmod.public_url(settings.REDIS_URL),
                           master_url=master, work_dir=str(work),
                           max_workers=settings.STANDBY_MAX_WORKERS,
                           executor_memory=settings.EXECUTOR_MEMORY,
                           runs=max(1, settings.STANDBY_RUNS))
    secretfile.write_private(work / "standby.json", json.dumps(asdict(cfg), indent=1))
    r = busmod.connect(settings.REDIS_URL)
    # Counted as alive at once, before its Python has started and set this itself.
    r.set(sb.alive_key(standby_id), 0, ex=60)
    pid = spawn_detached([sys.executable, "-m", RUNNER_MODULE, "--standby",
                          str(work / "standby.json")], work / "standby.log",
                         Path(settings.BASE_DIR), _runner_env())
    # Its pid at once (it sets the same itself once its Python is up): a stop of the
    # product meanwhile finds it (stop_standbys).
    r.set(sb.alive_key(standby_id), pid, ex=60)
    return standby_id, pid


def standby_ids(r: Any, state: str = "alive") -> set[str]:
    """Standbys alive (warming up or offered), or ``state="serving"``: serving a run after
    which they offer themselves again (STANDBY_RUNS)."""
    # SCAN walks the whole keyspace; the default 10 keys a call made it ~130 round trips
    # a pass over the test database's ~1,300 keys (the reconciler asks every second).
    return {key.split(":")[2]
            for key in r.scan_iter(f"streamwise:standby:*:{state}", count=1000)}


def maintain_standbys(settling_runs: int) -> str | None:
    """Start a standby when fewer than STANDBY_RUNNERS live, unless a run is starting or
    just started (a standby's warm-up would compete with it for the cores). Returns the
    new standby's id."""
    if settings.STANDBY_RUNNERS < 1 or settling_runs:
        return None
    r = busmod.connect(settings.REDIS_URL)
    if len(standby_ids(r) | standby_ids(r, "serving")) >= settings.STANDBY_RUNNERS:
        return None
    try:
        master = master_url()
    except LaunchError:
        return None  # no cluster (yet): nothing to keep warm
    if not r.set(STANDBY_SPAWN_LOCK, 1, nx=True, ex=30):
        return None
    standby_id, _pid = launch_standby(master)
    return standby_id


def claim_standby(config: dict[str, Any], checkpoint_dir: Path) -> sb.Offer | None:
    """Hand the run to a warm standby that fits it (its config written as for a cold
    runner); None if there is none. Offers that do not fit stay offered."""
    r = busmod.connect(settings.REDIS_URL)
    passed: list[str] = []
    claimed = None
    try:
        for _ in range(r.llen(sb.READY_KEY)):
            raw = r.lpop(sb.READY_KEY)
            if raw is None:
                break
            offer = sb.Offer.from_json(raw)
            if process_state(offer.pid) != "alive":
                continue  # died while offered: drop it
            if sb.fits(offer, config) is not None:
                passed.append(raw)
                continue
            claimed = offer
            break
    finally:
        for raw in passed:
            r.rpush(sb.READY_KEY, raw)
    if claimed is None:
        return None
    cfg_path = write_runner_config(config, checkpoint_dir)
    r.rpush(sb.config_key(claimed.standby_id), str(cfg_path))
    r.expire(sb.config_key(claimed.standby_id), 300)
    return claimed


def stop_standbys() -> int:
    """SIGTERM every standby that is still only a standby (``up`` on its way out)."""
    r = busmod.connect(settings.REDIS_URL)
    pids = set()
    while (raw := r.lpop(sb.READY_KEY)) is not None:
        pids.add(sb.Offer.from_json(raw).pid)
    for standby_id in standby_ids(r):
        raw_pid = r.get(sb.alive_key(standby_id))
        if raw_pid and raw_pid.isdigit() and int(raw_pid):
            pids.add(int(raw_pid))
    pids |= standby_pids_here()
    stopped = 0
    for pid in pids:
        if process_state(pid) == "alive":
            os.kill(pid, signal.SIGTERM)
            stopped += 1
    return stopped


def standby_pids_here() -> set[int]:
    """The standby runners on this machine started for this product: their command line
    names a config under STANDBY_ROOT. One just spawned has not yet said its pid on
    Redis, and a stop must not miss it (it would wait for a cluster that is gone)."""
    roots = {str(Path(settings.STANDBY_ROOT)), str(Path(settings.STANDBY_ROOT).resolve())}
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace")
                    for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if (RUNNER_MODULE in args and "--standby" in args
                and any(a.startswith(root + os.sep) for a in args for root in roots)):
            found.add(int(entry.name))
    return found


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


def runner_state(run: Any) -> str:
    """:func:`process_state` of ``run``'s runner pid, where 'alive' also means the process
    is this run's runner: its command line names the run's config, or the standby that
    took the run. Another runner that reused the pid counts as gone."""
    state = process_state(run.runner_pid)
    if state != "alive":
        return state
    try:
        cmdline = Path(f"/proc/{run.runner_pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return "gone"
    if run.checkpoint_dir and str(Path(run.checkpoint_dir) / "runner.json") in cmdline:
        return "alive"
    # The reconciler asks every second: the run's events only when it is not a plain launch.
    launched = run.events.filter(kind="runner_launched").order_by("-id").first()
    standby = launched.payload.get("standby") if launched else None
    if standby and str(Path(settings.STANDBY_ROOT) / standby / "standby.json") in cmdline:
        return "alive"
    return "gone"


def tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
