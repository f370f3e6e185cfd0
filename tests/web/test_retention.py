"""Retention on the real database (both engines): old samples thinned to one per bucket
(the highest p95 kept), old runs' progress events and unapplied decisions pruned, old
runs' output and checkpoints removed, and nothing else touched."""
from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from tests.conftest import make_pipeline_and_policy


def _run(user, **fields):
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name=f"r{timezone.now().timestamp()}")
    return Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                              created_by=user, **fields)


def _decision(run, step: int, outcome: str):
    from control.models import Decision

    return Decision.objects.create(
        run=run, t=0.0, step=step, strategy="mpc", action="hold", outcome=outcome,
        current_workers=1, current_freq_ghz=2.0, chosen_workers=1, chosen_freq_ghz=2.0,
        solve_ms=1.0)


@pytest.mark.django_db
def test_retention_thins_prunes_and_removes_only_what_its_policy_says(
        local_operator, settings, tmp_path: Path) -> None:
    from pipelines import actions, retention
    from pipelines.models import MetricSample, RunEvent

    settings.CHECKPOINT_ROOT = tmp_path / "checkpoints"
    now = datetime(2026, 11, 26, 12, 0, tzinfo=dt_timezone.utc)
    policy = retention.RetentionPolicy(raw_samples_days=7, sample_bucket_s=60,
                                       detail_days=30, files_days=7)
    old_dir = settings.CHECKPOINT_ROOT / "run-old"
    (old_dir / "output").mkdir(parents=True)
    (old_dir / "output" / "batch-000000001.parquet").write_bytes(b"x" * 1000)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    old = _run(local_operator, status="stopped", ended_at=now - timedelta(days=40),
               checkpoint_dir=str(old_dir))
    foreign = _run(local_operator, status="stopped", ended_at=now - timedelta(days=40),
                   checkpoint_dir=str(outside))  # not under CHECKPOINT_ROOT: never removed
    live = _run(local_operator, status="running")
    # Old samples: bucket A has p95s 10, 30 (kept), 20; bucket B one sample without a
    # p95 (kept). Recent samples are all kept.
    start = now - timedelta(days=8)
    start = start.replace(second=0)
    for batch, (offset_s, p95) in enumerate([(0, 10.0), (10, 30.0), (20, 20.0), (70, None)]):
        MetricSample.objects.create(run=old, batch_id=batch, latency_p95_ms=p95,
                                    t=start + timedelta(seconds=offset_s))
    for batch in range(3):
        MetricSample.objects.create(run=live, batch_id=batch, latency_p95_ms=1.0,
                                    t=now - timedelta(seconds=batch))
    for run in (old, live):
        actions.record_event(run, "runner:migration_step", "runner", "step 1/2")
        actions.record_event(run, "runner:stopped", "runner", "stopped")
        actions.record_event(run, "stop_requested", "user:u", "")
        _decision(run, 1, "hold")
        _decision(run, 2, "applied")

    planned = retention.prune(now, policy, dry_run=True)
    assert MetricSample.objects.count() == 7 and old_dir.exists()  # a dry run deletes nothing
    done = retention.prune(now, policy)
    assert planned.as_dict() == {**done.as_dict(), "dry_run": True}
    assert (done.samples_deleted, done.events_deleted, done.decisions_deleted,
            done.directories_removed, done.bytes_freed) == (2, 1, 1, 1, 1000)
    kept = sorted(old.samples.values_list("batch_id", flat=True))
    assert kept == [1, 3] and live.samples.count() == 3
    assert sorted(old.events.values_list("kind", flat=True)) == ["runner:stopped",
                                                                 "stop_requested"]
    assert live.events.count() == 3 and foreign.pk and outside.exists()
    assert list(old.decisions.values_list("outcome", flat=True)) == ["applied"]
    assert live.decisions.count() == 2
    assert not old_dir.exists()
    assert RunEvent.objects.filter(run=old).count() == 2
    again = retention.prune(now, policy)
    assert again.samples_deleted == again.events_deleted == again.directories_removed == 0


@pytest.mark.django_db
def test_the_retention_page_is_for_admins(local_operator) -> None:
    from django.contrib.auth import get_user_model

    from django.contrib.auth.models import Group

    from accounts.roles import OPERATOR

    client = Client()
    operator = get_user_model().objects.create_user("ret-operator", password="x")
    operator.groups.add(Group.objects.get(name=OPERATOR))
    client.force_login(operator)
    assert client.get("/retention/").status_code == 403
    assert "/retention/" not in client.get("/runs/").content.decode()
    client.force_login(local_operator)  # a superuser: staff
    page = client.get("/retention/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Metric samples" in body and "for ever" in body and "would delete" in body
