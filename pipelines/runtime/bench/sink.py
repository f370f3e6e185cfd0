"""Benchmark: do the sink's numbers agree with Spark's own?

Runs the demo pipeline (or a definition file) on a fresh embedded standalone cluster
through the real runner for a while, then compares, over the batches after warm-up:

* **rows**: records committed by the sink vs Spark's ``numInputRows`` (the demo's
  filter drops ~0.5 % of records before the keyed operator, so expect ~0.995);
* **throughput**: sink records per second of commit time vs Spark's input rows per
  second of trigger time (its own progress timestamps);
* **p95 latency per batch**: the sink's (observed emission-time quantiles vs its commit
  instant) vs one derived only from Spark's progress: the batch's source offsets
  [start, end) give the exact records, the deterministic schedule gives their emission
  times, and Spark's trigger timestamp plus its phase durations (up to the end of
  ``addBatch``) give when the output was written.

    python -m pipelines.runtime.bench.sink [--seconds 90] [--definition FILE]

Prints medians and ratios; exits 2 on bad input, 1 if the run fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.spec import definition
from pipelines.runtime.runner.harness import HarnessError, RunnerProcess



def spark_side_p95_ms(record: dict, spec: definition.PipelineSpec, t0: float) -> float | None:
    """p95 latency of a batch from Spark's progress and the schedule only."""
    start, end = record.get("source_start"), record.get("source_end")
    durations = record.get("durations_ms") or {}
    if start is None or end is None or end <= start or "triggerExecution" not in durations:
        return None
    written = (record["trigger_started_at"]
               + (durations["triggerExecution"] - durations.get("commitOffsets", 0)) / 1000.0)
    emit = t0 + spec.schedule().emission_times(np.arange(start, end, dtype=np.int64))
    return float(written - np.quantile(emit, 0.05)) * 1000.0


def summarize(records: list[dict], spec: definition.PipelineSpec, t0: float,
              warmup: int = 3) -> dict:
    steady = [r for r in records if r["batch_id"] >= warmup and r.get("records")]
    if len(steady) < 3:
        raise RuntimeError(f"only {len(steady)} batches after warm-up; run longer")
    sink_rows = sum(r["records"] for r in steady)
    spark_rows = sum(r["input_rows"] for r in steady)
    # Throughput over the same batches, each side on its own clock: rows of batches
    # 2..N over the time between the ends (sink commits) / starts (Spark triggers).
    sink_span = steady[-1]["t"] - steady[0]["t"]
    spark_span = steady[-1]["trigger_started_at"] - steady[0]["trigger_started_at"]
    sink_tp = sum(r["records"] for r in steady[1:]) / sink_span
    spark_tp = sum(r["input_rows"] for r in steady[1:]) / spark_span
    ratios, sink_p95, spark_p95 = [], [], []
    for r in steady:
        derived = spark_side_p95_ms(r, spec, t0)
        if derived and r.get("latency_p95_ms"):
            sink_p95.append(r["latency_p95_ms"])
            spark_p95.append(derived)
            ratios.append(r["latency_p95_ms"] / derived)
    within = sum(1 for x in ratios if abs(x - 1) <= 0.05) / len(ratios)
    return {
        "batches": len(steady),
        "rows": {"sink": sink_rows, "spark": spark_rows, "ratio": sink_rows / spark_rows},
        "throughput_rps": {"sink": sink_tp, "spark": spark_tp, "ratio": sink_tp / spark_tp},
        "p95_ms": {"sink_median": statistics.median(sink_p95),
                   "spark_median": statistics.median(spark_p95),
                   "median_ratio": statistics.median(ratios),
                   "batches_within_5pct": within},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.runtime.bench.sink")
    ap.add_argument("--seconds", type=float, default=90.0,
                    help="how long to measure after the query starts")
    ap.add_argument("--definition", type=Path, help="pipeline definition JSON (default: demo)")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = ap.parse_args(argv)
    try:
        doc = (json.loads(args.definition.read_text()) if args.definition
               else definition.DEMO_DEFINITION)
        spec = definition.validate(doc)
    except (OSError, json.JSONDecodeError, definition.DefinitionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="streamwise-bench-"))
    print(f"starting an embedded Spark cluster in {work} …", flush=True)
    info = cluster.start(work / "spark")
    run = RunnerProcess(work / "run", info.master_url, spec.raw, args.redis_url,
                        run_id=990_001, token="bench", initial_workers=1, max_workers=1)
    try:
        with run:
            run.wait_until(lambda: any(e["type"] == "query_started" for e in run.events),
                           300, "the query to start")
            print(f"query started; measuring for {args.seconds:.0f}s", flush=True)
            deadline = time.monotonic() + args.seconds

            shown = [0]

            def measured() -> bool:
                if len(run.metrics) >= shown[0] + 10:
                    shown[0] = len(run.metrics)
                    print(f"  {shown[0]} batches", flush=True)
                return time.monotonic() > deadline

            run.wait_until(measured, args.seconds + 120, "the measurement window")
        records, t0 = run.metrics, run.t0
    except HarnessError as exc:
        print(f"error: {exc}; see {work}/run/runner.log", file=sys.stderr)
        return 1
    finally:
        cluster.stop(info)
    try:
        result = summarize(records, spec, t0)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows, tp, p95 = result["rows"], result["throughput_rps"], result["p95_ms"]
    print(f"\nsink vs Spark over {result['batches']} batches after warm-up (1 executor, "
          f"{spec.key_groups} key groups)")
    print(f"  rows:        sink {rows['sink']:>10,}   Spark {rows['spark']:>10,}   "
          f"ratio {rows['ratio']:.4f}  (filter drops ~0.5 %)")
    print(f"  throughput:  sink {tp['sink']:>10,.0f}   Spark {tp['spark']:>10,.0f}   "
          f"ratio {tp['ratio']:.4f}  records/s")
    print(f"  p95 latency: sink {p95['sink_median']:>10,.0f}   Spark {p95['spark_median']:>10,.0f}"
          f"   median ratio {p95['median_ratio']:.4f}  ms (median over batches); "
          f"{p95['batches_within_5pct']:.0%} of batches within 5 %")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
