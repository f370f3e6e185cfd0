"""``/metrics``: Streamwise in the Prometheus text exposition format, through the
official client library (``prometheus_client``), for Grafana (``docs/grafana.json``).

Per run (label ``run``, and ``pipeline``): its latest batch's latency quantiles, input and
output rate, a broker source's backlog, workers, CPU frequency and power (``source`` =
measured or modelled, as the run page labels it), dead letters; the controller's
decisions and the reconfigurations by kind and outcome (counters over the run's life);
the exactly-once check's verdict and problem counts. The control plane's own health: the
relay's lag (runner → database), the reconciler's last pass, the Celery queues' lengths.

Read from the database and Redis on each scrape (a collector, nothing cached): what is
exported is what the pages show. Access: a bearer token (``STREAMWISE_METRICS_TOKEN``)
or, without one, only the networks in ``STREAMWISE_METRICS_NETWORKS`` (loopback).
"""
from __future__ import annotations

import collections
import hmac
import ipaddress
import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

QUANTILES = (("0.5", "latency_p50_ms"), ("0.95", "latency_p95_ms"),
             ("0.99", "latency_p99_ms"))
RECONFIGURE_OUTCOMES = {"reconfigured": "applied", "reconfigure_failed": "failed",
                        "reconfigure_refused": "refused", "reconfigure_timeout": "timeout",
                        "reconfigure_ignored": "ignored"}
VERIFY_PROBLEMS = ("lost", "duplicated", "unexpected", "wrong")
# Runs whose verdict is exported besides the active ones: the latest checked.
RECENT_VERIFIED = 50


