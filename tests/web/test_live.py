"""Real services, no Spark: the WebSocket consumer fed by the real relay over the real
Redis channel layer, and the Celery tasks on a real worker."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from tests.conftest import make_pipeline_and_policy, run_async, wait_for


def _session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}" \
        .encode()


def _new_run(user, status="running", **fields):
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name=f"p{time.monotonic_ns()}",
                                                max_workers=2)
    return Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                              status=status, created_by=user, **fields)


async def _connect(path: str, cookie: bytes | None) -> WebsocketCommunicator:
    from webapp.asgi import application

    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.mark.django_db(transaction=True)
def test_websocket_receives_metrics_pushed_by_the_relay(operator) -> None:
    from pipelines.relay import Relay
    from pipelines.runtime import bus as busmod

    run = _new_run(operator)
    cookie = _session_cookie(operator)
    run_bus = busmod.RunnerBus(busmod.connect(settings.REDIS_URL), run.bus_key)
    control = busmod.ControlBus(run_bus.r, run.bus_key)
    control.reset()
    control.mark_live()

    async def scenario() -> tuple[dict, dict, dict, float]:
        comm = await _connect(f"/ws/runs/{run.pk}/", cookie)
        connected, _ = await comm.connect(timeout=10)
        assert connected
        snapshot = await comm.receive_json_from(timeout=10)
        relay = Relay()
        # What the runner does after a micro-batch:
        run_bus.publish_metrics({"batch_id": 0, "t": time.time(), "input_rows": 10,
                                 "records": 10, "latency_p95_ms": 123.0, "workers": 1,
                                 "power_w": 5.0, "power_source": "modelled"})
        await relay.step(block_ms=2000)
        metrics = await comm.receive_json_from(timeout=10)
        received = time.time()
        run_bus.publish_event(busmod.RunnerEvent.STOPPED, reason="test over")
        await relay.step(block_ms=2000)
        status = None
        for _ in range(6):
            msg = await comm.receive_json_from(timeout=10)
            if msg["kind"] == "status" and msg["run"]["status"] == "stopped":
                status = msg
                break
        await comm.disconnect()
        return snapshot, metrics, status, received

    snapshot, metrics, status, received = run_async(scenario())
    assert snapshot["kind"] == "snapshot" and snapshot["run"]["status"] == "running"
    assert metrics["kind"] == "metrics"
    sample = metrics["samples"][0]
    assert sample["latency_p95_ms"] == 123.0 and sample["power_measured"] is False
    assert received - sample["written_at"] < 5
    assert status is not None, "no stopped status pushed"
    run.refresh_from_db()
    assert run.status == "stopped" and run.samples.count() == 1
    assert run.events.filter(kind="runner:stopped", actor="runner").exists()
    assert not run_bus.r.sismember(busmod.LIVE_SET, run.bus_key)


@pytest.mark.django_db(transaction=True)
def test_the_sockets_of_a_run_share_one_group_membership_per_process(operator) -> None:
    """webapp.fanout: three pages of one run and one of another are two memberships of
    the layer's groups, each push reaches every page of its run once and no other, and
    the last page to close leaves the group."""
    from channels.layers import get_channel_layer
    from pipelines import actions
    from pipelines.runtime import bus as busmod

    one, other = _new_run(operator), _new_run(operator)
    cookie = _session_cookie(operator)
    r = busmod.connect(settings.REDIS_URL)
    layer = get_channel_layer()
    members = {run.pk: f"{layer.prefix}:group:{actions.group_name(run.pk)}"
               for run in (one, other)}

    async def scenario() -> tuple[dict, list, list, dict]:
        comms = []
        for run in (one, one, one, other):
            comm = await _connect(f"/ws/runs/{run.pk}/", cookie)
            assert (await comm.connect(timeout=10))[0]
            await comm.receive_json_from(timeout=10)  # the snapshot
            comms.append(comm)
        joined = {pk: r.zcard(key) for pk, key in members.items()}
        await layer.group_send(actions.group_name(one.pk),
                               {"type": "run.status", "run": {"id": one.pk, "n": 1}})
        got = [await comm.receive_json_from(timeout=10) for comm in comms[:3]]
        nothing = [await comms[3].receive_nothing(timeout=0.5)]
        for comm in comms:
            await comm.disconnect()
        left = {pk: r.zcard(key) for pk, key in members.items()}
        return joined, got, nothing, left

    joined, got, nothing, left = run_async(scenario())
    assert joined == {one.pk: 1, other.pk: 1}
    assert got == [{"kind": "status", "run": {"id": one.pk, "n": 1}}] * 3
    assert nothing == [True]
    assert left == {one.pk: 0, other.pk: 0}


@pytest.mark.django_db(transaction=True)
@pytest.mark.both_engines  # a read beside a write: isolation
def test_a_change_pushed_while_the_snapshot_is_read_reaches_the_page(
        operator, monkeypatch) -> None:
    """The consumer joins the run's group before it reads the snapshot: a change that
    commits just after the read (and is pushed at once) still reaches the client."""
    from channels.db import database_sync_to_async

    from pipelines import actions
    from pipelines.models import Run
    from webapp import consumers

    run = _new_run(operator)
    read_snapshot = consumers._snapshot

    def stop_the_run(run_id: int) -> None:
        Run.objects.filter(pk=run_id).update(status="stopping")
        actions.push(run_id, {"type": "run.status",
                              "run": actions.run_state(Run.objects.get(pk=run_id))})

    async def snapshot_then_a_change(run_id: int):
        snapshot = await read_snapshot(run_id)
        await database_sync_to_async(stop_the_run)(run_id)
        return snapshot

    monkeypatch.setattr(consumers, "_snapshot", snapshot_then_a_change)
    cookie = _session_cookie(operator)

    async def scenario() -> tuple[dict, dict]:
        comm = await _connect(f"/ws/runs/{run.pk}/", cookie)
        connected, _ = await comm.connect(timeout=10)
        assert connected
        snapshot = await comm.receive_json_from(timeout=10)
        pushed = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return snapshot, pushed

    snapshot, pushed = run_async(scenario())
    assert snapshot["run"]["status"] == "running"
    assert pushed["kind"] == "status" and pushed["run"]["status"] == "stopping"


@pytest.mark.django_db(transaction=True)
def test_websocket_refuses_anonymous_and_unknown_runs(operator) -> None:
    run = _new_run(operator)

    async def scenario() -> tuple:
        anon = await _connect(f"/ws/runs/{run.pk}/", None)
        ok_anon, code_anon = await anon.connect(timeout=10)
        missing = await _connect("/ws/runs/999999/", _cookie)
        ok_missing, code_missing = await missing.connect(timeout=10)
        return ok_anon, code_anon, ok_missing, code_missing

    _cookie = _session_cookie(operator)
    ok_anon, code_anon, ok_missing, code_missing = run_async(scenario())
    assert (ok_anon, code_anon) == (False, 4401)
    assert (ok_missing, code_missing) == (False, 4404)


def _controlled_run(user):
    """A running run under Lat-Node whose control steps only the test takes: the session's
    celery beat (started by an earlier test's live stack) ticks every due run each
    second, and a tick of its own would race the test's for the same records. The run
    was last ticked "now" and its step is an hour, so the beat never finds it due;
    ``ticks.tick`` itself does not look at the step."""
    from control import ticks
    from control.models import Policy
    from pipelines import launch

    run = _new_run(user, workers=1, key_groups=4, frequencies=[2.0], frequency_ghz=2.0)
    r = launch.run_bus(run).r
    for key in r.scan_iter(f"control:{run.bus_key}:*"):
        r.delete(key)
    r.set(ticks._key(run, "last"), time.time(), ex=3600)
    Policy.objects.filter(pk=run.policy_id).update(strategy="lat-node", control_step_s=3600)
    run.refresh_from_db()
    return run


def _runner_records(bus, first: int, count: int, rate: float = 800.0) -> None:
    from control import live

    for b in range(first, first + count):
        t = time.time() - (first + count - b)
        bus.publish_metrics({
            "batch_id": b + live.WARMUP_BATCHES, "t": t, "trigger_started_at": t - 1,
            "input_rows": int(rate), "records": int(rate), "batch_duration_ms": 1000,
            "latency_p95_ms": 1900.0, "workers": 1, "frequency_ghz": 2.0, "power_w": 6.9,
            "power_source": "modelled", "source_latest": int(rate * t),
            "source_end": int(rate * t), "placement": ["1"] * 4, "ran_on": ["1"] * 4,
            "group_bytes": [10] * 4, "group_ms": [1.0] * 4, "group_records": [5] * 4})


@pytest.mark.django_db(transaction=True)
def test_every_websocket_message_kind_matches_its_type(operator) -> None:
    """Each kind of webapp.messages, produced by the product's own code paths (relay,
    actions, the control loop) and received over a real WebSocket, has exactly the
    fields and types its TypedDict says (the run page reads these)."""
    from channels.db import database_sync_to_async

    from control import ticks
    from pipelines import actions
    from pipelines.models import EventKind
    from pipelines.relay import Relay
    from pipelines.runtime import bus as busmod
    from webapp import messages

    run = _controlled_run(operator)
    cookie = _session_cookie(operator)
    run_bus = busmod.RunnerBus(busmod.connect(settings.REDIS_URL), run.bus_key)
    control = busmod.ControlBus(run_bus.r, run.bus_key)
    control.reset()
    control.mark_live()
    # A snapshot with something in each list: a stored sample, an event, a decision.
    _runner_records(run_bus, 0, 6)
    run_async(Relay().step(block_ms=2000))
    assert ticks.tick(run) is not None
    actions.record_event(run, EventKind.ALERT, "test", "an event before the page opened")

    async def scenario() -> list[dict]:
        comm = await _connect(f"/ws/runs/{run.pk}/", cookie)
        connected, _ = await comm.connect(timeout=10)
        assert connected
        received = [await comm.receive_json_from(timeout=10)]
        _runner_records(run_bus, 6, 3)
        await Relay().step(block_ms=2000)  # metrics (and their storage)
        await database_sync_to_async(ticks.tick)(run)  # a decision
        await database_sync_to_async(actions.record_event)(run, EventKind.ALERT, "test", "an event")
        run_bus.publish_event(busmod.RunnerEvent.STOPPED, reason="test over")
        await Relay().step(block_ms=2000)  # a status change
        kinds = {m["kind"] for m in received}
        while kinds != set(messages.KINDS):
            msg = await comm.receive_json_from(timeout=10)
            received.append(msg)
            kinds.add(msg["kind"])
        await comm.disconnect()
        return received

    received = run_async(scenario())
    snapshot = received[0]
    assert snapshot["samples"] and snapshot["events"] and snapshot["decisions"]
    assert snapshot["samples"][-1]["groups"]["placement"] == ["1"] * 4
    for message in received:
        assert messages.problems(message) == [], message
    # The checker itself: a wrong type, a missing and an unknown field are reported.
    bad = {**snapshot, "run": {**snapshot["run"], "workers": "one", "extra": 1}}
    del bad["events"]
    assert sorted(messages.problems(bad)) == ["events: missing", "run.extra: unknown field",
                                             "run.workers: expected int, got 'one'"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.both_engines  # concurrent writers: locking
def test_tasks_on_a_real_worker_are_idempotent(live_stack, operator) -> None:
    from pipelines import tasks
    from pipelines.models import Run

    running = _new_run(operator, status="running")
    message = tasks.start_run.delay(running.pk, "user:operator").get(timeout=30)
    assert message == f"start ignored: run {running.pk} is already running"
    assert running.events.filter(kind="start_ignored").count() == 1

    stopped = _new_run(operator, status="stopped")
    message = tasks.start_run.delay(stopped.pk).get(timeout=30)
    assert "already stopped; create a new run" in message
    assert "already stopped" in tasks.stop_run.delay(stopped.pk).get(timeout=30)

    pending = _new_run(operator, status="pending")
    assert tasks.stop_run.delay(pending.pk).get(timeout=30) == "stopped"
    assert Run.objects.get(pk=pending.pk).status == "stopped"

    message = tasks.reconfigure_run.delay(stopped.pk, {"workers": 2}).get(timeout=30)
    assert "not running" in message
    message = tasks.reconfigure_run.delay(running.pk, {"workers": 9}).get(timeout=30)
    assert "workers must be in 1..2" in message


@pytest.mark.django_db(transaction=True)
def test_reconciler_marks_a_run_with_a_dead_runner_lost(live_stack, operator) -> None:
    """beat -> reconcile_runs on the worker: a 'running' run whose runner is gone."""
    from pipelines.models import Run

    from django.utils import timezone

    dead = subprocess.Popen(["true"])
    dead.wait()
    run = _new_run(operator, status="running", runner_pid=dead.pid, started_at=timezone.now(),
                   checkpoint_dir=str(settings.VAR_DIR))
    # Stopped while its runner was still starting: within the start grace it is not lost.
    young = _new_run(operator, status="stopping", runner_pid=dead.pid,
                     launched_at=timezone.now())
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "lost", 20,
             "the reconciler to mark the run lost")
    assert Run.objects.get(pk=young.pk).status == "stopping"
    run.refresh_from_db()
    assert "heartbeat missing" in run.status_reason and "is gone" in run.status_reason
    assert run.events.filter(kind="status:lost", actor="reconciler").exists()
    assert os.path.exists(settings.VAR_DIR)


@pytest.mark.django_db(transaction=True)
def test_views_require_login_and_start_then_stop_a_run(live_stack, operator) -> None:
    """HTTP form -> action -> Celery worker -> runner, and stop while it is starting."""
    from pipelines.models import Run
    from tests.conftest import stop_and_wait

    assert Client().get("/runs/").status_code == 302
    client = Client()
    client.force_login(operator)
    pipeline, policy = make_pipeline_and_policy(operator, name="via-view")
    response = client.post("/runs/start/", {"pipeline": pipeline.pk, "policy": policy.pk})
    assert response.status_code == 302
    run = Run.objects.latest("pk")
    assert response["Location"] == f"/runs/{run.pk}/"
    wait_for(lambda: Run.objects.get(pk=run.pk).runner_pid, 30, "the runner to be launched")
    assert client.post(f"/runs/{run.pk}/stop/").status_code == 302
    stop_and_wait(run.pk, operator)
    run.refresh_from_db()
    assert run.status == "stopped", run.status_reason
    kinds = list(run.events.values_list("kind", flat=True))
    assert kinds[:3] == ["created", "status:starting", "runner_launched"]
    assert "stop_requested" in kinds and "status:stopping" in kinds


@pytest.mark.django_db(transaction=True)
def test_the_relay_forgets_a_live_bus_key_whose_run_the_database_does_not_hold(operator) -> None:
    """A bus key left in ``runs:live`` by a run the database no longer holds (a reset
    database, a killed test run) is dropped; the real run's events are still recorded."""
    from pipelines.models import Run
    from pipelines.relay import Relay
    from pipelines.runtime import bus as busmod

    run = _new_run(operator)
    client = busmod.connect(settings.REDIS_URL)
    keys = (busmod.bus_key(run.pk + 1000, "gone"), busmod.bus_key(run.pk, "other"),
            run.bus_key)
    stale, wrong_token, real = (busmod.ControlBus(client, key) for key in keys)
    try:
        for key in keys:
            busmod.ControlBus(client, key).reset()
            busmod.ControlBus(client, key).mark_live()
            busmod.RunnerBus(client, key).publish_event(busmod.RunnerEvent.STOPPED,
                                                         reason="test over")

        async def relay_once() -> None:
            await Relay().step(block_ms=500)

        run_async(relay_once())
        live = client.smembers(busmod.LIVE_SET)
        assert stale.key not in live and wrong_token.key not in live
        assert Run.objects.get(pk=run.pk).status == "stopped"
    finally:
        for bus in (stale, wrong_token, real):
            bus.mark_done()
            bus.reset()
