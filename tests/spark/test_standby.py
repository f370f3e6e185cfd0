"""Warm standby runners (pipelines.runtime.runner.standby): a run adopts a standby's Spark
application and starts from it; what a standby cannot serve starts cold."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_pipeline_and_policy, run_status, stop_and_wait, wait_for


def _offer(**changes):
    from pipelines.runtime.runner.standby import Offer

    doc = {"standby_id": "s1", "pid": 1, "master_url": "spark://127.0.0.1:7077",
           "max_workers": 4, "executor_memory": "512m", "app_id": "app-1", "ready_at": 0.0}
    return Offer(**{**doc, **changes})


@pytest.mark.dbless
def test_a_standby_fits_only_runs_its_application_can_serve() -> None:
    from pipelines.runtime.runner.standby import Offer, fits

    offer = _offer()
    run = {"master_url": "spark://127.0.0.1:7077", "max_workers": 2,
           "executor_memory": "512m"}
    assert fits(offer, run) is None
    assert fits(offer, {**run, "max_workers": 4}) is None
    assert "5 workers" in fits(offer, {**run, "max_workers": 5})
    assert "executor memory 1g" in fits(offer, {**run, "executor_memory": "1g"})
    assert "locality" in fits(offer, {**run, "locality_wait": "0s"})
    assert "spark://other:7077" in fits(_offer(master_url="spark://other:7077"), run)
    assert Offer.from_json(offer.to_json()) == offer


@pytest.mark.spark
@pytest.mark.single_pass
@pytest.mark.django_db(transaction=True)
def test_a_run_adopts_a_warm_standby_scales_from_it_and_hands_it_to_the_next_run(
        live_stack, operator, spark_cluster) -> None:
    """The live stack keeps one standby that serves run after run (``STANDBY_RUNS`` in
    its environment, as an operator would set it): the reconciler started it, a run
    adopts it and scales from it, and after that run's clean stop the same process and
    application, reset to one executor, serve the next run."""
    from django.conf import settings

    from pipelines import actions, launch
    from pipelines.launch import process_state
    from pipelines.models import MetricSample, Run
    from pipelines.runtime import bus as busmod
    from pipelines.runtime.runner import standby as sb

    assert live_stack.env["STANDBY_RUNS"] != "1" and live_stack.env["STANDBY_RUNNERS"] == "1"
    r = busmod.connect(settings.REDIS_URL)

    def offered() -> sb.Offer | None:
        raw = r.lindex(sb.READY_KEY, 0)
        return sb.Offer.from_json(raw) if raw else None

    # Warming beside earlier tests, or serving none while an earlier test's run ended.
    offer = wait_for(offered, 300, "the live stack's standby to offer itself")
    assert process_state(offer.pid) == "alive"
    pipeline, policy = make_pipeline_and_policy(operator, "standby-run", max_workers=2)
    runs = []
    try:
        run = actions.create_run(pipeline, policy, operator)
        runs.append(run)
        wait_for(lambda: run_status(run.pk) == "running", 120, "the run to be running")
        wait_for(lambda: MetricSample.objects.filter(run=run).count() >= 3, 120,
                 "3 metric samples in the DB")
        run.refresh_from_db()
        launched = run.events.get(kind="runner_launched")
        assert launched.payload["standby"] == offer.standby_id, launched.message
        assert run.runner_pid == offer.pid and run.spark_app_id == offer.app_id
        assert offered() is None  # claimed: offered to nobody else
        # Serving a run it will outlive: counted, so the reconciler starts no other.
        assert r.exists(sb.serving_key(offer.standby_id))
        assert launch.standby_ids(r, "serving") == {offer.standby_id}
        for s in MetricSample.objects.filter(run=run):
            assert s.records > 0 and s.workers == 1
        log = (Path(run.checkpoint_dir) / "runner.log").read_text()
        assert f"adopted standby {offer.standby_id}" in log

        # The adopted application scales like a cold one (its target was one executor).
        actions.request_workers(run, 2, operator)
        outcomes = ["reconfigured", "reconfigure_failed", "reconfigure_timeout"]
        wait_for(lambda: run.events.filter(kind__in=outcomes).exists(), 170,
                 "the runner's acknowledgement of set_workers")
        ack = run.events.get(kind__in=outcomes)
        assert ack.kind == "reconfigured", ack.message
        assert ack.payload["workers"] == 2 and Run.objects.get(pk=run.pk).workers == 2
        stop_and_wait(run.pk, operator)
        run.refresh_from_db()
        assert run.status == "stopped", run.status_reason

        # The same process and application offer themselves again, back to one
        # executor, and the next run starts on them with one worker.
        again = wait_for(offered, 120, "the standby's offer after the run")
        assert (again.standby_id, again.pid, again.app_id) == (
            offer.standby_id, offer.pid, offer.app_id)
        assert process_state(offer.pid) == "alive"
        second = actions.create_run(pipeline, policy, operator)
        runs.append(second)
        wait_for(lambda: MetricSample.objects.filter(run=second).count() >= 2, 120,
                 "2 metric samples of the second run")
        second.refresh_from_db()
        assert second.events.get(kind="runner_launched").payload["standby"] == offer.standby_id
        assert (second.runner_pid, second.spark_app_id) == (offer.pid, offer.app_id)
        assert all(s.workers == 1 for s in MetricSample.objects.filter(run=second))
    finally:
        for run in runs:
            stop_and_wait(run.pk, operator)
