"""Benchmark: three runs of different priorities on an over-committed cluster
(``pipelines/management/shares.py``), on the product as ``up`` starts it.

Prints, per run: its priority, the cores it asked for and was granted over time (its
decisions, and the arbiter's on its behalf), its batches over the latency bound and the
verifier's verdict; and the high-priority run's ask -> grant in control steps and
seconds, and when it first carried a batch on its second worker. ``--repeat`` runs the
scenario again after the first (the medians)."""
from __future__ import annotations

import os
import statistics
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pipelines.management import shares
from pipelines.management.benchkit import bench_operator, start_product


class Command(BaseCommand):
    help = "Three runs share an over-committed cluster: the arbiter's grants and preemptions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--repeat", type=int, default=1)
        parser.add_argument("--timeout", type=float, default=420.0,
                            help="seconds to wait for the high run's second worker")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["repeat"] <= 10:
            raise CommandError("--repeat must be in 1..10")
        user = bench_operator()
        # The example plug-in vetoes every scale-down of the low run (shares.py): the
        # product's processes inherit the setting.
        os.environ["QUIET_HOUR_END_MINUTES"] = "60"
        product = start_product(self.stdout)
        carried, steps, failures = [], [], 0
        try:
            for i in range(options["repeat"]):
                self.stdout.write(f"--- scenario {i + 1} of {options['repeat']}")
                outcome = shares.run_scenario(user, options["timeout"], say=self.stdout.write)
                for row in shares.report(outcome):
                    self.stdout.write(
                        f"{row['run']} (run {row['id']}, priority {row['priority']}): "
                        f"held {row['workers_held']} workers over {row['batches']} batches, "
                        f"{row['violations']} over the bound; verifier: {row['verifier']}")
                    for line in row["timeline"]:
                        self.stdout.write(f"    {line}")
                    failures += not row["verified"]
                if outcome.asked_step is not None and outcome.granted_step is not None:
                    steps.append(outcome.granted_step - outcome.asked_step)
                if outcome.carried_at is not None:
                    carried.append(outcome.carried_at)
        finally:
            product.stop()
        self.stdout.write(
            f"high run: ask -> grant {steps} control steps; second worker carrying at "
            f"{[round(c) for c in carried]} s after the start"
            + (f" (median {statistics.median(carried):.0f} s)" if carried else ""))
        if failures or len(carried) < options["repeat"]:
            raise CommandError(f"{failures} run(s) failed the verifier; "
                               f"{options['repeat'] - len(carried)} scenario(s) without the "
                               "second worker")
