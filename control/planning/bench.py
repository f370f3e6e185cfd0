"""Planner benchmarks: ``python -m control bench-planning`` prints the tables.

Migration (Ding et al. §6, AT-3 in spirit): the 2011 Twitter crawl is
not available, so the stream is a word-count-like one: K keys with Zipf(s) popularity
hashed into G = 64 key groups, the popularity drifting (a few ranks swap every step),
and the worker count following the thesis' random-walk rate trace
(data file ``elastic-hft/random_walk_rates``) scaled to a worker range. Each planner
carries its own layout through the whole sequence; at each step it migrates when the
worker count changed or its layout broke the cap (1+τ)·W/n. State of a group = the
distinct keys it saw in a window (Σ_k 1 − e^{−λ·p_k·ω}), so hot groups hold no more
state than their key count — load and state are not proportional, as in a count job.

Fusion: random layered DAGs with log-normal costs; COLA vs the three baselines, wins/
ties/losses, and the gap to the exact optimum on small graphs.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import numpy as np

from control.planning import migration as mig
from control.workload import read_rate_trace, resolve_data_path

TRACE = "elastic-hft/random_walk_rates"
PLANNER_ORDER = mig.PLANNERS


@dataclass
class Scenario:
    zipf_s: float
    tau: float
    workers: tuple[int, int]
    groups: int = 64
    keys: int = 20_000
    steps: int = 180
    seed: int = 7


def _rates(steps: int) -> list[float]:
    try:
        rates = read_rate_trace(resolve_data_path(TRACE))
    except Exception:  # noqa: BLE001 - the trace is optional; fall back to a random walk
        rng = random.Random(1)
        rates, r = [], 300_000.0
        for _ in range(steps):
            r = max(50_000.0, r * (1 + rng.gauss(0, 0.08)))
            rates.append(r)
    return [rates[i % len(rates)] for i in range(steps)]


def worker_sequence(scn: Scenario) -> list[int]:
    rates = _rates(scn.steps)
    lo, hi = min(rates), max(rates)
    a, b = scn.workers
    return [int(round(a + (b - a) * (r - lo) / (hi - lo or 1))) for r in rates]


def load_sequence(scn: Scenario) -> tuple[list[list[float]], list[list[float]]]:
    """Per step: group loads (sum 1) and group state sizes (distinct keys in window)."""
    rng = np.random.default_rng(scn.seed)
    group_of = rng.integers(0, scn.groups, scn.keys)
    rank_of = rng.permutation(scn.keys)  # key -> popularity rank
    base = 1.0 / np.arange(1, scn.keys + 1) ** scn.zipf_s
    base /= base.sum()
    loads, states = [], []
    for _ in range(scn.steps):
        p = base[rank_of]
        w = np.bincount(group_of, weights=p, minlength=scn.groups)
        s = np.bincount(group_of, weights=1 - np.exp(-200_000 * p), minlength=scn.groups)
        loads.append(w.tolist())
        states.append(s.tolist())
        # Drift: 1 % of keys swap popularity with a random other key.
        a = rng.integers(0, scn.keys, scn.keys // 100)
        b = rng.integers(0, scn.keys, scn.keys // 100)
        rank_of[a], rank_of[b] = rank_of[b].copy(), rank_of[a].copy()
    return loads, states


def mtm_from(sequence: list[int]) -> dict[int, dict[int, float]]:
    """Ding §6: the migration transition matrix estimated from a worker-count history."""
    counts: dict[int, dict[int, int]] = {}
    for a, b in zip(sequence, sequence[1:], strict=False):
        counts.setdefault(a, {}).setdefault(b, 0)
        counts[a][b] += 1
    return {a: {b: c / sum(row.values()) for b, c in row.items()} for a, row in counts.items()}


def run_migrations(scn: Scenario, planners: tuple[str, ...] = PLANNER_ORDER) -> dict[str, dict]:
    workers = worker_sequence(scn)
    loads, states = load_sequence(scn)
    # History of the *previous* run of the trace estimates the MTM (the paper uses the
    # previous month); here: the same trace shifted, an honest stand-in.
    mtm = mtm_from(worker_sequence(Scenario(scn.zipf_s, scn.tau, scn.workers, steps=scn.steps,
                                            seed=scn.seed + 1)))
    out: dict[str, dict] = {}
    for name in planners:
        first = mig.MigrationProblem(tuple(loads[0]), tuple(states[0]), (0,) * scn.groups,
                                     workers[0], scn.tau)
        if name == "consistent-hash":
            layout = mig.consistent_hash_assignment(scn.groups, list(range(workers[0])))
        elif name in ("balanced", "flux"):
            layout = list(mig.plan_balanced(first).assignment)
        else:
            layout = mig.scratch_assignment(first)
        moved = total = 0.0
        migrations = violations = infeasible = 0
        worst = 0.0
        solve: list[float] = []
        inexact = 0
        for t in range(1, scn.steps):
            problem = mig.MigrationProblem(tuple(loads[t]), tuple(states[t]), tuple(layout),
                                           workers[t], scn.tau)
            total += sum(states[t])
            in_use = len(set(layout))
            if in_use == workers[t] and max(mig.worker_loads(loads[t], layout).values()) <= \
                    problem.cap * (1 + mig.CAP_TOLERANCE):
                worst = max(worst, max(mig.worker_loads(loads[t], layout).values()) / problem.cap)
                continue
            started = time.perf_counter()
            if name == "mtm":
                plan = mig.plan_mtm(problem, mtm, gamma=0.8)
            else:
                plan = mig.plan(problem, name)
            solve.append((time.perf_counter() - started) * 1e3)
            migrations += 1
            if not plan.feasible and plan.reason and plan.min_tau is not None:
                infeasible += 1
                continue  # no layout meets the cap: the planner keeps the old one
            violations += not plan.feasible
            inexact += plan.extra.get("exact") is False
            worst = max(worst, plan.max_load / plan.cap)
            moved += plan.migration_cost
            layout = list(plan.assignment)
        out[name] = {"moved_pct": 100 * moved / total if total else 0.0,
                     "migrations": migrations, "cap_violations": violations,
                     "infeasible": infeasible, "worst_load_over_cap": worst,
                     "not_proven_optimal": inexact,
                     "solve_ms_median": statistics.median(solve) if solve else 0.0}
    return out


def migration_table(taus: tuple[float, ...] = (0.2, 0.5, 1.2),
                    steps: int = 180) -> list[tuple[Scenario, dict[str, dict]]]:
    rows = []
    for s, workers in ((0.8, (8, 16)), (1.2, (2, 6))):
        for tau in taus:
            scn = Scenario(zipf_s=s, tau=tau, workers=workers, steps=steps)
            rows.append((scn, run_migrations(scn)))
    return rows


def print_migration_table(rows: list[tuple[Scenario, dict[str, dict]]]) -> None:
    print("Migration planners over the random-walk trace (state moved as % of state held, "
          "summed over the sequence; viol = steps whose layout broke (1+τ)W/n; "
          "worst = max load / cap)")
    head = f"{'scenario':<28}" + "".join(f"{p:>21}" for p in PLANNER_ORDER)
    print(head)
    for scn, res in rows:
        label = f"zipf {scn.zipf_s} n∈{scn.workers[0]}..{scn.workers[1]} τ={scn.tau}"
        cells = []
        for p in PLANNER_ORDER:
            r = res[p]
            cells.append(f"{r['moved_pct']:6.2f}% v{r['cap_violations']:<3d}w{r['worst_load_over_cap']:.2f}")
        print(f"{label:<28}" + "".join(f"{c:>21}" for c in cells))
        best = min(PLANNER_ORDER, key=lambda p: (res[p]["cap_violations"] > 0,
                                                 res[p]["moved_pct"]))
        print(f"{'':<28}least state moved without violations: {best}; table decisions not "
              f"proven optimal: {res['ding-table']['not_proven_optimal']}/"
              f"{res['ding-table']['migrations']}")


def ding_timing(instances: int = 30, seed: int = 3) -> dict[str, float]:
    """Ding's solve time at the paper's sizes (G = 64, n, n′ ∈ [8, 16]), with the
    from-scratch balanced split's time in the same run as the baseline."""
    rng = random.Random(seed)
    ding_ms, scratch_ms = [], []
    for _ in range(instances):
        g, n, n2 = 64, rng.randint(8, 16), rng.randint(8, 16)
        loads = tuple(rng.paretovariate(2) for _ in range(g))
        sizes = tuple(rng.random() for _ in range(g))
        start = mig.scratch_assignment(mig.MigrationProblem(loads, sizes, (0,) * g, n, 1.2))
        problem = mig.MigrationProblem(loads, sizes, tuple(start), n2, 0.3)
        t = time.perf_counter()
        mig.plan_ding(problem)
        ding_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        mig.plan_scratch(problem)
        scratch_ms.append((time.perf_counter() - t) * 1e3)
    return {"ding_median_ms": statistics.median(ding_ms), "ding_max_ms": max(ding_ms),
            "scratch_median_ms": statistics.median(scratch_ms)}


