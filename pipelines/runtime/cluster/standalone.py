"""The embedded Spark standalone cluster: one master and one worker on 127.0.0.1.

The pip ``pyspark`` package has ``bin/spark-class`` but no ``sbin/start-*.sh``, so the
master and worker are started as ``spark-class`` processes.

Spark's RPC is authenticated (``spark.authenticate``): the cluster directory keeps a
secret made once (``auth-secret``, mode 0600), master and worker read it from a
properties file (never from their command line, which ``ps`` shows), and an application
joins only with the same secret: ``session.build_session`` reads the file named by
``$SPARK_AUTH_SECRET_FILE``, which ``start`` sets for the processes started after it.
Executors get the secret from their worker in their environment, as Spark does. The
worker advertises more cores than the machine has: executors are 1-core and the
product asks for as many as the policy allows (standalone does not pin cores).

CLI::

    python -m pipelines.runtime.cluster start --dir var/spark   # prints the master URL
    python -m pipelines.runtime.cluster stop --dir var/spark
    python -m pipelines.runtime.cluster status --dir var/spark  # the master's workers

On another machine (same installation path, the cluster's ``auth-secret`` copied
there with mode 0600), a worker joins the master; the master must listen on an address
that machine reaches (``start --host``)::

    python -m pipelines.runtime.cluster worker --master spark://10.0.0.5:7077 \
        --host 10.0.0.6 --secret-file /etc/streamwise/auth-secret --dir var/spark-worker
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pyspark

from pipelines.runtime.cluster import classarchive
from pipelines.runtime.host import priority
from pipelines.runtime.host.secretfile import make_once

HOST = "127.0.0.1"
SECRET_FILE = "auth-secret"
SECRET_ENV = "SPARK_AUTH_SECRET_FILE"
# The options of every JVM Streamwise starts: the runs' drivers and executors
# (query.session), the cluster's master and workers, the verifier's local session;
# ``$STREAMWISE_JVM_OPTIONS`` replaces them (empty: the JVM's defaults). On 2 cores a
# run's JVMs spent much of their CPU in C2's compiler threads and G1's concurrent
# threads: with C1 only and the serial collector, two NEXMark runs (Q3, Q5: start,
# scale-up, rebalance, windows) took 0.79x the time at 76 % CPU against 89 % (twice
# each, alternating order). A batch here is dominated by its fixed costs, which C2's
# peak code does not shorten; the master and workers only schedule and relay, and a
# local session for a check lives seconds, so neither has use for C2 either.
JVM_OPTIONS_ENV = "STREAMWISE_JVM_OPTIONS"
DEFAULT_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def jvm_options() -> str:
    """``$STREAMWISE_JVM_OPTIONS`` (default ``DEFAULT_JVM_OPTIONS``) and the class
    archive's option (``classarchive.jvm_option``), as one string."""
    return " ".join(filter(None, (os.environ.get(JVM_OPTIONS_ENV, DEFAULT_JVM_OPTIONS).strip(),
                                  classarchive.jvm_option())))


class ClusterError(RuntimeError):
    pass


@dataclass
class ClusterInfo:
    master_url: str
    master_web: str
    master_pid: int
    worker_pid: int
    worker_cores: int
    secret_file: str = ""  # the shared secret of spark.authenticate ("" before it)


def spark_home() -> Path:
    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((HOST, port)) == 0


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as the master's JSON API reports it."""

    id: str
    host: str
    state: str  # ALIVE, DEAD, DECOMMISSIONED, ...
    cores: int
    cores_used: int
    memory_mb: int
    memory_used_mb: int

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"

    @property
    def cores_free(self) -> int:
        return max(0, self.cores - self.cores_used) if self.alive else 0


def workers(web_url: str) -> list[WorkerStatus]:
    """The master's workers (its ``/json/`` API), alive ones first."""
    found = [WorkerStatus(id=str(w.get("id", "")), host=str(w.get("host", "")),
                          state=str(w.get("state", "")), cores=int(w.get("cores", 0)),
                          cores_used=int(w.get("coresused", 0)),
                          memory_mb=int(w.get("memory", 0)),
                          memory_used_mb=int(w.get("memoryused", 0)))
             for w in master_json(web_url).get("workers", [])]
    return sorted(found, key=lambda w: (not w.alive, w.host, w.id))


def master_json(web_url: str) -> dict:
    """The master's ``/json/`` status. A master still starting may answer with an empty
    or partial body (its web server is up before the page is): that is an ``OSError``
    here, like a master not listening yet, so callers that poll retry on one exception."""
    with urllib.request.urlopen(f"{web_url}/json/", timeout=3) as resp:
        body = resp.read()
    try:
        return json.loads(body)
    except ValueError as exc:
        raise OSError(f"{web_url}/json/ answered {len(body)} bytes that are not JSON") from exc


