"""``python -m pipelines.nexmark``: NEXMark events and reference results as JSON lines.

    python -m pipelines.nexmark events --events N [--rate R] [--start S]
        Beam's event stream (default: Beam's default configuration, 10 ms apart);
        --rate R: one generator at R events/s of event time.
    python -m pipelines.nexmark expected QN --events N [--rate R]
        The final result rows of query QN (Q0..Q8) over the first N events
        (``reference.py``: Beam's semantics, outside Spark).
    python -m pipelines.nexmark bench [--queries Q0,Q5] [--workers 1,2] ...
        Sustainable rate per query on 1 and 2 executors, Streamwise vs plain PySpark
        (``pipelines.runtime.bench.nexmark``; it needs Spark, this package does not).
"""
from __future__ import annotations

import argparse
import json
import sys

from pipelines.nexmark import generator as gen
from pipelines.nexmark import reference


def _whole(minimum: int):  # noqa: ANN202 - an argparse type
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") \
                from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


_positive = _whole(1)
_non_negative = _whole(0)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m pipelines.nexmark",
                                  description="NEXMark events and reference results "
                                  "(JSON lines; Beam's field names, times in epoch ms)")
    verbs = top.add_subparsers(dest="verb", required=True)
    verbs.add_parser("bench", help="sustainable rates, Streamwise vs plain PySpark "
                     "(python -m pipelines.nexmark bench --help)")
    events = verbs.add_parser("events", help="print the event stream")
    events.add_argument("--events", type=_positive, required=True, metavar="N")
    events.add_argument("--rate", type=_positive, metavar="R",
                        help="events per second of event time (default: Beam's default)")
    events.add_argument("--start", type=_non_negative, default=0, metavar="S",
                        help="first event number (default 0)")
    expected = verbs.add_parser("expected", help="print a query's final result rows")
    expected.add_argument("query", type=str.upper, choices=list(reference.QUERIES),
                          metavar="QN", help=f"one of {', '.join(reference.QUERIES)}")
    expected.add_argument("--events", type=_positive, required=True, metavar="N")
    expected.add_argument("--rate", type=_positive, metavar="R",
                          help="events per second of event time (default: Beam's default)")
    return top


def config_for(rate: int | None) -> gen.NexmarkConfig:
    return gen.BEAM_DEFAULT if rate is None else gen.NexmarkConfig.at_rate(rate)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        # The bench runs Spark through the runtime, which imports this package: it is
        # run as its own module rather than imported (the layers stay acyclic).
        import os

        os.execv(sys.executable, [sys.executable, "-m", "pipelines.runtime.bench.nexmark",
                                  *argv[1:]])
    args = parser().parse_args(argv)
    out = sys.stdout
    if args.verb == "events":
        config = config_for(args.rate)
        for count in range(args.start, args.start + args.events):
            out.write(json.dumps(gen.event(count, config)) + "\n")
    elif args.verb == "expected":
        events = gen.events(args.events, config_for(args.rate))
        for row in reference.expected(args.query, events):
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into head
        sys.exit(0)
