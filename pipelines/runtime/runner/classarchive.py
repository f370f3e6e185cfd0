"""Make the class-data-sharing archive ``cluster.classarchive`` names: a local session
whose JVM runs the standby's warm-up (``standby.warm_up``: the real source, operators
and sink) and writes the classes it loaded as it exits. ``python -m
pipelines.runtime.runner.classarchive`` (the bootstrap runs it; ~1 min, once per
installation). No Django import."""
from __future__ import annotations

import argparse
import json
import shutil
import os
import subprocess
import sys
import time
from pathlib import Path

from pipelines.runtime.cluster.classarchive import ARCHIVE_ENV, archive_path, facts_path, fits

BUILD_TIMEOUT_S = 600.0
PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the child's working directory


def _dump(target: Path) -> None:
    """In a child process: the product's own session (``build_session``, on a local
    master) whose driver JVM writes the archive as it exits."""
    from pipelines.runtime.cluster import standalone
    from pipelines.runtime.query import session
    from pipelines.runtime.runner.standby import warm_up

    # No archive mapped while one is written (the JVM refuses both), the runs' options.
    os.environ[ARCHIVE_ENV] = "off"
    os.environ[standalone.JVM_OPTIONS_ENV] = (f"{standalone.DEFAULT_JVM_OPTIONS} "
                                              f"-XX:ArchiveClassesAtExit={target}")
    spark = session.build_session("local[2]", "streamwise-class-archive", 2, "512m")
    work = target.parent / "class-archive-work"
    work.mkdir(parents=True, exist_ok=True)
    try:
        warm_up(spark, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts = {"classpath": spark._jvm.java.lang.System.getProperty("java.class.path"),
             "java_home": spark._jvm.java.lang.System.getProperty("java.home"),
             "made_at": time.time()}
    facts_path(target).write_text(json.dumps(facts, indent=1))
    jvm = spark.sparkContext._gateway.proc  # the driver JVM (PySpark's launcher exec'd it)
    spark.stop()
    # The JVM writes the archive while it exits, which it does once its stdin closes;
    # this process must not end first, or the archive is not there yet when looked for.
    jvm.stdin.close()
    jvm.wait(timeout=BUILD_TIMEOUT_S)


def build(path: Path | None = None, force: bool = False) -> str:
    """Make the archive unless one that fits is there; returns what was done."""
    path = path or archive_path()
    if path is None:
        return f"class archive: off (${ARCHIVE_ENV})"
    if not force and fits(path) is None:
        return f"class archive: {path} fits"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    log = path.with_suffix(".log")
    started = time.monotonic()
    with open(log, "wb") as out:
        # The JVM writes the archive as it exits: only a child process's exit makes it.
        child = subprocess.run([sys.executable, "-m", "pipelines.runtime.runner.classarchive",
                                "--dump", str(partial)], stdout=out, stderr=subprocess.STDOUT,
                               timeout=BUILD_TIMEOUT_S, cwd=PROJECT_ROOT)
    if child.returncode != 0 or not partial.is_file():
        raise RuntimeError(f"the class archive was not made (exit {child.returncode}); "
                           f"see {log}")
    partial.replace(path)
    facts_path(partial).replace(facts_path(path))
    why = fits(path)
    if why is not None:
        raise RuntimeError(f"the class archive just made does not fit: {why}; see {log}")
    return f"class archive: made {path} in {time.monotonic() - started:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--force", action="store_true", help="make it even if one fits")
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        _dump(Path(args.dump))
        return 0
    try:
        done = build(force=args.force)
        if args.force or not done.endswith(" fits"):  # quiet when there is nothing to do
            print(done)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        # The product runs without it, only slower to start: say so, do not fail.
        print(f"class archive: not made ({exc}); the JVMs start without it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