def ensure_secret(workdir: Path) -> Path:
    """The cluster's shared secret, made once (``secretfile.make_once``)."""
    path = workdir / SECRET_FILE
    make_once(path, lambda: secrets.token_hex(32))
    return path


def read_secret(path: str | os.PathLike[str]) -> str:
    secret = Path(path).read_text().strip()
    if not secret:
        raise ClusterError(f"{path} is empty: no Spark authentication secret in it")
    return secret


def _daemon_properties(workdir: Path, secret_path: Path) -> Path:
    """Master and worker settings as a private properties file."""
    props = workdir / "daemon.conf"
    fd = os.open(props, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("spark.authenticate true\n"
                f"spark.authenticate.secret {read_secret(secret_path)}\n"
                # The REST submission gateway (6066, no authentication: anyone who
                # reaches it runs code) and the web UIs' kill links are off.
                "spark.master.rest.enabled false\n"
                "spark.ui.killEnabled false\n")
    return props


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab")
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    # The data plane's priority (host.priority): a session's, so the executors the
    # worker forks have it too.
    priority.lower_session_of(proc.pid)
    return proc


def _daemon_env(workdir: Path, host: str) -> dict[str, str]:
    daemon_options = " ".join(filter(None, (os.environ.get("SPARK_DAEMON_JAVA_OPTS", ""),
                                            jvm_options())))
    return dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP=host,
                SPARK_DAEMON_JAVA_OPTS=daemon_options,
                SPARK_WORKER_DIR=str(workdir / "work"), SPARK_LOG_DIR=str(workdir / "logs"),
                PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))


def _spark_class() -> str:
    return str(spark_home() / "bin" / "spark-class")


def start(workdir: Path, worker_cores: int = 8, worker_memory: str = "8g",
          port: int | None = None, timeout_s: float = 60.0, host: str = HOST,
          local_worker: bool = True) -> ClusterInfo:
    """Start the master on ``host`` (loopback unless workers on other hosts must reach
    it) and, unless ``local_worker`` is false, a worker beside it; wait until a worker
    is ALIVE in the master's JSON (without a local worker: only for the master)."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    web_port = free_port(host)
    secret_path = ensure_secret(workdir)
    props = str(_daemon_properties(workdir, secret_path))
    env = _daemon_env(workdir, host)
    log_from = _size(workdir / "master.log")  # (appended to, run after run)
    master = _spawn([_spark_class(), "org.apache.spark.deploy.master.Master", "--host", host,
                     "--port", str(port), "--webui-port", str(web_port),
                     "--properties-file", props], workdir / "master.log", env)
    url = f"spark://{host}:{port}"
    procs = [(master, "master")]
    worker = None
    if local_worker:
        worker = _spawn([_spark_class(), "org.apache.spark.deploy.worker.Worker", url,
                         "--host", host, "--cores", str(worker_cores),
                         "--memory", worker_memory, "--webui-port", str(free_port(host)),
                         "--work-dir", str(workdir / "work"), "--properties-file", props],
                        workdir / "worker.log", env)
        procs.append((worker, "worker"))
    info = ClusterInfo(master_url=url, master_web=f"http://{host}:{web_port}",
                       master_pid=master.pid, worker_pid=worker.pid if worker else 0,
                       worker_cores=worker_cores if worker else 0,
                       secret_file=str(secret_path))
    os.environ[SECRET_ENV] = str(secret_path)  # what this process starts next joins
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc, name in procs:
            if proc.poll() is not None:
                stop(info)
                raise ClusterError(f"Spark {name} exited with code {proc.returncode}; "
                                   f"see {workdir / (name + '.log')}")
        # Another process may take the free port between our look and the master's
        # bind: the master then moves on to the next one (Spark's port retry), and
        # whatever holds ours would never list our worker.
        bound = bound_ui_port(workdir / "master.log", log_from) or web_port
        info = replace(info, master_web=f"http://{host}:{bound}")
        try:
            ready = master_json(info.master_web)
            if not local_worker or any(w.get("state") == "ALIVE" for w in ready["workers"]):
                (workdir / "cluster.json").write_text(json.dumps(asdict(info)))
                return info
        except OSError:
            pass
        time.sleep(0.5)
    stop(info)
    raise ClusterError(f"Spark cluster not ready after {timeout_s:.0f}s; see {workdir}")


_UI_STARTED = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def bound_ui_port(master_log: Path, offset: int = 0) -> int | None:
    """The port the master's web UI bound, as its log says after ``offset`` (where this
    master's lines begin; None before it says)."""
    try:
        with open(master_log, "rb") as f:
            f.seek(offset)
            found = _UI_STARTED.search(f.read().decode(errors="replace"))
    except OSError:
        return None
    return int(found.group(1)) if found else None


