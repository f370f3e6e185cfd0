"""What a new Spark application costs before its first Python task answers: with the
class archive and the preloaded Python daemon (``cluster.classarchive``,
``query.pydaemon``) against without them, alternating, on the same cluster.

Each sample is one application (the product's ``build_session``, one executor) that
runs one ``mapInPandas`` job: the seconds from the process' start to the job's result,
and the CPU seconds of its driver JVM, its executor JVM and the executor's Python
processes (the daemon and its workers), read from /proc before it is stopped."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.cluster.classarchive import ARCHIVE_ENV
from pipelines.runtime.host.procs import cmdline, proc_table, tree_pids
from pipelines.runtime.query.session import PYTHON_DAEMON_ENV

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import sys, time
started = time.time()
from pipelines.runtime.query.session import build_session
spark = build_session(sys.argv[1], sys.argv[2], 1, "512m")
spark.range(100).mapInPandas(lambda batches: batches, "id long").collect()
print(spark.sparkContext.applicationId, round(time.time() - started, 3), flush=True)
sys.stdin.read()  # until the benchmark has read its CPU
"""
VARIANTS = {"shared": {}, "plain": {ARCHIVE_ENV: "off", PYTHON_DAEMON_ENV: "pyspark.daemon"}}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reps", type=int, default=3, help="applications per variant")


def check(args: argparse.Namespace) -> None:
    if not 1 <= args.reps <= 20:
        raise ValueError("--reps: 1 to 20")


def _sample(info: cluster.ClusterInfo, name: str, variant: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **VARIANTS[variant])
    probe = subprocess.Popen([sys.executable, "-c", PROBE, info.master_url, name], cwd=ROOT,
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        line = probe.stdout.readline().split() if probe.stdout else []
        if len(line) != 2:
            raise RuntimeError(f"the {variant} probe ended (exit {probe.poll()})")
        app_id, first_result_s = line[0], float(line[1])
        table = proc_table()  # CPU of each process and of its waited-for children
        driver = [p for p in tree_pids([probe.pid], table) if "SparkSubmit" in cmdline(p)]
        executor = [p for p in tree_pids([info.worker_pid], table)
                    if "CoarseGrainedExecutorBackend" in cmdline(p) and app_id in cmdline(p)]
        python = [p for p in tree_pids(executor, table) if p not in executor]
        cpu = {p: table[p][1] for p in (*driver, *executor, *python)}
        return {"first_result_s": first_result_s,
                "driver_cpu_s": sum(cpu[p] for p in driver),
                "executor_cpu_s": sum(cpu[p] for p in executor),
                "python_cpu_s": sum(cpu[p] for p in python)}
    finally:
        probe.kill()
        probe.wait()
        deadline = time.monotonic() + 60  # the next sample gets the worker's core
        while time.monotonic() < deadline and any(
                a["name"] == name for a in cluster.master_json(info.master_web)["activeapps"]):
            time.sleep(0.2)


def run(master_url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    info = cluster.load(work / "spark")
    if info is None:
        raise RuntimeError(f"no cluster in {work / 'spark'}")
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for rep in range(args.reps):
        # Alternating order: neither variant always meets the warmer page cache.
        for variant in (("shared", "plain") if rep % 2 == 0 else ("plain", "shared")):
            samples[variant].append(_sample(info, f"bench-jvm-{variant}-{rep}", variant))
            print(f"{variant} {rep}: {samples[variant][-1]}", file=sys.stderr, flush=True)
    medians = {v: {k: round(statistics.median(s[k] for s in rows), 2) for k in rows[0]}
               for v, rows in samples.items()}
    return {"benchmark": "jvm-start", "reps": args.reps, "median": medians,
            "ratio_shared_to_plain": {
                k: round(medians["shared"][k] / medians["plain"][k], 2)
                for k in medians["plain"] if medians["plain"][k]}}
