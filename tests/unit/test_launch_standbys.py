"""A product's stop finds every standby runner it started, one that has not said its pid
on Redis yet included (pipelines.launch.standby_pids_here)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from pipelines import launch

pytestmark = pytest.mark.dbless

SLEEPER = "import time; time.sleep(60)"


def _fake_standby(config: Path) -> subprocess.Popen:
    """A process whose command line is a standby's (python -c … -m MODULE --standby
    CONFIG: the rest are only its arguments), that does nothing."""
    return subprocess.Popen([sys.executable, "-c", SLEEPER, "-m", launch.RUNNER_MODULE,
                             "--standby", str(config)])


def test_standbys_under_this_products_root_are_found_and_no_others(tmp_path) -> None:
    ours = _fake_standby(Path(settings.STANDBY_ROOT) / "abc123" / "standby.json")
    theirs = _fake_standby(tmp_path / "elsewhere" / "standby.json")
    try:
        found = launch.standby_pids_here()
        assert ours.pid in found
        assert theirs.pid not in found
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait(10)
