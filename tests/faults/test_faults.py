"""Faults caused for real, no Spark: a Redis the test started and kills, a process that
ignores SIGTERM, a pid that is some other runner's. The relay's database error is the
one fault injected (a store that raises once)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import free_port, make_pipeline_and_policy, run_async, run_status, wait_for

pytestmark = pytest.mark.faults


class OwnRedis:
    """A redis-server on a free loopback port, without persistence: a restart comes back
    empty, as the machine's Redis does after a crash."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, 20, "the test's redis-server to answer")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


@pytest.mark.dbless
def test_a_runner_holds_its_records_while_redis_is_away_and_writes_them_after(
        own_redis: OwnRedis) -> None:
    from pipelines.runtime import bus as busmod

    runner_bus = busmod.RunnerBus(busmod.connect(own_redis.url), busmod.bus_key(1, "faults"))
    assert runner_bus.publish_metrics({"batch_id": 0, "t": time.time()}) is not None
    own_redis.kill()
    # Neither a write nor an ack raises while Redis is away: they wait, in order.
    for batch in (1, 2, 3):
        assert runner_bus.publish_metrics({"batch_id": batch, "t": time.time()}) is None
    assert runner_bus.publish_event(busmod.RunnerEvent.WORKERS_CHANGED, workers=2) is None
    runner_bus.ack("c1", True, "applied")
    assert runner_bus.waiting == 5 and not runner_bus.flush()
    # Back, but empty: the restart lost batch 0, which Redis held and nobody had read.
    # The runner sees a new server and writes its recent entries again, first.
    own_redis.start()
    assert runner_bus.publish_metrics({"batch_id": 4, "t": time.time()}) is not None
    assert runner_bus.waiting == 0 and runner_bus.dropped == 0 and runner_bus.resent == 1
    r = runner_bus.r

    def batches() -> list[int]:
        return [json.loads(f["m"])["batch_id"]
                for _id, f in r.xrange(busmod.metrics_key(runner_bus.key))]

    assert batches() == [0, 1, 2, 3, 4]
    (_id, event), = r.xrange(busmod.events_key(runner_bus.key))
    assert json.loads(event["e"])["workers"] == 2 and json.loads(event["e"])["seq"] == 0
    (_id, ack), = r.xrange(busmod.acks_key(runner_bus.key))
    assert json.loads(ack["a"])["command_id"] == "c1"
    # A restart between two writes, which no write saw fail: the next heartbeat notices.
    own_redis.kill()
    own_redis.start()
    runner_bus.heartbeat(phase="running")
    assert batches() == [0, 1, 2, 3, 4] and runner_bus.resent == 1 + 5 + 2


@pytest.mark.dbless
def test_the_reconciler_judges_no_heartbeat_while_redis_has_just_restarted(
        own_redis: OwnRedis) -> None:
    import redis

    from pipelines import tasks
    from pipelines.runtime import bus as busmod

    client = redis.Redis.from_url(own_redis.url)
    assert tasks.redis_restarted_recently(client)
    # uptime_in_seconds counts whole seconds: wait it out rather than assume a speed.
    wait_for(lambda: not tasks.redis_restarted_recently(client), busmod.HEARTBEAT_TTL_S + 10,
             "the test's Redis to be up for a heartbeat TTL")


def _sleeper(*argv: str, ignore_sigterm: bool = False) -> subprocess.Popen:
    """A process whose command line carries ``argv`` (as a runner's would), doing nothing."""
    code = ("import signal, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else "")
            + "print('ready', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _new_run(user, **fields):
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name=f"p{time.monotonic_ns()}")
    return Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                              created_by=user, **fields)


