"""Migration schedules (Megaphone §3.3 and §4.4): the order in which key groups move
from the current to the target assignment.

* ``all-at-once``: every move in one step (Megaphone's single ``Map(target)``; Spark's
  behaviour when a placement changes). Shortest, with the largest latency spike.
* ``fluid``: one group per step, the next issued when the previous completed.
* ``batched``: each worker sends at most one group and receives at most one group per
  step. Megaphone builds each step with a maximum matching (Hopcroft–Karp) on the
  sender→receiver graph and repeats; that greedy can need more steps than necessary.
  Here the moves are the edges of a bipartite multigraph (senders on one side,
  receivers on the other; a worker that both sends and receives appears on both), and
  a proper edge colouring gives the steps. By König's edge-colouring theorem a
  bipartite multigraph needs exactly Δ colours — Δ = the most groups any one worker
  sends or receives, an obvious lower bound — and the alternating-path algorithm below
  finds such a colouring in O(|moves|·|workers|).

``max_bytes_per_step`` (optional) additionally caps the state moved per step: a colour
class heavier than the cap is split first-fit-decreasing, so the step count may then
exceed Δ (a group larger than the cap travels alone and is reported as ``oversized``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from control.planning import PlanningError

STRATEGIES = ("all-at-once", "fluid", "batched")


@dataclass(frozen=True)
class Move:
    group: int
    source: int
    target: int
    size: float = 0.0

    def as_dict(self) -> dict:
        return {"group": self.group, "from": self.source, "to": self.target}


@dataclass(frozen=True)
class Schedule:
    strategy: str
    steps: tuple[tuple[Move, ...], ...]
    lower_bound: int  # Δ: no schedule with ≤ 1 send and ≤ 1 receive per worker is shorter
    oversized: tuple[int, ...] = ()  # groups larger than max_bytes_per_step

    def as_dict(self) -> dict:
        return {"strategy": self.strategy,
                "steps": [[m.as_dict() for m in step] for step in self.steps],
                "step_bytes": [sum(m.size for m in step) for step in self.steps],
                "moves": sum(len(s) for s in self.steps), "lower_bound": self.lower_bound,
                "oversized": list(self.oversized)}


def moves_between(current: Sequence[int], target: Sequence[int],
                  state_sizes: Sequence[float] | None = None) -> list[Move]:
    if len(current) != len(target):
        raise PlanningError(f"current and target must have the same length "
                            f"(got {len(current)} and {len(target)})")
    sizes = state_sizes if state_sizes is not None else [0.0] * len(current)
    if len(sizes) != len(current):
        raise PlanningError(f"state_sizes must have one entry per group ({len(current)})")
    return [Move(g, a, b, float(sizes[g]))
            for g, (a, b) in enumerate(zip(current, target, strict=True)) if a != b]


def degree_bound(moves: Sequence[Move]) -> int:
    sends: dict[int, int] = {}
    receives: dict[int, int] = {}
    for m in moves:
        sends[m.source] = sends.get(m.source, 0) + 1
        receives[m.target] = receives.get(m.target, 0) + 1
    return max([0, *sends.values(), *receives.values()])


def edge_colouring(moves: Sequence[Move]) -> list[int]:
    """A proper edge colouring of the sender/receiver multigraph with Δ colours.

    For each edge (u, v): take a colour a free at sender u and b free at receiver v. If
    a ≠ b, swap a and b along the alternating a/b path starting at v (it cannot reach u
    in a bipartite graph, since it alternates sides and u is missing a), after which a
    is free at both ends. Every vertex has < Δ coloured edges when one more arrives, so a
    free colour always exists among Δ."""
    delta = degree_bound(moves)
    # at[("s", worker)][colour] = edge index; at[("r", worker)][colour] = edge index
    at: dict[tuple[str, int], dict[int, int]] = {}
    colour = [-1] * len(moves)

    def free(vertex: tuple[str, int]) -> int:
        used = at.setdefault(vertex, {})
        return next(c for c in range(delta) if c not in used)

    def other_end(e: int, vertex: tuple[str, int]) -> tuple[str, int]:
        m = moves[e]
        return ("r", m.target) if vertex == ("s", m.source) else ("s", m.source)

    for e, m in enumerate(moves):
        u, v = ("s", m.source), ("r", m.target)
        a, b = free(u), free(v)
        if a != b:
            # Collect the a/b alternating path from v (starts with an a-edge at v).
            path, vertex, want = [], v, a
            while want in at.setdefault(vertex, {}):
                edge = at[vertex][want]
                path.append(edge)
                vertex = other_end(edge, vertex)
                want = b if want == a else a
            for edge in path:  # remove, then re-add with swapped colours
                old = colour[edge]
                mm = moves[edge]
                del at[("s", mm.source)][old]
                del at[("r", mm.target)][old]
            for edge in path:
                new = b if colour[edge] == a else a
                colour[edge] = new
                mm = moves[edge]
                at[("s", mm.source)][new] = edge
                at[("r", mm.target)][new] = edge
        colour[e] = a
        at[u][a] = e
        at[v][a] = e
    return colour


def receives_per_step(targets: Sequence[int], strategy: str) -> dict[int, int]:
    """The most groups any one step of ``strategy`` delivers to each receiving worker,
    given the receiving worker of every move, without building the schedule: all of them
    for all-at-once; one for fluid (one move per step) and for batched (each colour class
    gives a worker at most one incoming group — the defining property of the colouring).
    Tested equal to the schedules themselves; the simulator uses it on every rebalance,
    where colouring 10⁵ moves would dominate its run time."""
    if strategy not in STRATEGIES:
        raise PlanningError(f"strategy: unknown {strategy!r}; choose from {', '.join(STRATEGIES)}")
    workers, counts = np.unique(np.asarray(targets, dtype=np.int64), return_counts=True)
    if strategy == "all-at-once":
        return {int(w): int(c) for w, c in zip(workers, counts, strict=True)}
    return {int(w): 1 for w in workers}


def schedule(current: Sequence[int], target: Sequence[int], strategy: str,
             state_sizes: Sequence[float] | None = None,
             max_bytes_per_step: float | None = None) -> Schedule:
    """The ordered steps from ``current`` to ``target`` (worker id per group)."""
    if strategy not in STRATEGIES:
        raise PlanningError(f"strategy: unknown {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if max_bytes_per_step is not None and not max_bytes_per_step > 0:
        raise PlanningError("max_bytes_per_step: must be > 0")
    moves = moves_between(current, target, state_sizes)
    bound = degree_bound(moves)
    if not moves:
        return Schedule(strategy, (), 0)
    if strategy == "all-at-once":
        groups = [list(moves)]
    elif strategy == "fluid":
        # Largest state first: the big moves are done while the system is still calm,
        # and the tail of the migration is made of quick steps.
        groups = [[m] for m in sorted(moves, key=lambda m: (-m.size, m.group))]
    else:
        colours = edge_colouring(moves)
        groups = [[] for _ in range(bound)]
        for m, c in zip(moves, colours, strict=True):
            groups[c].append(m)
        groups.sort(key=lambda step: (-sum(m.size for m in step), step[0].group))
    oversized: list[int] = []
    if max_bytes_per_step is not None:
        split: list[list[Move]] = []
        for step in groups:
            bins: list[list[Move]] = []
            room: list[float] = []
            for m in sorted(step, key=lambda m: (-m.size, m.group)):
                if m.size > max_bytes_per_step:
                    oversized.append(m.group)
                    bins.append([m])
                    room.append(0.0)
                    continue
                for i, r in enumerate(room):
                    if m.size <= r:
                        bins[i].append(m)
                        room[i] -= m.size
                        break
                else:
                    bins.append([m])
                    room.append(max_bytes_per_step - m.size)
            split.extend(bins)
        groups = split
    steps = tuple(tuple(sorted(step, key=lambda m: m.group)) for step in groups)
    return Schedule(strategy, steps, bound, tuple(sorted(oversized)))
