"""The run's "Optimise plan" page: its Python operators' measured profile and COLA's
proposal (``pipelines.runtime.query.planopt``), read from the run's directory on this host.

The runner writes ``pe-plan.json`` (the PEs the forwarding query runs) and every PE
worker its profile lines (``pe-profile/``); the source records read over the same
span come from the run's stored batches. The proposal is applied by a live re-plan
(``actions.request_plan``).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.models import Run
from pipelines.runtime.spec import dataflow
from pipelines.runtime.query import planopt
from pipelines.runtime.spec import definition as pdef
from pipelines.runtime.query.dataflow_spark import pe_name

PROFILE_WINDOW_S = 30.0  # the profile the page shows: the last this many seconds
PE_COLOURS = ("#dbe8fb", "#fde3cf", "#daf2dc", "#f3dcf5", "#fbf3c7", "#d6f1f3", "#eadfd4")


@dataclass
class PlanPage:
    """What the page shows, or ``refusal`` (why there is nothing to optimise yet)."""

    refusal: str = ""
    graph: dataflow.Graph | None = None
    current: planopt.PlanProposal | None = None
    proposals: dict[str, planopt.PlanProposal] = field(default_factory=dict)
    measured: planopt.MeasuredGraph | None = None
    rate: float = 0.0
    cores: int = 0
    window_s: float = 0.0
    picture: Any = None
    node_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    edge_facts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def proposed(self) -> planopt.PlanProposal | None:
        return self.proposals.get("cola")

    @property
    def changes(self) -> bool:
        return (self.current is not None and self.proposed is not None
                and (self.current.pes, self.current.partitions)
                != (self.proposed.pes, self.proposed.partitions))


def has_python_operators(run: Run) -> bool:
    """Whether the run's pipeline has Python operators (something to fuse), read from
    the stored definition as it is (the page says why when it does not validate)."""
    nodes = (run.pipeline_version.definition or {}).get("nodes") or []
    return any(isinstance(n, dict) and n.get("type") == "python" for n in nodes)


def current_plan(run: Run, spec: pdef.PipelineSpec) -> tuple[dataflow.PePlan, float]:
    """The PEs the run's forwarding query runs (and since when): the runner's
    ``pe-plan.json``, else the definition's."""
    assert spec.graph is not None and spec.pe_plan is not None
    path = Path(run.checkpoint_dir or "/nonexistent") / "pe-plan.json"
    try:
        doc = json.loads(path.read_text())
        since = float(doc.pop("since", 0.0))
        doc.pop("generation", None)
        return dataflow.validate_plan(doc, spec.graph), since
    except (OSError, ValueError, dataflow.GraphError):
        return spec.pe_plan, 0.0


def plan_page(run: Run, algorithms: tuple[str, ...] = planopt.ALGORITHMS,
              draw: bool = True) -> PlanPage:
    """The page of ``run``: its current plan and each of ``algorithms``' proposal on
    the measured profile, and (``draw``) the DAG laid out with the measured facts. The
    plan watch asks for COLA's proposal only and no drawing."""
    try:
        spec = pdef.validate(run.pipeline_version.definition)
    except pdef.DefinitionError as exc:
        return PlanPage(refusal=f"the pipeline's definition no longer validates: {exc}")
    if spec.graph is None or spec.pe_plan is None or not spec.pe_plan.pes:
        return PlanPage(refusal="the pipeline has no Python operator: there is nothing to "
                                "fuse (add python nodes to a dataflow pipeline)")
    if run.status != "running" or not run.checkpoint_dir:
        return PlanPage(refusal=f"the run is {run.status}: a plan is optimised on the "
                                "profile of a running query")
    plan, since = current_plan(run, spec)
    now = time.time()
    start = max(since, now - PROFILE_WINDOW_S)
    samples = list(run.samples.filter(t__gte=_dt(start)).order_by("t")
                   .values_list("t", "input_rows"))
    if len(samples) < 2:
        return PlanPage(refusal="the current plan has not run long enough yet: its profile "
                                "needs a few batches (try again in a few seconds)")
    first_t = samples[0][0].timestamp()
    records = sum(rows for _t, rows in samples[1:])
    names = {pe_name(pe) for pe in plan.pes}
    # A batch's profile lines are written while it runs (each task ends with one),
    # before its commit: the batches after the first one are the lines in between.
    profile = planopt.read_profile(Path(run.checkpoint_dir) / "pe-profile", first_t,
                                   names, until=samples[-1][0].timestamp())
    try:
        measured = planopt.measured_graph(spec.graph, profile, records)
    except ValueError as exc:
        return PlanPage(refusal=str(exc))
    span = samples[-1][0].timestamp() - first_t
    rate = records / span if span > 0 else 0.0
    cores = max(1, run.workers or 1)
    page = PlanPage(graph=spec.graph, measured=measured, rate=rate, cores=cores,
                    window_s=span)
    page.current = planopt.evaluate(spec.graph, measured, list(plan.pes), max(rate, 1.0),
                                    max(plan.partitions, spec.partitions), "current", plan)
    for alg in algorithms:
        best = planopt.max_sustainable(spec.graph, measured, plan, spec.partitions, cores,
                                       alg)
        # Shown at the run's rate (loads), with the rate it is modelled to sustain.
        page.proposals[alg] = planopt.evaluate(spec.graph, measured, list(best.pes),
                                               max(rate, 1.0), best.partitions, alg, plan)
    if draw:
        _draw(page, plan)
    return page


def _dt(epoch: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def _draw(page: PlanPage, plan: dataflow.PePlan) -> None:
    """The DAG with the measured cost on each Python operator and rate on each edge,
    and each operator's PE (colour) in the current plan."""
    assert page.graph is not None and page.measured is not None
    page.picture = dataflow.graph_picture(page.graph)
    m = page.measured
    for k, pe in enumerate(plan.pes):
        for op in pe:
            page.node_facts[op] = {
                "pe": k + 1, "colour": PE_COLOURS[k % len(PE_COLOURS)],
                "cpu_us": m.cpu_per_record[op] * 1e6,
                "load": m.cpu_per_record[op] * page.rate}
    for (a, b), rows in m.rows_per_record.items():
        pa = next(n for n in page.picture.nodes if n.id == a)
        pb = next(n for n in page.picture.nodes if n.id == b)
        page.edge_facts.append({
            "from": a, "to": b, "rows_s": rows * page.rate,
            "bytes": m.bytes_per_record[(a, b)] / rows if rows else 0.0,
            "x": (pa.x + dataflow.NODE_W + pb.x) // 2, "y": pa.y + dataflow.NODE_H // 2 - 6,
            "cut": plan.pe_of(a) != plan.pe_of(b)})