class StreamwiseCollector:
    """Every metric of the module docstring, gathered at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from pipelines.models import ACTIVE_STATUSES, Run

        runs = list(Run.objects.filter(status__in=ACTIVE_STATUSES)
                    .select_related("pipeline_version__pipeline"))
        yield from self._samples(runs)
        yield from self._decisions(runs)
        yield from self._verification(runs)
        yield from self._control_plane()

    @staticmethod
    def _labels(run: Any) -> list[str]:
        return [str(run.pk), run.pipeline_version.pipeline.name]

    def _samples(self, runs: list[Any]) -> Iterator[Metric]:
        labels = ["run", "pipeline"]
        up = GaugeMetricFamily("streamwise_run_active", "1 for each active run, by status",
                               labels=[*labels, "status"])
        latency = GaugeMetricFamily(
            "streamwise_run_latency_seconds", "the latest batch's end-to-end latency "
            "quantile (measured: emission to the sink's commit)", labels=[*labels, "quantile"])
        gauges = {
            "input_rate": GaugeMetricFamily("streamwise_run_input_records_per_second",
                                            "the latest batch's input rate (Spark's)",
                                            labels=labels),
            "output_rate": GaugeMetricFamily("streamwise_run_output_records_per_second",
                                             "the latest batch's output rate", labels=labels),
            "backlog_s": GaugeMetricFamily("streamwise_run_backlog_seconds",
                                           "how far a broker source's newest entry is ahead "
                                           "of what the latest batch read", labels=labels),
            "workers": GaugeMetricFamily("streamwise_run_workers", "executors of the run",
                                         labels=labels),
            "dead_letters": GaugeMetricFamily("streamwise_run_dead_letters",
                                              "a broker source's entries that did not "
                                              "convert, so far", labels=labels),
        }
        ghz = GaugeMetricFamily("streamwise_run_cpu_frequency_hertz", "the executors' CPU "
                                "frequency (source: where it was read or set)",
                                labels=[*labels, "source"])
        power = GaugeMetricFamily("streamwise_run_power_watts", "the run's power (source: "
                                  "measured or modelled)", labels=[*labels, "source"])
        for run in runs:
            names = self._labels(run)
            up.add_metric([*names, run.status], 1)
            sample = run.samples.order_by("-t", "-batch_id").first()
            if sample is None:
                continue
            for quantile, field in QUANTILES:
                value = getattr(sample, field)
                if value is not None:
                    latency.add_metric([*names, quantile], value / 1000.0)
            for field, family in gauges.items():
                value = getattr(sample, field)
                if value is not None:
                    family.add_metric(names, float(value))
            if sample.frequency_ghz is not None:
                ghz.add_metric([*names, sample.frequency_source or "unknown"],
                               sample.frequency_ghz * 1e9)
            if sample.power_w is not None:
                power.add_metric([*names, "measured" if sample.power_measured else
                                  "modelled"], sample.power_w)
        yield up
        yield latency
        yield from gauges.values()
        yield ghz
        yield power

    def _decisions(self, runs: list[Any]) -> Iterator[Metric]:
        from django.db.models import Count

        from control.models import Decision
        from pipelines.models import RunEvent

        by_run = {run.pk: self._labels(run) for run in runs}
        decisions = CounterMetricFamily(
            "streamwise_decisions", "the controller's decisions, by action and outcome",
            labels=["run", "pipeline", "action", "outcome"])
        for row in (Decision.objects.filter(run_id__in=by_run)
                    .values("run_id", "action", "outcome").annotate(n=Count("id"))):
            decisions.add_metric([*by_run[row["run_id"]], row["action"], row["outcome"]],
                                 row["n"])
        reconfigurations = CounterMetricFamily(
            "streamwise_reconfigurations", "reconfigurations of the run (workers, "
            "rebalance, moves, re-plans, ...), by command and outcome",
            labels=["run", "pipeline", "command", "outcome"])
        counts: collections.Counter[tuple[int, str, str]] = collections.Counter()
        for run_id, kind, payload in (RunEvent.objects.filter(
                run_id__in=by_run, kind__in=RECONFIGURE_OUTCOMES)
                .values_list("run_id", "kind", "payload")):
            command = str((payload or {}).get("command") or "unknown")
            counts[(run_id, command, RECONFIGURE_OUTCOMES[kind])] += 1
        for (run_id, command, outcome), n in sorted(counts.items()):
            reconfigurations.add_metric([*by_run[run_id], command, outcome], n)
        yield decisions
        yield reconfigurations

    def _verification(self, runs: list[Any]) -> Iterator[Metric]:
        from pipelines.models import Run

        checked = {run.pk: run for run in runs if run.verification}
        for run in (Run.objects.exclude(verification=None)
                    .select_related("pipeline_version__pipeline")
                    .order_by("-pk")[:RECENT_VERIFIED]):
            checked.setdefault(run.pk, run)
        ok = GaugeMetricFamily("streamwise_verification_ok", "the exactly-once check's "
                               "verdict: 1 OK, 0 problems (absent while running)",
                               labels=["run", "pipeline"])
        problems = GaugeMetricFamily("streamwise_verification_problems", "the exactly-once "
                                     "check's problem counts by kind",
                                     labels=["run", "pipeline", "kind"])
        for run in checked.values():
            doc = run.verification or {}
            if doc.get("state") != "done" or doc.get("ok") is None:
                continue
            ok.add_metric(self._labels(run), 1 if doc["ok"] else 0)
            report = doc.get("report") or {}
            for kind in VERIFY_PROBLEMS:
                problems.add_metric([*self._labels(run), kind], float(report.get(kind, 0)))
        yield ok
        yield problems

    def _control_plane(self) -> Iterator[Metric]:
        from pipelines.runtime import bus as busmod

        health = GaugeMetricFamily("streamwise_control_plane_seconds", "the control plane's "
                                   "own timings as last reported: relay_lag (a runner's "
                                   "sample to the database), reconcile_pass (the "
                                   "reconciler's last pass)", labels=["measure"])
        queues = GaugeMetricFamily("streamwise_celery_queue_length", "tasks waiting in a "
                                   "Celery queue", labels=["queue"])
        try:
            r = busmod.connect(settings.REDIS_URL)
            found = r.hgetall(busmod.HEALTH_KEY)
            for name in ("relay_lag", "reconcile_pass"):
                value = found.get(f"{name}_s")
                if value is not None:
                    health.add_metric([name], float(value))
            for queue in (settings.CONTROL_QUEUE, settings.LAB_QUEUE):
                queues.add_metric([queue], float(r.llen(queue)))
        except Exception as exc:  # noqa: BLE001 - Redis away: the rest still scrapes
            log.warning("metrics: control plane health not read: %s", exc)
        yield health
        yield queues


def _allowed(request: HttpRequest) -> bool:
    token = getattr(settings, "STREAMWISE_METRICS_TOKEN", "")
    if token:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(n, strict=False)
               for n in settings.STREAMWISE_METRICS_NETWORKS)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The exposition (403 without the token, or from another network)."""
    if not _allowed(request):
        return HttpResponse("metrics: a bearer token or an allowed network is needed\n",
                            status=403, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamwiseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
