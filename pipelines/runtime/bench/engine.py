"""Benchmarks of the elastic runtime on a fresh embedded Spark cluster (JSON out).

    python -m pipelines.runtime.bench migration [--keys 250000,1000000,4000000] ...
    python -m pipelines.runtime.bench scale [--keys 1000000] ...
    python -m pipelines.runtime.bench replan [--keys 1000000] [--reconfigs 10] ...
    python -m pipelines.runtime.bench plan [--reps 3] [--pipelines hft6,nexmark5]

``migration`` (the protocol of Megaphone, Hoffmann et al., VLDB 2019, §5.3, on Spark):
per state size, a keyed count over uniform keys on 2 executors and G key groups is
filled with a burst, runs steady, then half the groups are swapped between the executors
with each schedule (all-at-once, fluid, batched; each swap reverses the previous one).
Per schedule: max and p95 batch duration and per-batch latency during the migration vs
the steady state just before it, migration duration, groups and bytes moved. Spark's
default is the same pipeline with ``spark.locality.wait=0`` and no placement of ours:
Spark moves groups by itself whenever an executor is free (``group_moves`` per batch).

``scale``: 1 -> 2 -> 1 workers with planned migration + decommission (the runtime) vs
Spark's default: raise the executor target (the new executor gets no state), and kill
an executor. So that the kill hits an executor *holding state* — the case that hurts —
the baseline run first spreads the groups with a planned rebalance, then kills the
newest executor at once (mid-batch or not, as a cluster manager would). Per phase: max
and p95 batch duration and latency, failed tasks, groups on the new executor.

Every run ends with the verifier (nothing lost, nothing duplicated, same values).
Numbers are medians/maxima over batches of one run on a noisy 2-core machine: read the
ratios, which compare runs made minutes apart on the same machine.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pipelines.runtime.spec import definition
from pipelines.runtime.elastic import migration as elastic
from pipelines.runtime.verify import verifier as verify
from pipelines.runtime.runner.harness import HarnessError, RunnerProcess, keyed_count, wait_steady

SCHEDULES = elastic.STRATEGIES


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def window_stats(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch duration and latency (p95 and max per batch) over some batches."""
    dur = [b["batch_duration_ms"] for b in batches]
    p95 = [b["latency_p95_ms"] for b in batches if b.get("latency_p95_ms") is not None]
    mx = [b["latency_max_ms"] for b in batches if b.get("latency_max_ms") is not None]
    return {"batches": len(batches),
            "batch_ms": {"median": quantile(dur, 0.5), "p95": quantile(dur, 0.95), "max": max(dur, default=None)},
            "latency_p95_ms": {"median": quantile(p95, 0.5), "p95": quantile(p95, 0.95),
                               "max": max(p95, default=None)},
            "latency_max_ms": max(mx, default=None),
            "failed_tasks": sum(b.get("failed_tasks") or 0 for b in batches),
            "group_moves": sum(b.get("group_moves") or 0 for b in batches)}


def half_swap(placement: list[str]) -> dict[str, str]:
    """Half the groups change executor, each executor sending as many as it receives
    (the layout stays balanced): per executor pair, swap half of each one's groups."""
    owners = sorted(set(placement), key=lambda e: (len(e), e))
    if len(owners) < 2:
        raise HarnessError("need 2 executors holding groups")
    a, b = owners[:2]
    ga = [g for g, e in enumerate(placement) if e == a]
    gb = [g for g, e in enumerate(placement) if e == b]
    k = min(len(ga), len(gb)) // 2
    return {**{str(g): b for g in ga[:k]}, **{str(g): a for g in gb[:k]}}


def measure_move(run: RunnerProcess, moves: dict[str, str], schedule: str,
                 steady_batches: int) -> dict[str, Any]:
    before = run.metrics[-steady_batches:]
    ack = run.command("move_groups", moves=moves, schedule=schedule, timeout_s=900)
    if not ack["ok"]:
        raise HarnessError(f"move_groups ({schedule}) failed: {ack['message']}")
    summary = ack["migration"]
    first = summary["step_details"][0]["batch_id"]
    last = summary["step_details"][-1]["batch_id"]
    # The batch after the last step catches up the backlog the last step left.
    run.wait_until(lambda: run.metrics[-1]["batch_id"] >= last + 1, 300, "the catch-up batch")
    during = [m for m in run.metrics if first <= m["batch_id"] <= last + 1]
    steady, migr = window_stats(before), window_stats(during)
    # The reload itself: task time of each moved group in the batch it moved, vs the
    # same group's median task time in steady state.
    normal = {g: quantile([b["group_ms"][g] for b in before if b.get("group_ms")
                     and b["group_ms"][g] is not None], 0.5)
              for g in range(len(before[-1].get("group_ms") or []))}
    extra = [ms - (normal.get(int(g)) or 0)
             for st in summary["step_details"] for g, ms in st["moved_task_ms"].items()]
    per_exec_step = [sum(st["moved_task_ms"].get(str(mv["group"]), 0) for mv in st["moves"]
                         if mv["to"] == e) for st in summary["step_details"]
                     for e in {mv["to"] for mv in st["moves"]}]
    return {"schedule": schedule, "steps": summary["steps"],
            "reload_extra_ms_per_group": {"median": quantile(extra, 0.5), "max": max(extra, default=None)},
            "moved_task_ms_per_executor_step_max": max(per_exec_step, default=None),
            "groups_moved": summary["groups_moved"], "bytes_moved": summary["bytes_moved"],
            "verified_placement": summary["verified"], "migration_s": summary["duration_s"],
            "steady": steady, "during": migr,
            "worst_batch_ms_vs_steady_median": ratio(migr["batch_ms"]["max"],
                                                      steady["batch_ms"]["median"])}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def verify_run(run: RunnerProcess, doc: dict[str, Any]) -> dict[str, Any]:
    report = verify.verify(definition.validate(doc), run.t0, run.work / "checkpoint",
                           run.work / "output")
    log("  " + report.line())
    return {"ok": report.ok, "batches": report.batches, "records": report.records,
            "lost": report.lost, "duplicated": report.duplicated, "wrong": report.wrong,
            "unexpected": report.unexpected}


