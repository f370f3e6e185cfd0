"""The exactly-once check in the product: a Verify action per run (a job on the Lab
queue, with progress), automatically on stop, the verdict on the run page's badge and in
the run's log. The run directories are the verifier's own fakes (tests/unit/test_elastic_units):
correct, then with one row lost."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
from django.test import Client

from pipelines.runtime.query.compiler import output_path
from tests.conftest import make_pipeline_and_policy, wait_for
from tests.unit.test_elastic_units import COUNT_DOC, _fake_run

KEPT = {**COUNT_DOC, "sink": {"type": "latency", "keep_output": True}}


def _stopped_run(user, run_dir: Path | None, doc: dict = KEPT, status: str = "stopped"):
    from pipelines.models import Pipeline, Run

    pipeline, policy = make_pipeline_and_policy(user, name=f"v{Pipeline.objects.count()}")
    version = pipeline.current_version
    version.definition = doc
    version.save()
    return Run.objects.create(pipeline_version=version, policy=policy, created_by=user,
                              status=status, checkpoint_dir=str(run_dir or ""))


def _run_dir(tmp_path: Path) -> Path:
    run_dir = _fake_run(tmp_path, KEPT, [300, 700, 1200])
    (run_dir / "runner.json").write_text(json.dumps({"definition": KEPT}))
    (run_dir / "t0").write_text(json.dumps({"t0": 1.0e9}))
    return run_dir


@pytest.mark.django_db
def test_a_verification_checks_the_kept_output_and_reports_the_first_difference(
        local_operator, tmp_path: Path) -> None:
    from pipelines import tasks

    run_dir = _run_dir(tmp_path)
    run = _stopped_run(local_operator, run_dir)
    line = tasks.verify_run(run.pk, "user:operator")
    run.refresh_from_db()
    assert run.verification["state"] == "done" and run.verification["ok"] is True
    assert (run.verification["done"], run.verification["of"]) == (3, 3)
    assert run.verification_badge == ("OK · 3 batches", "v-ok")
    assert line.startswith("OK - 3 batches, 1200 records")
    event = run.events.get(kind="verified")
    assert event.payload["ok"] and event.payload["requested_by"] == "user:operator"
    # One row of batch 1 lost: FAILED, and the first difference says which.
    path = output_path(run_dir / "output", 1)
    pd.read_parquet(path).iloc[1:].to_parquet(path)
    tasks.verify_run(run.pk, "user:operator")
    run.refresh_from_db()
    assert run.verification["ok"] is False and run.verification_badge[0] == "FAILED"
    assert "lost 1" in run.verification["line"] and "batch 1" in run.verification["line"]
    page = Client()
    page.force_login(local_operator)
    html = page.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-verification"' in html and "FAILED" in html and "lost 1" in html
    assert "FAILED" in page.get("/runs/").content.decode()


@pytest.mark.django_db
def test_a_run_is_verified_only_once_ended_and_only_with_kept_output(
        local_operator, tmp_path: Path) -> None:
    from pipelines import actions, tasks

    running = _stopped_run(local_operator, tmp_path, status="running")
    queued, why = actions.request_verification(running, "user:operator")
    assert not queued and "once it has ended" in why
    no_output = _stopped_run(local_operator, tmp_path, doc={**KEPT, "sink": {
        "type": "latency", "keep_output": False}})
    queued, why = actions.request_verification(no_output, "user:operator")
    assert not queued and "kept no output" in why
    assert no_output.events.get(kind="verify_requested").message.startswith("not verified")
    unreadable = _stopped_run(local_operator, tmp_path / "nothing-here")
    assert tasks.verify_run(unreadable.pk).startswith("error: cannot read the run")
    unreadable.refresh_from_db()
    assert unreadable.verification_badge == ("not checkable", "v-none")
    # Stopping a run that keeps output queues its check.
    stopping = _stopped_run(local_operator, tmp_path, status="stopping")
    assert actions.transition(stopping, "stopped", "runner", "stopped")
    stopping.refresh_from_db()
    assert stopping.verification["state"] == "queued"
    assert "on stop" in stopping.events.get(kind="verify_requested").message
    # One check at a time (a second would overwrite the first's verdict), unless the
    # first has been silent for longer than a check may take.
    again, why = actions.request_verification(stopping, "user:operator")
    assert not again and "already queued" in why
    from pipelines.models import Run

    Run.objects.filter(pk=stopping.pk).update(verification={
        **stopping.verification, "at": time.time() - actions.VERIFY_STALE_S - 1})
    stopping.refresh_from_db()
    assert actions.request_verification(stopping, "user:operator")[0]


@pytest.mark.django_db(transaction=True)
def test_the_verify_button_runs_the_check_on_the_lab_worker(live_stack, operator,
                                                            tmp_path: Path) -> None:
    from pipelines.models import Run

    run = _stopped_run(operator, _run_dir(tmp_path))
    client = Client()
    client.force_login(operator)
    response = client.post(f"/runs/{run.pk}/verify/")
    assert response.status_code == 302
    wait_for(lambda: (Run.objects.get(pk=run.pk).verification or {}).get("state") == "done",
             120, "the Lab worker to verify the run")
    run.refresh_from_db()
    assert run.verification["ok"] is True
    assert run.events.filter(kind="verified", actor="celery").exists()
