"""``python -m control plan-migration | schedule-migration | plan-fusion | bench-planning``.

JSON in (a file, or stdin for ``-`` / nothing), JSON out on stdout; bad input prints
one line ``error: …`` on stderr and exits 2. An infeasible problem is not bad input: the
answer has ``"feasible": false`` and a ``reason`` (exit 0). Schemas: README.md here.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from control.jsonio import InputError, read_json
from control.planning import PlanningError
from control.planning import fusion as fu
from control.planning import migration as mig
from control.planning import schedule as sch


def _numbers(doc: dict, key: str, whole: bool = False) -> list:
    value = doc.get(key)
    if not isinstance(value, list) or not value:
        raise PlanningError(f"{key}: need a non-empty list of numbers")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int | float) or (whole and not isinstance(v, int)):
            raise PlanningError(f"{key}[{i}]: must be a {'whole number' if whole else 'number'}")
    return value


def migration_problem(doc: Any) -> mig.MigrationProblem:
    if not isinstance(doc, dict):
        raise PlanningError("input must be a JSON object")
    loads = _numbers(doc, "loads")
    sizes = _numbers(doc, "state_sizes")
    current = _numbers(doc, "current", whole=True)
    n2 = doc.get("target_workers")
    if isinstance(n2, bool) or not isinstance(n2, int):
        raise PlanningError("target_workers: must be a whole number >= 1")
    tau = doc.get("tau", 0.2)
    if isinstance(tau, bool) or not isinstance(tau, int | float):
        raise PlanningError("tau: must be a number >= 0")
    nonempty = doc.get("nonempty", False)
    if not isinstance(nonempty, bool):
        raise PlanningError("nonempty: must be true or false")
    return mig.MigrationProblem(tuple(float(x) for x in loads), tuple(float(x) for x in sizes),
                                tuple(current), n2, float(tau), nonempty)


def _mtm(doc: dict) -> dict[int, dict[int, float]]:
    raw = doc.get("mtm")
    if not isinstance(raw, dict) or not raw:
        raise PlanningError('mtm: the mtm planner needs {"mtm": {"n": {"n2": probability}}}')
    out: dict[int, dict[int, float]] = {}
    try:
        for a, row in raw.items():
            if not isinstance(row, dict):
                raise PlanningError(f"mtm[{a}]: must be an object of probabilities")
            out[int(a)] = {int(b): float(p) for b, p in row.items()}
    except (TypeError, ValueError) as exc:
        raise PlanningError("mtm: keys must be worker counts, values probabilities") from exc
    return out


def cmd_plan_migration(args: argparse.Namespace) -> dict:
    doc = read_json(args.file)
    problem = migration_problem(doc)
    if args.planner == "mtm":
        gamma = doc.get("gamma", 0.8)
        if isinstance(gamma, bool) or not isinstance(gamma, int | float):
            raise PlanningError("gamma: must be a number in [0, 1)")
        result = mig.plan_mtm(problem, _mtm(doc), gamma=float(gamma))
    else:
        result = mig.plan(problem, args.planner)
    return result.as_dict()


def cmd_schedule(args: argparse.Namespace) -> dict:
    doc = read_json(args.file)
    if not isinstance(doc, dict):
        raise PlanningError("input must be a JSON object")
    current = _numbers(doc, "current", whole=True)
    target = _numbers(doc, "target", whole=True)
    sizes = _numbers(doc, "state_sizes") if "state_sizes" in doc else None
    cap = doc.get("max_bytes_per_step")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float)):
        raise PlanningError("max_bytes_per_step: must be a number > 0")
    return sch.schedule(current, target, args.strategy, sizes, cap).as_dict()


def cmd_plan_fusion(args: argparse.Namespace) -> dict:
    problem = fu.parse_problem(read_json(args.file))
    return fu.plan_fusion(problem, args.algorithm).as_dict(problem)


def cmd_bench(args: argparse.Namespace) -> None:
    from control.planning import bench

    bench.main(quick=args.quick)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan-migration", help="which key groups move where (Ding et al.)")
    p.add_argument("file", nargs="?")
    p.add_argument("--planner", choices=mig.PLANNERS, default="ding")
    p.set_defaults(planning=cmd_plan_migration)
    s = sub.add_parser("schedule-migration", help="pace the moves (Megaphone)")
    s.add_argument("file", nargs="?")
    s.add_argument("--strategy", choices=sch.STRATEGIES, default="batched")
    s.set_defaults(planning=cmd_schedule)
    f = sub.add_parser("plan-fusion", help="fuse operators into PEs and place them (COLA)")
    f.add_argument("file", nargs="?")
    f.add_argument("--algorithm", choices=fu.ALGORITHMS, default="cola")
    f.set_defaults(planning=cmd_plan_fusion)
    b = sub.add_parser("bench-planning", help="planner tables (migration cost, fusion)")
    b.add_argument("--quick", action="store_true", help="fewer steps and graphs")
    b.set_defaults(planning=cmd_bench)


def run(args: argparse.Namespace) -> int:
    try:
        out = args.planning(args)
    except (InputError, PlanningError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if out is not None:
        print(json.dumps(out, indent=1, allow_nan=False))
        if isinstance(out, dict) and out.get("feasible") is False:
            print(f"infeasible: {out.get('reason', '')}", file=sys.stderr)
    return 0
