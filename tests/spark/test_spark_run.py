"""Real Spark runs on the embedded standalone cluster, driven through Celery."""
from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import make_pipeline_and_policy, run_status, stop_and_wait, wait_for

pytestmark = pytest.mark.spark


@pytest.mark.django_db(transaction=True)
def test_run_metrics_reach_the_db_and_workers_change(live_stack, operator) -> None:
    from pipelines import actions
    from pipelines.models import MetricSample, Run

    pipeline, policy = make_pipeline_and_policy(operator, "spark-e2e", max_workers=2)
    run = actions.create_run(pipeline, policy, operator)
    try:
        wait_for(lambda: run_status(run.pk) == "running", 150, "the run to be running")
        wait_for(lambda: MetricSample.objects.filter(run=run).count() >= 3, 120,
                 "3 metric samples in the DB")
        run.refresh_from_db()
        assert run.spark_app_id.startswith("app-") and run.workers == 1
        samples = list(MetricSample.objects.filter(run=run).order_by("batch_id"))
        for s in samples:  # the first batch too: a resumed stale checkpoint shows here
            assert s.records > 0 and s.input_rows >= s.records
            assert 0 < s.latency_p50_ms <= s.latency_p95_ms <= s.latency_p99_ms \
                <= s.latency_max_ms
            assert s.power_w > 0 and s.workers == 1

        actions.request_workers(run, 2, operator)
        outcomes = ["reconfigured", "reconfigure_failed", "reconfigure_timeout"]
        wait_for(lambda: run.events.filter(kind__in=outcomes).exists(),
                 170, "the runner's acknowledgement of set_workers")
        ack = run.events.get(kind__in=outcomes)
        assert ack.kind == "reconfigured", ack.message
        assert ack.payload["workers"] == 2 and Run.objects.get(pk=run.pk).workers == 2
        # Key groups moved onto the new executor before the command was acknowledged,
        # each step verified from the executor that ran it.
        migration = ack.payload["migration"]
        assert migration["verified"] and migration["groups_moved"] >= 1
        # The runner's own event comes through the relay, independently of the ack.
        wait_for(lambda: run.events.filter(kind="runner:migration_done").exists(), 30,
                 "the relayed runner:migration_done event")
        wait_for(lambda: MetricSample.objects.filter(run=run, workers=2).exists(), 90,
                 "a micro-batch measured with 2 workers")
        two = MetricSample.objects.filter(run=run, workers=2).latest("batch_id")
        assert len(set(two.groups["placement"])) == 2 and two.drift == 0

        # A rebalance request goes through the same path and is audited.
        actions.request_rebalance(run, "ding-table", "fluid", 0.5, operator)
        wait_for(lambda: run.events.filter(kind__in=outcomes).count() >= 2, 170,
                 "the runner's acknowledgement of rebalance")
        second = run.events.filter(kind__in=outcomes).order_by("-id").first()
        assert second.kind == "reconfigured", second.message
    finally:
        stop_and_wait(run.pk, operator)
    run.refresh_from_db()
    assert run.status == "stopped", run.status_reason
    wait_for(lambda: runner_done(run.runner_pid), 30,
             "the runner to exit (or, adopted from a standby, to offer it again)")


def runner_done(pid: int) -> bool:
    """The run's runner process has ended, or it was a standby that serves further runs
    (the live stack's, STANDBY_RUNS) and is offered again: no run of its left."""
    from django.conf import settings

    from pipelines.launch import process_state
    from pipelines.runtime import bus as busmod
    from pipelines.runtime.runner import standby as sb

    if process_state(pid) != "alive":
        return True
    r = busmod.connect(settings.REDIS_URL)
    return any(sb.Offer.from_json(raw).pid == pid for raw in r.lrange(sb.READY_KEY, 0, -1))


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