@pytest.mark.django_db(transaction=True)
def test_only_this_runs_runner_is_signalled_and_sigterm_comes_before_sigkill(
        operator, tmp_path: Path) -> None:
    from pipelines import actions, launch, tasks
    from pipelines.launch import RUNNER_MODULE
    from pipelines.models import EventKind

    mine, other = tmp_path / "run-mine", tmp_path / "run-other"
    stubborn = _sleeper(RUNNER_MODULE, str(mine / "runner.json"), ignore_sigterm=True)
    stranger = _sleeper(RUNNER_MODULE, str(other / "runner.json"))
    standby = _sleeper(RUNNER_MODULE, "--standby",
                       str(Path(settings.STANDBY_ROOT) / "sb-test" / "standby.json"))
    try:
        run = _new_run(operator, status="running", runner_pid=stubborn.pid,
                       checkpoint_dir=str(mine))
        assert launch.runner_state(run) == "alive"
        # The same pid recorded for a run whose config it does not name: not its runner.
        reused = _new_run(operator, status="running", runner_pid=stubborn.pid,
                          checkpoint_dir=str(other))
        assert launch.runner_state(reused) == "gone"
        assert launch.process_state(stranger.pid) == "alive"
        adopted = _new_run(operator, status="running", runner_pid=standby.pid,
                           checkpoint_dir=str(tmp_path / "run-adopted"))
        assert launch.runner_state(adopted) == "gone"
        actions.record_event(adopted, EventKind.RUNNER_LAUNCHED, "test", "adopted",
                             {"pid": standby.pid, "standby": "sb-test"})
        assert launch.runner_state(adopted) == "alive"

        bus = launch.run_bus(run)
        bus.r.delete(f"run:{bus.key}:sigterm_at")
        assert tasks._terminate(bus, stubborn.pid) is False  # SIGTERM sent, ignored
        assert tasks._terminate(bus, stubborn.pid) is False  # within the grace period
        assert stubborn.poll() is None
        bus.r.set(f"run:{bus.key}:sigterm_at", time.time() - tasks.RUNNER_TERM_GRACE_S - 1)
        assert tasks._terminate(bus, stubborn.pid) is True
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
        bus.r.delete(f"run:{bus.key}:sigterm_at")
    finally:
        for proc in (stubborn, stranger, standby):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_runner_that_died_is_lost_at_the_next_pass_not_when_its_heartbeat_expires(
        operator, tmp_path: Path) -> None:
    from django.utils import timezone

    from pipelines import launch, tasks
    from pipelines.launch import RUNNER_MODULE
    from pipelines.runtime import bus as busmod

    runner = _sleeper(RUNNER_MODULE, str(tmp_path / "runner.json"))
    try:
        run = _new_run(operator, status="running", runner_pid=runner.pid,
                       checkpoint_dir=str(tmp_path), started_at=timezone.now())
        bus = launch.run_bus(run)
        busmod.RunnerBus(bus.r, bus.key).heartbeat(pid=runner.pid, phase="running")
        beat = bus.read_heartbeat()
        assert beat is not None and beat["host"] == busmod.HOSTNAME
        assert not tasks.runner_died(run, beat)
        runner.kill()
        runner.wait(timeout=10)
        assert tasks.runner_died(run, beat)
        # A pid means nothing on another host: that runner is judged by its heartbeat.
        assert not tasks.runner_died(run, {**beat, "host": "elsewhere"})
        assert bus.read_heartbeat() is not None  # still within its TTL
        # This pass, or the session's live reconciler's if it came first.
        wait_for(lambda: tasks.reconcile_runs() and run_status(run.pk) == "lost", 10,
                 "the run to be lost")
        run.refresh_from_db()
        assert run.status_reason.startswith("the runner died; runner pid")
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_runner_hung_in_its_stop_is_ended_and_the_run_says_so(operator, tmp_path) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from pipelines import actions, launch, tasks
    from pipelines.launch import RUNNER_MODULE
    from pipelines.runtime import bus as busmod

    hung = _sleeper(RUNNER_MODULE, str(tmp_path / "runner.json"), ignore_sigterm=True)
    try:
        run = _new_run(operator, status="running", runner_pid=hung.pid,
                       checkpoint_dir=str(tmp_path))
        assert actions.transition(run, "stopping", "user:operator", "stop requested")
        bus = launch.run_bus(run)
        busmod.RunnerBus(bus.r, bus.key).heartbeat(pid=hung.pid, phase="stopping")
        # Judged as the reconciler would be, a stop timeout later (the test's clock is
        # moved, not waited: the session's own reconciler sees a fresh stop meanwhile).
        later = timezone.now() + timedelta(seconds=settings.STOP_TIMEOUT_S + 1)
        assert tasks._end_a_hung_stop(run, bus, timezone.now()) == 0
        assert tasks._end_a_hung_stop(run, bus, later) == 0  # SIGTERM, ignored
        assert hung.poll() is None
        bus.r.set(f"run:{bus.key}:sigterm_at", time.time() - tasks.RUNNER_TERM_GRACE_S - 1)
        assert tasks._end_a_hung_stop(run, bus, later) == 1
        assert hung.wait(timeout=10) == -signal.SIGKILL
        run.refresh_from_db()
        assert run.status == "stopped" and "did not stop within" in run.status_reason
        assert "SIGTERM, then SIGKILL" in run.status_reason
        assert bus.read_heartbeat() is None
        bus.r.delete(f"run:{bus.key}:sigterm_at")
    finally:
        if hung.poll() is None:
            hung.kill()
        hung.wait(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_run_left_pending_has_its_start_queued_again_then_fails(
        operator, monkeypatch, settings) -> None:
    """A start lost with Redis' queue: the reconciler queues it again, once per period,
    and gives up with a reason after PENDING_GIVE_UP_S. The reconciler is called with the
    times to judge at, from the run's creation and the requeue's record (a loaded
    machine's pauses between real calls must not move a call into the next period). The
    queue is the one stand-in: a real start would launch Spark."""
    from datetime import timedelta

    from pipelines import tasks

    settings.PENDING_REQUEUE_S, settings.PENDING_GIVE_UP_S = 60.0, 600.0
    queued = []
    monkeypatch.setattr(tasks, "enqueue", lambda task, *args: queued.append((task, args)))
    run = _new_run(operator)
    assert run.status == "pending"
    created = run.created_at

    def after(base, seconds: float):
        return base + timedelta(seconds=seconds)

    assert tasks._reconcile_pending(after(created, 30)) == 0 and queued == []
    assert tasks._reconcile_pending(after(created, 61)) == 0
    assert queued == [(tasks.Task.START_RUN, (run.pk, "reconciler"))]
    event = run.events.get(kind="start_requeued")
    assert event.actor == "reconciler" and "queued again" in event.message
    # Not again within the period from that requeue; once more after it.
    assert tasks._reconcile_pending(after(event.at, 59)) == 0 and len(queued) == 1
    assert tasks._reconcile_pending(after(event.at, 61)) == 0 and len(queued) == 2
    assert tasks._reconcile_pending(after(created, 601)) == 1
    run.refresh_from_db()
    assert run.status == "failed" and "never started" in run.status_reason


@pytest.mark.django_db
def test_a_query_without_batches_while_input_waits_is_stalled_until_batches_resume(
        local_operator) -> None:
    """The judgement on the runner's heartbeat facts (a real blocked query: see
    test_spark_faults). The run stays inside the test's transaction: a live stack's
    reconciler would find it running without a heartbeat and mark it lost."""
    from pipelines import tasks

    run = _new_run(local_operator, status="running")
    limit = tasks.stall_limit_s(1.0, run.policy.control_step_s)
    beat = {"t": 1000.0, "expected_batch_s": 1.0, "input_waiting": True}
    assert tasks.judge_progress(run, {**beat, "last_batch_at": 1000.0 - limit + 1}) == 0
    # Idle, not stalled: nothing scheduled waits to be read.
    assert tasks.judge_progress(run, {**beat, "input_waiting": False,
                                      "last_batch_at": 1000.0 - limit - 60}) == 0
    assert tasks.judge_progress(run, {**beat, "last_batch_at": 1000.0 - limit - 1}) == 1
    run.refresh_from_db()
    assert run.status == "stalled" and "no batch for" in run.status_reason
    alert = run.events.get(kind="alert")
    assert alert.actor == "reconciler" and "stalled" in alert.message
    assert tasks.judge_progress(run, {**beat, "last_batch_at": 999.5}) == 1
    run.refresh_from_db()
    assert run.status == "running" and run.status_reason == "batches resumed"
    # The heartbeat's age counts: written a while ago, the same facts are a stall.
    assert tasks.judge_progress(run, {**beat, "last_batch_at": 1000.0 - limit + 1}, 2.0) == 1
    run.refresh_from_db()
    assert run.status == "stalled"
    assert tasks.judge_progress(run, {**beat, "last_batch_at": 999.5}) == 1
    # Batches wait while a reconfiguration moves state: that is not a stall.
    assert tasks.judge_progress(run, {**beat, "last_batch_at": 1000.0 - limit - 1,
                                      "reconfiguring": "set_workers"}) == 0


@pytest.mark.django_db(transaction=True)
def test_a_reconfiguration_redelivered_after_its_deadline_sends_nothing(operator) -> None:
    """As after a worker crash: the task comes back an hour later and finds the request
    expired; the runner's command stream stays empty and the run's log says why."""
    from pipelines import launch, tasks
    from pipelines.runtime import bus as busmod

    run = _new_run(operator, status="running", workers=1)
    bus = launch.run_bus(run)
    bus.reset()
    try:
        message = tasks.reconfigure_run(run.pk, {"command": "set_workers",
                                                 "args": {"workers": 2}},
                                        "user:operator", time.time() - 3600)
        assert "expired 3600 s before it could be sent" in message
        assert bus.r.xlen(busmod.commands_key(bus.key)) == 0
        event = run.events.get(kind="reconfigure_ignored")
        assert event.actor == "user:operator" and "expired" in event.message
    finally:
        bus.reset()


@pytest.mark.django_db(transaction=True)
def test_the_relay_follows_the_databases_active_runs_when_redis_forgot_them(
        operator) -> None:
    """A Redis restart empties ``runs:live``; the relay still records an active run."""
    from pipelines.relay import Relay
    from pipelines.runtime import bus as busmod

    run = _new_run(operator, status="running")
    run_bus = busmod.RunnerBus(busmod.connect(settings.REDIS_URL), run.bus_key)
    control = busmod.ControlBus(run_bus.r, run.bus_key)
    control.reset()
    control.mark_done()  # as after the restart: not in the live set
    try:
        for batch in range(3):
            run_bus.publish_metrics({"batch_id": batch, "t": time.time(), "records": 5})

        async def relay_once() -> None:
            await Relay().step(block_ms=2000)

        run_async(relay_once())
        assert sorted(run.samples.values_list("batch_id", flat=True)) == [0, 1, 2]
    finally:
        control.reset()


@pytest.mark.django_db(transaction=True)
@pytest.mark.both_engines  # a duplicate in a savepoint
def test_the_relay_reads_again_what_it_could_not_store_and_pushes_it_once(
        operator, monkeypatch) -> None:
    from pipelines import actions
    from pipelines.relay import Relay
    from pipelines.runtime import bus as busmod

    run = _new_run(operator, status="running")
    run_bus = busmod.RunnerBus(busmod.connect(settings.REDIS_URL), run.bus_key)
    control = busmod.ControlBus(run_bus.r, run.bus_key)
    control.reset()
    control.mark_live()
    store = actions.store_samples
    failures = []

    def store_fails_once(run_id, wires):
        if not failures:
            failures.append(len(wires))
            raise RuntimeError("database went away")
        return store(run_id, wires)

    monkeypatch.setattr(actions, "store_samples", store_fails_once)
    try:
        for batch in range(2):
            run_bus.publish_metrics({"batch_id": batch, "t": time.time(), "records": 5})

        async def scenario() -> list[dict]:
            # What this relay pushes (a live stack left up by an earlier test runs a
            # relay of its own, which follows the same run and pushes to the same group).
            relay = Relay()
            pushed: list[dict] = []
            send = relay.layer.group_send

            async def recording_send(group: str, message: dict) -> None:
                pushed.append(message)
                await send(group, message)

            relay.layer.group_send = recording_send  # type: ignore[method-assign]
            try:
                with pytest.raises(RuntimeError):
                    await relay.step(block_ms=2000)
                await relay.step(block_ms=2000)  # the same entries again, stored this time
                run_bus.publish_metrics({"batch_id": 2, "t": time.time(), "records": 5})
                await relay.step(block_ms=2000)
            finally:
                del relay.layer.group_send  # the process's shared layer, as it was
            return pushed

        pushed = run_async(scenario())
        assert failures == [2]
        assert sorted(run.samples.values_list("batch_id", flat=True)) == [0, 1, 2]
        batches = [s["batch_id"] for message in pushed for s in message["samples"]]
        assert batches == [0, 1, 2]
    finally:
        control.mark_done()
        control.reset()


@pytest.mark.dbless
def test_fault_tests_leave_no_process_behind() -> None:
    """Guard for this file: nothing it started still runs (pids are ours, by ppid)."""
    children = subprocess.run(["ps", "-o", "pid=,cmd=", "--ppid", str(os.getpid())],
                              capture_output=True, text=True).stdout
    assert "redis-server" not in children and "time.sleep(120)" not in children, children


@pytest.mark.dbless
def test_a_runner_killed_while_throttling_leaves_no_process_stopped(tmp_path: Path) -> None:
    """Frequency emulation SIGSTOPs executors many times a second; SIGKILL the process
    doing it and its watchdog continues them."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    throttler = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from pipelines.runtime.host.frequency import DutyCycleThrottle\n"
         f"t = DutyCycleThrottle(lambda: [{victim.pid}], f_max_ghz=2.0, period_s=0.05)\n"
         "t.set(0.2)\n"
         "while t._watchdog is None:\n"
         "    time.sleep(0.01)\n"
         "print(t._watchdog.pid, flush=True)\n"
         "time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    try:
        assert throttler.stdout is not None
        watchdog = int(throttler.stdout.readline())
        # Stopped 90 % of the time: seen stopped within a few looks.
        wait_for(lambda: state(victim.pid) == "T", 10, "the throttle to stop the process",
                 interval=0.01)
        throttler.kill()
        throttler.wait(timeout=10)
        wait_for(lambda: state(victim.pid) != "T", 10, "the watchdog to continue it")
        time.sleep(0.5)  # and it stays running: nothing stops it again
        assert state(victim.pid) != "T"
        wait_for(lambda: not Path(f"/proc/{watchdog}").exists() or state(watchdog) == "Z",
                 10, "the watchdog to exit")
    finally:
        for proc in (throttler, victim):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.mark.dbless
def test_lab_comparisons_have_a_queue_and_a_worker_of_their_own() -> None:
    """Four Lab submissions once filled every slot of the one worker and stopped the
    control loop: Lab jobs now go to their own queue, served by their own worker."""
    from pipelines.management.commands.up import product_processes
    from webapp.celery import app

    def queue_of(name: str) -> str:
        return app.amqp.router.route({}, name)["queue"].name

    assert queue_of("control.tasks.run_lab") == settings.LAB_QUEUE
    for name in ("control.tasks.control_tick_all", "control.tasks.apply_decision",
                 "pipelines.tasks.reconcile_runs", "pipelines.tasks.start_run",
                 "pipelines.tasks.reconfigure_run"):
        assert queue_of(name) == settings.CONTROL_QUEUE, name
    workers = {argv[argv.index("-Q") + 1]: argv for name, argv in
               product_processes(8000, Path("/tmp")).items() if "worker" in argv}
    assert set(workers) == {settings.CONTROL_QUEUE, settings.LAB_QUEUE}