def fusion_table(sizes: tuple[int, ...] = (20, 50, 100, 200), seeds: int = 3
                 ) -> dict[str, dict[str, int]]:
    from control.planning import fusion as fu

    tally = {b: {"wins": 0, "ties": 0, "losses": 0, "baseline_infeasible": 0}
             for b in ("none", "fuse-all", "greedy-merge")}
    print(f"{'operators':>9} {'hosts':>5} {'cola':>16} {'none':>16} {'fuse-all':>16} "
          f"{'greedy-merge':>16}   (inter-PE traffic / max host utilisation; * infeasible)")
    for n in sizes:
        for seed in range(seeds):
            hosts = 4 + (seed % 4)
            p = fu.random_dag(n, 1000 * n + seed, hosts=hosts, exlocate=2, colocate=2)
            plans = {a: fu.plan_fusion(p, a) for a in fu.ALGORITHMS}
            cells = []
            for a in ("cola", "none", "fuse-all", "greedy-merge"):
                pl = plans[a]
                util = max(ld / c for ld, c in zip(pl.host_loads, p.capacity, strict=True))
                cells.append(f"{pl.inter_pe_traffic:9.2f}/{util:4.2f}{'' if pl.feasible else '*'}")
            print(f"{n:>9} {hosts:>5} " + " ".join(f"{c:>16}" for c in cells))
            c = plans["cola"]
            for b in tally:
                pb = plans[b]
                if not pb.feasible:
                    tally[b]["baseline_infeasible"] += 1
                elif c.inter_pe_traffic < pb.inter_pe_traffic - 1e-9:
                    tally[b]["wins"] += 1
                elif c.inter_pe_traffic > pb.inter_pe_traffic + 1e-9:
                    tally[b]["losses"] += 1
                else:
                    tally[b]["ties"] += 1
    print("COLA vs baselines (feasible baselines only):", tally)
    return tally


