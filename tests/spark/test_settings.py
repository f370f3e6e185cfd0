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

ROOT = Path(__file__).resolve().parents[2]


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


APP_PROBE = """
import os, sys, time
from pyspark.sql import SparkSession
if sys.argv[3] == "product":  # the product's own session, secret from the cluster's file
    from pipelines.runtime.query.session import build_session
    spark = build_session(sys.argv[1], sys.argv[2], 1, "512m")
else:
    builder = (SparkSession.builder.master(sys.argv[1]).appName(sys.argv[2])
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.cores.max", "1").config("spark.executor.cores", "1")
               .config("spark.executor.memory", "512m"))
    if sys.argv[3] != "-":
        builder = (builder.config("spark.authenticate", "true")
                   .config("spark.authenticate.secret", sys.argv[3]))
    spark = builder.getOrCreate()
time.sleep(3600)
"""


# What a driver logs when the master refuses its connection (no or another secret:
# the SASL handshake fails); it retries, and is refused again, until it gives up.
REFUSED = "Failed to connect to master"


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:  # it ended while we looked
            pass
    return out


@pytest.mark.spark
def test_the_embedded_cluster_admits_only_applications_with_its_secret(
        spark_cluster: object, tmp_path: Path) -> None:
    """spark.authenticate: master and worker read the secret from a private file (not
    their command line); an application without it, or with another one, never
    registers, and one with it does."""
    import os
    import subprocess
    import sys
    import time

    from pipelines.runtime.cluster import standalone as cluster

    secret_file = Path(spark_cluster.secret_file)
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    secret = cluster.read_secret(secret_file)
    def shown_by_ps(pids: list[int]) -> list[int]:
        return [p for p in pids if secret in Path(f"/proc/{p}/cmdline").read_text()]

    for pid in (spark_cluster.master_pid, spark_cluster.worker_pid):
        assert not shown_by_ps(_tree(pid))

    def registered(name: str, secret_arg: str) -> bool:
        """Whether the master admits the application: it lists it (True), or the
        driver's log says the master refused its connection (False). Both are events
        the probe's own start leads to, so nothing here waits out a fixed time; the
        120-s deadline only detects a probe that does neither. The product's own driver
        (and its JVM) never shows the secret on a command line."""
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        if secret_arg != "product":
            env.pop(cluster.SECRET_ENV, None)
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen([sys.executable, "-c", APP_PROBE, spark_cluster.master_url,
                                 name, secret_arg], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(log, "wb"))
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                apps = cluster.master_json(spark_cluster.master_web)["activeapps"]
                if any(a["name"] == name for a in apps):
                    if secret_arg == "product":
                        assert not shown_by_ps(_tree(proc.pid))
                    return True
                if REFUSED in log.read_text(errors="replace"):
                    # Refused at the handshake: a later attempt is refused the same way.
                    apps = cluster.master_json(spark_cluster.master_web)["activeapps"]
                    return any(a["name"] == name for a in apps)
                assert proc.poll() is None, log.read_text()[-2000:]
                time.sleep(0.25)
            pytest.fail(f"{name}: neither registered nor refused in 120 s; "
                        f"{log.read_text(errors='replace')[-2000:]}")
        finally:
            proc.kill()
            proc.wait()

    assert not registered("probe-no-secret", "-")
    assert not registered("probe-wrong-secret", "0" * 64)
    assert registered("probe-product", "product")


JVM_PROBE = """
import sys, time
from pipelines.runtime.query.session import build_session
spark = build_session(sys.argv[1], "probe-shared-classes", 1, "512m")
spark.range(10).mapInPandas(lambda batches: batches, "id long").collect()  # a Python worker
print(spark.sparkContext.applicationId, flush=True)
time.sleep(3600)
"""


def _maps(pid: int, path: Path) -> bool:
    try:
        return str(path) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.spark
def test_every_jvm_maps_the_class_archive_and_python_workers_fork_from_the_preloaded_daemon(
        spark_cluster: object) -> None:
    """The installation's class archive (made by the bootstrap) fits this JDK and these
    jars, and the JVMs map it rather than load Spark's classes: the embedded master and
    worker, a run's driver and its executor. The executor's Python workers come from
    ``pydaemon``, which has pandas and pyarrow imported before it forks them."""
    import subprocess
    import sys

    from pipelines.runtime.cluster import classarchive
    from pipelines.runtime.host.procs import cmdline as _cmdline

    archive = classarchive.archive_path()
    assert archive is not None and classarchive.fits(archive) is None
    for pid in (spark_cluster.master_pid, spark_cluster.worker_pid):
        assert any(_maps(p, archive) for p in _tree(pid)), _cmdline(pid)
    probe = subprocess.Popen([sys.executable, "-c", JVM_PROBE, spark_cluster.master_url],
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        app_id = probe.stdout.readline().strip()  # after its Python task ran
        assert app_id.startswith("app-"), probe.poll()
        driver = [p for p in _tree(probe.pid) if "SparkSubmit" in _cmdline(p)]
        assert driver and _maps(driver[0], archive)
        executor = [p for p in _tree(spark_cluster.worker_pid)
                    if "CoarseGrainedExecutorBackend" in _cmdline(p) and app_id in _cmdline(p)]
        assert executor and _maps(executor[0], archive)
        daemons = [p for p in _tree(executor[0])
                   if "-m pipelines.runtime.query.pydaemon" in _cmdline(p)]
        assert daemons, [_cmdline(p) for p in _tree(executor[0])]
    finally:
        probe.kill()
        probe.wait()


def test_a_class_archive_that_is_off_absent_or_not_an_archive_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.runtime.cluster import classarchive

    monkeypatch.setenv(classarchive.ARCHIVE_ENV, "off")
    assert classarchive.archive_path() is None and classarchive.jvm_option() == ""
    absent = tmp_path / "absent.jsa"
    monkeypatch.setenv(classarchive.ARCHIVE_ENV, str(absent))
    assert classarchive.jvm_option() == "" and classarchive.fits(absent) == "it does not exist"
    garbage = tmp_path / "garbage.jsa"
    garbage.write_bytes(b"not an archive" * 100)
    monkeypatch.setenv(classarchive.ARCHIVE_ENV, str(garbage))
    assert classarchive.jvm_option() == f"-XX:SharedArchiveFile={garbage}"
    assert classarchive.fits(garbage) == "its facts file is missing"
    classarchive.facts_path(garbage).write_text('{"classpath": "."}')
    assert classarchive.fits(garbage).startswith("the JVM refuses it")
