"""The data plane's CPU priority (pipelines.runtime.host.priority), on this kernel."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipelines.runtime.host import priority

pytestmark = pytest.mark.dbless

CHILD = """
import os, sys
from pipelines.runtime.host import priority
priority.lower_session(int(sys.argv[1]))
print(os.getpriority(os.PRIO_PROCESS, 0), flush=True)
sys.stdin.read()
"""


def _autogroup() -> bool:
    return priority.session_nice(os.getpid()) is not None


def test_the_setting_is_bounded_and_zero_turns_it_off(monkeypatch) -> None:
    monkeypatch.setenv("STREAMWISE_DATA_PLANE_NICE", "0")
    assert priority.data_plane_nice() == 0
    monkeypatch.setenv("STREAMWISE_DATA_PLANE_NICE", "40")
    assert priority.data_plane_nice() == 19
    monkeypatch.setenv("STREAMWISE_DATA_PLANE_NICE", "lots")
    assert priority.data_plane_nice() == priority.DATA_PLANE_NICE
    monkeypatch.delenv("STREAMWISE_DATA_PLANE_NICE")
    assert priority.data_plane_nice() == priority.DATA_PLANE_NICE


def test_a_session_leader_lowers_its_session_and_nobody_elses() -> None:
    mine = priority.session_nice(os.getpid())
    leader = subprocess.Popen([sys.executable, "-c", CHILD, "7"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    member = subprocess.Popen([sys.executable, "-c", CHILD, "7"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # in this session
    try:
        assert int(leader.stdout.readline()) == 7
        assert int(member.stdout.readline()) == 7  # its own nice, as a process's
        if _autogroup():
            assert priority.session_nice(leader.pid) == 7
            # The member is not its session's leader: this test's session is untouched.
            assert priority.session_nice(os.getpid()) == mine
    finally:
        for proc in (leader, member):
            proc.stdin.close()
            proc.wait(10)


def test_a_parent_lowers_a_new_session_it_started_and_never_raises_one() -> None:
    if not _autogroup():
        pytest.skip("this kernel has no autogroup (sched(7)): nothing to lower")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while priority.session_nice(proc.pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        priority.lower_session_of(proc.pid, 9)
        assert priority.session_nice(proc.pid) == 9
        priority.lower_session_of(proc.pid, 3)  # would raise it: left as it is
        assert priority.session_nice(proc.pid) == 9
    finally:
        proc.stdin.close()
        proc.wait(10)
