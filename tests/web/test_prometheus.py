"""``/metrics`` (issue 47): Streamwise in Prometheus' exposition format, read back by the
real Prometheus text parser (``prometheus_client.parser``); only from an allowed network
or with the token."""
from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import make_pipeline_and_policy


def _scrape(client: Client, **extra: str) -> dict[str, list]:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=")
    return {f.name: f.samples for f in text_string_to_metric_families(
        response.content.decode())}


def _value(samples: list, **labels: str) -> float:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (labels, samples)
    return found[0]


@pytest.mark.django_db
def test_a_runs_latest_sample_decisions_reconfigurations_and_verdict_are_exported(
        local_operator, settings) -> None:
    from django.utils import timezone

    from control.models import Decision
    from pipelines import actions
    from pipelines.models import EventKind, MetricSample, Run
    from pipelines.runtime import bus as busmod

    pipeline, policy = make_pipeline_and_policy(local_operator, name="prom", max_workers=2)
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=local_operator, workers=2)
    now = timezone.now()
    for i, p95 in enumerate((812.5, 1234.25)):
        MetricSample.objects.create(
            run=run, batch_id=i, t=now + dt.timedelta(seconds=i), latency_p50_ms=400.0,
            latency_p95_ms=p95, latency_p99_ms=p95 * 1.5, input_rate=1500.0 + i,
            output_rate=700.0, workers=2, frequency_ghz=2.4, frequency_source="emulated",
            power_w=31.5, power_measured=False, backlog_s=0.75, dead_letters=3)
    for step, outcome in enumerate(("applied", "applied", "hold")):
        Decision.objects.create(run=run, t=0.0, step=step, strategy="mpc",
                                action="hold" if outcome == "hold" else "scale_up",
                                outcome=outcome, current_workers=1, current_freq_ghz=2.0,
                                chosen_workers=2, chosen_freq_ghz=2.0, solve_ms=1.0)
    actions.record_event(run, EventKind.RECONFIGURED, "runner", "ok",
                         {"command": "set_workers", "ok": True})
    actions.record_event(run, EventKind.RECONFIGURE_FAILED, "runner", "no",
                         {"command": "rebalance", "ok": False})
    ended = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                               status="stopped", created_by=local_operator,
                               verification={"state": "done", "ok": False, "report": {
                                   "lost": 2, "duplicated": 0, "unexpected": 0, "wrong": 1}})
    r = busmod.connect(settings.REDIS_URL)
    r.hset(busmod.HEALTH_KEY, mapping={"relay_lag_s": 0.125, "reconcile_pass_s": 0.04})

    got = _scrape(Client())
    labels = {"run": str(run.pk), "pipeline": "prom"}
    stored = MetricSample.objects.filter(run=run).order_by("-t").first()
    latency = got["streamwise_run_latency_seconds"]
    assert _value(latency, **labels, quantile="0.95") == stored.latency_p95_ms / 1000
    assert _value(latency, **labels, quantile="0.99") == 1234.25 * 1.5 / 1000
    assert _value(got["streamwise_run_input_records_per_second"], **labels) == 1501.0
    assert _value(got["streamwise_run_backlog_seconds"], **labels) == 0.75
    assert _value(got["streamwise_run_workers"], **labels) == 2
    assert _value(got["streamwise_run_power_watts"], **labels, source="modelled") == 31.5
    assert _value(got["streamwise_run_cpu_frequency_hertz"], **labels,
                  source="emulated") == 2.4e9
    assert _value(got["streamwise_run_dead_letters"], **labels) == 3
    assert _value(got["streamwise_run_active"], **labels, status="running") == 1
    decisions = got["streamwise_decisions"]
    assert _value(decisions, **labels, action="scale_up", outcome="applied") == 2
    assert all(s.name == "streamwise_decisions_total" for s in decisions)
    reconf = got["streamwise_reconfigurations"]
    assert _value(reconf, **labels, command="set_workers", outcome="applied") == 1
    assert _value(reconf, **labels, command="rebalance", outcome="failed") == 1
    ended_labels = {"run": str(ended.pk), "pipeline": "prom"}
    assert _value(got["streamwise_verification_ok"], **ended_labels) == 0
    assert _value(got["streamwise_verification_problems"], **ended_labels, kind="lost") == 2
    assert _value(got["streamwise_control_plane_seconds"], measure="relay_lag") == 0.125
    assert {s.labels["queue"] for s in got["streamwise_celery_queue_length"]} == {
        "control", "lab"}

    # The Grafana dashboard in docs/ asks only for what is exported.
    import re
    from pathlib import Path

    dashboard = (Path(__file__).resolve().parents[2] / "docs" / "grafana.json").read_text()
    asked = {n.removesuffix("_total") for n in re.findall(r"streamwise_[a-z_]+", dashboard)}
    assert asked and asked <= set(got), asked - set(got)


@pytest.mark.django_db
def test_metrics_need_an_allowed_network_or_the_token(settings) -> None:
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    settings.STREAMWISE_METRICS_NETWORKS = ["10.1.0.0/16"]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    settings.STREAMWISE_METRICS_TOKEN = "s3cret-token"
    client = Client(REMOTE_ADDR="10.1.2.3")
    assert client.get("/metrics").status_code == 403  # a token, once set, is needed
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    _scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")