def fusion_gap(graphs: int = 20, operators: int = 9) -> list[float]:
    """COLA's inter-PE traffic over the brute-force optimum on small graphs."""
    from control.planning import fusion as fu

    ratios = []
    for seed in range(graphs):
        p = fu.random_dag(operators, 100 + seed, hosts=3, slack=0.9, exlocate=1, colocate=1)
        opt = fu.brute_force(p)
        c = fu.cola(p)
        if opt is None:
            continue
        ratios.append(c.inter_pe_traffic / opt.inter_pe_traffic
                      if opt.inter_pe_traffic > 0 and c.feasible else
                      (1.0 if c.feasible else float("inf")))
    return ratios


def main(quick: bool = False) -> None:
    timing = ding_timing(10 if quick else 30)
    print(f"Ding exact DP at G=64, n,n′∈[8,16]: median {timing['ding_median_ms']:.2f} ms, "
          f"max {timing['ding_max_ms']:.2f} ms (from-scratch split, same run: "
          f"{timing['scratch_median_ms']:.2f} ms; ratio "
          f"{timing['ding_median_ms'] / max(timing['scratch_median_ms'], 1e-9):.1f}×). "
          "Paper: SSM ≤ 2 ms in Java.")
    rows = migration_table(taus=(0.2, 1.2) if quick else (0.2, 0.5, 1.2),
                           steps=60 if quick else 180)
    print_migration_table(rows)
    fusion_table(sizes=(20, 50) if quick else (20, 50, 100, 200), seeds=2 if quick else 3)
    ratios = fusion_gap(graphs=8 if quick else 20, operators=8 if quick else 9)
    finite = [r for r in ratios if r != float("inf")]
    print(f"COLA / optimum on {len(ratios)} small feasible graphs: median "
          f"{statistics.median(finite) if finite else float('nan'):.3f}, worst "
          f"{max(ratios) if ratios else float('nan'):.3f}, optimal on "
          f"{sum(abs(r - 1) < 1e-9 for r in ratios)}; COLA infeasible where the optimum "
          f"exists: {sum(r == float('inf') for r in ratios)}")
