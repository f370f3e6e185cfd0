"""Restart from checkpoint (issue 46): a failed or lost run's runner starts again on its
own checkpoint and clock; the page offers it only then, the action refuses with the
reason where it cannot, and the start task hands the runner the run's clock."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import make_pipeline_and_policy


@pytest.mark.django_db
def test_a_failed_run_restarts_from_its_checkpoint_and_clock(
        local_operator, tmp_path, monkeypatch, django_capture_on_commit_callbacks) -> None:
    from pipelines import actions, launch, tasks
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(local_operator, name="web-restart")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="failed", created_by=local_operator,
                             status_reason="a Python operator raised ValueError: x")
    run_dir = tmp_path / f"run-{run.bus_key}"
    Run.objects.filter(pk=run.pk).update(checkpoint_dir=str(run_dir))
    monkeypatch.setattr(tasks.settings, "CHECKPOINT_ROOT", str(tmp_path))
    client = Client()
    client.force_login(local_operator)
    assert 'id="restart-run"' in client.get(f"/runs/{run.pk}/").content.decode()
    # No checkpoint (it failed before its query started): refused, saying why.
    response = client.post(f"/runs/{run.pk}/restart/", follow=True)
    assert "cannot restart: it has no checkpoint" in response.content.decode()
    assert Run.objects.get(pk=run.pk).status == "failed"
    (run_dir / "checkpoint" / "offsets").mkdir(parents=True)
    (run_dir / "t0").write_text(json.dumps({"t0": 1796000000.25}))
    started: list[int] = []
    monkeypatch.setattr(actions, "enqueue", lambda _task, run_id, _actor: started.append(run_id))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.pk}/restart/", follow=True)
    assert "restarts from its checkpoint" in response.content.decode()
    run.refresh_from_db()
    assert run.status == "pending" and run.ended_at is None and started == [run.pk]
    kinds = list(run.events.order_by("pk").values_list("kind", flat=True))
    assert kinds[-2:] == ["status:pending", "restart_requested"]
    assert 'id="restart-run"' not in client.get(f"/runs/{run.pk}/").content.decode()
    # The start task gives the runner the run's own clock (its records' schedule).
    configs: list[dict] = []
    monkeypatch.setattr(launch, "master_url", lambda: "spark://127.0.0.1:7077")
    monkeypatch.setattr(launch, "claim_standby", lambda _config, _dir: None)
    monkeypatch.setattr(launch, "launch_runner",
                        lambda config, _dir: configs.append(config) or 4242)
    outcome = tasks.start_run(run.pk, "test")
    assert configs and configs[0]["t0"] == 1796000000.25, outcome
    assert Path(configs[0]["checkpoint_dir"]) == run_dir
    # A run that is not failed or lost is not restarted.
    ok, why = actions.restart_run(Run.objects.get(pk=run.pk), local_operator)
    assert not ok and "only a failed or lost run" in why
