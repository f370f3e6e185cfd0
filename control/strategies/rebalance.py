"""Rebalancers of key groups over workers (thesis §6.4.3). Pure Python.

A key (group) k weighs ``w_k = p_k * T_k`` (its share of the arrivals times its
computation time); worker i's load is the sum of the weights routed to it.

* ``balanced``: Algorithm 1, the greedy (LPT) approximation of minimum makespan: keys by
  weight, descending, each to the currently least-loaded worker. Recomputed from
  scratch: it ignores which keys move (makespan <= (4/3 - 1/(3n)) OPT, Graham 1969).
* ``flux`` (Shah et al. 2003): keys of removed workers first go greedily to the
  least-loaded workers (the artifact); then, while the most-loaded (donor) and
  least-loaded (receiver) workers differ by more than the threshold, move the donor's
  heaviest key that reduces their imbalance. Few keys move.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Assignment:
    routing: tuple[int, ...]  # key -> worker
    loads: tuple[float, ...]  # worker -> load
    moved: tuple[int, ...]  # keys whose worker changed

    @property
    def makespan(self) -> float:
        return max(self.loads) if self.loads else 0.0

    @property
    def imbalance(self) -> float:
        """max load / mean load (1 = perfectly balanced)."""
        mean = sum(self.loads) / len(self.loads)
        return self.makespan / mean if mean > 0 else 1.0


def _finish(weights: Sequence[float], routing: list[int], workers: int,
            previous: Sequence[int] | None) -> Assignment:
    loads = [0.0] * workers
    for k, w in enumerate(routing):
        loads[w] += weights[k]
    moved = tuple(k for k, w in enumerate(routing) if previous is None or previous[k] != w)
    return Assignment(tuple(routing), tuple(loads), moved)


def balanced(weights: Sequence[float], workers: int,
             previous: Sequence[int] | None = None) -> Assignment:
    """Algorithm 1 (greedy LPT). Ties go to the lowest worker index, deterministically.
    A heap of (load, worker) finds the least-loaded worker in O(log n): the same choice
    as a linear scan with the same tie-break, so 100,000 keys on 1,000 workers take
    well under a second."""
    if workers < 1:
        raise ValueError("need at least one worker")
    heap = [(0.0, i) for i in range(workers)]
    routing = [0] * len(weights)
    for k in sorted(range(len(weights)), key=lambda k: (-weights[k], k)):
        load, target = heapq.heappop(heap)
        routing[k] = target
        heapq.heappush(heap, (load + weights[k], target))
    return _finish(weights, routing, workers, previous)


def flux(weights: Sequence[float], workers: int, previous: Sequence[int],
         threshold: float = 0.10, max_moves: int | None = None,
         cap: float | None = None) -> Assignment:
    """Flux with an imbalance threshold (0.10 = 10 %, the thesis' shared-memory value).

    The loop stops when (max - min) <= threshold * max, when ``cap`` is given and every
    load is within it (the planners compare Flux at Ding's load bound), or when no single
    key of the donor reduces the donor/receiver gap (every move strictly reduces it, so
    it ends).
    """
    if workers < 1:
        raise ValueError("need at least one worker")
    routing = list(previous)
    loads = [0.0] * workers
    orphans = []
    for k, w in enumerate(routing):
        if 0 <= w < workers:
            loads[w] += weights[k]
        else:
            orphans.append(k)
    for k in sorted(orphans, key=lambda k: (-weights[k], k)):  # removed workers' keys
        target = min(range(workers), key=lambda i: (loads[i], i))
        routing[k] = target
        loads[target] += weights[k]
    limit = max_moves if max_moves is not None else 10 * len(weights) + 1
    for _ in range(limit):
        donor = max(range(workers), key=lambda i: (loads[i], -i))
        receiver = min(range(workers), key=lambda i: (loads[i], i))
        gap = loads[donor] - loads[receiver]
        if gap <= threshold * loads[donor] or (cap is not None and loads[donor] <= cap):
            break
        # A key of weight w shrinks the gap iff 0 < w < gap; the heaviest such key
        # shrinks it most.
        candidates = [k for k, w in enumerate(routing) if w == donor and 0 < weights[k] < gap]
        if not candidates:
            break
        k = max(candidates, key=lambda k: (weights[k], -k))
        routing[k] = receiver
        loads[donor] -= weights[k]
        loads[receiver] += weights[k]
    return _finish(weights, routing, workers, previous)