def state_summary(run: RunnerProcess) -> dict[str, Any]:
    last = run.metrics[-1]
    return {"state_rows": last.get("state_rows"),
            "state_bytes": sum(last.get("group_bytes") or [])}


def bench_migration(master: str, work: Path, redis_url: str, keys: int, rate: float,
                    groups: int, steady: int, schedules: tuple[str, ...],
                    spark_default: bool, state_store: str,
                    executor_memory: str) -> dict[str, Any]:
    doc = keyed_count(keys, rate, groups, burst_records=keys, state_store=state_store)
    out: dict[str, Any] = {"keys": keys, "rate": rate, "groups": groups, "executors": 2,
                           "state_store": state_store}
    log(f"migration: {keys:,} keys, {groups} groups, {rate:g} rec/s, {state_store} store")
    with RunnerProcess(work / f"mig-{keys}-{state_store}", master, doc, redis_url,
                       max_workers=2, initial_workers=2, token=f"mig{keys}{state_store}",
                       executor_memory=executor_memory) as run:
        wait_steady(run, rate, steady)
        out["state"] = state_summary(run)
        log(f"  state: {out['state']['state_rows']:,} rows, "
            f"{out['state']['state_bytes'] / 1e6:.1f} MB to reload in all")
        # Warm-up (not measured): the first reload on an executor pays one-off costs.
        warm = half_swap(run.metrics[-1]["placement"])
        warm = dict(list(warm.items())[:1] + list(warm.items())[-1:])
        run.command("move_groups", moves=warm, schedule="all-at-once", timeout_s=600)
        run.wait_batches(steady)
        results = []
        for schedule in schedules:
            moves = half_swap(run.metrics[-1]["placement"])
            r = measure_move(run, moves, schedule, steady)
            log(f"  {schedule:12s} steps {r['steps']:2d}  worst batch "
                f"{r['during']['batch_ms']['max']} ms (steady median "
                f"{r['steady']['batch_ms']['median']} ms)  worst p95 latency "
                f"{r['during']['latency_p95_ms']['max']:.0f} ms  took {r['migration_s']} s")
            results.append(r)
            run.wait_batches(steady)
        out["schedules"] = results
    out["verifier"] = verify_run(run, doc)
    by = {r["schedule"]: r for r in out["schedules"]}
    if "all-at-once" in by:
        base_b = by["all-at-once"]["during"]["batch_ms"]["max"]
        base_l = by["all-at-once"]["during"]["latency_p95_ms"]["max"]
        out["vs_all_at_once"] = {
            s: {"worst_batch_ratio": ratio(by[s]["during"]["batch_ms"]["max"], base_b),
                "worst_latency_p95_ratio": ratio(by[s]["during"]["latency_p95_ms"]["max"],
                                                  base_l)}
            for s in by if s != "all-at-once"}
        steady_median = by["all-at-once"]["steady"]["batch_ms"]["median"]
        out["all_at_once_costs_more_than_one_batch"] = bool(
            base_b and steady_median and base_b - steady_median > steady_median)
    if spark_default:
        log("  Spark default (locality wait 0, no placement of ours)")
        with RunnerProcess(work / f"mig-{keys}-{state_store}-spark", master, doc, redis_url,
                           max_workers=2, initial_workers=2, token=f"migs{keys}{state_store}",
                           locality_wait="0s", enforce_placement=False,
                           executor_memory=executor_memory) as run:
            wait_steady(run, rate, steady)
            batches = run.wait_batches(3 * steady)
            stats = window_stats(batches)
            log(f"  spark-default: {stats['group_moves']} group moves in {len(batches)} "
                f"batches, worst batch {stats['batch_ms']['max']} ms")
        out["spark_default"] = {"window": stats, "verifier": verify_run(run, doc)}
    return out


