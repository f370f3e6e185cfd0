"""The plan optimiser on a running query's measured profile: COLA (Khandekar et al.,
"COLA: Optimizing Stream Processing Applications via Graph Partitioning", §2–3;
``control.planning.fusion``) applied to a dataflow pipeline's Python operators.

**Profile** (:func:`read_profile`). Every PE's workers (``pyops.run_pe``) append, about
once a second, their operators' CPU (the worker process's, during each call), rows in
and out and Arrow bytes out, and the PE process's CPU, whose part outside the operators
is the crossing: a task's worker set-up and the Arrow conversions of its input and
output. Per operator that gives its CPU per record and its output's rows and bytes per
source record — the node costs and edge rates drawn on the DAG, all measured — and over
every profile line a fit of the crossing's CPU as ``a · tasks + b · bytes``
(:meth:`Profile.crossing_costs`, non-negative least squares).

**COLA's model on Spark** (:func:`fusion_problem`), per source record at a target rate R:

* operator cost ``w_v`` = its measured CPU per source record × R (core-seconds per
  second);
* edge cost ``w_e`` = what cutting the edge costs: its rows' Arrow conversions on both
  sides (``2 · b`` × the edge's measured bytes per source record × R) and, since on a
  chain every cut adds a PE, one more PE's per-task cost (``a`` × the tasks a PE runs
  per second, measured). Only the Python side is measured; the JVM's share of a crossing
  (Arrow → rows → Arrow) is not in the model. The crossings into the first PE and out of
  the last exist in every plan; they are added to their operators' cost;
* hosts: Spark runs a stage's PEs one after the other inside each task (measured:
  two chained ``mapInPandas`` on 2 cores took 2.25 s where one fused took 1.7 s, so
  chained PEs do not overlap), so every task carries every PE of its stage. The host
  is therefore the stage's ``partitions`` tasks together, capacity γ × partitions cores
  (γ = ``HEADROOM``), and a PE's load is SIZE(S) (eq. 1) at R, spread over them;
  ``partitions`` (the placement: how many executors the PEs spread over) is the
  fewest, from the source's up to the executor cores, at which the plan fits — a
  repartition in front of the first PE when that exceeds the source's;
* constraints: the pipeline's ``plan.colocate``/``plan.exlocate`` pairs (§3.1 PE
  colocation and exlocation); a PE must be a chain (one ``mapInPandas`` runs its
  operators in order), so a PE that is not one is cut into its chains.

The sustainable rate a plan is predicted to reach is (γ × partitions − its per-task
costs) / (its Σ SIZE per source record): labelled "modelled" wherever it is shown.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from control.planning import fusion
from pipelines.runtime.spec import dataflow
from pipelines.runtime.operators import catalogue as pyops

HEADROOM = 0.9  # γ: the share of a core a plan may fill (COLA §4's capacity scaling)
ALGORITHMS = ("cola", "fuse-all", "none", "greedy-merge")


# A profile line (a worker's sums over about a second) whose CPU per row is more than
# SPIKE times the operator's median line is a one-off: in a profiled run on 2 cores one
# call of the format operator took 84 ms (42 µs a row against a median of 1.6: a full
# garbage collection, or the operator's first call in a new worker, up to 8x), and in a
# window of a few dozen lines it made that operator 2.7x its cost timed alone.
SPIKE = 3.0


@dataclass
class OperatorProfile:
    node_id: str
    cpu_s: float = 0.0  # every line's
    rows_in: int = 0
    rows_out: int = 0
    bytes_out: int = 0
    # Each profile line's (CPU s, rows in), for ``steady_cpu_s``.
    lines: list[tuple[float, int]] = field(default_factory=list)

    @property
    def steady_cpu_s(self) -> float:
        """The CPU of all ``rows_in`` at the cost per row of the lines that are no
        spike (``SPIKE``): what the operator costs run after run, which COLA plans on.
        With fewer than three lines, all of them."""
        lines = [(c, r) for c, r in self.lines if r > 0]
        if len(lines) < 3:
            return self.cpu_s
        median = float(np.median([c / r for c, r in lines]))
        kept = [(c, r) for c, r in lines if c / r <= SPIKE * median]
        return sum(c for c, _ in kept) / sum(r for _, r in kept) * self.rows_in


@dataclass
class PeProfile:
    name: str
    tasks: int = 0
    batches: int = 0
    cpu_s: float = 0.0
    rows_in: int = 0
    bytes_in: int = 0
    rows_out: int = 0
    bytes_out: int = 0

    @property
    def operators(self) -> list[str]:
        return self.name.split("+")


@dataclass
class Profile:
    operators: dict[str, OperatorProfile] = field(default_factory=dict)
    pes: dict[str, PeProfile] = field(default_factory=dict)
    first_t: float | None = None
    last_t: float | None = None
    # Per profile line: (tasks, Arrow bytes in + out, process CPU outside the operators).
    samples: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(p.rows_in for p in self.operators.values())

    def crossing_costs(self) -> tuple[float, float]:
        """Measured: (CPU s per task, CPU s per Arrow byte) of a PE's crossing — its
        process CPU outside its operators (a task's worker set-up and the input's and
        output's Arrow conversions), fitted by non-negative least squares over every
        profile line as ``a · tasks + b · (bytes in + out)``."""
        from scipy.optimize import nnls

        rows = [(t, b, o) for t, b, o in self.samples if t or b]
        if len(rows) < 2:
            return 0.0, 0.0
        a = np.array([[t, b / 1e6] for t, b, _ in rows], dtype=float)
        y = np.array([max(0.0, o) for _, _, o in rows], dtype=float)
        (per_task, per_mb), _ = nnls(a, y)
        return float(per_task), float(per_mb) / 1e6

    def tasks_per_s(self) -> float:
        """How many tasks a PE runs per second (the mean over the PEs)."""
        if self.first_t is None or self.last_t is None or not self.pes:
            return 0.0
        span = max(1.0, self.last_t - self.first_t)
        return sum(pe.tasks for pe in self.pes.values()) / len(self.pes) / span


def read_profile(directory: Path, since: float = 0.0, pes: set[str] | None = None,
                 until: float = math.inf) -> Profile:
    """Sum every worker's profile lines written from ``since`` to ``until`` (epoch s),
    of the PEs named in ``pes`` (all if None)."""
    out = Profile()
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.jsonl")):
        parts = path.name.split(".")  # PE (node ids: no dots), pid, segment, jsonl
        if len(parts) == 4 and parts[2].isdigit() and not (
                int(parts[2]) + pyops.PeProfiler.SEGMENT_S >= since
                and int(parts[2]) <= until):
            continue  # written entirely outside the span
        with open(path) as lines:
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if not since <= rec["t"] <= until or (pes is not None
                                                      and rec["pe"] not in pes):
                    continue
                out.first_t = rec["t"] if out.first_t is None else min(out.first_t, rec["t"])
                out.last_t = rec["t"] if out.last_t is None else max(out.last_t, rec["t"])
                pe = out.pes.setdefault(rec["pe"], PeProfile(rec["pe"]))
                for k in ("tasks", "batches", "cpu_s", "rows_in", "bytes_in", "rows_out",
                          "bytes_out"):
                    setattr(pe, k, getattr(pe, k) + rec.get(k, 0))
                out.samples.append((rec.get("tasks", 0), rec["bytes_in"] + rec["bytes_out"],
                                    rec["cpu_s"] - sum(o["cpu_s"]
                                                       for o in rec["ops"].values())))
                for node_id, sums in rec["ops"].items():
                    op = out.operators.setdefault(node_id, OperatorProfile(node_id))
                    op.cpu_s += sums["cpu_s"]
                    op.rows_in += sums["rows_in"]
                    op.rows_out += sums["rows_out"]
                    op.bytes_out += sums["bytes_out"]
                    op.lines.append((sums["cpu_s"], sums["rows_in"]))
    return out


@dataclass(frozen=True)
class MeasuredGraph:
    """Per source record: each Python operator's CPU (s) and each edge's rows and
    Arrow bytes; the crossing CPU per byte. All measured (``read_profile``)."""

    operators: tuple[str, ...]  # python nodes, topological
    cpu_per_record: dict[str, float]
    rows_per_record: dict[tuple[str, str], float]  # edge -> rows per source record
    bytes_per_record: dict[tuple[str, str], float]
    crossing_s_per_byte: float
    crossing_s_per_task: float
    tasks_per_s: float  # per PE
    entry: dict[str, float]  # first operators: bytes per source record entering Python
    exit: dict[str, float]  # operators whose rows leave Python: bytes per source record
    source_records: int
    entry_rows: dict[str, float] = field(default_factory=dict)  # rows per source record

    def as_dict(self) -> dict[str, Any]:
        return {"operators": {o: {"cpu_us_per_record": self.cpu_per_record[o] * 1e6}
                              for o in self.operators},
                "edges": [{"from": a, "to": b, "rows_per_record": self.rows_per_record[(a, b)],
                           "bytes_per_record": self.bytes_per_record[(a, b)]}
                          for a, b in self.rows_per_record],
                "crossing_ns_per_byte": self.crossing_s_per_byte * 1e9,
                "crossing_ms_per_task": self.crossing_s_per_task * 1e3,
                "tasks_per_s": self.tasks_per_s,
                "source_records": self.source_records, "label": "measured"}


def measured_graph(graph: dataflow.Graph, profile: Profile, source_records: int
                   ) -> MeasuredGraph:
    """Costs per source record from a profile over ``source_records`` records read."""
    if profile.empty or source_records <= 0:
        raise ValueError("no profile yet: the Python operators have not run")
    python = [n.id for n in graph.nodes if n.type == "python"]
    ops = profile.operators
    missing = [o for o in python if o not in ops]
    if missing:
        raise ValueError(f"no profile of {', '.join(missing)} yet")
    n = float(source_records)
    cpu = {o: ops[o].steady_cpu_s / n for o in python}
    rows, size = {}, {}
    for a in python:
        for b in python:
            if a in graph.node(b).inputs:
                rows[(a, b)] = ops[a].rows_out / n
                size[(a, b)] = ops[a].bytes_out / n
    entry: dict[str, float] = {}
    entry_rows: dict[str, float] = {}
    exit_: dict[str, float] = {}
    for o in python:
        node = graph.node(o)
        if graph.node(node.inputs[0]).type != "python":
            # Entering Python: the rows it reads, at the bytes its PE measured per row.
            pe = next((p for p in profile.pes.values() if p.operators[0] == o), None)
            per_row = pe.bytes_in / pe.rows_in if pe and pe.rows_in else 0.0
            entry[o] = ops[o].rows_in * per_row / n
            entry_rows[o] = ops[o].rows_in / n
        if any(o in m.inputs and m.type != "python" for m in graph.nodes):
            exit_[o] = ops[o].bytes_out / n
    per_task, per_byte = profile.crossing_costs()
    return MeasuredGraph(tuple(python), cpu, rows, size, per_byte, per_task,
                         profile.tasks_per_s(), entry, exit_, source_records, entry_rows)


def fusion_problem(measured: MeasuredGraph, rate: float, partitions: int,
                   plan: dataflow.PePlan) -> fusion.FusionProblem:
    """COLA's problem at ``rate`` source records/s over ``partitions`` tasks (module
    docstring): costs in cores, one host of HEADROOM × partitions cores. A cut edge
    costs its rows' Arrow conversions on both sides and one more PE's fixed cost per
    task (on a chain, every cut adds a PE)."""
    index = {o: i for i, o in enumerate(measured.operators)}
    per_byte, per_task = measured.crossing_s_per_byte, measured.crossing_s_per_task
    fixed_per_s = per_task * measured.tasks_per_s  # cores, whatever the rate
    cpu = []
    for k, o in enumerate(measured.operators):
        boundary = 2 * per_byte * (measured.entry.get(o, 0.0) + measured.exit.get(o, 0.0))
        cpu.append((measured.cpu_per_record[o] + boundary) * rate
                   + (fixed_per_s if k == 0 else 0.0))
    edges = tuple((index[a], index[b], 2 * per_byte * b_ * rate + fixed_per_s)
                  for (a, b), b_ in measured.bytes_per_record.items())
    return fusion.FusionProblem(
        operators=measured.operators, cpu=tuple(cpu), edges=edges,
        hosts=(f"{partitions} task(s)",), capacity=(HEADROOM * partitions,),
        colocate=tuple((index[a], index[b]) for a, b in plan.colocate),
        exlocate=tuple((index[a], index[b]) for a, b in plan.exlocate))


def chains(graph: dataflow.Graph, members: list[str]) -> list[tuple[str, ...]]:
    """``members`` (one of COLA's PEs) as the chains one ``mapInPandas`` each can run,
    in topological order."""
    order = [n.id for n in graph.nodes if n.id in members]
    out: list[list[str]] = []
    for o in order:
        if out and dataflow.python_chain_breaks(graph, out[-1][-1], o) is None:
            out[-1].append(o)
        else:
            out.append([o])
    return [tuple(c) for c in out]


@dataclass(frozen=True)
class PlanProposal:
    algorithm: str
    pes: tuple[tuple[str, ...], ...]
    partitions: int
    rate: float
    pe_load: tuple[float, ...]  # modelled cores per task at ``rate``
    crossings_per_record: float  # JVM<->Python round trips per source record (modelled)
    crossing_bytes_per_s: float  # modelled
    total_load: float  # modelled cores per task at ``rate`` (Σ SIZE / partitions)
    max_rate: float  # modelled sustainable source rate
    feasible: bool
    reason: str = ""

    def pe_plan(self, base: dataflow.PePlan) -> dataflow.PePlan:
        return dataflow.PePlan(self.pes, self.partitions, base.colocate, base.exlocate)

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "pes": [list(p) for p in self.pes],
                "partitions": self.partitions, "rate": self.rate,
                "pe_load": [round(x, 4) for x in self.pe_load],
                "crossings_per_record": round(self.crossings_per_record, 4),
                "crossing_bytes_per_s": round(self.crossing_bytes_per_s, 1),
                "total_load": round(self.total_load, 4),
                "max_rate": round(self.max_rate, 1), "feasible": self.feasible,
                "reason": self.reason, "label": "modelled"}


def evaluate(graph: dataflow.Graph, measured: MeasuredGraph, pes: list[tuple[str, ...]],
             rate: float, partitions: int, algorithm: str,
             plan: dataflow.PePlan) -> PlanProposal:
    """The modelled loads of running ``pes`` at ``rate`` over ``partitions`` tasks, and
    whether they fit and keep the plan's colocation and exlocation pairs."""
    index = {o: i for i, o in enumerate(measured.operators)}

    def sizes_at(r: float) -> list[float]:
        ev = fusion.Evaluator(fusion_problem(measured, r, partitions, plan))
        return [ev.pe_size([index[o] for o in pe]) for pe in pes]

    sizes = sizes_at(rate)
    fixed = sum(sizes_at(0.0))  # cores whatever the rate: the PEs' per-task costs
    per_record = sum(sizes_at(1.0)) - fixed  # core-seconds per source record
    cap = HEADROOM * partitions
    load = [s / partitions for s in sizes]
    pe_of = {o: k for k, pe in enumerate(pes) for o in pe}
    cut = [(a, b) for (a, b) in measured.bytes_per_record if pe_of[a] != pe_of[b]]
    # Each PE is one JVM -> Python -> JVM round trip of the rows it reads.
    crossings = sum(measured.rows_per_record[e] for e in cut) + \
        sum(measured.entry_rows.values())
    moved = sum(measured.bytes_per_record[e] for e in cut) + \
        sum(measured.entry.values()) + sum(measured.exit.values())
    valid, reason = True, ""
    for a, b in plan.exlocate:
        if pe_of[a] == pe_of[b]:
            valid, reason = False, f"{a} and {b} share a PE (exlocate)"
    for a, b in plan.colocate:
        if pe_of[a] != pe_of[b]:
            valid, reason = False, f"{a} and {b} are apart (colocate)"
    total = sum(sizes)
    fits = total <= cap * (1 + 1e-9)
    if valid and not fits:
        reason = f"needs {total:.2f} cores at {rate:g}/s; has {cap:.2f}"
    max_rate = (cap - fixed) / per_record if per_record > 0 else math.inf
    return PlanProposal(algorithm, tuple(pes), partitions, rate, tuple(load), crossings,
                        moved * rate, total / partitions, max(0.0, max_rate),
                        valid and fits, reason)


def propose(graph: dataflow.Graph, measured: MeasuredGraph, plan: dataflow.PePlan,
            rate: float, source_partitions: int, cores: int,
            algorithm: str = "cola") -> PlanProposal:
    """``algorithm``'s plan (COLA or a baseline of ``control.planning.fusion``) for
    ``rate`` source records/s: the fewest partitions (from the source's up to
    ``cores``) at which it fits, else all the cores."""
    lo = max(1, min(source_partitions, cores))
    order = {n.id: k for k, n in enumerate(graph.nodes)}
    best: PlanProposal | None = None
    for partitions in range(lo, max(lo, cores) + 1):
        problem = fusion_problem(measured, rate, partitions, plan)
        result = fusion.plan_fusion(problem, algorithm)
        pes: list[tuple[str, ...]] = []
        for members in result.pes:
            pes.extend(chains(graph, [measured.operators[i] for i in members]))
        pes.sort(key=lambda pe: order[pe[0]])
        # Judged on the chains it runs as (a PE cut into chains may split a
        # colocated pair): capacity and constraints both, by ``evaluate``.
        best = evaluate(graph, measured, pes, rate, partitions, algorithm, plan)
        if best.feasible:
            return best
    assert best is not None
    return best


def max_sustainable(graph: dataflow.Graph, measured: MeasuredGraph, plan: dataflow.PePlan,
                    source_partitions: int, cores: int, algorithm: str = "cola"
                    ) -> PlanProposal:
    """``algorithm``'s plan at the highest rate it is modelled to sustain (bisection on
    the rate; COLA's plan depends on the rate through the capacity constraint)."""
    probe = propose(graph, measured, plan, 1.0, source_partitions, cores, algorithm)
    # The most any partitioning may carry: the plan over every core.
    widest = evaluate(graph, measured, list(probe.pes), 1.0,
                      max(cores, source_partitions), algorithm, plan)
    hi = max(probe.max_rate, widest.max_rate, 1.0) * 1.01
    lo = 1.0
    best = probe
    for _ in range(30):
        mid = (lo + hi) / 2
        cand = propose(graph, measured, plan, mid, source_partitions, cores, algorithm)
        if cand.feasible:
            lo, best = mid, cand
        else:
            hi = mid
        if hi - lo < 0.005 * hi:
            break
    return best
