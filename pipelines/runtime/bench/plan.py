"""Benchmark of the plan optimiser (``python -m pipelines.runtime.bench plan``).

COLA's experiment (Khandekar et al. §4: profile the unfused job, fuse with the profile,
compare throughput with NONE and FINT) on real Spark, for three pipelines of Python
operators (``pyops.py``): the HFT kernel split into six operators of uneven cost
(parse, enrich, bucket, fit, score, format), NEXMark bids through five (Query 1's
conversion, parsing ``extra``, a band, a fraud score, formatting), and orders through
six operators of the example package with two exlocated pairs (``ORDERS_NOTES``:
there COLA's plan differs from fuse-all's and greedy merging's).

Per pipeline:

1. **Profile** — one run of the unfused plan (NONE, every operator its own PE, as COLA
   profiles first): ``PROFILE_S`` at a modest rate, then saturated. Its profile gives
   the measured graph (``planopt.measured_graph``) and its saturated throughput sets
   the common rate (``COMMON_SHARE`` of it).
2. **Plans** — COLA, fuse-all, NONE and greedy merging (FINT-like) from
   ``planopt.max_sustainable`` on that graph (COLA at the highest rate it is modelled to
   sustain; a baseline likewise).
3. **Runs** — every distinct plan ``--reps`` times in turn, each repetition in a
   rotated order (algorithms proposing the same plan share its runs), one fresh run
   each: silent until the query is up (the profile run's start-up lag, with a
   margin), then ``COMMON_S`` at
   the common rate (p95 latency: the median of the per-batch p95 over its last
   ``COMMON_TAIL_S``, after the query's start-up),
   then saturated: the source is far ahead and every batch reads
   ``max_records_per_batch`` records; the **sustainable rate** is the records those
   batches read over the seconds they took (after the first saturated batch).

Medians over the repetitions; the ratio of each plan's to NONE's. Every run's output is
checked by the verifier (each source record once, every value as the pandas reference).
A table goes to stderr, the JSON document to stdout.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.runtime.spec import definition
from pipelines.runtime.query import planopt
from pipelines.runtime.operators import catalogue as pyops
from pipelines.runtime.verify import verifier as verify
from pipelines.runtime.query.dataflow_spark import pe_name, profile_dir
from pipelines.runtime.runner.harness import RunnerProcess

PROFILE_RATE = 2000.0
PROFILE_S = 44.0
PROFILE_TRIGGER_MS = 2000
COMMON_S = 30.0
COMMON_TAIL_S = 12.0  # p95 over the common phase's last this many seconds (warmed up)
SATURATED_BATCHES = 8
COMMON_SHARE = 0.4
CORES = 2  # the runs' executors (1 core each)

# orders6: six operators of the example package (examples/streamwise-example-ops) where
# two pairs must run in separate Python workers (the definition's plan.exlocate, COLA
# §3.1 PE exlocation): A..E must be cut between a and e, C..F between c and f. Each
# order_note sets a note of its own length, so every edge carries rows of another
# width: one cut on the 900-character edge c->d separates both pairs; fusing in order
# (fuse-all) cuts before e, the 6,000-character edge; merging the heaviest pairs first
# (greedy) joins a-b, c-d-e and leaves two cuts, b->c and e->f (850 each).
ORDERS_NOTES = (("a", 1000), ("b", 850), ("c", 900), ("d", 6000), ("e", 850))
ORDERS_EXLOCATE = [["a", "e"], ["c", "f"]]


def orders_notes_definition(rate: float, plan: dict[str, Any] | None = None,
                            max_records_per_batch: int = 200_000) -> dict[str, Any]:
    """The orders through five notes of uneven width and their region (module note)."""
    nodes: list[dict[str, Any]] = [
        {"id": "orders", "type": "generator", "seed": 21, "partitions": 2,
         "rate": {"kind": "constant", "records_per_s": rate},
         "keys": {"kind": "zipf", "n": 1000, "s": 1.1}}]
    prev = "orders"
    for node_id, chars in ORDERS_NOTES:
        nodes.append({"id": node_id, "type": "python", "input": prev,
                      "function": "order_note", "params": {"chars": chars}})
        prev = node_id
    nodes += [{"id": "f", "type": "python", "input": prev, "function": "customer_region"},
              {"id": "out", "type": "sink", "input": "f", "keep_output": True}]
    return {"nodes": nodes, "max_records_per_batch": max_records_per_batch,
            "plan": plan if plan is not None else {"exlocate": ORDERS_EXLOCATE}}


PIPELINES = {
    "hft6": pyops.hft_split_definition,
    "nexmark5": pyops.nexmark_python_definition,
    "orders6": orders_notes_definition,
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(value: float | None, unit: str = " ms") -> str:
    """A latency, or "-" when no batch of the common phase's tail reported one."""
    return "-" if value is None else f"{value:,.0f}{unit}"