def bench_scale(master: str, work: Path, redis_url: str, keys: int, rate: float,
                groups: int, steady: int, schedule: str, state_store: str,
                executor_memory: str) -> dict[str, Any]:
    doc = keyed_count(keys, rate, groups, burst_records=keys, state_store=state_store)
    out: dict[str, Any] = {"keys": keys, "rate": rate, "groups": groups,
                           "state_store": state_store}
    for mode in ("planned", "kill"):
        log(f"scale ({mode}): {keys:,} keys, {groups} groups, {rate:g} rec/s, 1 -> 2 -> 1")
        kw: dict[str, Any] = {"executor_memory": executor_memory}
        with RunnerProcess(work / f"scale-{mode}", master, doc, redis_url, max_workers=2,
                           initial_workers=1, token=f"scale{mode}", **kw) as run:
            wait_steady(run, rate, steady)
            at1 = window_stats(run.metrics[-steady:])
            old_exec = {e for e in run.metrics[-1]["ran_on"] if e}
            up = run.command("set_workers", workers=2, mode=mode, schedule=schedule,
                             timeout_s=900)
            if not up["ok"]:
                raise HarnessError(f"scale up ({mode}) failed: {up['message']}")
            mark = run.metrics[-1]["batch_id"]
            run.wait_batches(2 * steady)
            after_up = [m for m in run.metrics if m["batch_id"] > mark]
            new_exec = [e for e in up["executors"] if e not in old_exec]
            placement = run.metrics[-1]["ran_on"]
            at2 = window_stats(after_up[-steady:])
            if mode == "kill":  # give the executor about to be killed half the state
                spread = run.command("rebalance", tau=0.2, schedule=schedule, timeout_s=900)
                if not spread["ok"]:
                    raise HarnessError(f"rebalance before the kill failed: {spread['message']}")
                run.wait_batches(steady)
            held = sum(1 for e in run.metrics[-1]["ran_on"] if e in new_exec)
            mark = run.metrics[-1]["batch_id"]
            down = run.command("set_workers", workers=1, mode=mode, schedule=schedule,
                               timeout_s=900)
            if not down["ok"]:
                raise HarnessError(f"scale down ({mode}) failed: {down['message']}")
            run.wait_batches(steady)
            during_down = [m for m in run.metrics if m["batch_id"] > mark]
            phase = {"at_1_worker": at1, "scale_up_s": up["took_s"],
                     "groups_on_new_executor": sum(1 for e in placement if e in new_exec),
                     "groups_held_by_the_released_executor": held,
                     "at_2_workers": at2, "scale_down_s": down["took_s"],
                     "scale_down_window": window_stats(during_down),
                     "up_migration": up.get("migration"), "down_migration": down.get("migration")}
            for key in ("up_migration", "down_migration"):
                if phase[key]:
                    phase[key] = {k: v for k, v in phase[key].items() if k != "step_details"}
            log(f"  {mode}: batch median {at1['batch_ms']['median']} ms at 1 worker, "
                f"{at2['batch_ms']['median']} ms at 2 ({phase['groups_on_new_executor']} groups "
                f"on the new executor); releasing an executor holding {held} groups: worst batch "
                f"{phase['scale_down_window']['batch_ms']['max']} ms, failed tasks "
                f"{phase['scale_down_window']['failed_tasks']}")
        phase["verifier"] = verify_run(run, doc)
        out[mode] = phase
    out["scale_down_worst_batch_ratio_planned_vs_kill"] = ratio(
        out["planned"]["scale_down_window"]["batch_ms"]["max"],
        out["kill"]["scale_down_window"]["batch_ms"]["max"])
    return out


# ------------------------------------------------------------- the CLI's entries
def migration_arguments(ap: Any) -> None:
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--no-spark-default", action="store_true")


def check_migration(args: Any) -> None:
    args.schedules = tuple(s for s in args.schedules.split(",") if s)
    if not args.schedules or any(s not in SCHEDULES for s in args.schedules):
        raise ValueError(f"--schedules must be among {', '.join(SCHEDULES)}")


def run_migration(master: str, work: Path, args: Any) -> dict[str, Any]:
    return {"benchmark": "migration", "sizes": [
        bench_migration(master, work, args.redis_url, k, args.rate, args.groups,
                        args.steady, args.schedules, not args.no_spark_default,
                        args.state_store, args.executor_memory) for k in args.keys]}


def scale_arguments(ap: Any) -> None:
    ap.add_argument("--schedule", default="batched", help="the migration schedule")


def check_scale(args: Any) -> None:
    if args.schedule not in SCHEDULES:
        raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}")


def run_scale(master: str, work: Path, args: Any) -> dict[str, Any]:
    return {"benchmark": "scale", "sizes": [
        bench_scale(master, work, args.redis_url, k, args.rate, args.groups, args.steady,
                    args.schedule, args.state_store, args.executor_memory)
        for k in args.keys]}
