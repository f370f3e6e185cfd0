"""Control library CLI (no Django). JSON in, JSON out; bad input: one line, exit 2.

    python -m control decide [FILE|-] [--solver bnb|dp|exhaustive]
    python -m control bench-mpc [--workers 12] [--freqs 9] [--horizon 1..5] [--instances 20]
    python -m control plan-migration [FILE|-] [--planner ding|mtm|consistent-hash|...]
    python -m control schedule-migration [FILE|-] [--strategy all-at-once|fluid|batched]
    python -m control plan-fusion [FILE|-] [--algorithm cola|none|fuse-all|greedy-merge]
    python -m control bench-planning [--quick]
    python -m control simulate [FILE|-] [--summary-only]
    python -m control reproduce-thesis [--seeds 3] [--steps 180]
    python -m control bench-sim

The ``decide`` input schema is documented in ``control/README.md``.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from typing import Any

from control import forecasting as fc
from control import sysmodel as sm
from control.jsonio import InputError, read_json
from control.planning import cli as planning_cli
from control.sim import cli as sim_cli
from control.strategies import mpc

# Thesis Table 7.1 (N = 12, |F| = 9): B&B states explored.
THESIS_TABLE_7_1 = {1: (108, 1.0), 2: (2_537, 0.2175), 3: (72_055, 0.0572)}
MPC_FIELDS = {"alpha", "beta", "gamma", "latency_bound_s", "qos", "resource", "ca2", "cs2",
              "feedback", "time_unit_s", "utilisation_margin", "f_step"}


def _need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise InputError(f"{where}{key} is required")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(f"{where}{key} has the wrong type")
    return value


def build_problem(doc: Any) -> tuple[mpc.MpcProblem, list[float], str]:
    """The MPC problem of a ``decide`` document (see control/README.md)."""
    if not isinstance(doc, dict):
        raise InputError("the input must be a JSON object")
    name, params = _strategy(doc)
    current = _need(doc, "current", dict, "")
    lo, hi = _need(doc, "workers", list, "")[:2] if len(doc.get("workers", [])) == 2 else (0, 0)
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= 1024):
        raise InputError("workers must be [min, max] whole numbers, 1 <= min <= max")
    freqs = doc.get("freqs_ghz", list(sm.THESIS_FREQUENCIES_GHZ))
    if not isinstance(freqs, list) or not freqs or not all(
            isinstance(f, (int, float)) and f > 0 for f in freqs):
        raise InputError("freqs_ghz must be a non-empty list of positive numbers")
    obs = _need(doc, "observation", dict, "")
    forecast = _forecast(doc, obs)
    try:
        problem = mpc.MpcProblem(
            worker_options=tuple(range(lo, hi + 1)),
            freq_options=mpc.strategy_freqs(name, tuple(sorted(float(f) for f in freqs))),
            current=mpc.Config(int(_need(current, "workers", int, "current.")),
                               float(_need(current, "freq_ghz", (int, float), "current."))),
            rate_forecast=tuple(forecast),
            comp_time_s=float(_need(obs, "comp_time_s", (int, float), "observation.")),
            f_measured=float(obs.get("f_measured", max(freqs))),
            **params)
        problem.validate()
    except (TypeError, ValueError) as exc:
        raise InputError(str(exc)) from exc
    return problem, forecast, name


def _strategy(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The thesis strategy the document names, with its parameters overridden."""
    name = _need(doc, "strategy", str, "")
    if name not in mpc.THESIS_STRATEGIES:
        raise InputError(f"strategy must be one of {sorted(mpc.THESIS_STRATEGIES)}")
    params = dict(mpc.THESIS_STRATEGIES[name])
    overrides = doc.get("params", {})
    if not isinstance(overrides, dict) or set(overrides) - MPC_FIELDS:
        raise InputError(f"params may only set {sorted(MPC_FIELDS)}")
    params.update(overrides)
    return name, params


def _forecast(doc: dict[str, Any], obs: dict[str, Any]) -> list[float]:
    """The rates over the horizon: the document's forecaster fed its rate history."""
    history = _need(obs, "rate_history", list, "observation.")
    if not history or not all(isinstance(x, (int, float)) and x >= 0 for x in history):
        raise InputError("observation.rate_history must be a non-empty list of rates >= 0")
    horizon = doc.get("horizon", 1)
    if not isinstance(horizon, int) or not 1 <= horizon <= 8:
        raise InputError("horizon must be a whole number in 1..8")
    forecaster_doc = doc.get("forecaster", {"kind": "holt"})
    kind = forecaster_doc.get("kind") if isinstance(forecaster_doc, dict) else None
    if kind not in fc.FORECASTERS:
        raise InputError(f"forecaster.kind must be one of {sorted(fc.FORECASTERS)}")
    options = {k: v for k, v in forecaster_doc.items() if k != "kind"}
    try:
        forecaster = fc.FORECASTERS[kind](**options)
    except (TypeError, ValueError) as exc:
        raise InputError(f"forecaster: {exc}") from exc
    for x in history:
        forecaster.observe(float(x))
    return [max(r, 0.0) for r in forecaster.forecast(horizon)]