def _runner(work: Path, master: str, redis_url: str, doc: dict[str, Any], name: str
            ) -> RunnerProcess:
    return RunnerProcess(work / name, master, doc, redis_url, token=name,
                         max_workers=CORES, initial_workers=CORES)


def _step_rate(doc: dict[str, Any], low: float, low_s: float, high: float,
               lead_s: float = 0.0) -> dict[str, Any]:
    """``low`` records/s until ``low_s``, then ``high``; nothing before ``lead_s``."""
    steps = [[0, low], [low_s, high]] if not lead_s else [[0, 0], [lead_s, low],
                                                          [low_s, high]]
    doc["nodes"][0]["rate"] = {"kind": "step", "steps": steps}
    return doc


def measure(run: RunnerProcess, low_s: float, timeout_s: float = 600.0
            ) -> dict[str, Any]:
    """p95 over the common-rate phase's tail, then the saturated throughput."""
    t0 = run.wait_until(lambda: run.events and any(e["type"] == "query_started"
                                                   for e in run.events), 240,
                        "the query") and run.t0
    run.wait_until(lambda: run.metrics and run.metrics[-1]["t"] > t0 + low_s + 1.0,
                   timeout_s, "the saturated phase")
    common = [m for m in run.metrics
              if t0 + low_s - min(COMMON_TAIL_S, low_s / 2) <= m["t"] <= t0 + low_s]
    saturated_from = len(run.metrics)
    run.wait_until(lambda: len(run.metrics) >= saturated_from + SATURATED_BATCHES + 1,
                   timeout_s, "saturated batches")
    sat = run.metrics[saturated_from + 1:]
    seconds = sum(m["batch_duration_ms"] for m in sat) / 1000.0
    rows = sum(m["input_rows"] for m in sat)
    p95 = [m["latency_p95_ms"] for m in common if m.get("latency_p95_ms") is not None]
    return {"sustainable_rate": rows / seconds if seconds else None,
            "p95_ms": _median(p95), "common_batches": len(common),
            "saturated_batches": len(sat), "saturated_rows": rows}


def input_sample(spec: definition.PipelineSpec, t0: float, rows: int
                 ) -> tuple[list[pyops.PeStep], Any]:
    """The first Python operator's input for about ``rows`` rows (generated, filtered
    as the pipeline filters) and the chain of Python operators, in order."""
    import pandas as pd

    assert spec.graph is not None
    python = [n for n in spec.graph.nodes if n.type == "python"]
    steps = [pyops.PeStep(n.id, n.params["function"], n.params["params"]) for n in python]
    upstream = python[0].inputs[0]
    frames = verify.python_frames(spec, t0, 0, rows)
    passing = max(1, len(frames[upstream]))
    frames = verify.python_frames(spec, t0, 0, int(rows * rows / passing) + 1)
    sample = frames[upstream].head(rows).copy()
    if "event_time" not in sample:  # every PE's batches carry it
        sample["event_time"] = pd.to_datetime(sample["emit_ts"], unit="s")
    return steps, sample


def profile_pipeline(master: str, work: Path, redis_url: str, name: str,
                     ) -> tuple[dict[str, Any], planopt.MeasuredGraph, dict[str, Any]]:
    """The unfused run: its measured graph, its saturated throughput and each operator
    timed alone meanwhile (the profile's independent check)."""
    doc = _step_rate(PIPELINES[name](PROFILE_RATE), PROFILE_RATE, PROFILE_S,
                     PROFILE_RATE * 40)
    doc["trigger_ms"] = PROFILE_TRIGGER_MS  # batches of a steady size to time alone
    spec = definition.validate(doc)
    assert spec.graph is not None and spec.pe_plan is not None
    run = _runner(work, master, redis_url, doc, f"{name}-profile")
    with run:
        run.wait_until(lambda: run.events and any(e["type"] == "query_started"
                                                  for e in run.events), 240, "the query")
        # Past the start-up: the first batches also load every worker's modules.
        run.wait_until(lambda: run.metrics and run.metrics[-1]["t"] > run.t0
                       + PROFILE_S / 2, 240, "the start-up")
        since = run.metrics[-1]["t"]
        rows = max(50, int(run.metrics[-1]["input_rows"] / spec.partitions))
        steps, sample = input_sample(spec, run.t0, rows)
        alone = pyops.time_chain_alone_isolated(
            steps, sample, max(4.0, run.t0 + PROFILE_S - time.time() - 2.0))
        run.wait_batches(1)  # (the metrics read meanwhile)
        until = run.metrics[-1]["t"]
        records = sum(m["input_rows"] for m in run.metrics if since < m["t"] <= until)
        result = measure(run, PROFILE_S)
        # The first batch's commit after the source's zero: the query's start-up, whose
        # backlog the plans' runs must drain before their common phase's tail.
        result["start_lag_s"] = round(run.metrics[0]["t"] - run.t0, 2)
    names = {pe_name(pe) for pe in spec.pe_plan.pes}
    prof = planopt.read_profile(profile_dir(run.work / "source-plan"), since, names,
                                until=until)
    measured = planopt.measured_graph(spec.graph, prof, records)
    result["alone_check"] = {
        s.node_id: {"profiled_us_per_row": prof.operators[s.node_id].steady_cpu_s
                    / max(1, prof.operators[s.node_id].rows_in) * 1e6,
                    "alone_us_per_row": alone[s.node_id] * 1e6} for s in steps}
    for check in result["alone_check"].values():
        check["ratio"] = round(check["profiled_us_per_row"] / check["alone_us_per_row"], 3)
    result["alone_rows_per_call"] = rows
    del doc["trigger_ms"]
    return doc, measured, result


