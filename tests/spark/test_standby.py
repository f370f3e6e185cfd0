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
def test_a_run_adopts_a_warm_standby_and_scales_from_it(live_stack, operator,
                                                        spark_cluster) -> None:
    from django.conf import settings

    from pipelines import actions, launch
    from pipelines.launch import process_state
    from pipelines.models import MetricSample, Run
    from pipelines.runtime import bus as busmod
    from pipelines.runtime.runner import standby as sb

    r = busmod.connect(settings.REDIS_URL)
    r.delete(sb.READY_KEY)
    standby_id, pid = launch.launch_standby(spark_cluster.master_url)
    run = None
    try:
        wait_for(lambda: r.llen(sb.READY_KEY) >= 1 or process_state(pid) != "alive", 300,
                 "the standby's offer")
        assert process_state(pid) == "alive", launch.tail(
            Path(settings.STANDBY_ROOT) / standby_id / "standby.log", 20)
        offer = sb.Offer.from_json(r.lindex(sb.READY_KEY, 0))
        assert (offer.standby_id, offer.pid) == (standby_id, pid)

        pipeline, policy = make_pipeline_and_policy(operator, "standby-run", max_workers=2)
        run = actions.create_run(pipeline, policy, operator)
        wait_for(lambda: run_status(run.pk) == "running", 120, "the run to be running")
        wait_for(lambda: MetricSample.objects.filter(run=run).count() >= 3, 120,
                 "3 metric samples in the DB")
        run.refresh_from_db()
        launched = run.events.get(kind="runner_launched")
        assert launched.payload["standby"] == standby_id, launched.message
        assert run.runner_pid == pid and run.spark_app_id == offer.app_id
        assert r.llen(sb.READY_KEY) == 0  # claimed: offered to nobody else
        for s in MetricSample.objects.filter(run=run):
            assert s.records > 0 and s.workers == 1
        log = (Path(run.checkpoint_dir) / "runner.log").read_text()
        assert f"adopted standby {standby_id}" in log

        # The adopted application scales like a cold one (its target was one executor).
        actions.request_workers(run, 2, operator)
        outcomes = ["reconfigured", "reconfigure_failed", "reconfigure_timeout"]
        wait_for(lambda: run.events.filter(kind__in=outcomes).exists(), 170,
                 "the runner's acknowledgement of set_workers")
        ack = run.events.get(kind__in=outcomes)
        assert ack.kind == "reconfigured", ack.message
        assert ack.payload["workers"] == 2 and Run.objects.get(pk=run.pk).workers == 2
    finally:
        if run is not None:
            stop_and_wait(run.pk, operator)
        launch.stop_standbys()
    run.refresh_from_db()
    assert run.status == "stopped", run.status_reason
    wait_for(lambda: process_state(pid) != "alive", 30, "the runner to exit")
