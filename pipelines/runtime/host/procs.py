"""Process trees read from Linux's /proc: which processes descend from a few roots, and
the CPU time they used. Shared by the NEXMark benchmark (a driver's and its executors'
CPU per record) and the re-plan's state transfer (is it starving, which threads to raise).
"""
from __future__ import annotations

import os
from pathlib import Path


def proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and its waited-for children)."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        table[int(entry.name)] = (int(fields[1]), (utime + stime + cutime + cstime) / tick)
    return table


def tree_pids(roots: list[int], table: dict[int, tuple[int, float]] | None = None
              ) -> list[int]:
    """The live processes under ``roots``, the roots included."""
    table = proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_cpu_s(roots: list[int], exclude_roots: tuple[int, ...] = ()) -> float:
    """CPU seconds so far of the processes under ``roots`` (the roots themselves unless
    listed in ``exclude_roots``): a difference of two readings is the CPU spent between
    them, as long as no process of the tree ended unwaited in between."""
    table = proc_table()
    return sum(table[pid][1] for pid in tree_pids(roots, table) if pid not in exclude_roots)


def cmdline(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces ("" once it ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""
