"""The data plane's CPU priority against the control plane's.

Spark (the embedded cluster's daemons and executors, the runners' drivers, the
standbys) and the Lab's simulations can keep every core busy; the control plane
(daphne, the relay, the control worker, beat) needs little CPU but needs it at once: a
push or a control tick that waits behind a saturated machine is late (issue 50: 50
viewers of 6 live runs, p95 170 ms against 15 ms idle, at a load average of 19). So a
data-plane process's session is lowered when it starts, by the process itself
(``lower_session``, the runners' and standbys' double fork) or by its parent
(``lower_session_of``: the cluster's daemons, the Lab's worker), and what it starts
inherits it: the executors a Spark worker forks, a runner's Python workers.

Linux shares the CPU between *sessions* first when autogroup is on (the default on
desktop and most server kernels; every process here starts its own session), and a
process's nice value then only weighs against the other processes of its session. The
session's weight is its autogroup's nice (``/proc/self/autogroup``, sched(7)), which a
process may raise (lower priority) without privilege. Both are set: the autogroup for
kernels that have it, the process's own nice for those that do not.
"""
from __future__ import annotations

import os
from pathlib import Path

# The default nice of a data-plane session: a weight of 335 against a control-plane
# session's 1,024 (sched(7)'s table), so that a control-plane process that wants a core
# gets about three quarters of one, and Spark still gets all a quiet control plane
# leaves.
DATA_PLANE_NICE = 5
AUTOGROUP = Path("/proc/self/autogroup")


def data_plane_nice() -> int:
    """``STREAMWISE_DATA_PLANE_NICE`` (0 turns the lowering off), else DATA_PLANE_NICE."""
    raw = os.environ.get("STREAMWISE_DATA_PLANE_NICE", "")
    try:
        value = int(raw) if raw.strip() else DATA_PLANE_NICE
    except ValueError:
        value = DATA_PLANE_NICE
    return max(0, min(19, value))


def lower_session(nice: int | None = None) -> None:
    """Lower this process's priority to ``nice`` (default ``data_plane_nice()``), and
    its session's where autogroup is on and this process leads the session (so that a
    process of somebody else's session never lowers that session); never raises
    either. Safe in a ``preexec_fn`` after ``setsid``; failures are ignored (a kernel
    without autogroup, a read-only /proc)."""
    nice = data_plane_nice() if nice is None else nice
    if nice <= 0:
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass
    if os.getsid(0) != os.getpid():
        return
    try:
        with open(AUTOGROUP, "w") as f:
            f.write(str(nice))
    except OSError:
        pass


def lower_session_of(pid: int, nice: int | None = None) -> None:
    """From the parent, right after starting ``pid`` in a session of its own
    (``start_new_session``): lower that session's autogroup to ``nice``, which takes
    effect at once for every thread of the session, those started since included (a
    thread's own nice does not: it is per thread). No-op without autogroup."""
    nice = data_plane_nice() if nice is None else nice
    if nice <= 0:
        return
    try:
        current = session_nice(pid)
        if current is not None and current < nice:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass


def session_nice(pid: int) -> int | None:
    """The autogroup nice of ``pid``'s session (None: no autogroup here)."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    try:
        return int(text.rsplit("nice", 1)[1])
    except (IndexError, ValueError):
        return None
