"""Optimal operator-state migration (Ding et al., "Optimal Operator State Migration for
Elastic Data Stream Processing", §3–4) and the baselines it is compared with.

Model (§3.1, Table 1): key groups ("tasks") 0..G−1 with load w_j and state size s_j;
every worker owns a *contiguous* range of groups. A migration to n′ workers must give
every worker a load ≤ cap = (1+τ)·W/n′ (Def. 3.1) and moves the state of every group
whose owner changes; its cost is Σ s_j over those groups (Def. 3.2).

``plan_ding`` is exact: a dynamic programme equivalent to SSM (§3.2, Fig. 2 and 4) with
one index of state, vectorised with numpy over (start, end, last gain node):

    F[k][x][y] = best gain (state that stays) with groups [0, x) split into k ranges, the
                 last range that *keeps state* given to old worker y (0 = none yet).

The key fact that makes one index enough: if new range A precedes range B and both keep
state of their old owners a and b, then a's old range precedes b's (otherwise B could
not overlap b's range). So the ranges that keep state are matched to old workers in
order, and every other range ("free") goes to a retired-or-new worker with no gain.
A range may also be given to an old worker it does not overlap (gain 0) — a valid but
never better choice, which keeps the recurrence a prefix maximum:

    F[k+1][x2][y′] = max over x with W[x, x2) ≤ cap of
                     max( F[k][x][y′],                          (free range)
                          max_{y<y′} F[k][x][y] + S(I_y′ ∩ [x, x2)) )

O(n′·G²·n) time; 2–10 ms at G = 64, n, n′ ≤ 16 (``bench_migration``), where the paper
reports ≤ 2 ms for its Java SSM (Fig. 10). Checked against brute force (every interval
partition × every matching) in ``tests/unit/test_planning.py``.

``plan_mtm`` adds the MTM-aware look-ahead (Def. 4.1); its candidate reduction is
documented there. Baselines: consistent hashing (the paper's CH), ``balanced`` and
``flux`` (control library, thesis §6.4.3), and ``scratch`` (the best-balanced contiguous
split, recomputed ignoring where state is: Storm's default in the paper).
"""
from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from control.planning import PlanningError
from control.strategies import rebalance

# Loads are floats: a range whose load exceeds the cap by less than this relative
# tolerance is accepted (so an exactly balanced split at τ = 0 is feasible).
CAP_TOLERANCE = 1e-9
PLANNERS = ("ding", "ding-ordered", "ding-table", "mtm", "mtm-table", "consistent-hash",
            "balanced", "flux", "scratch")


@dataclass(frozen=True)
class MigrationProblem:
    """Def. 3.2's input. ``current[j]`` is the worker id owning group j."""

    loads: tuple[float, ...]
    state_sizes: tuple[float, ...]
    current: tuple[int, ...]
    target_workers: int
    tau: float
    # Paper: a worker may end with an empty range. True: every worker owns ≥ 1 group
    # (what the elastic runtime wants: a worker it pays for must do keyed work).
    nonempty: bool = False

    def __post_init__(self) -> None:
        g = len(self.loads)
        if g == 0:
            raise PlanningError("loads: need at least one key group")
        if len(self.state_sizes) != g or len(self.current) != g:
            raise PlanningError(f"loads, state_sizes and current must have the same length "
                                f"(got {g}, {len(self.state_sizes)}, {len(self.current)})")
        for name, values in (("loads", self.loads), ("state_sizes", self.state_sizes)):
            for j, v in enumerate(values):
                if not np.isfinite(v) or v < 0:
                    raise PlanningError(f"{name}[{j}]: must be a finite number >= 0")
        if sum(self.loads) <= 0:
            raise PlanningError("loads: the total load must be > 0")
        for j, w in enumerate(self.current):
            if w < 0:
                raise PlanningError(f"current[{j}]: worker ids must be >= 0")
        if self.target_workers < 1:
            raise PlanningError("target_workers: must be >= 1")
        if self.nonempty and self.target_workers > g:
            raise PlanningError(f"target_workers: {self.target_workers} non-empty workers "
                                f"need at least as many key groups (have {g})")
        if not np.isfinite(self.tau) or self.tau < 0:
            raise PlanningError("tau: must be a finite number >= 0")

    @property
    def total_load(self) -> float:
        return float(sum(self.loads))

    @property
    def cap(self) -> float:
        """Def. 3.1: the largest load a worker may carry after the migration."""
        return (1.0 + self.tau) * self.total_load / self.target_workers

    @property
    def current_workers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.current)))


@dataclass(frozen=True)
class MigrationPlan:
    planner: str
    assignment: tuple[int, ...]  # worker id per group
    migration_cost: float  # Σ s_j of moved groups
    moved: tuple[int, ...]
    max_load: float
    cap: float
    feasible: bool  # every worker's load <= cap, and exactly target_workers workers
    solve_ms: float
    reason: str = ""  # why infeasible, in one line
    min_tau: float | None = None  # smallest τ at which a contiguous split exists
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"planner": self.planner, "assignment": list(self.assignment),
               "migration_cost": self.migration_cost, "moved": list(self.moved),
               "max_load": self.max_load, "cap": self.cap, "feasible": self.feasible,
               "solve_ms": round(self.solve_ms, 3)}
        if self.reason:
            out["reason"] = self.reason
        if self.min_tau is not None:
            out["min_tau"] = self.min_tau
        out.update(self.extra)
        return out


# --- helpers shared by every planner -------------------------------------------------

def contiguous_ranges(owner: Sequence[int]) -> dict[int, tuple[int, int]]:
    """worker -> [start, end) if every worker's groups are contiguous, else PlanningError."""
    ranges: dict[int, tuple[int, int]] = {}
    for j, w in enumerate(owner):
        if w in ranges:
            start, end = ranges[w]
            if end != j:
                raise PlanningError(
                    f"current: worker {w} owns groups {start}..{end - 1} and {j}, which are not "
                    "one contiguous range (Ding §3.1); plan once with 'scratch' or 'ding' from a "
                    "contiguous layout")
            ranges[w] = (start, j + 1)
        else:
            ranges[w] = (j, j + 1)
    return ranges


