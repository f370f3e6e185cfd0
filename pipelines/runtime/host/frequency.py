"""CPU frequency actuators (the thesis' DVFS knob f, §6.2.2) with two backends.

* :class:`CpufreqActuator` — real DVFS through Linux cpufreq: the ``userspace``
  governor's ``scaling_setspeed`` when available, else capping ``scaling_max_freq``.
  Needs root and a kernel that exposes cpufreq (VMs and containers usually do not).
  Labelled ``cpufreq``.
* :class:`DutyCycleThrottle` — emulation for machines without DVFS: the run's local
  executor processes (JVM and their Python workers) are stopped and continued
  (SIGSTOP/SIGCONT) at a fine period so they get a fraction f/f_max of wall time. For
  CPU-bound work this slows them like a clock of f/f_max would; it does not save
  energy, so its power is always the model's. Labelled ``emulated``.

``choose_actuator`` picks cpufreq when it is writable, else the throttle. Both report
the frequency they set; the runner publishes it with the label, never as a reading.

A process the throttle has stopped must not stay stopped when the runner dies (SIGKILL
runs no cleanup): while throttling, a watchdog process holds a pipe from the runner and
the list of pids; when the pipe closes, for whatever reason, it continues them all.

    python -m pipelines.runtime.host.frequency watchdog   (started by the throttle)
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CPU_ROOT = Path("/sys/devices/system/cpu")
EMULATED_STEPS = (0.6, 0.7, 0.8, 0.9, 1.0)  # fractions of f_max offered when emulating


class FrequencyError(RuntimeError):
    """The frequency cannot be set (no permission, out of range), one line."""


@dataclass(frozen=True)
class FrequencySetting:
    ghz: float
    source: str  # "cpufreq" or "emulated"
    available: tuple[float, ...]


def _round_ghz(khz_or_ghz: float) -> float:
    return round(khz_or_ghz, 3)


class CpufreqActuator:
    """Linux cpufreq on every CPU under ``root`` (a fake tree in tests)."""

    label = "cpufreq"

    def __init__(self, root: Path = CPU_ROOT) -> None:
        self.root = Path(root)
        self.cpus = sorted(self.root.glob("cpu[0-9]*/cpufreq"),
                           key=lambda p: int(p.parent.name[3:]))
        if not self.cpus:
            raise FrequencyError(f"no cpufreq under {self.root}")
        self._saved: dict[Path, str] = {}

    @classmethod
    def usable(cls, root: Path = CPU_ROOT) -> bool:
        try:
            act = cls(root)
        except FrequencyError:
            return False
        return all(os.access(d / "scaling_max_freq", os.W_OK) for d in act.cpus)

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text().strip()

    def frequencies(self) -> tuple[float, ...]:
        """Settable frequencies (GHz), ascending: the driver's table, else 100 MHz
        steps between cpuinfo_min_freq and cpuinfo_max_freq."""
        first = self.cpus[0]
        table = first / "scaling_available_frequencies"
        if table.exists():
            khz = sorted({int(x) for x in self._read(table).split()})
        else:
            lo = int(self._read(first / "cpuinfo_min_freq"))
            hi = int(self._read(first / "cpuinfo_max_freq"))
            khz = list(range(hi, lo - 1, -100_000))[::-1]
        return tuple(_round_ghz(k / 1e6) for k in khz)

    def _mode(self, d: Path) -> str:
        governors = (d / "scaling_available_governors")
        if (governors.exists() and "userspace" in self._read(governors).split()
                and (d / "scaling_setspeed").exists()):
            return "userspace"
        return "max_freq"

    def _write(self, path: Path, value: str) -> None:
        try:
            if path not in self._saved:
                self._saved[path] = self._read(path)
            path.write_text(value)
        except OSError as exc:
            raise FrequencyError(f"cannot write {path}: {exc.strerror} (cpufreq needs root)") \
                from exc

    def set(self, ghz: float) -> float:
        choices = self.frequencies()
        if not choices[0] - 1e-9 <= ghz <= choices[-1] + 1e-9:
            raise FrequencyError(f"{ghz} GHz is outside {choices[0]}..{choices[-1]} GHz")
        target = min(choices, key=lambda f: abs(f - ghz))
        khz = str(int(round(target * 1e6)))
        for d in self.cpus:
            if self._mode(d) == "userspace":
                self._write(d / "scaling_governor", "userspace")
                self._write(d / "scaling_setspeed", khz)
            else:
                if int(self._read(d / "scaling_min_freq")) > int(khz):
                    self._write(d / "scaling_min_freq", khz)
                self._write(d / "scaling_max_freq", khz)
        return target

    def current(self) -> float:
        vals = [int(self._read(d / "scaling_cur_freq")) for d in self.cpus]
        return _round_ghz(sum(vals) / len(vals) / 1e6)

    def restore(self) -> None:
        """Put back every value this actuator changed (governor first)."""
        for path in sorted(self._saved, key=lambda p: p.name != "scaling_governor"):
            try:
                path.write_text(self._saved[path])
            except OSError:
                pass
        self._saved.clear()


# ------------------------------------------------------------------ emulation
def process_table() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process we can read."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        table[int(entry.name)] = (ppid, argv)
    return table


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine (one of its addresses can be bound). An
    executor elsewhere cannot be throttled from here: its processes are another host's."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except OSError:
        return False
    for family, kind, _proto, _name, address in infos:
        try:
            with socket.socket(family, kind) as s:
                s.bind((address[0], 0))
                return True
        except OSError:
            continue
    return False


def _argv_value(argv: list[str], flag: str) -> str | None:
    try:
        return argv[argv.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def executor_processes(app_id: str) -> dict[str, list[int]]:
    """Executor id -> pids of its JVM and every descendant (the PySpark daemon and
    Python workers do the Python source's and operator's work), for one application's
    executors on this machine: those whose host is one of its addresses (a process
    listed here but bound to another host's address, as in a network namespace, is
    that host's)."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _argv) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, list[int]] = {}
    for pid, (_ppid, argv) in table.items():
        if "CoarseGrainedExecutorBackend" not in " ".join(argv) or app_id not in argv:
            continue
        executor = _argv_value(argv, "--executor-id")
        host = _argv_value(argv, "--hostname")
        if executor is None or (host is not None and not is_local_address(host)):
            continue
        tree, todo = [], [pid]
        while todo:
            p = todo.pop()
            tree.append(p)
            todo.extend(children.get(p, []))
        out[executor] = tree
    return out


class DutyCycleThrottle:
    """Run ``pids()`` for ``duty = f/f_max`` of every ``period_s``, stop them for the
    rest. Processes are re-listed every ``refresh_s`` (executors come and go)."""

    label = "emulated"

    def __init__(self, pids: Callable[[], list[int]], f_max_ghz: float,
                 period_s: float = 0.02, refresh_s: float = 1.0) -> None:
        self.pids = pids
        self.f_max = f_max_ghz
        self.period_s = period_s
        self.refresh_s = refresh_s
        self.duty = 1.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopped: set[int] = set()
        self._lock = threading.Lock()
        self._watchdog: subprocess.Popen | None = None

    def frequencies(self) -> tuple[float, ...]:
        return tuple(round(self.f_max * s, 2) for s in EMULATED_STEPS)

    def set(self, ghz: float) -> float:
        top = max(self.frequencies())  # the advertised (rounded) f_max counts as f_max
        if not 0 < ghz <= max(top, self.f_max) + 1e-9:
            raise FrequencyError(f"{ghz} GHz is outside (0, {top}] GHz (emulated "
                                 "frequencies cannot exceed the measured one)")
        self.duty = min(1.0, ghz / self.f_max)
        if self.duty >= 0.999:
            self.stop()
        elif self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="duty-cycle", daemon=True)
            self._thread.start()
        return round(self.f_max * self.duty, 3)

    def current(self) -> float:
        return round(self.f_max * self.duty, 3)

    def _signal(self, pids: list[int], sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            if sig == signal.SIGSTOP:
                self._stopped.add(pid)
            else:
                self._stopped.discard(pid)

    def _tell_watchdog(self, pids: list[int]) -> None:
        self._watchdog = tell_watchdog(self._watchdog, pids)

    def _end_watchdog(self) -> None:
        end_watchdog(self._watchdog)
        self._watchdog = None

    def _loop(self) -> None:
        pids: list[int] = []
        listed = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - listed >= self.refresh_s:
                pids, listed = self.pids(), now
                self._tell_watchdog(pids)
            on = self.period_s * self.duty
            with self._lock:
                self._signal(pids, signal.SIGCONT)
            if self._stop.wait(on):
                break
            with self._lock:
                if self._stop.is_set():
                    break
                self._signal(pids, signal.SIGSTOP)
            time.sleep(max(self.period_s - on, 0.0))
        with self._lock:
            self._signal(list(self._stopped), signal.SIGCONT)
        self._end_watchdog()

    def stop(self) -> None:
        """Continue every process and end the loop (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            self._signal(list(self._stopped), signal.SIGCONT)
        self.duty = 1.0

    def restore(self) -> None:
        self.stop()


def choose_actuator(app_id: str, f_max_ghz: float,
                    root: Path = CPU_ROOT) -> CpufreqActuator | DutyCycleThrottle:
    """Real DVFS when cpufreq is writable here, else duty-cycle emulation."""
    if CpufreqActuator.usable(root):
        return CpufreqActuator(root)
    return DutyCycleThrottle(
        lambda: [p for tree in executor_processes(app_id).values() for p in tree], f_max_ghz)


def tell_watchdog(watchdog: subprocess.Popen | None,
                  pids: list[int]) -> subprocess.Popen | None:
    """Give a watchdog (``watchdog_main``; started when ``watchdog`` is None or has
    died) the pids to continue should this process die: the watchdog to keep, or None
    if it died meanwhile (a new one is started on the next call)."""
    if watchdog is None or watchdog.poll() is not None:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", __name__, "watchdog"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, start_new_session=True,
            cwd=Path(__file__).resolve().parents[3])  # where the package imports from
    assert watchdog.stdin is not None
    try:
        watchdog.stdin.write((json.dumps(pids) + "\n").encode())
        watchdog.stdin.flush()
    except OSError:
        return None
    return watchdog


def end_watchdog(watchdog: subprocess.Popen | None) -> None:
    """Close a watchdog's pipe (it continues its processes and exits) and reap it."""
    if watchdog is None:
        return
    try:
        watchdog.stdin.close()  # type: ignore[union-attr]
    except OSError:
        pass
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watchdog.kill()


def watchdog_main() -> int:
    """Read pid lists (JSON, one per line) from stdin, the pipe the throttle holds; when
    it closes (the throttle ended, or its process died), continue the last list's
    processes (a negative pid: a process group, as for kill(2)). Continuing a process
    that runs is harmless."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the group is the runner's
    pids: list[int] = []
    for line in sys.stdin:
        try:
            pids = [int(p) for p in json.loads(line)]
        except (ValueError, TypeError):
            continue
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            continue
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["watchdog"]:
        print("usage: python -m pipelines.runtime.host.frequency watchdog", file=sys.stderr)
        sys.exit(2)
    sys.exit(watchdog_main())
