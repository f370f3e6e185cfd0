"""What a micro-batch costs with each way of writing checkpoint files
(``python -m pipelines.runtime.bench checkpoint-files``): the FileSystem API's manager,
the product's default, against Spark's own FileContext one (``session.py``,
``$STREAMWISE_CHECKPOINT_FILES``), alternating, on the same cluster.

Each sample is one run (a runner started cold, one 1-core executor, batches back to
back) of a keyed count or NEXMark Q5: after its warm-up batches, the CPU seconds its
processes (runner, driver JVM, the executor and its Python workers, and the processes
they forked and waited for: Hadoop's `readlink` and `chmod`) spent over a window,
divided by the batches committed in it, and the median time between two commits."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.host.procs import tree_cpu_s
from pipelines.runtime.query.session import CHECKPOINT_FILE_MANAGERS, CHECKPOINT_FILES_ENV
from pipelines.runtime.runner.harness import RunnerProcess

VARIANTS = tuple(CHECKPOINT_FILE_MANAGERS)  # ours first: the default
WARM_UP_BATCHES = 6


def _pipeline(name: str) -> dict[str, Any]:
    if name == "nexmark-q5":
        from pipelines.nexmark import queries

        return queries.definition("Q5", 500, key_groups=4)
    return {"source": {"type": "generator", "seed": 3, "partitions": 2,
                       "rate": {"kind": "constant", "records_per_s": 800},
                       "keys": {"kind": "zipf", "n": 200, "s": 1.1}},
            "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count",
                           "field": "value"}],
            "sink": {"type": "latency"}, "key_groups": 4}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reps", type=int, default=2, help="runs per variant")
    ap.add_argument("--window", type=float, default=30.0,
                    help="seconds measured per run, after its warm-up")
    ap.add_argument("--pipeline", choices=["keyed-count", "nexmark-q5"],
                    default="keyed-count")


def check(args: argparse.Namespace) -> None:
    if not 1 <= args.reps <= 20:
        raise ValueError("--reps: 1 to 20")
    if not 5 <= args.window <= 600:
        raise ValueError("--window: 5 to 600 seconds")


def _sample(info: cluster.ClusterInfo, work: Path, doc: dict[str, Any], variant: str,
            window_s: float, redis_url: str) -> dict[str, float]:
    run = RunnerProcess(work, info.master_url, doc, redis_url, token=work.name,
                        max_workers=1, initial_workers=1)
    previous = os.environ.get(CHECKPOINT_FILES_ENV)
    os.environ[CHECKPOINT_FILES_ENV] = variant  # the environment the runner starts with
    try:
        run.start()
    finally:
        if previous is None:
            os.environ.pop(CHECKPOINT_FILES_ENV, None)
        else:
            os.environ[CHECKPOINT_FILES_ENV] = previous
    try:
        run.wait_batches(WARM_UP_BATCHES)
        assert run.proc is not None

        def cpu() -> float:  # the worker JVM itself serves every application alike
            return tree_cpu_s([run.proc.pid, info.worker_pid],  # type: ignore[union-attr]
                              exclude_roots=(info.worker_pid,))

        before, first = cpu(), len(run.metrics)
        deadline = time.monotonic() + window_s
        while time.monotonic() < deadline:
            run.poll(block_ms=200)
        spent = cpu() - before
        batches = run.metrics[first:]
    finally:
        run.stop()
    commits = [m["t"] for m in batches]
    return {"batches": len(batches), "cpu_s": round(spent, 2),
            "cpu_s_per_batch": round(spent / max(1, len(batches)), 3),
            "batch_interval_s": round(statistics.median(
                b - a for a, b in zip(commits, commits[1:])), 3) if len(commits) > 1 else 0.0}


def run(master_url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    info = cluster.load(work / "spark")
    if info is None:
        raise RuntimeError(f"no cluster in {work / 'spark'}")
    doc = _pipeline(args.pipeline)
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for rep in range(args.reps):
        # Alternating order: neither variant always runs on the warmer machine.
        for variant in (VARIANTS if rep % 2 == 0 else VARIANTS[::-1]):
            sample = _sample(info, work / f"{variant}-{rep}", doc, variant, args.window,
                             args.redis_url)
            samples[variant].append(sample)
            print(f"{variant} {rep}: {sample}", file=sys.stderr, flush=True)
    medians = {v: {k: round(statistics.median(s[k] for s in rows), 3) for k in rows[0]}
               for v, rows in samples.items()}
    return {"benchmark": "checkpoint-files", "pipeline": args.pipeline, "reps": args.reps,
            "window_s": args.window, "median": medians,
            "ratio_filesystem_to_filecontext": {
                k: round(medians["filesystem"][k] / medians["filecontext"][k], 2)
                for k in ("cpu_s_per_batch", "batch_interval_s")
                if medians["filecontext"][k]}}
