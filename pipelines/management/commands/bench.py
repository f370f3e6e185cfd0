"""Every benchmark of the product, in one catalogue: ``manage.py bench``.

Each benchmark lives next to the code it measures (a management command when it needs
the web stack, a module's CLI when it needs only Spark or the pure libraries) and prints
its own ratios against a baseline measured in the same run. This command is the one
place that lists them, runs any subset in its own process (so one that fails does not
stop the rest), and ends with a table of what ran, how long it took and whether it
passed. ``make bench`` runs them all.

    manage.py bench --list
    manage.py bench push start mpc
    manage.py bench --quick          # the short variants, where a benchmark has one
"""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

PYTHON = sys.executable


@dataclass(frozen=True)
class Benchmark:
    name: str
    measures: str  # what it measures, and its baseline
    argv: tuple[str, ...]
    quick: tuple[str, ...] = field(default=())  # extra arguments for --quick


CATALOGUE: tuple[Benchmark, ...] = (
    Benchmark("push", "metrics record -> browser (relay, Channels, daphne, Chromium) vs a "
              "bare Redis XADD->XREAD", ("manage.py", "bench_push")),
    Benchmark("load", "N concurrent runs and V WebSocket viewers for M minutes (stale "
              "statuses, lost runs, push latency) vs one viewer of one run",
              ("manage.py", "bench_load"), ("--minutes", "1", "--viewers", "10",
                                            "--baseline-s", "20")),
    Benchmark("shares", "three runs of different priorities on an over-committed cluster: "
              "the arbiter's grants, preemptions by planned migration, violations, verifier",
              ("manage.py", "bench_shares")),
    Benchmark("start", "Start POST -> first point on the run page vs a bare PySpark "
              "application", ("manage.py", "bench_start"), ("--runs", "3")),
    Benchmark("jvm-start", "a new Spark application's first Python task with the class "
              "archive and the preloaded Python daemon vs neither (CPU and seconds)",
              ("-m", "pipelines.runtime.bench", "jvm-start"), ("--reps", "1")),
    Benchmark("checkpoint-files", "a micro-batch's CPU with checkpoint files written "
              "through Hadoop's FileSystem API vs Spark's FileContext default",
              ("-m", "pipelines.runtime.bench", "checkpoint-files"), ("--reps", "1")),
    Benchmark("sink", "the latency sink's rows, throughput and p95 vs Spark's own progress",
              ("-m", "pipelines.runtime.bench.sink")),
    Benchmark("mpc", "MPC solve times: DP vs Branch & Bound vs the thesis' Table 7.1",
              ("-m", "control", "bench-mpc", "--instances", "10")),
    Benchmark("planning", "Ding's DP, every migration planner, COLA vs baselines and brute "
              "force", ("-m", "control", "bench-planning"), ("--quick",)),
    Benchmark("sim", "simulator timing targets", ("-m", "control", "bench-sim")),
    Benchmark("thesis", "the thesis' strategy grid with its qualitative checks",
              ("-m", "control", "reproduce-thesis")),
    Benchmark("migration", "state migration per schedule vs Spark's own placement",
              ("-m", "pipelines.runtime.bench", "migration")),
    Benchmark("scale", "1 -> 2 -> 1 workers: planned migration + decommission vs Spark's "
              "default", ("-m", "pipelines.runtime.bench", "scale")),
    Benchmark("nexmark", "NEXMark Q0-Q8 sustainable rate on 1 and 2 executors: Streamwise "
              "vs the same query as plain PySpark", ("-m", "pipelines.nexmark", "bench"),
              ("--queries", "Q1,Q5", "--workers", "1")),
    Benchmark("closed-loop", "MPC and rule controllers on real Spark vs static 1 and max "
              "workers", ("-m", "pipelines.runtime.bench", "closed-loop")),
    Benchmark("replan", "live re-plan: Gloss' seamless hand-over vs stop and restart "
              "(downtime, disrupted time)", ("-m", "pipelines.runtime.bench", "replan"),
              ("--reconfigs", "2")),
    Benchmark("plan", "COLA's plan of the Python operators vs fuse-all, one PE per operator "
              "and greedy merging (sustained rate, verified)",
              ("-m", "pipelines.runtime.bench", "plan"), ("--reps", "1")),
)
BY_NAME = {b.name: b for b in CATALOGUE}


class Command(BaseCommand):
    help = "Run the product's benchmarks (all, or the ones named); --list shows them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", metavar="NAME",
                            help=f"benchmarks to run (default: all): {', '.join(BY_NAME)}")
        parser.add_argument("--list", action="store_true", help="list them and exit")
        parser.add_argument("--quick", action="store_true",
                            help="the short variant where a benchmark has one")

    def handle(self, *args: object, **opts: object) -> None:
        if opts["list"]:
            width = max(len(b.name) for b in CATALOGUE)
            for b in CATALOGUE:
                self.stdout.write(f"{b.name:<{width}}  {b.measures}\n{'':<{width}}  "
                                  f"python {' '.join(b.argv)}")
            return
        names = list(opts["names"]) or list(BY_NAME)  # type: ignore[call-overload]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise CommandError(f"unknown benchmark {', '.join(unknown)}; known: "
                               f"{', '.join(BY_NAME)}")
        results: list[tuple[str, int, float]] = []
        for i, name in enumerate(names, 1):
            bench = BY_NAME[name]
            argv = (PYTHON, *bench.argv, *(bench.quick if opts["quick"] else ()))
            self.stdout.write(f"\n=== [{i}/{len(names)}] {name}: {bench.measures}\n"
                              f"    {' '.join(argv[1:])}", ending="\n")
            self.stdout.flush()
            started = time.monotonic()
            code = subprocess.call(argv, cwd=settings.BASE_DIR)
            results.append((name, code, time.monotonic() - started))
        self.stdout.write("\nbenchmark      result  wall")
        for name, code, wall in results:
            self.stdout.write(f"{name:<14} {'ok' if code == 0 else f'exit {code}':<7} "
                              f"{wall:6.0f} s")
        failed = [name for name, code, _ in results if code != 0]
        if failed:
            raise CommandError(f"{len(failed)} of {len(results)} failed: {', '.join(failed)}")
