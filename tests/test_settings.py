"""Settings that must differ between installations."""
from __future__ import annotations

import ipaddress
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


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            raw, port = local.split(":")
            address = bytes.fromhex(raw)
            if width == 8:
                text = ".".join(str(b) for b in address[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(address[i:i + 4][::-1] for i in range(0, 16, 4))
                ip6 = ipaddress.IPv6Address(words)
                text = str(ip6.ipv4_mapped or ip6)  # Java listens on IPv4 as ::ffff:a.b.c.d
            found.append((text, int(port, 16)))
    return found


@pytest.mark.spark
def test_the_embedded_cluster_listens_on_loopback_only_and_offers_no_rest_gateway(
        spark_cluster: object) -> None:
    """Spark's REST submission gateway (6066, no authentication) runs any code it is
    sent: the embedded master starts without it, and master and worker bind loopback."""
    for pid in (spark_cluster.master_pid, spark_cluster.worker_pid):
        ports = _listening(pid)
        assert ports, pid
        assert all(ipaddress.ip_address(a).is_loopback for a, _p in ports), ports
        assert 6066 not in {p for _a, p in ports}, ports
