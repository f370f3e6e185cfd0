"""The product's long-running processes as ``up`` starts them, and how a command that
starts them ends them: shared by ``up`` and the product benchmarks (benchkit)."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from django.conf import settings

from pipelines.runtime.host import priority


# Celery workers without the event traffic between them: gossip (each worker follows the
# others' heartbeats), mingle (a start-up exchange of revoked task ids) and worker
# heartbeat events serve event monitors such as Flower, which Streamwise does not use
# (its own health is the relay's lag, the reconciler's pass and the queues' lengths, on
# /metrics); ``control.ping`` and the other remote-control commands still work.
QUIET_WORKER = ("--without-gossip", "--without-mingle", "--without-heartbeat")


# The product's processes that do the data plane's work (a Lab comparison simulates for
# minutes on a core): started at its lower priority (pipelines.runtime.host.priority).
DATA_PLANE = frozenset({"lab-worker"})


def set_priority(name: str, pid: int) -> None:
    """The priority of product process ``name``, just started as ``pid`` in a session of
    its own: lowered if it is data plane (DATA_PLANE)."""
    if name in DATA_PLANE:
        priority.lower_session_of(pid)


# How long daphne lets a WebSocket's handshake and connect handler take before it drops
# the socket (daphne's default: 5 s). Every page's socket reconnects at once after a
# restart of daphne; their connect handlers (session, role, snapshot) queue for the
# database's one thread, and at 1,000 sockets the later ones waited longer than 5 s and
# were dropped, to reconnect into the same queue.
WEBSOCKET_CONNECT_TIMEOUT_S = 120


def daphne_command(port: int) -> list[str]:
    """The web server (pages and WebSockets) on loopback ``port``."""
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
            "--websocket_connect_timeout", str(WEBSOCKET_CONNECT_TIMEOUT_S),
            "webapp.asgi:application"]


def product_processes(port: int, var: Path, worker_name: str = "streamwise@%h"
                      ) -> dict[str, list[str]]:
    """The product's long-running processes (web + WebSockets, the Celery workers of the
    control and Lab queues, beat, the relay), as ``up`` starts them; the start benchmark
    starts the same."""
    py = sys.executable
    return {
        "web": daphne_command(port),
        "worker": [py, "-m", "celery", "-A", "webapp", "worker", "-l", "info",
                   *QUIET_WORKER, "-Q", settings.CONTROL_QUEUE, "--concurrency", "4",
                   "-n", worker_name],
        # Lab comparisons on their own worker (one at a time: each uses a core).
        "lab-worker": [py, "-m", "celery", "-A", "webapp", "worker", "-l", "info",
                       *QUIET_WORKER, "-Q", settings.LAB_QUEUE, "--concurrency", "1",
                       "-n", f"lab-{worker_name}"],
        "beat": [py, "-m", "celery", "-A", "webapp", "beat", "-l", "info",
                 "-s", str(var / "celerybeat-schedule")],
        "relay": [py, str(Path(settings.BASE_DIR) / "manage.py"), "relay"],
    }


def end_on_sigterm() -> None:
    """SIGTERM (a stop, a timeout, a cancelled CI job) unwinds the command as Ctrl-C
    does, so its ``finally`` ends every process it started."""
    def interrupt(*_args: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
