"""Settings that must differ between installations."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dbless

ROOT = Path(__file__).resolve().parents[1]


def _secret_key(var: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env.update(STREAMWISE_VAR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings")
    return subprocess.run([sys.executable, "-c", "from django.conf import settings; "
                           "print(settings.SECRET_KEY)"], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_without_secret_key_each_installation_makes_its_own_once(tmp_path: Path) -> None:
    first = _secret_key(tmp_path / "a")
    assert len(first) >= 50 and "insecure" not in first
    assert _secret_key(tmp_path / "a") == first  # kept: sessions survive a restart
    assert stat.S_IMODE((tmp_path / "a" / "secret_key").stat().st_mode) == 0o600
    assert _secret_key(tmp_path / "b") != first