def bench_plan(master: str, work: Path, redis_url: str, reps: int = 3,
               pipelines: tuple[str, ...] = tuple(PIPELINES)) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "plan", "reps": reps, "pipelines": []}
    for name in pipelines:
        log(f"[{name}] profiling the unfused plan ...")
        doc, measured, prof_run = profile_pipeline(master, work, redis_url, name)
        log(f"[{name}] profile vs each operator timed alone (us/row): " + ", ".join(
            f"{k} {v['profiled_us_per_row']:.2f}/{v['alone_us_per_row']:.2f}"
            for k, v in prof_run["alone_check"].items()))
        spec = definition.validate(doc)
        assert spec.graph is not None and spec.pe_plan is not None
        proposals = {alg: planopt.max_sustainable(spec.graph, measured, spec.pe_plan,
                                                  spec.partitions, CORES, alg)
                     for alg in planopt.ALGORITHMS}
        phases = _phases(prof_run, proposals)
        log(f"[{name}] start-up lag {prof_run['start_lag_s']:.1f} s: each run silent "
            f"{phases.lead_s:.0f} s, {COMMON_S:.0f} s at {phases.common:,.0f}/s, "
            "then saturated")
        for alg, p in proposals.items():
            log(f"[{name}] {alg}: {[list(pe) for pe in p.pes]} over {p.partitions} "
                f"partition(s), modelled max {p.max_rate:,.0f}/s")
        runs_of = _shared_runs(proposals)
        runs = _run_reps(master, work, redis_url, name, spec, proposals, runs_of, phases,
                         reps)
        summary = _summary(proposals, runs_of, runs)
        out["pipelines"].append({"pipeline": name, "common_rate": round(phases.common, 1),
                                 "silent_lead_s": phases.lead_s,
                                 "measured_graph": measured.as_dict(),
                                 "profile_run": prof_run, "plans": summary,
                                 "runs": runs})
        log(table(name, phases.common, summary))
    return out


@dataclass(frozen=True)
class _Phases:
    """A plan run's rate schedule: silent, then the common rate, then saturated."""

    lead_s: float
    common: float
    common_s: float
    high: float
    batch: int


def _phases(prof_run: dict[str, Any], proposals: dict[str, Any]) -> _Phases:
    common = COMMON_SHARE * (prof_run["sustainable_rate"] or PROFILE_RATE)
    # The source is silent until the query is up (the profile run's measured start-up
    # lag, with a margin): the common phase then has no start-up backlog to drain, and
    # its tail is the plan at the common rate. (Whole seconds: a rate schedule's steps
    # are.)
    lead_s = float(math.ceil(1.25 * prof_run["start_lag_s"] + 2.0))
    # The saturated phase: far above every plan (the source is then ahead at once).
    high = 40 * max(common, max(p.max_rate for p in proposals.values()))
    batch = int(max(2000, 2 * (prof_run["sustainable_rate"] or PROFILE_RATE)))
    return _Phases(lead_s, common, lead_s + COMMON_S, high, batch)


def _shared_runs(proposals: dict[str, Any]) -> dict[str, str]:
    """Each algorithm's name -> the algorithm whose runs it shares. Algorithms proposing
    the same plan share its runs: one plan, one rate (running it once per name would
    only measure the machine's noise between them)."""
    runs_of: dict[str, str] = {}
    for alg, p in proposals.items():
        runs_of[alg] = next((a for a in runs_of.values()
                             if proposals[a].pes == p.pes
                             and proposals[a].partitions == p.partitions), alg)
    return runs_of


