"""A class-data-sharing archive of Spark's classes for the JVMs of every run.

Each driver and each executor is a new JVM that loads and verifies some 10,000 of
Spark's classes before its first task; on 2 cores that start is most of what a short
run, a standby's warm-up or a scale-up's new executor costs in CPU. The JDK keeps
loaded classes in a shared archive (CDS; JEP 350's dynamic archive: a JVM started with
``-XX:ArchiveClassesAtExit`` writes the classes it loaded, and a JVM started with
``-XX:SharedArchiveFile`` maps them instead of loading them). Measured here (local
session, its first jobs, machine loaded by a test run): the JVM used 10.2-10.8 s of
CPU without the archive and 5.0-6.5 s with it.

The archive is made once per installation (``python -m
pipelines.runtime.runner.classarchive``, which the bootstrap runs) by a local session
that runs the standby's warm-up (the real source, operators and sink), and it is used
by every JVM whose class path is the one it was made with: drivers and executors
start with the same one (``$SPARK_HOME/conf`` and ``jars``). A JVM for which it does
not fit (another JDK build, changed jars, another class path) says so in its log and
runs without it, as it does when the file is absent (another host of the cluster).
No Django import."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# A path, or "off" for no archive (the JVMs' own default sharing only).
ARCHIVE_ENV = "STREAMWISE_CLASS_ARCHIVE"


def default_path() -> Path:
    """Beside the installation it is made from: the venv holds the jars it maps."""
    return Path(sys.prefix) / "share" / "streamwise" / "spark-classes.jsa"


def archive_path() -> Path | None:
    """The archive the JVMs should map, or None (switched off)."""
    configured = os.environ.get(ARCHIVE_ENV, "").strip()
    if configured.lower() == "off":
        return None
    return Path(configured) if configured else default_path()


def jvm_option() -> str:
    """``-XX:SharedArchiveFile=...`` when the archive exists, else nothing."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def facts_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def fits(path: Path) -> str | None:
    """Why the archive at ``path`` cannot serve this installation's JVMs, or None: the
    JVM itself checks it (``-Xshare:on`` refuses to start on an archive of another JDK
    build, of other jars or of another class path) with the class path it was made
    with."""
    if not path.is_file():
        return "it does not exist"
    try:
        facts = json.loads(facts_path(path).read_text())
        classpath = facts["classpath"]
    except (OSError, ValueError, KeyError):
        return "its facts file is missing"
    check = subprocess.run([_java(), "-Xshare:on", f"-XX:SharedArchiveFile={path}", "-cp",
                            classpath, "-version"], capture_output=True, text=True,
                           timeout=120)
    if check.returncode != 0:
        lines = (check.stdout + check.stderr).strip().splitlines()
        return f"the JVM refuses it: {lines[-1] if lines else check.returncode}"
    return None
