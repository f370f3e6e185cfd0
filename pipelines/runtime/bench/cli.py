"""``python -m pipelines.runtime.bench NAME [options]``: the runtime's benchmarks, each
on a fresh embedded Spark cluster, JSON on stdout (progress on stderr).

Every benchmark is one entry of :data:`BENCHMARKS`, which both lists them (``--help``,
``manage.py bench --list``) and runs them: its own options, their check (a bad value
is one line and exit 2, before any Spark starts) and its run.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.runner.harness import HarnessError

Run = Callable[[str, Path, argparse.Namespace], dict[str, Any]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    measures: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    check: Callable[[argparse.Namespace], None]  # raises ValueError naming the option
    run: Run


def _common(ap: argparse.ArgumentParser, default_keys: str) -> None:
    ap.add_argument("--keys", default=default_keys,
                    help="comma-separated key counts (state sizes)")
    ap.add_argument("--rate", type=float, default=2000.0, help="steady records/s")
    ap.add_argument("--groups", type=int, default=16, help="key groups G")
    ap.add_argument("--steady", type=int, default=6, help="batches per steady window")
    ap.add_argument("--state-store", choices=["rocksdb", "hdfs"], default="rocksdb")
    ap.add_argument("--executor-memory", default="2g")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")


def _check_common(args: argparse.Namespace) -> None:
    try:
        args.keys = [int(k) for k in str(args.keys).split(",")]
    except ValueError:
        raise ValueError("--keys: comma-separated whole numbers") from None
    if not 2 <= args.groups <= 256 or args.rate <= 0 or min(args.keys) < 1 \
            or args.steady < 2:
        raise ValueError("need 2 <= groups <= 256, rate > 0, keys >= 1, steady >= 2")


def _registry() -> dict[str, Benchmark]:
    from pipelines.runtime.bench import (checkpointfiles, closedloop, engine, jvmstart, plan,
                                         replan, sources)

    return {b.name: b for b in (
        Benchmark("migration", "state migration per schedule vs Spark's own placement",
                  engine.migration_arguments, engine.check_migration, engine.run_migration),
        Benchmark("scale", "1 -> 2 -> 1 workers: planned migration + decommission vs "
                  "Spark's default", engine.scale_arguments, engine.check_scale,
                  engine.run_scale),
        Benchmark("closed-loop", "MPC and rule controllers on real Spark vs static 1 and "
                  "max workers", closedloop.arguments, closedloop.check, closedloop.run),
        Benchmark("replan", "live re-plan: seamless hand-over vs stop and restart "
                  "(Gloss §9.1's downtime and disrupted time)", replan.arguments,
                  replan.check, replan.run),
        Benchmark("plan", "COLA's plan of the Python operators vs fuse-all, one PE per "
                  "operator and greedy merging", plan.arguments, plan.check, plan.run),
        Benchmark("jvm-start", "a new application's first Python task: class archive and "
                  "preloaded Python daemon vs neither", jvmstart.arguments, jvmstart.check,
                  jvmstart.run),
        Benchmark("checkpoint-files", "a micro-batch's CPU with checkpoint files written "
                  "through Hadoop's FileSystem API vs Spark's FileContext default",
                  checkpointfiles.arguments, checkpointfiles.check, checkpointfiles.run),
        Benchmark("sources", "each real source's drain rate and CPU per 1,000 records vs a "
                  "plain PySpark application reading the same broker", sources.arguments,
                  sources.check, sources.run),
    )}


BENCHMARKS = _registry()
COMMON = {"migration": "250000,1000000,4000000"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipelines.runtime.bench")
    commands = ap.add_subparsers(dest="command", required=True, metavar="NAME")
    for bench in BENCHMARKS.values():
        sub = commands.add_parser(bench.name, help=bench.measures)
        _common(sub, COMMON.get(bench.name, "1000000"))
        bench.add_arguments(sub)
    return ap


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM ends the benchmark like Ctrl-C: its runners and cluster are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parser().parse_args(argv)
    bench = BENCHMARKS[args.command]
    try:
        _check_common(args)
        bench.check(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="streamwise-elastic-bench-"))
    log(f"starting an embedded Spark cluster in {work} ...")
    info = cluster.start(work / "spark")
    started = time.time()
    try:
        result = bench.run(info.master_url, work, args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop(info)
    result["seconds"] = round(time.time() - started, 1)
    result["median_note"] = "one run per configuration; ratios compare runs on one machine"
    print(json.dumps(result, indent=1))
    return 0
