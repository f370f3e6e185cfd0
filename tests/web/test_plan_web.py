"""The "Optimise plan" page without Spark: a run's profile (written as its PE workers
write it) on the DAG, the current plan beside COLA's, an audited plan change, refusals
with the reason, and bad input answered in the page."""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.test import Client

from pipelines.runtime.operators import catalogue as pyops
from tests.conftest import make_pipeline_and_policy

COSTS_US = dict(zip(pyops.HFT_STEPS, (2.0, 0.8, 0.7, 4.0, 0.9, 1.2), strict=True))


def _python_run(user, run_dir: Path, rate: float = 2000.0, per_byte_s: float = 8e-9,
                name: str = "plan-web"):
    """A running run of the six-operator pipeline with 20 s of profile and batches
    (``per_byte_s``: the CPU its PEs' crossings cost per byte moved)."""
    from pipelines import actions
    from pipelines.models import MetricSample, Pipeline, Run

    _, policy = make_pipeline_and_policy(user, name=f"{name}-policy", max_workers=2)
    pipeline = actions.save_pipeline(Pipeline(name=name,
                                              definition=pyops.hft_split_definition(rate)),
                                     user)
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             created_by=user, status="running", workers=2, key_groups=8,
                             checkpoint_dir=str(run_dir))
    now = time.time()
    (run_dir / "pe-profile").mkdir(parents=True)
    (run_dir / "pe-plan.json").write_text(json.dumps(
        {"generation": 0, "since": now - 25, "pes": [[s] for s in pyops.HFT_STEPS]}))
    rows = int(rate)  # one batch a second, one profile line per PE a second
    for k, step in enumerate(pyops.HFT_STEPS):
        with open(run_dir / "pe-profile" / f"{step}.{k}.jsonl", "w") as out:
            for i in range(20):
                op_cpu = COSTS_US[step] * 1e-6 * rows
                moved = rows * (64 + 16 * k) * 2
                out.write(json.dumps({
                    "t": now - 20 + i, "pe": step, "pid": k, "tasks": 2 + i % 2,
                    "batches": 2, "cpu_s": op_cpu + 0.004 * (2 + i % 2) + per_byte_s * moved,
                    "rows_in": rows, "bytes_in": moved // 2, "rows_out": rows,
                    "bytes_out": moved // 2,
                    "ops": {step: {"cpu_s": op_cpu, "rows_in": rows, "rows_out": rows,
                                   "bytes_out": moved // 2}}}) + "\n")
    for i in range(21):
        MetricSample.objects.create(run=run, batch_id=i, input_rows=rows, records=rows,
                                    t=datetime.fromtimestamp(now - 20.5 + i, UTC))
    return run


@pytest.mark.django_db
def test_the_plan_page_shows_the_profile_and_colas_proposal_and_applies_it(
        local_operator, tmp_path: Path) -> None:
    from pipelines.models import RunEvent

    run = _python_run(local_operator, tmp_path / "run")
    client = Client()
    client.force_login(local_operator)
    assert 'id="optimise-plan"' in client.get(f"/runs/{run.pk}/").content.decode()
    page = client.get(f"/runs/{run.pk}/plan/").content.decode()
    assert 'id="plan-current"' in page and 'id="plan-cola"' in page
    assert "measured" in page and "modelled" in page
    for step, us in COSTS_US.items():  # the profile on the DAG, per source record
        assert f'data-node="{step}" data-pe="{pyops.HFT_STEPS.index(step) + 1}" ' \
               f'data-cpu-us="{us:.3f}"' in page
    current = json.loads(page.split('id="plan-current" data-pes="')[1].split('"')[0]
                         .replace("&quot;", '"'))
    proposed = json.loads(page.split('id="plan-cola" data-pes="')[1].split('"')[0]
                          .replace("&quot;", '"'))
    assert current == [[s] for s in pyops.HFT_STEPS] and proposed == [list(pyops.HFT_STEPS)]
    assert 'id="apply-plan" disabled' not in page
    # Bad input: an answer in the page, nothing queued.
    for bad, words in (("not json", "not a plan"), (json.dumps({"pes": [["fit"]]}),
                                                    "is in no PE"),
                       (json.dumps({"pes": [["parse", "fit"]]}), "does not read")):
        r = client.post(f"/runs/{run.pk}/plan/", {"plan": bad}, follow=True)
        assert words in r.content.decode(), bad
    assert not RunEvent.objects.filter(run=run, kind="reconfigure_requested").exists()
    r = client.post(f"/runs/{run.pk}/plan/", {"plan": json.dumps(
        {"pes": proposed, "partitions": 2})}, follow=True)
    assert "1 PE(s) over 2 partition(s)" in r.content.decode()
    requested = RunEvent.objects.get(run=run, kind="reconfigure_requested")
    assert requested.payload == {"command": "replan", "key_groups": 8, "scheme": "seamless",
                                 "plan": {"pes": proposed, "partitions": 2}}
    assert requested.message.startswith("re-plan to 1 PE(s): parse -> enrich")


@pytest.mark.django_db
def test_the_plan_page_says_why_there_is_nothing_to_optimise(local_operator,
                                                              tmp_path: Path) -> None:
    from pipelines import actions
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(local_operator, name="no-python")
    run = actions.create_run(pipeline, policy, local_operator)
    client = Client()
    client.force_login(local_operator)
    assert 'id="optimise-plan"' not in client.get(f"/runs/{run.pk}/").content.decode()
    assert "has no Python operator" in client.get(f"/runs/{run.pk}/plan/").content.decode()
    python_run = _python_run(local_operator, tmp_path / "run")
    Run.objects.filter(pk=python_run.pk).update(status="stopped")
    page = client.get(f"/runs/{python_run.pk}/plan/").content.decode()
    assert "the run is stopped" in page
    r = client.post(f"/runs/{python_run.pk}/plan/",
                    {"plan": json.dumps({"pes": [list(pyops.HFT_STEPS)]})}, follow=True)
    assert "only while it is running" in r.content.decode()


@pytest.mark.django_db
def test_the_plan_watch_proposes_colas_plan_once_when_the_pes_saturate(
        local_operator, tmp_path: Path) -> None:
    from control import planwatch
    from pipelines.models import RunEvent

    cool = _python_run(local_operator, tmp_path / "cool", name="cool")  # 1-2 % of a core
    # Crossings that cost 1 us a byte: the unfused plan's tasks need more than a core.
    hot = _python_run(local_operator, tmp_path / "hot", per_byte_s=1e-6, name="hot")
    assert planwatch.watch_plans() == 1
    alert = RunEvent.objects.get(run=hot, kind="alert")
    assert alert.payload["proposed_plan"] == {"pes": [list(pyops.HFT_STEPS)],
                                              "partitions": 2}
    assert "saturate" in alert.message and "COLA proposes 1 PE(s)" in alert.message
    assert "Optimise plan" in alert.message
    assert planwatch.watch_plans() == 0  # raised once, not on every pass
    assert RunEvent.objects.filter(run=hot, kind="alert").count() == 1
    assert not RunEvent.objects.filter(run=cool, kind="alert").exists()