def start_worker(workdir: Path, master_url: str, host: str, cores: int = 1,
                 memory: str = "1g", secret_file: Path | None = None,
                 netns: str | None = None, env: dict[str, str] | None = None,
                 timeout_s: float = 60.0, master_web: str | None = None) -> int:
    """Join a worker on ``host`` to the master at ``master_url`` with the cluster's
    secret (``secret_file``; default ``workdir``'s): what an operator runs on each
    further machine (``cluster worker``), and what the multi-host test runs inside a
    network namespace (``netns``: ``ip netns exec``). Returns its pid (its process
    group: ``stop_worker``). With ``master_web``, waits until the master lists it ALIVE."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    props = str(_daemon_properties(workdir, secret_file or ensure_secret(workdir)))
    daemon_env = {**_daemon_env(workdir, host), **(env or {})}
    args = [_spark_class(), "org.apache.spark.deploy.worker.Worker", master_url,
            "--host", host, "--cores", str(cores), "--memory", memory,
            "--webui-port", "0", "--work-dir", str(workdir / "work"),
            "--properties-file", props]
    if netns:
        args = ["ip", "netns", "exec", netns, *args]
    proc = _spawn(args, workdir / "worker.log", daemon_env)
    deadline = time.monotonic() + timeout_s
    while master_web and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterError(f"Spark worker on {host} exited with code "
                               f"{proc.returncode}; see {workdir / 'worker.log'}")
        try:
            if any(w.host == host and w.alive for w in workers(master_web)):
                return proc.pid
        except OSError:
            pass
        time.sleep(0.5)
    if master_web:
        stop_worker(proc.pid)
        raise ClusterError(f"the worker on {host} did not register with {master_url} "
                           f"within {timeout_s:.0f} s; see {workdir / 'worker.log'}")
    return proc.pid


def stop_worker(pid: int, grace_s: float = 5.0) -> None:
    """Stop a worker started by :func:`start_worker` (its executors die with it)."""
    stop(ClusterInfo("", "", 0, pid, 0), grace_s)


def stop(info: ClusterInfo, grace_s: float = 5.0) -> None:
    """Stop the worker (its executors die with it) and the master, by pid only: SIGTERM
    to both process groups, then SIGKILL to what is left after ``grace_s`` (one wait for
    both, so a benchmark being stopped is gone within seconds)."""
    pids = []
    for pid in (info.worker_pid, info.master_pid):
        if pid <= 0:  # no such process (a cluster without a local worker)
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
            pids.append(pid)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _exists(pid)]
        time.sleep(0.1)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended: reaped here if it is our child)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def load(workdir: Path) -> ClusterInfo | None:
    path = workdir / "cluster.json"
    if not path.exists():
        return None
    return ClusterInfo(**json.loads(path.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.runtime.cluster")
    ap.add_argument("action", choices=["start", "stop", "status", "worker"])
    ap.add_argument("--dir", default="var/spark", type=Path)
    ap.add_argument("--cores", default=8, type=int)
    ap.add_argument("--memory", default="8g")
    ap.add_argument("--port", default=7077, type=int)
    ap.add_argument("--host", default=HOST, help="the address to listen on")
    ap.add_argument("--master", help="worker: the master's spark:// URL")
    ap.add_argument("--secret-file", type=Path, help="worker: the cluster's auth-secret")
    args = ap.parse_args(argv)
    if args.action == "worker":
        if not args.master or not args.secret_file:
            ap.error("worker needs --master and --secret-file")
        try:
            read_secret(args.secret_file)
            pid = start_worker(args.dir, args.master, args.host, args.cores, args.memory,
                               args.secret_file)
        except (ClusterError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"worker pid {pid} on {args.host} joining {args.master}")
        return 0
    if args.action == "start":
        try:
            info = start(args.dir, args.cores, args.memory, args.port, host=args.host)
        except ClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(info.master_url)
        return 0
    info = load(args.dir)
    if info is None:
        print("no embedded cluster recorded in", args.dir, file=sys.stderr)
        return 1
    if args.action == "stop":
        stop(info)
        (args.dir / "cluster.json").unlink(missing_ok=True)
        return 0
    print(json.dumps(master_json(info.master_web), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