def worker_loads(loads: Sequence[float], assignment: Sequence[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for j, w in enumerate(assignment):
        out[w] = out.get(w, 0.0) + loads[j]
    return out


def evaluate(problem: MigrationProblem, planner: str, assignment: Sequence[int],
             solve_ms: float, reason: str = "", extra: dict | None = None) -> MigrationPlan:
    """Cost, moved groups, max load and feasibility of any assignment (one rule for all)."""
    moved = tuple(j for j, w in enumerate(assignment) if w != problem.current[j])
    cost = float(sum(problem.state_sizes[j] for j in moved))
    loads = worker_loads(problem.loads, assignment)
    max_load = max(loads.values())
    cap = problem.cap
    feasible = (not reason and max_load <= cap * (1 + CAP_TOLERANCE)
                and len(loads) <= problem.target_workers)
    if not reason and not feasible:
        reason = (f"max load {max_load:.6g} exceeds the cap {cap:.6g}" if max_load > cap
                  else f"uses {len(loads)} workers, more than {problem.target_workers}")
    return MigrationPlan(planner, tuple(assignment), cost, moved, float(max_load), cap,
                         feasible, solve_ms, reason, extra=extra or {})


def target_ids(problem: MigrationProblem) -> list[int]:
    """The worker ids after the migration when the planner does not choose which old
    workers retire: the lowest current ids are kept (Spark decommissions the newest
    executors), new workers get ids above the largest current id."""
    old = list(problem.current_workers)
    n2 = problem.target_workers
    if n2 <= len(old):
        return old[:n2]
    top = max(old)
    return old + [top + 1 + i for i in range(n2 - len(old))]


def min_bottleneck(loads: Sequence[float], parts: int, nonempty: bool = False) -> float:
    """The smallest achievable max range load over splits of ``loads`` into ≤ ``parts``
    contiguous ranges (exactly ``parts`` non-empty ones when ``nonempty``): binary search
    over the O(G²) candidate range sums with the greedy check. Used for τ_min."""
    prefix = np.concatenate(([0.0], np.cumsum(loads)))
    g = len(loads)
    sums = sorted({float(prefix[b] - prefix[a]) for a in range(g) for b in range(a + 1, g + 1)})
    lo = 0

    def fits(cap: float) -> bool:
        if max(loads) > cap * (1 + CAP_TOLERANCE):
            return False
        count, acc = 1, 0.0
        for w in loads:
            if acc + w > cap * (1 + CAP_TOLERANCE):
                count, acc = count + 1, w
            else:
                acc += w
        # With ≤ parts ranges at this cap, splitting further keeps it (G ≥ parts).
        return count <= parts

    hi = len(sums) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(sums[mid]):
            hi = mid
        else:
            lo = mid + 1
    return sums[lo]


def _min_tau(problem: MigrationProblem) -> float:
    best = min_bottleneck(problem.loads, problem.target_workers, problem.nonempty)
    return max(0.0, best * problem.target_workers / problem.total_load - 1.0)


def infeasibility(problem: MigrationProblem) -> str:
    """A one-line reason when no contiguous split meets the cap, else ''."""
    cap = problem.cap
    heaviest = max(range(len(problem.loads)), key=lambda j: problem.loads[j])
    if problem.loads[heaviest] > cap * (1 + CAP_TOLERANCE):
        return (f"key group {heaviest} alone has load {problem.loads[heaviest]:.6g}, above the "
                f"cap (1+τ)·W/n′ = {cap:.6g}: raise τ to at least {_min_tau(problem):.4g}, "
                "use more workers, or split the hot key")
    if min_bottleneck(problem.loads, problem.target_workers) > cap * (1 + CAP_TOLERANCE):
        return (f"no split into {problem.target_workers} contiguous ranges keeps every load "
                f"under the cap {cap:.6g}: raise τ to at least {_min_tau(problem):.4g}")
    return ""


def _infeasible_plan(problem: MigrationProblem, planner: str, reason: str,
                     started: float) -> MigrationPlan:
    plan = evaluate(problem, planner, problem.current, (time.perf_counter() - started) * 1e3,
                    reason=reason)
    return MigrationPlan(plan.planner, plan.assignment, 0.0, (), plan.max_load, plan.cap,
                         False, plan.solve_ms, reason, _min_tau(problem))


# --- Ding: exact single-step migration -------------------------------------------------

def _ding_partition(problem: MigrationProblem, cap: float,
                    ranges: list[tuple[int, int]]) -> tuple[float, list[tuple[int, int, int]]]:
    """Max gain and the ranges [(start, end, old node index or -1 for free)], or
    (-inf, []) if no split into target_workers ranges meets ``cap``."""
    g = len(problem.loads)
    n = len(ranges)
    n2 = problem.target_workers
    w_prefix = np.concatenate(([0.0], np.cumsum(problem.loads)))
    s_prefix = np.concatenate(([0.0], np.cumsum(problem.state_sizes)))
    idx = np.arange(g + 1)
    x, x2 = idx[:, None], idx[None, :]
    valid = (x2 > x) if problem.nonempty else (x2 >= x)
    valid &= (w_prefix[x2] - w_prefix[x]) <= cap * (1 + CAP_TOLERANCE)
    # overlap[y, x, x2] = state of old node y inside [x, x2); node 0 is "none".
    overlap = np.zeros((n + 1, g + 1, g + 1))
    for y, (a, b) in enumerate(ranges, start=1):
        lo = np.maximum(x, a)
        hi = np.minimum(x2, b)
        overlap[y] = np.where(hi > lo, s_prefix[np.maximum(hi, lo)] - s_prefix[lo], 0.0)
    overlap = overlap.transpose(1, 2, 0)  # [x, x2, y]
    neg = -np.inf
    f = np.full((g + 1, n + 1), neg)
    f[0, 0] = 0.0
    layers = [f]
    for _ in range(n2):
        # prefix[x, y'] = max_{y < y'} f[x, y]
        shifted = np.concatenate((np.full((g + 1, 1), neg), f[:, :-1]), axis=1)
        prefix = np.maximum.accumulate(shifted, axis=1)
        gain = prefix[:, None, :] + overlap
        gain[:, :, 0] = neg
        best = np.maximum(f[:, None, :], gain)
        best[~valid] = neg
        f = best.max(axis=0)
        layers.append(f)
    final = layers[-1][g]
    if not np.isfinite(final.max()):
        return neg, []
    # Backtrack through the stored layers (recomputing each choice; ties: free first).
    y = int(np.argmax(final))
    end = g
    out: list[tuple[int, int, int]] = []
    for k in range(n2, 0, -1):
        prev = layers[k - 1]
        target = layers[k][end, y]
        found = False
        for start in range(end, -1, -1):
            if not valid[start, end]:
                continue
            if prev[start, y] == target:  # free range, last gain node unchanged
                out.append((start, end, -1))
                end, found = start, True
                break
            if y > 0:
                before = prev[start, :y]
                cand = before.max() + overlap[start, end, y]
                if np.isfinite(cand) and np.isclose(cand, target, rtol=1e-12, atol=1e-9):
                    out.append((start, end, y - 1))
                    y, end, found = int(np.argmax(before)), start, True
                    break
        if not found:  # pragma: no cover - the recurrence guarantees a predecessor
            raise RuntimeError("ding backtrack lost its path")
    out.reverse()
    return float(final.max()), out


def _assign_free(problem: MigrationProblem, old_ids: list[int], ranges: list[tuple[int, int]],
                 split: list[tuple[int, int, int]]) -> list[int]:
    """Give every range a worker id: gain ranges keep their old owner; free ranges go to
    the unused old workers (by overlap, then lowest id), then to new ids."""
    s_prefix = np.concatenate(([0.0], np.cumsum(problem.state_sizes)))

    def overlap(node: int, start: int, end: int) -> float:
        a, b = ranges[node]
        lo, hi = max(a, start), min(b, end)
        return float(s_prefix[hi] - s_prefix[lo]) if hi > lo else 0.0

    used = {node for _, _, node in split if node >= 0}
    spare = [i for i in range(len(old_ids)) if i not in used]
    free = [i for i, (_, _, node) in enumerate(split) if node < 0]
    owner_of: dict[int, int] = {i: old_ids[node] for i, (_, _, node) in enumerate(split)
                                if node >= 0}
    # Pair free ranges with spare old workers, largest overlap first.
    pairs = sorted(((overlap(node, split[i][0], split[i][1]), -old_ids[node], i, node)
                    for i in free for node in spare), reverse=True)
    taken_ranges: set[int] = set()
    taken_nodes: set[int] = set()
    for _, _, i, node in pairs:
        if i in taken_ranges or node in taken_nodes:
            continue
        if len(taken_nodes) == min(len(free), len(spare)):
            break
        owner_of[i] = old_ids[node]
        taken_ranges.add(i)
        taken_nodes.add(node)
    next_id = max(old_ids) + 1
    for i in free:
        if i not in owner_of:
            owner_of[i] = next_id
            next_id += 1
    assignment = [0] * len(problem.loads)
    for i, (start, end, _) in enumerate(split):
        for j in range(start, end):
            assignment[j] = owner_of[i]
    return assignment


def ratio_order(problem: MigrationProblem) -> list[int]:
    """A linear order of the groups in which every current worker's groups are
    contiguous (workers by their first group), and inside each worker's run the groups
    with the most load per byte of state sit at the ends, alternating — the ends are
    what Ding's ranges can shave off cheaply. Spark places state partitions by an
    explicit table, so the task order of §3.1 is ours to choose."""
    runs: dict[int, list[int]] = {}
    for j, w in enumerate(problem.current):
        runs.setdefault(w, []).append(j)
    order: list[int] = []
    for w in sorted(runs, key=lambda w: runs[w][0]):
        ranked = sorted(runs[w], key=lambda j: (-problem.loads[j] / (problem.state_sizes[j]
                                                                   + 1e-12), j))
        front, back = [], []
        for i, j in enumerate(ranked):
            (front if i % 2 == 0 else back).append(j)
        order.extend(front + back[::-1])
    return order


def plan_ding_ordered(problem: MigrationProblem) -> MigrationPlan:
    """Ding's exact DP over ``ratio_order`` instead of the group ids: works from any
    layout (contiguous or not); exact for that order."""
    started = time.perf_counter()
    order = ratio_order(problem)
    permuted = MigrationProblem(tuple(problem.loads[j] for j in order),
                                tuple(problem.state_sizes[j] for j in order),
                                tuple(problem.current[j] for j in order),
                                problem.target_workers, problem.tau, problem.nonempty)
    inner = plan_ding(permuted)
    if not inner.feasible:
        return dataclasses.replace(inner, planner="ding-ordered", assignment=problem.current)
    assignment = [0] * len(order)
    for pos, j in enumerate(order):
        assignment[j] = inner.assignment[pos]
    return evaluate(problem, "ding-ordered", assignment, (time.perf_counter() - started) * 1e3)


def plan_ding(problem: MigrationProblem, cap: float | None = None) -> MigrationPlan:
    """Def. 3.2, exactly: the contiguous split into n′ ranges, every load ≤ cap, that
    keeps the most state in place. ``cap`` overrides (1+τ)W/n′ (used by ``plan_mtm``)."""
    started = time.perf_counter()
    owner_ranges = contiguous_ranges(problem.current)
    old_ids = sorted(owner_ranges, key=lambda w: owner_ranges[w][0])
    ranges = [owner_ranges[w] for w in old_ids]
    limit = problem.cap if cap is None else cap
    reason = infeasibility(problem)
    if reason:
        return _infeasible_plan(problem, "ding", reason, started)
    gain, split = _ding_partition(problem, limit, ranges)
    if not split:
        return _infeasible_plan(problem, "ding",
                                f"no split into {problem.target_workers} non-empty contiguous "
                                f"ranges meets the cap {limit:.6g}", started)
    assignment = _assign_free(problem, old_ids, ranges, split)
    plan = evaluate(problem, "ding", assignment, (time.perf_counter() - started) * 1e3)
    # The actual kept state can only exceed the DP's (a free range may land on an old
    # worker it overlaps), and the DP is optimal, so they agree.
    assert plan.migration_cost <= sum(problem.state_sizes) - gain + 1e-6 * (1 + gain)
    return plan


# --- exact planner over routing tables (Def. 3.2 without contiguity) -------------------

def min_cover(loads: Sequence[float], sizes: Sequence[float], excess: float
              ) -> tuple[float, tuple[int, ...]]:
    """The cheapest set of items (least Σ size) whose Σ load ≥ ``excess``: a covering
    knapsack, solved exactly by a Pareto frontier of (load, size) partial sums, loads
    clamped at ``excess`` (more is no better). (inf, ()) if even all items fall short."""
    if excess <= 0:
        return 0.0, ()
    frontier: dict[float, tuple[float, tuple[int, ...]]] = {0.0: (0.0, ())}
    for i, (w, c) in enumerate(zip(loads, sizes, strict=True)):
        for load, (cost, items) in list(frontier.items()):
            nl = min(excess, load + w)
            nc = cost + c
            if nl not in frontier or nc < frontier[nl][0]:
                frontier[nl] = (nc, items + (i,))
        # Keep only non-dominated points: more load must cost strictly more.
        pruned: dict[float, tuple[float, tuple[int, ...]]] = {}
        best = np.inf
        for load in sorted(frontier, reverse=True):
            if frontier[load][0] < best:
                pruned[load] = frontier[load]
                best = frontier[load][0]
        frontier = pruned
    top = frontier.get(excess)
    if top is None:
        # Float clamping: accept a load within tolerance of the excess.
        close = [v for k, v in frontier.items() if k >= excess * (1 - CAP_TOLERANCE)]
        if not close:
            return np.inf, ()
        top = min(close)
    return top


def _pack(items: list[tuple[float, int]], room: dict[int, float]) -> dict[int, int] | None:
    """First-fit decreasing of (load, group) items into workers' spare room (the most
    room first); None if something does not fit."""
    room = dict(room)
    out: dict[int, int] = {}
    for load, group in sorted(items, key=lambda x: (-x[0], x[1])):
        fits = [w for w, r in room.items() if load <= r * (1 + CAP_TOLERANCE) + 1e-12]
        if not fits:
            return None
        w = max(fits, key=lambda w: (room[w], -w))
        out[group] = w
        room[w] -= load
    return out


def plan_table(problem: MigrationProblem, max_retire_sets: int = 5000) -> MigrationPlan:
    """``ding-table``: Ding's Def. 3.2 for an explicit routing table instead of contiguous
    ranges (any set of groups per worker — what Spark's state-store placement is, where
    §3.1's reason for intervals, a routing table that fits in cache, does not apply): the
    least state moved such that every worker's load ≤ cap, with n′ workers.

    Decomposition: retiring worker r costs its whole state; a kept worker w over the cap
    must shed load ≥ load_w − cap, cheapest by the covering knapsack ``min_cover``
    (exact). So the cost of a retire set R is the lower bound
    LB(R) = Σ_{r∈R} state_r + Σ_{w∉R} cover_w, and a plan achieving it exists when the
    shed and retired groups fit into the spare room (first-fit decreasing). Retire sets
    are tried in increasing LB; if the LB-minimal one packs, the plan is optimal
    (``exact`` true); a later one is reported with ``exact`` false.
    When packing fails everywhere (very tight caps) it falls back to Flux's result
    (``exact`` false). ``nonempty`` new workers receive the cheapest movable groups
    afterwards (``exact`` false when that moved anything)."""
    started = time.perf_counter()
    reason = ""
    if max(problem.loads) > problem.cap * (1 + CAP_TOLERANCE):
        reason = infeasibility(problem)
    if reason:
        return _infeasible_plan(problem, "ding-table", reason, started)
    table = _Table(problem)
    old, cap = table.old, problem.cap
    n, n2 = len(old), problem.target_workers
    new_ids = [max(old) + 1 + i for i in range(max(0, n2 - n))]
    delta = {w: table.state[w] - table.cover[w][0] for w in old}
    retire_sets = _retire_sets(old, max(0, n - n2), delta, max_retire_sets)
    base = sum(c for c, _ in table.cover.values())
    lb_min = base + min((sum(delta[w] for w in r) for r in retire_sets), default=0.0)
    for retire in retire_sets:
        kept = [w for w in old if w not in retire]
        if any(np.isinf(table.cover[w][0]) for w in kept):
            continue
        placed = _pack(*table.to_place(retire, kept, new_ids, cap))
        if placed is None:
            continue
        assignment = list(problem.current)
        for j, w in placed.items():
            assignment[j] = w
        # Optimal only if this retire set reaches the smallest lower bound: a set that
        # failed to pack might still beat it with costlier shedding.
        lower = base + sum(delta[w] for w in retire)
        exact = lower <= lb_min + 1e-9 * (1 + abs(lb_min))
        if problem.nonempty:
            exact = _fill_empty(problem, assignment, kept + new_ids) and exact
        return evaluate(problem, "ding-table", assignment, (time.perf_counter() - started) * 1e3,
                        extra={"exact": exact, "lower_bound": lb_min})
    fallback = plan_flux(problem)
    return dataclasses.replace(fallback, planner="ding-table",
                               solve_ms=(time.perf_counter() - started) * 1e3,
                               extra={"exact": False, "fallback": "flux"})


class _Table:
    """A routing table's workers: their groups, state and load, and the cheapest set of
    groups each must shed to get under the cap (``min_cover``)."""

    def __init__(self, problem: MigrationProblem) -> None:
        self.problem = problem
        self.old = list(problem.current_workers)
        self.groups: dict[int, list[int]] = {w: [] for w in self.old}
        for j, w in enumerate(problem.current):
            self.groups[w].append(j)
        self.state = {w: sum(problem.state_sizes[j] for j in self.groups[w]) for w in self.old}
        self.load = {w: sum(problem.loads[j] for j in self.groups[w]) for w in self.old}
        self.cover: dict[int, tuple[float, list[int]]] = {}
        for w in self.old:
            cost, items = min_cover([problem.loads[j] for j in self.groups[w]],
                                    [problem.state_sizes[j] for j in self.groups[w]],
                                    self.load[w] - problem.cap)
            self.cover[w] = (cost, [self.groups[w][i] for i in items])

    def to_place(self, retire: tuple[int, ...], kept: list[int], new_ids: list[int],
                 cap: float) -> tuple[list[tuple[float, int]], dict[int, float]]:
        """The groups to place (the retired workers' and what the kept ones shed) and
        each remaining worker's room under the cap."""
        loads = self.problem.loads
        items = [(loads[j], j) for r in retire for j in self.groups[r]]
        room = {w: cap for w in new_ids}
        for w in kept:
            shed = self.cover[w][1]
            items += [(loads[j], j) for j in shed]
            room[w] = cap - (self.load[w] - sum(loads[j] for j in shed))
        return items, room


def _retire_sets(old: list[int], k: int, delta: dict[int, float],
                 max_retire_sets: int) -> list[tuple[int, ...]]:
    """Retire sets of ``k`` workers by increasing lower bound: exhaustive when small,
    else the k cheapest plus single swaps (then exactness is not claimed unless the first
    one packs — it is still the LB-minimal set, so packing it proves optimality)."""
    if k == 0:
        return [()]
    if math.comb(len(old), k) <= max_retire_sets:
        return sorted(itertools.combinations(old, k),
                      key=lambda r: (sum(delta[w] for w in r), r))
    ranked = sorted(old, key=lambda w: (delta[w], w))
    first = tuple(sorted(ranked[:k]))
    swaps = {tuple(sorted(set(first) - {a} | {b})) for a in first for b in ranked[k:]}
    return [first, *sorted(swaps, key=lambda r: (sum(delta[w] for w in r), r))]


def _fill_empty(problem: MigrationProblem, assignment: list[int], workers: list[int]) -> bool:
    """Give every empty worker the cheapest group that can move to it within the cap
    (from a worker keeping ≥ 1 group). True if nothing had to move."""
    untouched = True
    for w in workers:
        if w in assignment:
            continue
        counts: dict[int, int] = {}
        for owner in assignment:
            counts[owner] = counts.get(owner, 0) + 1
        options = [j for j, owner in enumerate(assignment) if counts[owner] > 1
                   and problem.loads[j] <= problem.cap * (1 + CAP_TOLERANCE)]
        if not options:
            return False
        j = min(options, key=lambda j: (problem.state_sizes[j], -problem.loads[j], j))
        assignment[j] = w
        untouched = False
    return untouched


def table_brute_force(problem: MigrationProblem) -> float | None:
    """The least migration cost over every routing table (tiny instances only)."""
    old = list(problem.current_workers)
    n2 = problem.target_workers
    if n2 >= len(old):
        worker_sets = [old + [max(old) + 1 + i for i in range(n2 - len(old))]]
    else:
        worker_sets = [list(c) for c in itertools.combinations(old, n2)]
    cap = problem.cap * (1 + CAP_TOLERANCE)
    best: float | None = None
    for ws in worker_sets:
        for table in itertools.product(ws, repeat=len(problem.loads)):
            if problem.nonempty and len(set(table)) < n2:
                continue
            loads: dict[int, float] = {}
            for j, w in enumerate(table):
                loads[w] = loads.get(w, 0.0) + problem.loads[j]
            if max(loads.values()) > cap:
                continue
            cost = sum(problem.state_sizes[j] for j, w in enumerate(table)
                       if w != problem.current[j])
            if best is None or cost < best - 1e-12:
                best = cost
    return best


# --- brute force (the test oracle; tiny instances only) --------------------------------

def interval_partitions(g: int, parts: int, nonempty: bool) -> itertools.chain:
    """Every split of 0..g−1 into ``parts`` ordered contiguous ranges, as cut tuples."""
    if nonempty:
        cuts = itertools.combinations(range(1, g), parts - 1)
    else:
        cuts = itertools.combinations_with_replacement(range(0, g + 1), parts - 1)
    return (tuple([0, *c, g]) for c in cuts)


def plan_brute_force(problem: MigrationProblem) -> float | None:
    """The least migration cost over every interval partition and every matching of its
    ranges to workers (kept old workers or new ones), or None if none meets the cap."""
    g = len(problem.loads)
    n2 = problem.target_workers
    old = list(problem.current_workers)
    slots = old + [max(old) + 1 + i for i in range(max(0, n2 - len(old)))]
    cap = problem.cap * (1 + CAP_TOLERANCE)
    best: float | None = None
    for cuts in interval_partitions(g, n2, problem.nonempty):
        spans = [(cuts[i], cuts[i + 1]) for i in range(n2)]
        if any(sum(problem.loads[a:b]) > cap for a, b in spans):
            continue
        for owners in itertools.permutations(slots, n2):
            kept = sum(problem.state_sizes[j] for (a, b), w in zip(spans, owners, strict=True)
                       for j in range(a, b) if problem.current[j] == w)
            cost = sum(problem.state_sizes) - kept
            if best is None or cost < best - 1e-12:
                best = cost
    return best


# --- baselines -------------------------------------------------------------------------

def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def consistent_hash_assignment(groups: int, workers: Sequence[int],
                               virtual_nodes: int = 64) -> list[int]:
    """Consistent hashing (Karger et al.; the paper's CH): each worker has
    ``virtual_nodes`` points on a 64-bit ring; a group belongs to the next point
    clockwise. Adding or removing a worker moves only the groups next to its points,
    and ignores load."""
    ring = sorted((_stable_hash(f"worker-{w}#{v}"), w) for w in workers
                  for v in range(virtual_nodes))
    points = [p for p, _ in ring]
    out = []
    for j in range(groups):
        i = bisect.bisect_right(points, _stable_hash(f"group-{j}")) % len(ring)
        out.append(ring[i][1])
    return out


def plan_consistent_hash(problem: MigrationProblem) -> MigrationPlan:
    started = time.perf_counter()
    assignment = consistent_hash_assignment(len(problem.loads), target_ids(problem))
    return evaluate(problem, "consistent-hash", assignment,
                    (time.perf_counter() - started) * 1e3)


def _relabel(bins: Sequence[int], count: int, problem: MigrationProblem) -> list[int]:
    """Map bins 0..count−1 of a from-scratch assignment onto worker ids so that the most
    state stays (greedy by shared state; new ids for the rest)."""
    ids = target_ids(problem)
    shared: dict[tuple[int, int], float] = {}
    for j, b in enumerate(bins):
        key = (b, problem.current[j])
        shared[key] = shared.get(key, 0.0) + problem.state_sizes[j]
    pairs = sorted(((s, -b, -w, b, w) for (b, w), s in shared.items() if w in ids),
                   reverse=True)
    mapping: dict[int, int] = {}
    used: set[int] = set()
    for _, _, _, b, w in pairs:
        if b not in mapping and w not in used:
            mapping[b] = w
            used.add(w)
    rest = iter([w for w in ids if w not in used])
    for b in range(count):
        if b not in mapping:
            mapping[b] = next(rest)
    return [mapping[b] for b in bins]


def plan_balanced(problem: MigrationProblem) -> MigrationPlan:
    """Thesis Algorithm 1 (LPT) recomputed from scratch, its bins then relabelled onto
    the workers that share the most state with them."""
    started = time.perf_counter()
    result = rebalance.balanced(problem.loads, problem.target_workers)
    assignment = _relabel(result.routing, problem.target_workers, problem)
    return evaluate(problem, "balanced", assignment, (time.perf_counter() - started) * 1e3)


def plan_flux(problem: MigrationProblem, threshold: float = 0.10) -> MigrationPlan:
    """Flux (control library) from the current routing: retired workers' groups go to the
    least loaded, then heaviest-fitting moves from the most to the least loaded worker
    until the imbalance threshold *or* the same cap as Ding's (1+τ)W/n′ is met."""
    started = time.perf_counter()
    ids = target_ids(problem)
    index = {w: i for i, w in enumerate(ids)}
    previous = [index.get(w, -1) for w in problem.current]
    result = rebalance.flux(problem.loads, problem.target_workers, previous,
                            threshold=threshold, cap=problem.cap)
    assignment = [ids[i] for i in result.routing]
    return evaluate(problem, "flux", assignment, (time.perf_counter() - started) * 1e3)


def scratch_assignment(problem: MigrationProblem) -> list[int]:
    """The best-balanced contiguous split (minimum bottleneck), ranges given to the
    target ids in order — where the state is plays no part."""
    g, n2 = len(problem.loads), problem.target_workers
    best = min_bottleneck(problem.loads, n2, problem.nonempty)
    ids = target_ids(problem)
    assignment, part, acc = [], 0, 0.0
    for j, w in enumerate(problem.loads):
        # Start a new range when this one is full, or when the groups left are just
        # enough to give every remaining worker one (nonempty).
        left_workers = n2 - part - 1
        if assignment and part < n2 - 1 and (
                acc + w > best * (1 + CAP_TOLERANCE)
                or (problem.nonempty and g - j <= left_workers)):
            part, acc = part + 1, 0.0
        assignment.append(ids[part])
        acc += w
    return assignment


def plan_scratch(problem: MigrationProblem) -> MigrationPlan:
    started = time.perf_counter()
    return evaluate(problem, "scratch", scratch_assignment(problem),
                    (time.perf_counter() - started) * 1e3)


# --- MTM-aware look-ahead (Def. 4.1) -----------------------------------------------------

Partition = tuple[int, ...]  # cut points 0 = c_0 ≤ … ≤ c_k = G


def partition_of(assignment: Sequence[int]) -> Partition:
    cuts = [0] + [j for j in range(1, len(assignment)) if assignment[j] != assignment[j - 1]]
    return tuple(cuts + [len(assignment)])


def transition_cost(a: Partition, b: Partition, state_sizes: Sequence[float]) -> float:
    """c(P, P′): the least state moved from partition a to b, node labels free (Lemmas
    4.1–4.2). Ranges that keep state are matched in order (the key fact above), so the
    best matching is an LCS-style DP over the two range lists — O(|a|·|b|)."""
    prefix = np.concatenate(([0.0], np.cumsum(state_sizes)))
    ra = [(a[i], a[i + 1]) for i in range(len(a) - 1)]
    rb = [(b[i], b[i + 1]) for i in range(len(b) - 1)]
    best = np.zeros((len(ra) + 1, len(rb) + 1))
    for i, (a0, a1) in enumerate(ra, start=1):
        for j, (b0, b1) in enumerate(rb, start=1):
            lo, hi = max(a0, b0), min(a1, b1)
            shared = prefix[hi] - prefix[lo] if hi > lo else 0.0
            best[i, j] = max(best[i - 1, j], best[i, j - 1], best[i - 1, j - 1] + shared)
    return float(prefix[-1] - best[-1, -1])


def _ding_from(partition: Partition, problem: MigrationProblem, workers: int,
               cap_scale: float) -> Partition | None:
    """The Ding-optimal partition for ``workers`` starting from ``partition``, under a
    cap tightened by ``cap_scale`` ≤ 1 (None if infeasible)."""
    if problem.nonempty and workers > len(problem.loads):
        return None
    current = [0] * len(problem.loads)
    for i in range(len(partition) - 1):
        for j in range(partition[i], partition[i + 1]):
            current[j] = i
    sub = MigrationProblem(problem.loads, problem.state_sizes, tuple(current), workers,
                           problem.tau, problem.nonempty)
    tight = sub.total_load / workers + cap_scale * (sub.cap - sub.total_load / workers)
    if infeasibility(sub):
        return None
    gain, split = _ding_partition(sub, tight, [(partition[i], partition[i + 1])
                                               for i in range(len(partition) - 1)])
    if not split:
        return None
    return tuple([s for s, _, _ in split] + [len(problem.loads)])


def plan_mtm(problem: MigrationProblem, mtm: dict[int, dict[int, float]], gamma: float = 0.8,
             depth: int = 1, tightenings: Sequence[float] = (1.0, 0.75, 0.5, 0.25, 0.0),
             iterations: int = 50) -> MigrationPlan:
    """MTM-aware migration (Ding Def. 4.1, §4): minimise the single-step cost plus γ times
    the projected cost of the resulting partition,

        C(P) = Σ_{n″} M[|P|, n″] · min_{P″ ∈ Π(n″,τ)} [ c(P, P″) + γ·C(P″) ]

    (the digest's reading of PMC, Fig. 6, as a Bellman equation over partitionings).

    Tractable candidate set (our reduction; the paper's Π(n,τ) has ~10¹⁴ members at
    G = 64): for the worker counts reachable in the MTM, only partitions that Ding's exact
    planner returns — from the current layout and, ``depth`` levels deep (default 1: at
    G = 64 a second level costs ~20× the time for ~5 % less state moved), from every
    candidate — under a ladder of tightened caps W/n + t·(cap − W/n), t ∈ ``tightenings``.
    Tighter caps give better-balanced layouts that are cheaper to leave later; t = 1 is
    the myopic optimum, so γ = 0 (or an MTM without successors) gives ``plan_ding``'s
    cost. C is computed by value iteration on that finite set; every candidate meets the
    current cap, so the result is feasible whenever ``plan_ding``'s is.
    """
    started = time.perf_counter()
    _check_mtm(mtm, gamma)
    myopic = plan_ding(problem)
    if not myopic.feasible:
        return dataclasses.replace(myopic, planner="mtm")
    start = partition_of(problem.current)

    def successors(p: Partition, workers: int, t: float) -> Partition | None:
        return _ding_from(p, problem, workers, t)

    best, projected, candidates = _look_ahead(
        start, problem.target_workers, mtm, gamma, depth, tightenings, iterations,
        successors, lambda p: len(p) - 1,
        lambda a, b: transition_cost(a, b, problem.state_sizes))
    # Relabel the chosen partition onto worker ids with Ding's own matching: Ding with the
    # cap tightened to exactly this partition's bottleneck may still pick another split
    # of equal cost, so match ranges to owners directly.
    assignment = _label_partition(problem, best)
    return evaluate(problem, "mtm", assignment, (time.perf_counter() - started) * 1e3,
                    extra={"projected_cost": projected, "gamma": gamma,
                           "candidates": candidates, "myopic_cost": myopic.migration_cost})


def _check_mtm(mtm: dict[int, dict[int, float]], gamma: float) -> None:
    if not 0 <= gamma < 1:
        raise PlanningError("gamma: must be in [0, 1)")
    for n, row in mtm.items():
        total = sum(row.values())
        if any(p < 0 for p in row.values()) or (row and abs(total - 1) > 1e-6):
            raise PlanningError(f"mtm[{n}]: probabilities must be >= 0 and sum to 1")


def _look_ahead(start: Any, n2: int, mtm: dict[int, dict[int, float]], gamma: float,
                depth: int, tightenings: Sequence[float], iterations: int,
                successors: Callable[[Any, int, float], Any | None],
                workers_of: Callable[[Any], int],
                cost: Callable[[Any, Any], float]) -> tuple[Any, float, int]:
    """Def. 4.1's look-ahead over a finite candidate set (see ``plan_mtm``), for any
    layout form: ``successors(layout, n, t)`` is the myopic planner from ``layout`` to
    n workers under cap ladder step t (None: infeasible), ``cost(a, b)`` the state moved.
    Returns the chosen candidate for ``n2``, its projected cost and the candidates seen."""
    # Candidates for this step, then successors level by level.
    by_count: dict[int, set[Any]] = {}
    frontier: set[Any] = set()
    for t in tightenings:
        p = successors(start, n2, t)
        if p is not None:
            frontier.add(p)
    by_count.setdefault(n2, set()).update(frontier)
    for _ in range(depth):
        nxt: set[Any] = set()
        for p in frontier:
            for n3, prob in mtm.get(workers_of(p), {}).items():
                if prob <= 0:
                    continue
                for t in tightenings:
                    q = successors(p, n3, t)
                    if q is not None and q not in by_count.get(n3, set()):
                        nxt.add(q)
                        by_count.setdefault(n3, set()).add(q)
        frontier = nxt
    everything = [p for ps in by_count.values() for p in ps]
    cost_cache: dict[tuple[Any, Any], float] = {}

    def c(a: Any, b: Any) -> float:
        if (a, b) not in cost_cache:
            cost_cache[(a, b)] = cost(a, b)
        return cost_cache[(a, b)]

    projected = {p: 0.0 for p in everything}
    for _ in range(iterations):
        delta = 0.0
        for p in everything:
            value = 0.0
            for n3, prob in mtm.get(workers_of(p), {}).items():
                options = by_count.get(n3)
                if prob > 0 and options:
                    value += prob * min(c(p, q) + gamma * projected[q] for q in options)
            delta = max(delta, abs(value - projected[p]))
            projected[p] = value
        if delta < 1e-9:
            break
    here = by_count[n2]
    best = min(here, key=lambda p: (c(start, p) + gamma * projected[p], c(start, p), p))
    return best, projected[best], len(everything)


# --- MTM look-ahead on a routing table (ours) ------------------------------------------

Table = tuple[int, ...]  # worker id per group


def canonical_table(assignment: Sequence[int]) -> Table:
    """Worker ids renumbered by first appearance: two tables that differ only in labels
    are one layout (a transition's cost is label-free)."""
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(w, len(ids)) for w in assignment)


def table_transition_cost(a: Sequence[int], b: Sequence[int],
                          state_sizes: Sequence[float]) -> float:
    """c(A, B) for routing tables, worker labels free: the state that moves when B's
    workers are matched to A's so as to keep the most in place (a maximum-weight
    bipartite matching, scipy's ``linear_sum_assignment``) — Lemma 4.1's label freedom
    without the ranges."""
    from scipy.optimize import linear_sum_assignment

    ia = {w: i for i, w in enumerate(sorted(set(a)))}
    ib = {w: i for i, w in enumerate(sorted(set(b)))}
    shared = np.zeros((len(ia), len(ib)))
    for g, size in enumerate(state_sizes):
        shared[ia[a[g]], ib[b[g]]] += size
    rows, cols = linear_sum_assignment(shared, maximize=True)
    return float(sum(state_sizes) - shared[rows, cols].sum())


def plan_mtm_table(problem: MigrationProblem, mtm: dict[int, dict[int, float]],
                   gamma: float = 0.8, depth: int = 1,
                   tightenings: Sequence[float] = (1.0, 0.75, 0.5, 0.25, 0.0),
                   iterations: int = 50) -> MigrationPlan:
    """``mtm-table``: Def. 4.1's look-ahead (``plan_mtm``) on a routing table, what a
    running Spark query's placement is (ours: the paper plans contiguous ranges). The
    candidates are ``ding-table`` plans from the current table and, ``depth`` levels
    deep, from every candidate, under τ scaled by each t ∈ ``tightenings``; the cost
    between two tables is ``table_transition_cost``. γ = 0 (or an MTM without successors)
    gives ``plan_table``'s cost; every candidate meets the current cap."""
    started = time.perf_counter()
    _check_mtm(mtm, gamma)
    myopic = plan_table(problem)
    if not myopic.feasible:
        return dataclasses.replace(myopic, planner="mtm-table")
    labelled: dict[Table, Table] = {}  # this step's candidates, with the problem's ids
    start = canonical_table(problem.current)

    def successors(table: Table, workers: int, t: float) -> Table | None:
        current = problem.current if table == start else table
        if problem.nonempty and workers > len(table):
            return None
        try:
            plan = plan_table(MigrationProblem(problem.loads, problem.state_sizes,
                                               tuple(current), workers, problem.tau * t,
                                               problem.nonempty))
        except PlanningError:
            return None
        if not plan.feasible or plan.max_load > problem.cap * (1 + CAP_TOLERANCE):
            return None
        key = canonical_table(plan.assignment)
        if table == start:
            labelled.setdefault(key, plan.assignment)
        return key

    best, projected, candidates = _look_ahead(
        start, problem.target_workers, mtm, gamma, depth, tightenings, iterations,
        successors, lambda table: len(set(table)),
        lambda a, b: table_transition_cost(a, b, problem.state_sizes))
    return evaluate(problem, "mtm-table", labelled[best],
                    (time.perf_counter() - started) * 1e3,
                    extra={"projected_cost": projected, "gamma": gamma,
                           "candidates": candidates, "myopic_cost": myopic.migration_cost})


def _label_partition(problem: MigrationProblem, partition: Partition) -> list[int]:
    """Worker ids for the ranges of a fixed partition, keeping the most state (Ding's DP
    restricted to these ranges: same order argument, one range per step)."""
    owner_ranges = contiguous_ranges(problem.current)
    old_ids = sorted(owner_ranges, key=lambda w: owner_ranges[w][0])
    ranges = [owner_ranges[w] for w in old_ids]
    prefix = np.concatenate(([0.0], np.cumsum(problem.state_sizes)))
    spans = [(partition[i], partition[i + 1]) for i in range(len(partition) - 1)]
    k, n = len(spans), len(ranges)
    # best[i][y]: the first i ranges placed, the last one that keeps state on old node
    # y−1 (y = 0: none yet). A range keeps state only on a node after the previous one.
    best = np.full((k + 1, n + 1), -np.inf)
    best[0, 0] = 0.0
    choice: dict[tuple[int, int], tuple[int, int]] = {}
    for i, (a, b) in enumerate(spans, start=1):
        for y in range(n + 1):
            cand, pick = best[i - 1, y], (y, -1)  # free range
            if y > 0:
                lo, hi = max(a, ranges[y - 1][0]), min(b, ranges[y - 1][1])
                gain = prefix[hi] - prefix[lo] if hi > lo else 0.0
                for prev in range(y):
                    if best[i - 1, prev] + gain > cand:
                        cand, pick = best[i - 1, prev] + gain, (prev, y - 1)
            best[i, y] = cand
            choice[(i, y)] = pick
    y = int(np.argmax(best[k]))
    split: list[tuple[int, int, int]] = []
    for i in range(k, 0, -1):
        prev_y, node = choice[(i, y)]
        split.append((spans[i - 1][0], spans[i - 1][1], node))
        y = prev_y
    split.reverse()
    return _assign_free(problem, old_ids, ranges, split)


def plan(problem: MigrationProblem, planner: str, **options: object) -> MigrationPlan:
    """Dispatch by name (the CLI's ``--planner``)."""
    if planner == "ding":
        return plan_ding(problem)
    if planner == "ding-ordered":
        return plan_ding_ordered(problem)
    if planner == "ding-table":
        return plan_table(problem)
    if planner == "mtm":
        return plan_mtm(problem, **options)  # type: ignore[arg-type]
    if planner == "mtm-table":
        return plan_mtm_table(problem, **options)  # type: ignore[arg-type]
    if planner == "consistent-hash":
        return plan_consistent_hash(problem)
    if planner == "balanced":
        return plan_balanced(problem)
    if planner == "flux":
        return plan_flux(problem)
    if planner == "scratch":
        return plan_scratch(problem)
    raise PlanningError(f"planner: unknown {planner!r}; choose from {', '.join(PLANNERS)}")