def cmd_decide(args: argparse.Namespace) -> int:
    try:
        problem, forecast, name = build_problem(read_json(args.file))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    decision = mpc.decide(problem, args.solver)
    print(json.dumps({"strategy": name, "rate_forecast": forecast, **decision.as_dict()},
                     indent=1))
    return 0


def _bench_problem(rng: random.Random, workers: int, freqs: tuple[float, ...],
                   h: int) -> mpc.MpcProblem:
    # Random-walk-like rates (the thesis' 135K-458K tuples/s) and a per-tuple time that
    # the full machine sustains at the peak, as in the thesis' HFT kernel.
    comp = workers / 458_000 * rng.uniform(0.7, 1.0)
    start = rng.uniform(135_000, 458_000)
    rates = tuple(min(max(start * (1 + 0.05 * rng.gauss(0, 1)) ** i, 135_000), 458_000)
                  for i in range(1, h + 1))
    return mpc.MpcProblem(
        worker_options=tuple(range(1, workers + 1)), freq_options=freqs,
        current=mpc.Config(rng.randint(1, workers), rng.choice(freqs)), rate_forecast=rates,
        comp_time_s=comp, f_measured=max(freqs), ca2=rng.uniform(0.5, 1.5),
        cs2=rng.uniform(0.5, 1.5), latency_bound_s=1.5e-3 if rng.random() < 0.5 else 7e-3,
        **mpc.THESIS_STRATEGIES[rng.choice(sorted(mpc.THESIS_STRATEGIES))])


def cmd_bench(args: argparse.Namespace) -> int:
    lo, _, hi = args.horizon.partition("..")
    try:
        horizons = range(int(lo), int(hi or lo) + 1)
        if args.workers < 1 or args.freqs < 1 or min(horizons) < 1 or max(horizons) > 8:
            raise ValueError
    except ValueError:
        print("error: need --workers >= 1, --freqs >= 1, --horizon A..B within 1..8",
              file=sys.stderr)
        return 2
    freqs = tuple(round(1.2 + 0.1 * i, 1) for i in range(args.freqs))
    rng = random.Random(args.seed)
    print(f"bench-mpc: N={args.workers} |F|={args.freqs} ({args.workers * args.freqs} "
          f"configurations), {args.instances} random instances per horizon")
    print(" h |  DP median    p95 | B&B median      p95 | B&B explored (thesis) | agree")
    for h in horizons:
        dp_t, bnb_t, explored, agree, checked = [], [], [], True, 0
        for _ in range(args.instances):
            problem = _bench_problem(rng, args.workers, freqs, h)
            dp = mpc.decide(problem, "dp")
            dp_t.append(dp.solve_time_s * 1e3)
            costs = [dp.cost]
            if h <= args.bnb_max_h:
                bnb = mpc.decide(problem, "bnb")
                bnb_t.append(bnb.solve_time_s * 1e3)
                explored.append(bnb.nodes_explored / bnb.nodes_total)
                costs.append(bnb.cost)
            if (args.workers * args.freqs) ** h <= args.exhaustive_limit:
                costs.append(mpc.decide(problem, "exhaustive").cost)
                checked += 1
            agree &= max(costs) - min(costs) <= 1e-9 * max(1.0, abs(min(costs)))
        thesis = THESIS_TABLE_7_1.get(h)
        ref = f"{thesis[1]:.2%}" if thesis and args.workers == 12 and args.freqs == 9 else "—"
        q = (lambda xs: statistics.quantiles(xs, n=20)[18]) if len(dp_t) >= 2 else max
        bnb_cols = (f"{statistics.median(bnb_t):8.3f} {q(bnb_t):8.3f} ms | "
                    f"{statistics.median(explored):9.4%} ({ref:>7})" if bnb_t else
                    f"{'skipped (h > --bnb-max-h)':>21} | {'—':>9} ({ref:>7})")
        print(f"{h:2d} | {statistics.median(dp_t):7.3f} {q(dp_t):6.3f} ms | {bnb_cols} | "
              f"{'yes' if agree else 'NO'} (exhaustive on {checked})", flush=True)
    print("B&B explored = children whose cumulative cost was evaluated / nodes of the tree; "
          "the thesis' B&B visits children in fixed order, ours cheapest first.")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m control")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decide", help="one MPC decision from a JSON document")
    d.add_argument("file", nargs="?", help="JSON file, or - / nothing for stdin")
    d.add_argument("--solver", choices=sorted(mpc.SOLVERS), default="dp")
    b = sub.add_parser("bench-mpc", help="solve times of B&B and DP on random instances")
    b.add_argument("--workers", type=int, default=12)
    b.add_argument("--freqs", type=int, default=9)
    b.add_argument("--horizon", default="1..5")
    b.add_argument("--instances", type=int, default=20)
    b.add_argument("--seed", type=int, default=2016)
    b.add_argument("--bnb-max-h", type=int, default=3,
                   help="run B&B up to this horizon (Python B&B can take minutes at h=5)")
    b.add_argument("--exhaustive-limit", type=int, default=20_000,
                   help="check against exhaustive search when (N|F|)^h is at most this")
    planning_cli.add_commands(sub)
    sim_cli.add_commands(sub)
    args = ap.parse_args(argv)
    if getattr(args, "planning", None):
        return planning_cli.run(args)
    if getattr(args, "simulation", None):
        return args.simulation(args)
    return cmd_decide(args) if args.command == "decide" else cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
