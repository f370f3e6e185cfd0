"""A run whose executors live on two other hosts: network namespaces joined by a bridge
(tests/netns.py), each with a Spark worker bound to its own address; the master and the
run's driver listen on this machine's bridge address. The run scales 1 -> 2 -> 1 across
the hosts with its key groups migrated between them, every batch names the host of each
executor, the Cluster page lists both hosts with the run's executors, and the output is
exactly once. The workers' executors are told the data root is a path that does not
exist: the key distribution file reaches them inside the source's reader."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.spec import definition
from pipelines.runtime.verify import verifier as verify
from pipelines.runtime.runner.harness import RunnerProcess
from tests import netns

pytestmark = [pytest.mark.spark, pytest.mark.multihost, pytest.mark.single_pass]

# The key distribution is a data file: executors must not need to read it.
DOC = {"source": {"type": "generator", "seed": 11, "partitions": 2,
                  "rate": {"kind": "constant", "records_per_s": 600},
                  "keys": {"kind": "file", "file": "elastic-hft/probability_distribution"}},
       "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count",
                      "field": "value"}],
       "sink": {"type": "latency", "keep_output": True},
       "key_groups": 6}


@pytest.fixture
def two_host_cluster(tmp_path: Path) -> Iterator[tuple[netns.HostNetwork, Any]]:
    reason = netns.available()
    if reason:
        pytest.skip(reason)
    previous_secret = os.environ.get(cluster.SECRET_ENV)
    with netns.extra_hosts(2) as net:
        info = cluster.start(tmp_path / "master", host=net.gateway, local_worker=False)
        pids: list[int] = []
        try:
            for host in net.hosts:
                pids.append(cluster.start_worker(
                    tmp_path / host.name, info.master_url, host.address, cores=1,
                    memory="1g", secret_file=Path(info.secret_file), netns=host.name,
                    env={"STREAMWISE_DATA_ROOT": str(tmp_path / "no-data-on-workers")},
                    master_web=info.master_web))
            yield net, info
        finally:
            for pid in pids:
                cluster.stop_worker(pid)
            cluster.stop(info)
            # The session's embedded cluster has its own secret: later runners join it.
            if previous_secret is None:
                os.environ.pop(cluster.SECRET_ENV, None)
            else:
                os.environ[cluster.SECRET_ENV] = previous_secret


def _ack(run: RunnerProcess, name: str, **args: Any) -> dict[str, Any]:
    ack = run.command(name, timeout_s=300, **args)
    assert ack["ok"], ack["message"]
    return ack


def _hosts_in_use(record: dict[str, Any]) -> dict[str, str]:
    """Executor -> host of the executors holding key groups in this batch."""
    hosts = record.get("executor_hosts") or {}
    return {e: hosts[e] for e in set(record["placement"]) if e is not None}


def _cluster_page(client: Any, settings: Any, info: Any, record: dict[str, Any],
                  user: Any, logs: Path) -> str:
    """The Cluster page of the product, reading this cluster's master, with a run whose
    latest batch is ``record``; saved (and screenshotted) for the closing note."""
    from pipelines import actions, cluster_status
    from pipelines.models import Run
    from tests.conftest import make_pipeline_and_policy

    settings.SPARK_MASTER_URL = info.master_url
    settings.SPARK_MASTER_WEB_URL = info.master_web
    cluster_status._cores_cache.clear()
    pipeline, policy = make_pipeline_and_policy(user, name="multihost", max_workers=2)
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=user, workers=2)
    actions.store_samples(run.pk, [actions.sample_from_record(record)])
    client.force_login(user)
    html = client.get("/cluster/").content.decode()
    logs.mkdir(parents=True, exist_ok=True)
    page = logs / "cluster-page.html"
    static = Path(__file__).resolve().parents[2] / "static"
    page.write_text(html.replace('href="/static/', f'href="file://{static}/'))
    try:
        from pipelines.management.browser import headless_chromium

        driver = headless_chromium()
        try:
            driver.set_window_size(1200, 700)
            driver.get(f"file://{page}")
            driver.save_screenshot(str(logs / "cluster-page.png"))
        finally:
            driver.quit()
    except Exception as exc:  # the screenshot is for the note; the page is asserted
        print(f"no screenshot of the Cluster page: {exc}")
    return html


@pytest.mark.django_db
def test_a_run_scales_across_two_hosts_and_migrates_state_between_them(
        two_host_cluster: tuple[netns.HostNetwork, Any], tmp_path: Path, client: Any,
        settings: Any, local_operator: Any) -> None:
    from control.forms import PolicyForm

    net, info = two_host_cluster
    addresses = {h.address for h in net.hosts}
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    run = RunnerProcess(tmp_path / "run", info.master_url, DOC, redis_url, token="tmulti",
                        driver_host=net.gateway, max_workers=2, initial_workers=1)
    with run:
        first = run.wait_batches(3)[-1]
        (only, host_a), = _hosts_in_use(first).items()
        assert host_a in addresses

        up = _ack(run, "set_workers", workers=2, schedule="batched")
        assert up["migration"]["verified"] and up["migration"]["groups_moved"] >= 1
        both = run.wait_batches(3)[-1]
        in_use = _hosts_in_use(both)
        assert sorted(in_use.values()) == sorted(addresses), in_use  # one per host
        assert both["ran_on"] == both["placement"]

        html = _cluster_page(client, settings, info, both, local_operator,
                             Path(settings.VAR_DIR) / "test-logs")
        for executor, host in in_use.items():
            assert f'data-host="{host}"' in html
            assert f"executor {executor} on {host}" in html
        assert "2 cores alive" in html
        form = PolicyForm(data={"name": "too-wide", "max_workers": 3})
        assert "At most 2: the Spark cluster offers 2 cores" in str(form.errors)

        # The frequency actuators act on this machine only: both hosts are named.
        f_max = both["frequency_ghz"]
        slower = _ack(run, "set_frequency", ghz=round(0.8 * f_max, 3))
        assert sorted(slower["unavailable_on"].values()) == sorted(addresses)
        assert "unavailable on other hosts" in slower["message"]
        _ack(run, "set_frequency", ghz=f_max)

        down = _ack(run, "set_workers", workers=1, schedule="fluid")
        (kept,) = down["executors"]
        assert down["released"][0] not in down["migration"]["target"]
        last = run.wait_batches(3)[-1]
        assert set(last["placement"]) == {kept}
        assert _hosts_in_use(last)[kept] in addresses
        print("multi-host:", {"before": _hosts_in_use(first), "scaled up": in_use,
                              "scaled down": _hosts_in_use(last)})
    report = verify.verify(definition.validate(DOC), run.t0, run.work / "checkpoint",
                           run.work / "output")
    assert report.ok, report.problems
    assert report.batches >= 9 and report.output_rows > 0
