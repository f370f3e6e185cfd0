"""Operating a real run from code (issue 47): started from the command line, scaled
through the REST API with a user's token, scraped by Prometheus' own text parser while
it runs, stopped from the command line; the audit names the token's user."""
from __future__ import annotations

import io
import json
import urllib.request

import pytest
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import make_pipeline_and_policy, stop_and_wait, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.single_pass]


def _post(url: str, token: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _scraped_p95(base_url: str, run_id: int) -> float | None:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "streamwise_run_latency_seconds":
            for sample in family.samples:
                if sample.labels["run"] == str(run_id) and sample.labels["quantile"] == "0.95":
                    return sample.value
    return None


@pytest.mark.django_db(transaction=True)
def test_a_run_from_the_cli_scaled_by_the_api_scraped_and_stopped(live_stack, operator) -> None:
    from api.models import ApiToken
    from audit.models import AuditEntry
    from pipelines.models import MetricSample, Run

    pipeline, policy = make_pipeline_and_policy(operator, "api-spark", max_workers=2)
    token = ApiToken.issue(operator, "ci")[1]
    out = io.StringIO()
    call_command("runs", "start", "--pipeline", pipeline.name, "--policy", policy.name,
                 "--user", "operator", "--wait", "running", "--timeout", "240", stdout=out)
    run = Run.objects.get(pipeline_version__pipeline=pipeline)
    try:
        assert f"run {run.pk} created" in out.getvalue() and "is running" in out.getvalue()
        # (a scale-up before the first batch is refused: nothing is placed yet)
        wait_for(lambda: MetricSample.objects.filter(run=run).exists(), 120,
                 "the run's first batch")
        status, body = _post(f"{live_stack.base_url}/api/v1/runs/{run.pk}/workers", token,
                             {"workers": 2})
        assert status == 202, body
        wait_for(lambda: Run.objects.get(pk=run.pk).workers == 2, 240, "the second worker")
        requested = run.events.get(kind="reconfigure_requested")
        assert requested.actor == "user:operator" and requested.payload["workers"] == 2
        # The audit log names the token's user as the scale-up's actor.
        scaled = AuditEntry.objects.get(action="run.reconfigure_requested",
                                        target_id=str(run.pk))
        assert scaled.actor == "user:operator"
        # The runner's workers_changed (through the relay) moves Run.workers a moment
        # before the Celery task that waits for the runner's ack records the outcome.
        wait_for(lambda: run.events.filter(kind="reconfigured",
                                           payload__command="set_workers").exists(), 60,
                 "the scale-up's outcome recorded by the reconfigure task")

        def same_sample_p95() -> float | bool:
            before = MetricSample.objects.filter(run=run).order_by("-t", "-batch_id").first()
            scraped = _scraped_p95(live_stack.base_url, run.pk)
            after = MetricSample.objects.filter(run=run).order_by("-t", "-batch_id").first()
            if before is None or before.pk != after.pk or before.latency_p95_ms is None:
                return False  # a batch landed meanwhile: scrape again
            assert scraped == before.latency_p95_ms / 1000
            return True

        wait_for(same_sample_p95, 60, "a scrape between two batches", interval=0.1)
        out = io.StringIO()
        call_command("runs", "stop", str(run.pk), "--user", "operator", "--wait",
                     "--timeout", "120", stdout=out)
        assert "is stopped" in out.getvalue()
        assert run.events.get(kind="stop_requested").actor == "user:operator"
        assert AuditEntry.objects.filter(action="run.stop_requested", target_id=str(run.pk),
                                         actor="user:operator").exists()
    finally:
        stop_and_wait(run.pk, operator)
