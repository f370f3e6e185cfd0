"""Operator fusion and placement (COLA: Khandekar et al., "COLA: Optimizing Stream
Processing Applications via Graph Partitioning", §2–3).

Operators with CPU cost w_v and streams with traffic w_e (both in CPU units) are fused
into processing elements (PEs); PEs are placed on hosts with capacities B_h. A PE costs
SIZE(S) = w(S) + w(δ(S)) (eq. 1): its operators plus the streams crossing its boundary
(fused streams become function calls). Objective: the inter-PE traffic Σ w(cut edges)
(each cut edge counted once; the paper counts it twice, which changes nothing), subject
to host capacity (i), colocation and exlocation of operator pairs, and an optional
maximum PE CPU.

``cola`` is Basic COLA (§2.2) with the PE-exlocation phase of Advanced COLA (Fig. 4,
phase 1) and PE colocation done in pre-processing:

1. pre-process: fuse colocated pairs; Lemma 1 fusions (edge (u,v) with
   w_e ≥ min(w_u + w(δ(u)∖e), w_v + w(δ(v)∖e))) among operators with no exlocation;
2. start with one PE; while the plan is not feasible, split a PE in two by a minimum-
   ratio cut — a PE holding an exlocated pair first (the cut must separate a pair), then
   a PE above the maximum PE CPU, then the largest multi-operator PE (the Oracle);
3. post-process: merge the PE pair with the most traffic between them while the merge
   keeps the plan feasible (the paper's greedy merges), alternating with
   Fiduccia–Mattheyses passes over the PEs (ours) until neither helps; the whole run is
   repeated with both of the paper's oracles and two sweep widths, best plan kept;
4. place PEs by LPT list scheduling (Basic), or exactly (minimum max utilisation) when
   the instance is small.

**Cut routine (our reconstruction; the paper uses Leighton–Rao via Garg–Könemann and
omits the details).** Minimise w(δ(S₁)) / min(w(S₁), w(S₂)) (eq. 2) over the PE's
undirected subgraph: exactly, by enumerating every bipartition, when the PE has ≤ 14
atoms; otherwise by sweep cuts over several vertex orders — the Fiedler vector of the
traffic Laplacian, and shortest-path distances (edge length 1/traffic) from the
heaviest atom and from both ends of every exlocated pair — followed by single-vertex
moves while the ratio improves. A spectral/distance sweep replaces Leighton–Rao's LP;
it carries no O(log n) guarantee, so ``tests/unit/test_planning.py`` measures it against the
exact minimum-ratio cut.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import dataclass, field

import numpy as np

from control.planning import PlanningError

EXACT_CUT_ATOMS = 14
EXACT_PLACEMENT_PES = 10
ALGORITHMS = ("cola", "none", "fuse-all", "greedy-merge")


@dataclass(frozen=True)
class FusionProblem:
    operators: tuple[str, ...]
    cpu: tuple[float, ...]
    edges: tuple[tuple[int, int, float], ...]  # (src index, dst index, traffic)
    hosts: tuple[str, ...]
    capacity: tuple[float, ...]
    colocate: tuple[tuple[int, int], ...] = ()
    exlocate: tuple[tuple[int, int], ...] = ()
    max_pe_cpu: float | None = None

    @property
    def size(self) -> int:
        return len(self.operators)

    def adjacency(self) -> np.ndarray:
        a = np.zeros((self.size, self.size))
        for u, v, t in self.edges:
            if u != v:
                a[u, v] += t
                a[v, u] += t
        return a


@dataclass(frozen=True)
class FusionPlan:
    algorithm: str
    pes: tuple[tuple[int, ...], ...]  # operator indices per PE
    placement: tuple[int, ...]  # host index per PE
    inter_pe_traffic: float
    pe_sizes: tuple[float, ...]
    host_loads: tuple[float, ...]
    feasible: bool
    reason: str = ""
    solve_ms: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def max_host_load(self) -> float:
        return max(self.host_loads) if self.host_loads else 0.0

    def as_dict(self, problem: FusionProblem) -> dict:
        out = {"algorithm": self.algorithm,
               "pes": [[problem.operators[i] for i in pe] for pe in self.pes],
               "placement": [problem.hosts[h] if h >= 0 else None for h in self.placement],
               "inter_pe_traffic": self.inter_pe_traffic,
               "max_host_load": self.max_host_load,
               "max_host_utilisation": max((load / cap for load, cap in
                                            zip(self.host_loads, problem.capacity,
                                                strict=True)), default=0.0),
               "pe_sizes": list(self.pe_sizes), "host_loads": list(self.host_loads),
               "feasible": self.feasible, "solve_ms": round(self.solve_ms, 3)}
        if self.reason:
            out["reason"] = self.reason
        out.update(self.extra)
        return out


def parse_problem(doc: object) -> FusionProblem:
    """The CLI document → FusionProblem, with a one-line error naming the field."""
    if not isinstance(doc, dict):
        raise PlanningError("input must be a JSON object")
    ids, cpu = _named_numbers(doc.get("operators"), "operators", "cpu", 0.0, strict=False)
    if len(set(ids)) != len(ids):
        raise PlanningError("operators: ids must be unique")
    index = {op: i for i, op in enumerate(ids)}

    def ref(value: object, where: str) -> int:
        if str(value) not in index:
            raise PlanningError(f"{where}: unknown operator {value!r}")
        return index[str(value)]

    edges = []
    for i, e in enumerate(doc.get("edges", [])):
        if not isinstance(e, dict):
            raise PlanningError(f"edges[{i}]: need an object with src, dst, traffic")
        t = e.get("traffic")
        if not _number(t) or t < 0:
            raise PlanningError(f"edges[{i}].traffic: must be a number >= 0")
        edges.append((ref(e.get("src"), f"edges[{i}].src"), ref(e.get("dst"), f"edges[{i}].dst"),
                      float(t)))
    host_ids, caps = _named_numbers(doc.get("hosts"), "hosts", "capacity", 0.0, strict=True)
    pairs = {name: _operator_pairs(doc.get(name, []), name, ref)
             for name in ("colocate", "exlocate")}
    limit = doc.get("max_pe_cpu")
    if limit is not None and (not _number(limit) or limit <= 0):
        raise PlanningError("max_pe_cpu: must be a number > 0 (or absent)")
    problem = FusionProblem(tuple(ids), tuple(cpu), tuple(edges), tuple(host_ids), tuple(caps),
                            pairs["colocate"], pairs["exlocate"],
                            float(limit) if limit is not None else None)
    atoms = _colocated_atoms(problem)
    for a, b in problem.exlocate:
        if atoms[a] == atoms[b]:
            raise PlanningError(f"exlocate: {ids[a]} and {ids[b]} must also be colocated "
                                "(through colocate pairs): no valid plan exists")
    return problem


def _named_numbers(items: object, name: str, field: str, low: float, strict: bool
                   ) -> tuple[list[str], list[float]]:
    """``[{id, <field>}, ...]`` as ids and numbers (>= ``low``, or > with ``strict``)."""
    if not isinstance(items, list) or not items:
        raise PlanningError(f"{name}: need a non-empty list of {{id, {field}}}")
    ids: list[str] = []
    values: list[float] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "id" not in item:
            raise PlanningError(f"{name}[{i}]: need an object with id and {field}")
        v = item.get(field)
        if not _number(v) or (v <= low if strict else v < low):
            raise PlanningError(f"{name}[{i}].{field}: must be a number "
                                f"{'>' if strict else '>='} {low:g}")
        ids.append(str(item["id"]))
        values.append(float(v))
    return ids, values


def _operator_pairs(raw: Any, name: str, ref: Callable[[object, str], int]
                    ) -> tuple[tuple[int, int], ...]:
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, list) or len(p) != 2:
            raise PlanningError(f"{name}[{i}]: need a pair [a, b]")
        a, b = ref(p[0], f"{name}[{i}][0]"), ref(p[1], f"{name}[{i}][1]")
        if a == b:
            raise PlanningError(f"{name}[{i}]: a pair of two different operators")
        out.append((a, b))
    return tuple(out)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and bool(np.isfinite(v))


# --- shared evaluation ---------------------------------------------------------------

def _colocated_atoms(problem: FusionProblem) -> list[int]:
    """Union-find over colocate pairs: atom id per operator."""
    parent = list(range(problem.size))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in problem.colocate:
        parent[find(a)] = find(b)
    return [find(i) for i in range(problem.size)]


class Evaluator:
    """SIZE, traffic and feasibility of partitions of one problem (cached adjacency)."""

    def __init__(self, problem: FusionProblem) -> None:
        self.problem = problem
        self.adj = problem.adjacency()
        self.cpu = np.array(problem.cpu)
        self.degree = self.adj.sum(axis=1)
        self.capacity = np.array(problem.capacity)
        self.ex_pairs = problem.exlocate

    def pe_size(self, members: Sequence[int]) -> float:
        idx = np.fromiter(members, dtype=int)
        inner = self.adj[np.ix_(idx, idx)].sum()
        return float(self.cpu[idx].sum() + self.degree[idx].sum() - inner)

    def traffic(self, pes: Sequence[Sequence[int]]) -> float:
        label = np.empty(self.problem.size, dtype=int)
        for k, pe in enumerate(pes):
            label[list(pe)] = k
        cross = label[:, None] != label[None, :]
        return float(self.adj[cross].sum() / 2)

    def exlocation_violated(self, members: Sequence[int]) -> tuple[int, int] | None:
        s = set(members)
        for a, b in self.ex_pairs:
            if a in s and b in s:
                return a, b
        return None

    def lpt(self, sizes: Sequence[float]) -> tuple[list[int], list[float]]:
        """LPT list scheduling onto heterogeneous hosts (COLA §2.2): PEs by decreasing
        SIZE, each to the host minimising (load + SIZE)/capacity."""
        loads = [0.0] * len(self.capacity)
        place = [-1] * len(sizes)
        for p in sorted(range(len(sizes)), key=lambda p: (-sizes[p], p)):
            h = min(range(len(loads)),
                    key=lambda h: ((loads[h] + sizes[p]) / self.capacity[h], h))
            place[p] = h
            loads[h] += sizes[p]
        return place, loads

    def exact_placement(self, sizes: Sequence[float]) -> tuple[list[int], list[float]] | None:
        """Minimum max-utilisation placement by branch and bound (small instances): the
        ILP of COLA eqs. 3–8 without resource matching, solved by search."""
        order = sorted(range(len(sizes)), key=lambda p: (-sizes[p], p))
        cap = self.capacity
        best: list[float] = [float("inf")]
        best_place: list[list[int]] = [[]]
        loads = [0.0] * len(cap)
        place = [-1] * len(sizes)

        def visit(i: int, util: float) -> None:
            if util >= best[0] - 1e-12:
                return
            if i == len(order):
                best[0], best_place[0] = util, list(place)
                return
            p = order[i]
            seen: set[tuple[float, float]] = set()
            for h in sorted(range(len(cap)), key=lambda h: (loads[h] + sizes[p]) / cap[h]):
                key = (loads[h], cap[h])  # identical hosts in identical state: try once
                if key in seen:
                    continue
                seen.add(key)
                loads[h] += sizes[p]
                place[p] = h
                visit(i + 1, max(util, loads[h] / cap[h]))
                loads[h] -= sizes[p]
            place[p] = -1

        visit(0, 0.0)
        if not best_place[0]:
            return None
        out_loads = [0.0] * len(cap)
        for p, h in enumerate(best_place[0]):
            out_loads[h] += sizes[p]
        return best_place[0], out_loads

    def check(self, pes: Sequence[Sequence[int]], exact: bool = False
              ) -> tuple[bool, str, list[int], list[float], list[float]]:
        """(feasible, reason, placement, host loads, PE sizes)."""
        sizes = [self.pe_size(pe) for pe in pes]
        for pe in pes:
            bad = self.exlocation_violated(pe)
            if bad:
                ops = self.problem.operators
                return False, f"exlocated {ops[bad[0]]} and {ops[bad[1]]} share a PE", [], [], sizes
        limit = self.problem.max_pe_cpu
        if limit is not None:
            for pe, s in zip(pes, sizes, strict=True):
                if s > limit * (1 + 1e-9):
                    return False, f"a PE of size {s:.6g} exceeds max_pe_cpu {limit:.6g}", [], [], sizes
        place, loads = self.lpt(sizes)
        if exact and len(pes) <= EXACT_PLACEMENT_PES:
            found = self.exact_placement(sizes)
            if found is not None:
                place, loads = found
        for h, load in enumerate(loads):
            if load > self.capacity[h] * (1 + 1e-9):
                return (False, f"host {self.problem.hosts[h]} would carry {load:.6g} > "
                        f"capacity {self.capacity[h]:.6g}", place, loads, sizes)
        return True, "", place, loads, sizes


def _plan(ev: Evaluator, algorithm: str, pes: Sequence[Sequence[int]], started: float,
          extra: dict | None = None) -> FusionPlan:
    pes = [tuple(sorted(pe)) for pe in pes]
    pes.sort()
    ok, reason, place, loads, sizes = ev.check(pes, exact=True)
    if not place:
        place, loads = ev.lpt(sizes)
    return FusionPlan(algorithm, tuple(pes), tuple(place), ev.traffic(pes), tuple(sizes),
                      tuple(loads), ok, reason, (time.perf_counter() - started) * 1e3,
                      extra or {})


# --- the minimum-ratio cut -------------------------------------------------------------

def _ratio(cut: float, w1: float, w2: float) -> float:
    return cut / max(min(w1, w2), 1e-12)


def exact_min_ratio_cut(adj: np.ndarray, weight: np.ndarray,
                        must_separate: Sequence[tuple[int, int]] = ()) -> tuple[float, np.ndarray]:
    """Every bipartition (vertex 0 on side False), vectorised. Returns (ratio, side)."""
    n = len(weight)
    masks = np.arange(1, 2 ** (n - 1))
    side = ((masks[:, None] >> np.arange(0, n - 1)[None, :]) & 1).astype(bool)
    side = np.concatenate((np.zeros((len(masks), 1), dtype=bool), side), axis=1)
    x = side.astype(float)
    cut = ((x @ adj) * (1 - x)).sum(axis=1)
    w1 = x @ weight
    w2 = weight.sum() - w1
    ratio = cut / np.maximum(np.minimum(w1, w2), 1e-12)
    if must_separate:
        ok = np.zeros(len(masks), dtype=bool)
        for a, b in must_separate:
            ok |= side[:, a] != side[:, b]
        ratio = np.where(ok, ratio, np.inf)
    k = int(np.argmin(ratio))
    return float(ratio[k]), side[k]


def _distances(adj: np.ndarray, root: int) -> np.ndarray:
    """Dijkstra with edge length 1/traffic (heavy streams are short)."""
    import heapq

    n = len(adj)
    dist = np.full(n, np.inf)
    dist[root] = 0.0
    heap = [(0.0, root)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v in np.nonzero(adj[u])[0]:
            nd = d + 1.0 / adj[u, v]
            if nd < dist[v]:
                dist[v] = nd
                heapq.heappush(heap, (nd, int(v)))
    return dist


def sweep_min_ratio_cut(adj: np.ndarray, weight: np.ndarray,
                        must_separate: Sequence[tuple[int, int]] = (),
                        roots: int = 24) -> tuple[float, np.ndarray]:
    """Sweep cuts over spectral and distance orders, then single-vertex improvement."""
    n = len(weight)
    orders: list[np.ndarray] = []
    lap = np.diag(adj.sum(axis=1)) - adj
    try:
        vals, vecs = np.linalg.eigh(lap)
        orders.append(np.argsort(vecs[:, 1], kind="stable"))
    except np.linalg.LinAlgError:  # pragma: no cover - symmetric input
        pass
    # Distance sweeps from the ``roots`` heaviest vertices (0: every vertex).
    heavy = np.argsort(-weight, kind="stable")[: roots or n]
    roots = {int(v) for v in heavy} | {v for pair in must_separate for v in pair}
    for r in roots:
        d = _distances(adj, r)
        d[np.isinf(d)] = d[np.isfinite(d)].max() + 1 if np.isfinite(d).any() else 0
        orders.append(np.argsort(d, kind="stable"))
    best_ratio, best_side = np.inf, None
    total = weight.sum()
    for order in orders:
        side = np.zeros(n, dtype=bool)
        cut, w1 = 0.0, 0.0
        for k in range(n - 1):
            v = order[k]
            # moving v to side True: edges to True-side become internal, others cut
            to_true = adj[v, side].sum()
            cut += adj[v].sum() - 2 * to_true
            side[v] = True
            w1 += weight[v]
            if must_separate and not any(side[a] != side[b] for a, b in must_separate):
                continue
            r = _ratio(cut, w1, total - w1)
            if r < best_ratio:
                best_ratio, best_side = r, side.copy()
    if best_side is None:  # only reachable without a separating prefix: split a pair
        a, b = must_separate[0]
        da, db = _distances(adj, a), _distances(adj, b)
        best_side = db < da
        best_side[a], best_side[b] = False, True
        x = best_side.astype(float)
        best_ratio = _ratio(float(x @ adj @ (1 - x)), float(weight @ x), float(weight @ (1 - x)))
    # Single-vertex moves while they improve the ratio (and keep pairs separated).
    improved = True
    while improved:
        improved = False
        for v in range(n):
            trial = best_side.copy()
            trial[v] = not trial[v]
            if trial.all() or not trial.any():
                continue
            if must_separate and not any(trial[a] != trial[b] for a, b in must_separate):
                continue
            x = trial.astype(float)
            r = _ratio(float(x @ adj @ (1 - x)), float(weight @ x), float(weight @ (1 - x)))
            if r < best_ratio - 1e-12:
                best_ratio, best_side, improved = r, trial, True
    return float(best_ratio), best_side


def _atom_adjacency(ev: Evaluator, atoms: Sequence[Sequence[int]]) -> np.ndarray:
    """Traffic between every pair of atoms (groups of operators), symmetric."""
    # M^T·A·M with M the operator -> atom membership matrix: the sum of A over each
    # pair of atoms' members, in one product instead of k² slices.
    membership = np.zeros((ev.adj.shape[0], len(atoms)))
    for a, members in enumerate(atoms):
        membership[list(members), a] = 1.0
    adj = membership.T @ ev.adj @ membership
    np.fill_diagonal(adj, 0.0)
    return adj


def _exlocated_atoms(ev: Evaluator, atoms: Sequence[Sequence[int]]) -> dict[int, set[int]]:
    """atom -> the atoms it must not share a PE with."""
    atom_of = {op: a for a, members in enumerate(atoms) for op in members}
    out: dict[int, set[int]] = {}
    for a, b in ev.problem.exlocate:
        out.setdefault(atom_of[a], set()).add(atom_of[b])
        out.setdefault(atom_of[b], set()).add(atom_of[a])
    return out


def split_pe(ev: Evaluator, atoms: Sequence[Sequence[int]],
             must_separate: Sequence[tuple[int, int]] = (),
             roots: int = 24) -> tuple[list[int], list[int]]:
    """Split a PE made of ``atoms`` (colocated groups, never split) by a min-ratio cut;
    returns the atom indices of the two sides."""
    k = len(atoms)
    adj = _atom_adjacency(ev, atoms)
    weight = np.array([ev.cpu[list(a)].sum() for a in atoms]) + 1e-9
    atom_of = {op: i for i, a in enumerate(atoms) for op in a}
    pairs = [(atom_of[a], atom_of[b]) for a, b in must_separate
             if a in atom_of and b in atom_of and atom_of[a] != atom_of[b]]
    if k <= EXACT_CUT_ATOMS:
        _, side = exact_min_ratio_cut(adj, weight, pairs)
    else:
        _, side = sweep_min_ratio_cut(adj, weight, pairs, roots)
    left = [i for i in range(k) if not side[i]]
    right = [i for i in range(k) if side[i]]
    if not left or not right:  # defensive: never return an empty side
        heaviest = int(np.argmax(weight))
        left = [i for i in range(k) if i != heaviest]
        right = [heaviest]
    return left, right


# --- COLA --------------------------------------------------------------------------------

def _initial_atoms(problem: FusionProblem, ev: Evaluator, lemma1: bool) -> list[list[int]]:
    root = _colocated_atoms(problem)
    groups: dict[int, list[int]] = {}
    for op, r in enumerate(root):
        groups.setdefault(r, []).append(op)
    atoms = list(groups.values())
    if not lemma1:
        return atoms
    constrained = {v for pair in problem.exlocate for v in pair}
    limit = min(problem.max_pe_cpu or np.inf, max(problem.capacity))
    changed = True
    while changed:
        changed = False
        k = len(atoms)
        for i, j in itertools.combinations(range(k), 2):
            if constrained & set(atoms[i]) or constrained & set(atoms[j]):
                continue
            e = ev.adj[np.ix_(atoms[i], atoms[j])].sum()
            if e <= 0:
                continue
            out_i = ev.pe_size(atoms[i]) - e  # w_u + w(δ(u) ∖ e)
            out_j = ev.pe_size(atoms[j]) - e
            if e >= min(out_i, out_j) and ev.pe_size(atoms[i] + atoms[j]) <= limit:
                atoms[i] = atoms[i] + atoms[j]
                del atoms[j]
                changed = True
                break
    return atoms


def _pairs_by_traffic(ev: Evaluator, pes: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """PE index pairs joined by at least one stream, heaviest traffic between them first."""
    label = np.empty(ev.problem.size, dtype=int)
    for i, pe in enumerate(pes):
        label[list(pe)] = i
    between: dict[tuple[int, int], float] = {}
    for u, v, _ in ev.problem.edges:
        a, b = int(label[u]), int(label[v])
        if a != b:
            key = (min(a, b), max(a, b))
            if key not in between:
                between[key] = float(ev.adj[np.ix_(list(pes[key[0]]), list(pes[key[1]]))].sum())
    return [key for key, _ in sorted(between.items(), key=lambda kv: (-kv[1], kv[0]))]


def _greedy_merge(ev: Evaluator, pes: list[list[int]]) -> list[list[int]]:
    """Merge the feasible PE pair with the most traffic between them, repeatedly."""
    while True:
        k = len(pes)
        merged = False
        for a, b in _pairs_by_traffic(ev, pes):
            trial = [pe for i, pe in enumerate(pes) if i not in (a, b)] + [pes[a] + pes[b]]
            if ev.check(trial)[0]:
                pes = trial
                merged = True
                break
        if not merged or k == 1:
            return pes


ORACLES = ("largest", "most-loaded-host")


def _split_until_feasible(problem: FusionProblem, ev: Evaluator, atoms: list[list[int]],
                          oracle: str, roots: int) -> tuple[list[list[int]] | None, int, str]:
    """COLA's top-down loop (Fig. 2). Returns (PEs as operator lists, splits, reason);
    PEs None when even singletons are not feasible."""
    pes: list[list[int]] = [list(range(len(atoms)))]  # PEs as lists of atom indices

    def ops(pe: list[int]) -> list[int]:
        return [op for a in pe for op in atoms[a]]

    splits = 0
    while True:
        op_pes = [ops(pe) for pe in pes]
        ok, reason, place, loads, sizes = ev.check(op_pes)
        if ok:
            return op_pes, splits, ""
        target, separate = _oracle(problem, ev, pes, op_pes, oracle, place, loads, sizes)
        if target is None or len(pes[target]) < 2:
            return None, splits, reason
        pe = pes[target]
        left, right = split_pe(ev, [atoms[a] for a in pe], separate, roots)
        pes[target:target + 1] = [[pe[i] for i in left], [pe[i] for i in right]]
        splits += 1


def _oracle(problem: FusionProblem, ev: Evaluator, pes: list[list[int]],
            op_pes: list[list[int]], oracle: str, place: Sequence[int] | None,
            loads: Sequence[float], sizes: Sequence[float]
            ) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    """The PE to split next, and the exlocated pairs the split must separate: exlocation
    first (Advanced COLA phase 1), then max PE CPU, then the largest PE with more than
    one atom (Basic COLA) — or, the paper's alternative, the largest multi-atom PE on the
    most over-utilised host."""
    for i, pe in enumerate(op_pes):
        if ev.exlocation_violated(pe):
            members = set(pe)
            return i, tuple((a, b) for a, b in problem.exlocate
                            if a in members and b in members)
    if problem.max_pe_cpu is not None:
        over = [i for i in range(len(pes)) if sizes[i] > problem.max_pe_cpu * (1 + 1e-9)]
        if over:
            return max(over, key=lambda i: sizes[i]), ()
    multi = [i for i in range(len(pes)) if len(pes[i]) > 1]
    if multi and oracle == "most-loaded-host" and place:
        util = [loads[h] / ev.capacity[h] for h in range(len(loads))]
        hot = max(range(len(util)), key=lambda h: util[h])
        multi = [i for i in multi if place[i] == hot] or multi
    if multi:
        return max(multi, key=lambda i: (sizes[i], -i)), ()
    return None, ()


def _post_process(ev: Evaluator, op_pes: list[list[int]], atoms: Sequence[Sequence[int]],
                  atom_of: dict[int, int]) -> list[list[int]]:
    """The paper's greedy merges, alternated with our FM passes, pair swaps and
    merge-and-resplit, until a round gains nothing."""
    while True:
        before = ev.traffic(op_pes)
        op_pes = _greedy_merge(ev, op_pes)
        op_pes = _fm_refine(ev, [sorted({atom_of[op] for op in pe}) for pe in op_pes], atoms)
        op_pes = _resplit_pairs(ev, op_pes, atoms)
        if ev.traffic(op_pes) >= before - 1e-12:
            return op_pes


def _phase4(ev: Evaluator, atoms: Sequence[Sequence[int]], atom_of: dict[int, int],
            op_pes: list[list[int]], roots: int, t: float,
            checkpoints: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[tuple[list[list[int]], int]]:
    """Advanced COLA phase 4 (§3.3): keep splitting the largest PE while the inter-PE
    traffic stays ≤ (1 + T)·c, c the traffic at first feasibility; the feasible plans
    after 1, 2, 4, 8 and 16 extra splits are candidates (each is post-processed, and the
    best plan overall is kept). Finer PEs give the merges more freedom."""
    c0 = ev.traffic(op_pes)
    cur = [sorted({atom_of[op] for op in pe}) for pe in op_pes]
    out: list[tuple[list[list[int]], int]] = []

    def ops(pe: list[int]) -> list[int]:
        return [op for a in pe for op in atoms[a]]

    for more in range(1, max(checkpoints) + 1):
        multi = [i for i, pe in enumerate(cur) if len(pe) > 1]
        if not multi:
            break
        sizes = [ev.pe_size(ops(pe)) for pe in cur]
        target = max(multi, key=lambda i: (sizes[i], -i))
        pe = cur[target]
        left, right = split_pe(ev, [atoms[a] for a in pe], (), roots)
        cur[target:target + 1] = [[pe[i] for i in left], [pe[i] for i in right]]
        trial = [ops(x) for x in cur]
        if ev.traffic(trial) > (1 + t) * c0:
            break
        if more in checkpoints and ev.check(trial)[0]:
            out.append((trial, more))
    return out


def cola(problem: FusionProblem, post_process: bool = True, lemma1: bool = True,
         oracles: Sequence[str] = ORACLES, sweep_roots: Sequence[int] = (1, 24),
         phase4_t: float = 3.0) -> FusionPlan:
    """Basic COLA with both of the paper's oracles (§2.2: the largest PE, or the largest
    PE on the most over-utilised host) and two widths of the sweep cut (distance orders
    from the heaviest atom only, or from the 24 heaviest); with Advanced COLA's phase 4
    (``phase4_t`` = T; 0 turns it off); the best feasible plan wins. Post-processing:
    ``_post_process``."""
    started = time.perf_counter()
    ev = Evaluator(problem)
    atoms = _initial_atoms(problem, ev, lemma1)
    atom_of = {op: a for a, members in enumerate(atoms) for op in members}
    best: tuple[float, list[list[int]], dict] | None = None
    last_reason = ""
    for oracle, roots in itertools.product(oracles, sweep_roots):
        op_pes, splits, reason = _split_until_feasible(problem, ev, atoms, oracle, roots)
        extra = {"splits": splits, "atoms": len(atoms), "oracle": oracle,
                 "sweep_roots": roots}
        if op_pes is None:
            # Splitting adds each cut stream to both PEs' SIZE, so an all-split plan can
            # be heavier than a fused one: repair by traffic-greedy merging.
            last_reason = reason
            singletons = [list(a) for a in atoms]
            op_pes = _repair_by_merging(ev, singletons)
            if op_pes is None:
                continue
            extra["repaired"] = True
        candidates = [(op_pes, 0)]
        if phase4_t > 0 and not extra.get("repaired"):
            candidates += _phase4(ev, atoms, atom_of, op_pes, roots, phase4_t)
        for cand, more in candidates:
            if post_process:
                cand = _post_process(ev, cand, atoms, atom_of)
            traffic = ev.traffic(cand)
            if best is None or traffic < best[0] - 1e-12:
                best = (traffic, cand, {**extra, "phase4_splits": more})
    if best is None:
        pes = [list(a) for a in atoms]
        plan = _plan(ev, "cola", pes, started)
        return dataclasses.replace(plan, feasible=False,
                                   reason=f"no valid plan: even unfused ({last_reason})")
    return _plan(ev, "cola", best[1], started, extra=best[2])


def _resplit_pairs(ev: Evaluator, pes: list[list[int]], atoms: Sequence[Sequence[int]],
                   max_rounds: int = 20) -> list[list[int]]:
    """Merge-and-resplit (ours, as multilevel partitioners refine): for two PEs joined by
    traffic, sweep orders of their union (Fiedler vector; distances from the heaviest
    atoms) and take the prefix split with the least traffic between the halves that
    keeps the whole plan feasible. COLA's ratio cut balances sizes; this cut instead
    fills hosts, which is what the objective rewards once the plan is feasible."""
    atom_of = {op: a for a, members in enumerate(atoms) for op in members}
    ex_atoms = _exlocated_atoms(ev, atoms)
    all_adj = _atom_adjacency(ev, atoms)  # once; each pair's union is a slice of it
    all_weight = np.array([ev.cpu[list(a)].sum() for a in atoms]) + 1e-9
    for _ in range(max_rounds):
        for a, b in _pairs_by_traffic(ev, pes):
            union = sorted({atom_of[op] for op in pes[a] + pes[b]})
            others = [pe for i, pe in enumerate(pes) if i not in (a, b)]
            current = float(ev.adj[np.ix_(pes[a], pes[b])].sum())
            best = _best_resplit(ev, atoms, union, others, current,
                                 all_adj[np.ix_(union, union)], all_weight[union], ex_atoms)
            if best is not None:
                pes = others + best
                break
        else:
            break
    return pes


def _sweep_orders(adj: np.ndarray, weight: np.ndarray) -> list[np.ndarray]:
    """Orders of a union's atoms to sweep: by its Fiedler vector, and by the distance
    from each of its heaviest atoms."""
    orders = []
    if len(adj) > 2:
        lap = np.diag(adj.sum(axis=1)) - adj
        orders.append(np.argsort(np.linalg.eigh(lap)[1][:, 1], kind="stable"))
    for r in np.argsort(-weight, kind="stable")[:8]:
        d = _distances(adj, int(r))
        d[np.isinf(d)] = d[np.isfinite(d)].max() + 1
        orders.append(np.argsort(d, kind="stable"))
    return orders


def _best_resplit(ev: Evaluator, atoms: Sequence[Sequence[int]], union: list[int],
                  others: list[list[int]], current: float, adj: np.ndarray,
                  weight: np.ndarray, ex_atoms: dict[int, set[int]]
                  ) -> list[list[int]] | None:
    """The two PEs (operator lists) of the feasible prefix split of ``union`` with the
    least traffic between them, below ``current``; None if none is."""
    k = len(union)
    # Which positions of ``union`` must not share a PE, both ways. A sweep moves one atom
    # at a time from the right side to the left: once the left holds such a pair it does
    # for the rest of the sweep, and the right's count of pairs only falls, so each is
    # kept as it goes instead of checked pair by pair for every prefix.
    position = {atom: i for i, atom in enumerate(union)}
    apart = [{position[x] for x in ex_atoms.get(atom, ()) if x in position}
             for atom in union]
    if any(i in a for i, a in enumerate(apart)):
        return None  # an atom that may not share a PE with itself: no split keeps it
    best: tuple[float, list[int], list[int]] | None = None
    for order in _sweep_orders(adj, weight):
        side = np.zeros(k, dtype=bool)
        cut = 0.0
        left_apart = False
        right_pairs = sum(len(a) for a in apart) // 2
        for pos in range(k - 1):
            v = order[pos]
            cut += adj[v].sum() - 2 * adj[v, side].sum()
            left_apart = left_apart or any(side[j] for j in apart[v])
            right_pairs -= sum(1 for j in apart[v] if not side[j])
            side[v] = True
            if cut >= current - 1e-9 or (best and cut >= best[0] - 1e-12):
                continue
            if left_apart or right_pairs:
                continue
            left = [union[i] for i in range(k) if side[i]]
            right = [union[i] for i in range(k) if not side[i]]
            halves = [[op for i in left for op in atoms[i]],
                      [op for i in right for op in atoms[i]]]
            if ev.check(others + halves)[0]:
                best = (cut, left, right)
    if best is None:
        return None
    return [[op for i in best[1] for op in atoms[i]], [op for i in best[2] for op in atoms[i]]]


def _fm_refine(ev: Evaluator, pes: list[list[int]], atoms: Sequence[Sequence[int]],
               passes: int = 8, spare: int = 2) -> list[list[int]]:
    """Fiduccia–Mattheyses passes over the k-way partition of atoms (ours; the paper's
    cuts are approximate). In a pass every atom moves at most once, always the best-gain
    move that keeps the plan feasible (gain may be negative, to climb out of local
    minima); the pass then rolls back to its best prefix. Stops when a pass gains
    nothing. Gains come from an atom×PE link matrix updated per move. Then pair swaps."""
    pes = [list(pe) for pe in pes] + [[] for _ in range(spare)]  # room for new PEs
    if len(pes) < 2:
        return [[op for a in pe for op in atoms[a]] for pe in pes if pe]
    refiner = _KWayRefiner(ev, pes, atoms)
    for _ in range(passes):
        if refiner.fm_pass() <= 1e-12:
            break
    for _ in range(len(atoms)):
        if not refiner.swap_pair():
            break
    return [refiner.members(q) for q in range(refiner.k) if (refiner.where == q).any()]


class _KWayRefiner:
    """A k-way partition of atoms into PEs (``where[a]``: atom a's PE) with each PE's
    size, refined by single moves (FM passes) and pair swaps that keep it feasible."""

    def __init__(self, ev: Evaluator, pes: list[list[int]], atoms: Sequence[Sequence[int]]
                 ) -> None:
        self.ev, self.atoms = ev, atoms
        self.n, self.k = len(atoms), len(pes)
        self.adj = _atom_adjacency(ev, atoms)
        self.where = np.empty(self.n, dtype=int)
        for q, pe in enumerate(pes):
            if pe:
                self.where[pe] = q
        self.ex_atoms = _exlocated_atoms(ev, atoms)
        self.limit = ev.problem.max_pe_cpu
        self.sizes = self._all_sizes()

    def members(self, q: int) -> list[int]:
        return [op for a in np.nonzero(self.where == q)[0] for op in self.atoms[a]]

    def _size(self, q: int) -> float:
        return self.ev.pe_size(self.members(q)) if (self.where == q).any() else 0.0

    def _all_sizes(self) -> list[float]:
        return [self._size(q) for q in range(self.k)]

    def feasible(self, sizes: list[float]) -> bool:
        live = [x for x in sizes if x > 0]
        if self.limit is not None and any(x > self.limit * (1 + 1e-9) for x in live):
            return False
        _, loads = self.ev.lpt(live)
        return all(ld <= c * (1 + 1e-9) for ld, c in zip(loads, self.ev.capacity, strict=True))

    def _links(self) -> np.ndarray:
        """links[a, q]: the edge weight between atom a and the atoms of PE q."""
        links = np.zeros((self.n, self.k))
        for q in range(self.k):
            links[:, q] = self.adj[:, self.where == q].sum(axis=1)
        return links

    def _exlocated_in(self, a: int, q: int, but: int | None = None) -> bool:
        return any(self.where[b] == q for b in self.ex_atoms.get(a, ()) if b != but)

    def fm_pass(self) -> float:
        """One FM pass, rolled back to its best prefix; the gain it kept."""
        links = self._links()
        locked = np.zeros(self.n, dtype=bool)
        history: list[tuple[int, int]] = []  # atom, the PE it left
        total, best_total, best_len = 0.0, 0.0, 0
        for _step in range(self.n):
            gained = self._best_move(links, locked)
            if gained is None:
                break
            a, p, gain = gained
            total += gain
            history.append((a, p))
            if total > best_total + 1e-12:
                best_total, best_len = total, len(history)
        for a, p in reversed(history[best_len:]):  # roll back past the best
            self.where[a] = p
        self.sizes = self._all_sizes()
        return best_total

    def _best_move(self, links: np.ndarray, locked: np.ndarray
                   ) -> tuple[int, int, float] | None:
        """Make the best-gain feasible move of an unlocked atom (among the best few):
        (atom, the PE it left, its gain), or None when none fits."""
        rows = np.arange(self.n)
        own = links[rows, self.where]
        gain = links - own[:, None]
        gain[rows, self.where] = -np.inf
        gain[locked] = -np.inf
        for flat in np.argsort(-gain, axis=None)[: 4 * self.k + 8]:
            a, q = divmod(int(flat), self.k)
            if not np.isfinite(gain[a, q]):
                return None
            if self._exlocated_in(a, q):
                continue
            p = int(self.where[a])
            self.where[a] = q
            trial = list(self.sizes)
            trial[p], trial[q] = self._size(p), self.ev.pe_size(self.members(q))
            if self.feasible(trial):
                self.sizes = trial
                links[:, p] -= self.adj[:, a]
                links[:, q] += self.adj[:, a]
                locked[a] = True
                return a, p, float(gain[a, q])
            self.where[a] = p
        return None

    def swap_pair(self) -> bool:
        """Exchange the two atoms of different PEs whose swap gains most and stays
        feasible (when hosts are nearly full a single move rarely fits, but a swap can;
        gain: both moves minus the edge between them). False when none gains."""
        links = self._links()
        own = links[np.arange(self.n), self.where]
        boundary = [a for a in range(self.n) if (links[a] > own[a] - 1e-12).sum() > 1
                    or links[a].sum() > own[a]]
        best: tuple[float, int, int] | None = None
        for i, a in enumerate(boundary):
            for b in boundary[i + 1:]:
                pa, pb = int(self.where[a]), int(self.where[b])
                if pa == pb:
                    continue
                gain = (links[a, pb] - own[a]) + (links[b, pa] - own[b]) - 2 * self.adj[a, b]
                if gain > 1e-9 and (best is None or gain > best[0]) \
                        and self._swap_fits(a, b, pa, pb):
                    best = (gain, a, b)
        if best is None:
            return False
        _, a, b = best
        pa, pb = int(self.where[a]), int(self.where[b])
        self.where[a], self.where[b] = pb, pa
        self.sizes[pa], self.sizes[pb] = (self.ev.pe_size(self.members(pa)),
                                          self.ev.pe_size(self.members(pb)))
        return True

    def _swap_fits(self, a: int, b: int, pa: int, pb: int) -> bool:
        if self._exlocated_in(a, pb, but=b) or self._exlocated_in(b, pa, but=a):
            return False
        self.where[a], self.where[b] = pb, pa
        trial = list(self.sizes)
        trial[pa], trial[pb] = (self.ev.pe_size(self.members(pa)),
                                self.ev.pe_size(self.members(pb)))
        fits = self.feasible(trial)
        self.where[a], self.where[b] = pa, pb
        return fits


# --- baselines -------------------------------------------------------------------------

def no_fusion(problem: FusionProblem) -> FusionPlan:
    """NONE: every operator its own PE (colocated pairs still share one)."""
    started = time.perf_counter()
    ev = Evaluator(problem)
    return _plan(ev, "none", _initial_atoms(problem, ev, lemma1=False), started)


def _topological(problem: FusionProblem) -> list[int]:
    indeg = [0] * problem.size
    succ: list[list[int]] = [[] for _ in range(problem.size)]
    for u, v, _ in problem.edges:
        if u != v:
            succ[u].append(v)
            indeg[v] += 1
    ready = sorted(i for i in range(problem.size) if indeg[i] == 0)
    order: list[int] = []
    while ready:
        u = ready.pop(0)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    seen = set(order)
    return order + [i for i in range(problem.size) if i not in seen]  # cycles: id order


def fuse_all_that_fits(problem: FusionProblem) -> FusionPlan:
    """Walk the atoms in topological order, adding each to the open PE while the PE
    still fits (max PE CPU, largest host) and holds no exlocated pair."""
    started = time.perf_counter()
    ev = Evaluator(problem)
    atoms = _initial_atoms(problem, ev, lemma1=False)
    atom_of = {op: i for i, a in enumerate(atoms) for op in a}
    order: list[int] = []
    for op in _topological(problem):
        if atom_of[op] not in order:
            order.append(atom_of[op])
    limit = min(problem.max_pe_cpu or np.inf, max(problem.capacity))
    pes: list[list[int]] = []
    current: list[int] = []
    for a in order:
        trial = current + atoms[a]
        if current and (ev.pe_size(trial) > limit or ev.exlocation_violated(trial)):
            pes.append(current)
            current = list(atoms[a])
        else:
            current = trial
    if current:
        pes.append(current)
    return _plan(ev, "fuse-all", pes, started)


def _merge_until_feasible(ev: Evaluator, pes: list[list[int]], exact: bool
                          ) -> tuple[list[list[int]], bool]:
    """Merge the heaviest-traffic pair whose PE fits the largest host (and max PE CPU)
    without an exlocated pair, until the plan is feasible. Returns (PEs, feasible)."""
    limit = min(ev.problem.max_pe_cpu or np.inf, max(ev.problem.capacity))
    pes = [list(pe) for pe in pes]
    while not ev.check(pes, exact=exact)[0]:
        for a, b in _pairs_by_traffic(ev, pes):
            joined = pes[a] + pes[b]
            if ev.pe_size(joined) <= limit and not ev.exlocation_violated(joined):
                pes = [pe for i, pe in enumerate(pes) if i not in (a, b)] + [joined]
                break
        else:
            return pes, False
    return pes, True


def _repair_by_merging(ev: Evaluator, pes: list[list[int]]) -> list[list[int]] | None:
    """COLA's repair when even singletons do not fit (exact placement): None if merging
    never makes the plan feasible."""
    merged, ok = _merge_until_feasible(ev, pes, exact=True)
    return merged if ok else None


def greedy_merge(problem: FusionProblem) -> FusionPlan:
    """FINT-like bottom-up fusion: from NONE, merge the PE pair with the heaviest traffic
    between them — while the plan is infeasible, any merge whose PE still fits the largest
    host (and max PE CPU) without an exlocated pair; once feasible, only merges that keep
    the plan feasible — until no such pair remains."""
    started = time.perf_counter()
    ev = Evaluator(problem)
    pes, feasible = _merge_until_feasible(ev, _initial_atoms(problem, ev, lemma1=False),
                                          exact=False)
    if feasible:
        pes = _greedy_merge(ev, pes)
    return _plan(ev, "greedy-merge", pes, started)


def brute_force(problem: FusionProblem) -> FusionPlan | None:
    """The least inter-PE traffic over every partition of the atoms with a feasible
    exact placement (≤ ~10 atoms: Bell(10) = 115,975 partitions)."""
    started = time.perf_counter()
    ev = Evaluator(problem)
    atoms = _initial_atoms(problem, ev, lemma1=False)
    k = len(atoms)
    candidates: list[tuple[float, list[list[int]]]] = []
    for labels in _restricted_growth(k):
        groups: dict[int, list[int]] = {}
        for a, lab in enumerate(labels):
            groups.setdefault(lab, []).extend(atoms[a])
        pes = list(groups.values())
        candidates.append((ev.traffic(pes), pes))
    candidates.sort(key=lambda c: c[0])
    for _, pes in candidates:
        if ev.check(pes, exact=True)[0]:
            return _plan(ev, "optimum", pes, started)
    return None


def _restricted_growth(n: int):
    """Set partitions of n items as restricted growth strings."""
    labels = [0] * n

    def rec(i: int, top: int):
        if i == n:
            yield tuple(labels)
            return
        for lab in range(top + 2):
            labels[i] = lab
            yield from rec(i + 1, max(top, lab))

    if n == 0:
        yield ()
        return
    yield from rec(1, 0)


def plan_fusion(problem: FusionProblem, algorithm: str = "cola") -> FusionPlan:
    if algorithm == "cola":
        return cola(problem)
    if algorithm == "none":
        return no_fusion(problem)
    if algorithm == "fuse-all":
        return fuse_all_that_fits(problem)
    if algorithm == "greedy-merge":
        return greedy_merge(problem)
    raise PlanningError(f"algorithm: unknown {algorithm!r}; choose from {', '.join(ALGORITHMS)}")


def random_dag(operators: int, seed: int, hosts: int = 5, slack: float = 1.15,
               exlocate: int = 0, colocate: int = 0) -> FusionProblem:
    """A layered random DAG (≈1.4 edges per operator, like VWAP's 200/283) with
    log-normal CPU and traffic; equal hosts, their total capacity ``slack`` × the
    unfused plan's total SIZE (so NONE barely fits, and fusion frees room)."""
    rng = np.random.default_rng(seed)
    layers = max(2, int(round(operators ** 0.5)))
    layer = np.sort(rng.integers(0, layers, operators))
    layer[0] = 0
    edges: list[tuple[int, int, float]] = []
    seen: set[tuple[int, int]] = set()
    for v in range(1, operators):
        earlier = [u for u in range(v) if layer[u] < layer[v]] or list(range(v))
        u = int(rng.choice(earlier))
        seen.add((u, v))
        edges.append((u, v, float(rng.lognormal(0, 1))))
    for _ in range(int(0.4 * operators)):
        u, v = sorted(rng.choice(operators, 2, replace=False).tolist())
        if (u, v) not in seen:
            seen.add((u, v))
            edges.append((u, v, float(rng.lognormal(0, 1))))
    cpu = rng.lognormal(1, 0.8, operators)
    # Capacity relative to the unfused plan's total SIZE (Σ cpu + 2 Σ traffic).
    cap = slack * (float(cpu.sum()) + 2 * sum(t for _, _, t in edges)) / hosts
    ops = tuple(f"op{i}" for i in range(operators))
    pairs = [tuple(sorted(rng.choice(operators, 2, replace=False).tolist()))
             for _ in range(exlocate + colocate)]
    return FusionProblem(ops, tuple(float(c) for c in cpu), tuple(edges),
                         tuple(f"h{i}" for i in range(hosts)), (cap,) * hosts,
                         colocate=tuple(pairs[exlocate:]), exlocate=tuple(pairs[:exlocate]))
