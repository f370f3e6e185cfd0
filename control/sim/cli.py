"""``python -m control simulate | reproduce-thesis | bench-sim``.

``simulate`` reads a JSON scenario (file, or stdin for ``-``/nothing) and prints the
per-step series and the summary of every strategy (a fleet scenario, with ``runs``:
every arbiter, ``control/sim/fleet.py``); bad input prints one line
``error: …`` on stderr and exits 2. Schema: ``control/sim/README.md``.
"""
from __future__ import annotations

import argparse
import json
import sys

from control import sim
from control.jsonio import InputError, read_json


def cmd_simulate(args: argparse.Namespace) -> int:
    from control.sim import fleet as fleetsim

    try:
        doc = read_json(args.file)
        out = fleetsim.simulate_fleet(doc) if fleetsim.is_fleet(doc) else sim.simulate(doc)
    except (InputError, sim.ScenarioError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.summary_only:
        for res in out["results"]:
            for part in res.get("runs", [res]):
                part.pop("series")
    print(json.dumps(out, allow_nan=False))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from control.sim import thesis

    return thesis.main(seeds=args.seeds, steps=args.steps)


def cmd_bench(args: argparse.Namespace) -> int:
    from control.sim import thesis

    thesis.bench(steps=args.steps)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("simulate", help="run strategies on a simulated elastic operator")
    s.add_argument("file", nargs="?")
    s.add_argument("--summary-only", action="store_true", help="leave out per-step series")
    s.set_defaults(simulation=cmd_simulate)
    r = sub.add_parser("reproduce-thesis", help="the thesis' strategy grid and its checks")
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--steps", type=int, default=180)
    r.set_defaults(simulation=cmd_reproduce)
    b = sub.add_parser("bench-sim", help="simulator timing targets")
    b.add_argument("--steps", type=int, default=180)
    b.set_defaults(simulation=cmd_bench)
