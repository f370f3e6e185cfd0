"""Real Spark runs on the embedded standalone cluster, driven through Celery."""
from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import make_pipeline_and_policy, run_status, stop_and_wait, wait_for

pytestmark = pytest.mark.spark


@pytest.mark.single_pass
@pytest.mark.django_db(transaction=True)
def test_a_killed_runner_is_marked_lost(live_stack, operator) -> None:
    from pipelines import actions
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(operator, "spark-kill", max_workers=1)
    run = actions.create_run(pipeline, policy, operator)
    try:
        wait_for(lambda: run_status(run.pk) == "running", 150, "the run to be running")
        pid = Run.objects.get(pk=run.pk).runner_pid
        os.kill(pid, signal.SIGKILL)  # a fault we can cause for real
        wait_for(lambda: run_status(run.pk) == "lost", 40, "the reconciler to notice")
    finally:
        stop_and_wait(run.pk, operator)
    run.refresh_from_db()
    assert run.status == "lost"
    # Its process gone on this host: lost at the reconciler's next pass, not when its
    # heartbeat expires.
    assert run.status_reason.startswith("the runner died; runner pid"), run.status_reason


@pytest.mark.single_pass
@pytest.mark.django_db(transaction=True)
def test_a_runner_that_fails_reports_why(live_stack, operator) -> None:
    """A real failure inside the runner (its checkpoint already holds offsets, which
    a new run must never resume) ends the run as failed with the runner's reason."""
    from pathlib import Path

    from django.conf import settings
    from django.db import transaction

    from pipelines import actions

    pipeline, policy = make_pipeline_and_policy(operator, "spark-fail", max_workers=1)
    with transaction.atomic():
        run = actions.create_run(pipeline, policy, operator)
        stale = Path(settings.CHECKPOINT_ROOT) / f"run-{run.bus_key}" / "checkpoint" / "offsets"
        stale.mkdir(parents=True)
    try:
        wait_for(lambda: run_status(run.pk) in ("failed", "lost", "stopped"), 150,
                 "the run to end")
    finally:
        stop_and_wait(run.pk, operator)
    run.refresh_from_db()
    assert run.status == "failed"
    assert "already has offsets" in run.status_reason
    assert run.events.filter(kind="runner:failed", actor="runner").exists()
