"""``manage.py runs start --pipeline P --policy Q [--wait STATUS] [--user NAME]`` and
``manage.py runs stop ID [--wait]``: a run started and stopped from the command line,
through the Runs page's own form and actions (the same checks, the same audit)."""
from __future__ import annotations

import os
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

WAIT_POLL_S = 0.5


def run_url(run_id: int) -> str:
    base = os.environ.get("STREAMWISE_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
    return f"{base}/runs/{run_id}/"


class Command(BaseCommand):
    help = "Start or stop a run (printing its id and URL)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser("start", help="start a run of a pipeline under a policy")
        start.add_argument("--pipeline", required=True, help="the pipeline's name")
        start.add_argument("--policy", required=True, help="the policy's name")
        start.add_argument("--wait", metavar="STATUS", default="",
                           help="return once the run is STATUS (e.g. running) or has ended")
        start.add_argument("--timeout", type=float, default=300.0)
        start.add_argument("--user", default="admin")
        stop = sub.add_parser("stop", help="stop a run")
        stop.add_argument("run_id", type=int)
        stop.add_argument("--wait", action="store_true", help="return once it has ended")
        stop.add_argument("--timeout", type=float, default=300.0)
        stop.add_argument("--user", default="admin")

    def handle(self, *args: Any, **opts: Any) -> None:
        user = get_user_model().objects.filter(username=opts["user"]).first()
        if user is None:
            raise CommandError(f"--user: no user {opts['user']!r}")
        if opts["action"] == "start":
            self._start(user, opts)
        else:
            self._stop(user, opts)

    def _start(self, user: Any, opts: dict[str, Any]) -> None:
        from control.models import Policy
        from pipelines import actions
        from pipelines.forms import StartRunForm
        from pipelines.models import Pipeline, RunStatus

        if opts["wait"] and opts["wait"] not in RunStatus.values:
            raise CommandError(f"--wait: one of {', '.join(RunStatus.values)}")
        pipeline = Pipeline.objects.filter(name=opts["pipeline"]).first()
        policy = Policy.objects.filter(name=opts["policy"]).first()
        if pipeline is None or policy is None:
            raise CommandError(f"no {'pipeline' if pipeline is None else 'policy'} named "
                               f"{opts['pipeline'] if pipeline is None else opts['policy']!r}")
        if not user.has_perm("pipelines.add_run"):
            raise CommandError(f"{user.username} may not start runs")
        form = StartRunForm({"pipeline": pipeline.pk, "policy": policy.pk})
        if not form.is_valid():
            raise CommandError("; ".join(m for ms in form.errors.values() for m in ms))
        with transaction.atomic():
            run = actions.create_run(pipeline, policy, user)
        self.stdout.write(f"run {run.pk} created: {run_url(run.pk)}")
        if opts["wait"]:
            self._wait(run.pk, opts["wait"], opts["timeout"])

    def _stop(self, user: Any, opts: dict[str, Any]) -> None:
        from pipelines import actions
        from pipelines.models import Run

        run = Run.objects.filter(pk=opts["run_id"]).first()
        if run is None:
            raise CommandError(f"no run {opts['run_id']}")
        if not user.has_perm("pipelines.change_run"):
            raise CommandError(f"{user.username} may not stop runs")
        if run.is_terminal:
            self.stdout.write(f"run {run.pk} has ended already ({run.status})")
            return
        with transaction.atomic():
            actions.request_stop(run, user)
        self.stdout.write(f"run {run.pk} stopping: {run_url(run.pk)}")
        if opts["wait"]:
            self._wait(run.pk, "", opts["timeout"])

    def _wait(self, run_id: int, status: str, timeout: float) -> None:
        from pipelines.models import Run

        deadline = time.monotonic() + timeout
        while True:
            run = Run.objects.get(pk=run_id)
            if (status and run.status == status) or run.is_terminal:
                self.stdout.write(f"run {run_id} is {run.status}"
                                  + (f": {run.status_reason}" if run.status_reason else ""))
                if status and run.status != status:
                    raise CommandError(f"run {run_id} ended {run.status} before {status}")
                return
            if time.monotonic() > deadline:
                raise CommandError(f"run {run_id} is still {run.status} after {timeout:.0f} s")
            time.sleep(WAIT_POLL_S)