def _run_reps(master: str, work: Path, redis_url: str, name: str, spec: Any,
              proposals: dict[str, Any], runs_of: dict[str, str], phases: _Phases,
              reps: int) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {alg: [] for alg in set(runs_of.values())}
    order = [alg for alg in proposals if runs_of[alg] == alg]
    for rep in range(reps):
        # Each repetition in another order (a rotation): no plan always runs first.
        for alg in order[rep % len(order):] + order[:rep % len(order)]:
            plan = proposals[alg].pe_plan(spec.pe_plan).as_dict()
            pdoc = _step_rate(PIPELINES[name](phases.common, plan=plan,
                                              max_records_per_batch=phases.batch),
                              phases.common, phases.common_s, phases.high, phases.lead_s)
            run = _runner(work, master, redis_url, pdoc, f"{name}-{alg}-{rep}")
            with run:
                result = measure(run, phases.common_s)
            report = verify.verify_run_dir(run.work)
            result["verifier"] = report.line()
            result["verified"] = report.ok
            runs[alg].append(result)
            same = [a for a in proposals if runs_of[a] == alg and a != alg]
            log(f"[{name}] rep {rep + 1}/{reps} {'/'.join([alg, *same])}: "
                f"{result['sustainable_rate'] or 0:,.0f}/s, p95 "
                f"{_ms(result['p95_ms'])} at {phases.common:,.0f}/s "
                f"({result['common_batches']} batches); "
                f"{report.line()[:60]}")
    return runs


def _summary(proposals: dict[str, Any], runs_of: dict[str, str],
             runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per algorithm: its plan, its medians over its runs, its rate against NONE's."""
    summary = {}
    none = _median([r["sustainable_rate"] for r in runs[runs_of["none"]]
                    if r["sustainable_rate"]])
    for alg in proposals:
        results = runs[runs_of[alg]]
        rate = _median([r["sustainable_rate"] for r in results if r["sustainable_rate"]])
        summary[alg] = {
            "pes": [list(pe) for pe in proposals[alg].pes],
            "partitions": proposals[alg].partitions,
            "same_plan_as": runs_of[alg] if runs_of[alg] != alg else None,
            "modelled_max_rate": round(proposals[alg].max_rate, 1),
            "sustainable_rate_median": rate and round(rate, 1),
            "sustainable_rates": [r["sustainable_rate"] and round(r["sustainable_rate"], 1)
                                  for r in results],
            "p95_ms_median": _median([r["p95_ms"] for r in results if r["p95_ms"]]),
            "vs_none": round(rate / none, 3) if rate and none else None,
            "verified": all(r["verified"] for r in results)}
    return summary


def table(name: str, common: float, summary: dict[str, Any]) -> str:
    lines = [f"{name}: sustainable rate (median of reps) and p95 at {common:,.0f}/s",
             f"{'plan':<13}{'PEs':>4}{'parts':>6}{'rate/s':>10}{'x NONE':>8}"
             f"{'p95 ms':>9}{'modelled':>10}  verifier"]
    for alg, s in summary.items():
        lines.append(f"{alg:<13}{len(s['pes']):>4}{s['partitions']:>6}"
                     f"{s['sustainable_rate_median'] or 0:>10,.0f}"
                     f"{s['vs_none'] or 0:>8.2f}{_ms(s['p95_ms_median'], ''):>9}"
                     f"{s['modelled_max_rate']:>10,.0f}  "
                     f"{'OK' if s['verified'] else 'FAILED'}"
                     + (f"  (the plan of {s['same_plan_as']})" if s["same_plan_as"] else ""))
    return "\n".join(lines)


def check_args(pipelines: list[str]) -> tuple[str, ...]:
    bad = [p for p in pipelines if p not in PIPELINES]
    if bad or not pipelines:
        raise ValueError(f"--pipelines: among {', '.join(PIPELINES)}")
    for name in pipelines:  # (orders6 needs the example package installed)
        try:
            definition.validate(PIPELINES[name](100.0))
        except definition.DefinitionError as exc:
            raise ValueError(f"--pipelines: {name}: {exc}") from None
    return tuple(pipelines)



# ------------------------------------------------------------- the CLI's entry
def arguments(ap: Any) -> None:
    ap.add_argument("--reps", type=int, default=3, help="repetitions per plan")
    ap.add_argument("--pipelines", default="hft6,nexmark5,orders6",
                    help=f"comma-separated pipelines ({', '.join(PIPELINES)})")


def check(args: Any) -> None:
    args.pipelines = check_args([p.strip() for p in args.pipelines.split(",") if p.strip()])
    if args.reps < 1:
        raise ValueError("--reps must be >= 1")


def run(master: str, work: Path, args: Any) -> dict[str, Any]:
    return bench_plan(master, work, args.redis_url, args.reps, args.pipelines)
