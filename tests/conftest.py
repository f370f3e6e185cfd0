"""Fixtures that start the real thing: a Spark standalone cluster, and the product's
processes (Celery worker, celery beat, relay, daphne) pointed at the test database.

Run the suite with `make test` (it sets REDIS_URL to a test Redis DB, STREAMWISE_VAR
to var/test and DATABASE_URL for PostgreSQL, then SQLite)."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Users' passwords hashed cheaply (webapp/settings.py says why) in every process the
# tests start, the live stack's among them, which logs in the users this one makes.
# This process's own settings may be loaded before this file is (pytest-django loads
# them as it starts): pytest_configure sets its hashers itself.
os.environ["STREAMWISE_TEST_CHEAP_PASSWORD_HASHER"] = "1"


# make test's two lanes (.ci/test.sh) should end together. The dbless tests alone are
# about as long as the database tests (PostgreSQL, then SQLite): these dbless files
# run in the database lane's PostgreSQL pass instead (measured one after another at
# a6fb6e8..4621a36: dbless ~1,100 s, database ~700 s without the closed loop; these
# two files ~180 s). Re-balanced at ci24 (database lane 1,240 s, dbless 1,154 s): the
# JetStream and files tests (~44 s) back in the dbless lane.
DATABASE_LANE_FILES = ("test_plan_spark.py", "test_elastic_spark.py",
                       "test_packages_spark.py")


def folder_marker(conftest_file: str, marker: str) -> Callable[[list[pytest.Item]], None]:
    """The ``pytest_collection_modifyitems`` hook of a folder's conftest: it gives every
    test below that folder the folder's marker (before ``-m`` selects by it)."""
    here = Path(conftest_file).resolve().parent
    mark = getattr(pytest.mark, marker)

    @pytest.hookimpl(tryfirst=True)
    def mark_the_folder(items: list[pytest.Item]) -> None:
        for item in items:
            if here in Path(item.path).resolve().parents:
                item.add_marker(mark)

    return mark_the_folder


# Fixtures that start JVMs: a test that uses one waits for the class archive
# (_class_archive_made) and runs after the tests that start none.
JVM_FIXTURES = ("spark_cluster", "live_stack", "standby_pool", "one_worker")


def starts_jvms(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("spark")
                or set(JVM_FIXTURES) & set(getattr(item, "fixturenames", ())))


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers it adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """make test runs dbless tests once, single_pass tests only on SQLite and
    both_engines tests on both: a test with two of these markers is a mistake. Marks
    the tests of ``DATABASE_LANE_FILES`` database_lane, and puts the tests that start
    JVMs last."""
    for item in items:
        if item.path.name in DATABASE_LANE_FILES:
            item.add_marker(pytest.mark.database_lane)
    # Tests that start no JVM first, in their files' order: they run while
    # .ci/test.sh still makes the class archive, and they fail faster.
    items.sort(key=starts_jvms)
    marks = ("dbless", "single_pass", "both_engines")
    clash = [i.nodeid for i in items if sum(bool(i.get_closest_marker(m)) for m in marks) > 1]
    if clash:
        raise pytest.UsageError(f"marked with more than one of {', '.join(marks)}: "
                                f"{', '.join(clash)}")


_ARCHIVE_WAIT_S = 900.0


def wait_for_class_archive() -> None:
    """Until .ci/test.sh has made the class archive (``$STREAMWISE_CLASS_ARCHIVE_DONE``
    holds the maker's exit status), so that the JVMs about to start map it: without it
    they start, only slower, and the test that checks they map it fails. Outside
    .ci/test.sh the bootstrap made it already."""
    done = os.environ.get("STREAMWISE_CLASS_ARCHIVE_DONE")
    deadline = time.monotonic() + _ARCHIVE_WAIT_S
    while done and not Path(done).exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the class archive was not made within {_ARCHIVE_WAIT_S:.0f} s "
                        f"({done} never appeared)")
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def _class_archive_made(request: pytest.FixtureRequest) -> None:
    """For the Spark tests that start their own JVMs (a benchmark's cluster, extra
    hosts); the session fixtures that start JVMs wait themselves, as they are set up
    before any function fixture."""
    if starts_jvms(request.node):
        wait_for_class_archive()


def pytest_configure(config: pytest.Config) -> None:
    _flush_retries_a_deadlock()
    from django.conf import settings

    # The tests' own process keeps no warm standby (the live stack's services keep
    # theirs): a reconciler pass run in-process would otherwise start one that no
    # test stops and that outlives the suite.
    settings.STANDBY_RUNNERS = 0
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# Where the Spark tests' time went: per test, its wall time and its harness runs'
# start-ups (to the application, the query, the first batch), printed at the end.
_SPARK_TIME: list[tuple[str, float, list[dict[str, Any]]]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    from pipelines.runtime.runner.harness import RunnerProcess

    if not item.get_closest_marker("spark"):
        yield
        return
    mark, started = len(RunnerProcess.started), time.monotonic()
    yield
    runs = [r.start_up() for r in RunnerProcess.started[mark:]]
    _SPARK_TIME.append((item.nodeid, time.monotonic() - started, runs))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    _report_tree_cpu(terminalreporter)
    if not _SPARK_TIME:
        return
    write = terminalreporter.write_line
    terminalreporter.section("where the Spark tests' time went")
    write("test call s | harness runs (warm: adopted a standby) | start-up s: "
          "application / query / first batch, each from the run's start")
    total = sum(t for _n, t, _r in _SPARK_TIME)
    starts = 0.0
    for nodeid, took, runs in sorted(_SPARK_TIME, key=lambda x: -x[1]):
        shown = []
        for r in runs:
            parts = [f"{r[k]:.0f}" if r[k] is not None else "-"
                     for k in ("session_s", "query_s", "first_batch_s")]
            shown.append(("warm " if r["warm"] else "cold ") + "/".join(parts))
            starts += r["first_batch_s"] or 0.0
        # A parametrised test keeps its parameters, however long its name.
        test, bracket, params = nodeid.split("::", 1)[1].partition("[")
        name = test[:max(0, 60 - len(bracket + params))] + bracket + params
        write(f"{took:7.1f} {name:60} {'; '.join(shown)}")
    write(f"spark tests {total:.0f} s, of which {starts:.0f} s from a harness run's "
          "start to its first batch")


# Where a pass's CPU went: per test (set-up to tear-down), the CPU seconds of this
# process and every process under it (the live stack, the harness's runners and
# standbys, the Spark cluster and its executors), and of every process that has this
# pass's STREAMWISE_VAR in its environment and whatever is under it (the live stack's
# runners, which pipelines/launch.py detaches by a double fork): the other lane's
# processes are in neither. The suite's wall time on 2 cores follows its CPU (two lanes
# and the alone pass keep both busy), so this is the number a cut moves. It leaves out
# the servers every lane shares (PostgreSQL, Redis, NATS), and a process that outlives
# its parent drops out when it ends (init reaps it: a driver JVM ending a moment after
# its runner), so a test's figure is a lower bound, and can even come out negative.
# Alone on a quiet machine these sums came to ~60 % of the machine's busy CPU.
_TREE_CPU: list[tuple[str, float]] = []


def _pass_cpu_s() -> float:
    from pipelines.runtime.host import procs

    table = procs.proc_table()
    counted = set(procs.tree_pids([os.getpid()], table))
    var = os.environ.get("STREAMWISE_VAR")
    if var:
        wanted = f"STREAMWISE_VAR={var}".encode()
        marked = []
        for pid in table:
            if pid in counted:
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # ended meanwhile
                continue
            if wanted in environ:
                marked.append(pid)
        counted.update(procs.tree_pids(marked, table))
    return sum(table[pid][1] for pid in counted)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    before = _pass_cpu_s()
    yield
    _TREE_CPU.append((item.nodeid, _pass_cpu_s() - before))


def _report_tree_cpu(terminalreporter: Any) -> None:
    if not _TREE_CPU:
        return
    write = terminalreporter.write_line
    terminalreporter.section("where the CPU went (this pass's processes: tests/conftest.py)")
    for nodeid, cpu in sorted(_TREE_CPU, key=lambda x: -x[1])[:30]:
        write(f"{cpu:7.1f} {nodeid}")
    write(f"tests {sum(c for _n, c in _TREE_CPU):.0f} CPU s in all, {len(_TREE_CPU)} tests")


def _flush_retries_a_deadlock() -> None:
    """The flush that ends a transactional test (one TRUNCATE of every table) runs while
    the session's live stack keeps working: beat's reconcile every second, the relay
    recording events. On PostgreSQL a TRUNCATE that has locked table B and waits for
    table A, held by a transaction that wrote A and now wants B, is a deadlock, and the
    server may pick the flush as the victim (CI once failed a passed test so). The flush
    runs in its own atomic block, so it is rolled back whole and can simply be tried again;
    the product's transaction, not the harness's, is the one that must not be lost."""
    from django.db import OperationalError
    from django.db.backends.base.operations import BaseDatabaseOperations

    original = BaseDatabaseOperations.execute_sql_flush
    if getattr(original, "retries_a_deadlock", False):
        return

    def execute_sql_flush(self: BaseDatabaseOperations, sql_list: list[str]) -> None:
        for attempt in range(5):
            try:
                return original(self, sql_list)
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    execute_sql_flush.retries_a_deadlock = True  # type: ignore[attr-defined]
    BaseDatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


T = TypeVar("T")


def run_async(scenario: Awaitable[T], timeout: float = 60) -> T:
    """Run a test's async scenario (a WebSocket client, a relay step) to its end.

    Not ``asyncio.run``: there, every ``database_sync_to_async`` call goes to one thread
    that asgiref shares across the whole process, and cancelling a scenario waits for that
    thread, so one call blocked there hangs the next test until pytest's 600-s timeout
    (CI once hung so, cancelling a scenario). ``async_to_sync`` runs those calls on this
    test's own thread instead. The
    channel layer is made afresh on the new loop (channels_redis keeps per-loop receive
    state), and ``timeout`` ends a scenario that waits for something that never comes."""
    from asgiref.sync import async_to_sync
    from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)

    async def bounded() -> T:
        return await asyncio.wait_for(scenario, timeout)

    return async_to_sync(bounded)()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@dataclass
class Stack:
    base_url: str
    env: dict[str, str]
    logs: Path


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[Any]:
    from django.conf import settings

    from pipelines.runtime.cluster import standalone as cluster

    wait_for_class_archive()
    info = cluster.start(Path(settings.SPARK_DIR))
    yield info
    cluster.stop(info)
    (Path(settings.SPARK_DIR) / "cluster.json").unlink(missing_ok=True)


# How many harness runs one standby serves before a fresh one takes over. The dbless
# lane's pool warmed four standbys for its ~20 runs at 8 (ci28): the first, and
# replacements for those lost with their runs (runners the fault tests kill) or
# retired after their 8th; each warm-up is a driver, an executor and two batches.
STANDBY_RUNS = 12


@pytest.fixture(scope="session")
def standby_pool(spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Any]:
    """Warm standby runners for the harness's runs (``harness.StandbyPool``): each run
    adopts one instead of paying a Spark application's start itself, and a run that
    stops cleanly gives it back for the next test (``STANDBY_RUNS`` runs each: a
    fresh application now and then bounds what a long-lived driver accumulates).
    ``STREAMWISE_TEST_STANDBYS=0`` starts every run cold."""
    from pipelines.runtime.runner.harness import StandbyPool

    if os.environ.get("STREAMWISE_TEST_STANDBYS", "1") == "0":
        yield None
        return
    pool = StandbyPool(tmp_path_factory.mktemp("standbys"), spark_cluster.master_url,
                       os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"),
                       runs_per_standby=STANDBY_RUNS).start()
    try:
        yield pool
    finally:
        pool.close()
        print(f"\nstandby pool: {pool.adopted} runs adopted a warm standby "
              f"({pool.reused} one that had served a run before), {pool.cold} started cold")


@pytest.fixture(autouse=True)
def _harness_runs_adopt_standbys(request: pytest.FixtureRequest) -> Iterator[None]:
    """The Spark tests without a database drive runners through the harness: they
    start them on the standby pool. (Those on the live stack start theirs through
    the control plane, which keeps no standby in tests.)"""
    from pipelines.runtime.runner.harness import RunnerProcess

    node = request.node
    if not (node.get_closest_marker("spark") and node.get_closest_marker("dbless")):
        yield
        return
    RunnerProcess.pool = request.getfixturevalue("standby_pool")
    try:
        yield
    finally:
        RunnerProcess.pool = None


@pytest.fixture(scope="session")
def one_worker(spark_cluster: Any) -> Callable[[dict[str, Any]], Any]:
    """Measure (once per pipeline shape, stored under var/) one worker's capacity and
    batch overhead on this machine, for tests whose numbers must follow the machine's
    speed rather than assume it: ``one_worker(definition) -> Calibration``."""
    from django.conf import settings

    from pipelines.runtime.runner import calibration

    def measure(definition: dict[str, Any]) -> Any:
        shape = calibration.shape_of(definition)
        return calibration.load_or_calibrate(
            Path(settings.VAR_DIR) / "calibration" / f"{shape}.json",
            spark_cluster.master_url, Path(settings.VAR_DIR) / "calibration" / shape,
            os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"), definition,
            progress=lambda m: print(m, flush=True))

    return measure


# How many runs the live stack's standby serves before a fresh one takes over.
LIVE_STANDBY_RUNS = 20


@pytest.fixture(scope="session")
def live_stack(django_db_setup: Any, django_db_blocker: Any,
               spark_cluster: Any) -> Iterator[Stack]:
    """Worker, beat, relay and daphne as separate processes on the test database."""
    from django.conf import settings

    from pipelines.management.processes import QUIET_WORKER, daphne_command
    from webapp.celery import app as celery_app

    with django_db_blocker.unblock():
        db_url = test_database_url()
    logs = Path(settings.VAR_DIR) / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # One standby runner that serves run after run (STANDBY_RUNS): each test's run
    # adopts it instead of paying an application's start. The alone pass turns it off
    # (STREAMWISE_TEST_LIVE_STANDBYS=0): a standby's warm-up beside its calibration
    # would change the machine the calibration measures.
    standbys = os.environ.get("STREAMWISE_TEST_LIVE_STANDBYS", "1")
    env = dict(os.environ, DATABASE_URL=db_url, RECONCILE_EVERY_S="1",
               STANDBY_RUNNERS=standbys, STANDBY_RUNS=str(LIVE_STANDBY_RUNS),
               RUNNER_START_GRACE_S="60", PYTHONUNBUFFERED="1",
               # The example plug-in vetoes every scale-down (pipelines/management/shares.py)
               QUIET_HOUR_END_MINUTES="60")
    py = sys.executable
    commands = {
        "worker": [py, "-m", "celery", "-A", "webapp", "worker", "-l", "info",
                   *QUIET_WORKER, "-Q", settings.CONTROL_QUEUE, "--concurrency", "3",
                   "-n", f"test-{port}@%h"],
        "lab-worker": [py, "-m", "celery", "-A", "webapp", "worker", "-l", "info",
                       *QUIET_WORKER, "-Q", settings.LAB_QUEUE, "--concurrency", "1",
                       "-n", f"lab-test-{port}@%h"],
        "beat": [py, "-m", "celery", "-A", "webapp", "beat", "-l", "info",
                 "-s", str(logs / "celerybeat-schedule")],
        "relay": [py, str(ROOT / "manage.py"), "relay"],
        "web": daphne_command(port),
    }
    procs = []
    for name, args in commands.items():
        out = open(logs / f"{name}.log", "wb")
        procs.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                      cwd=ROOT, start_new_session=True))

    def web_up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(web_up, 60, "daphne to listen")
        wait_for(lambda: len(celery_app.control.ping(timeout=0.5) or []) >= 2, 60,
                 "the Celery workers of both queues")
        yield Stack(base_url=f"http://127.0.0.1:{port}", env=env, logs=logs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        # Its standby is a detached process (as in the product): once beat and the
        # worker are gone, nothing starts another.
        from pipelines import launch

        launch.stop_standbys()
        _end_other_sessions(django_db_blocker)


def _end_other_sessions(django_db_blocker: Any) -> None:
    """PostgreSQL refuses to drop the test DB while a session is open on it; a Celery
    pool child or a thread of this process may still hold one at teardown."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def _create_operator() -> Any:
    from django.contrib.auth.models import User

    return User.objects.create_superuser("operator", "op@example.com", "op-pass-123")


@pytest.fixture
def operator(transactional_db: Any) -> Any:
    return _create_operator()


@pytest.fixture
def local_operator(db: Any) -> Any:
    """A superuser inside the test's own transaction, for tests without the live stack:
    their runs stay invisible to a live stack left up by earlier tests (its control
    dispatcher would tick them), and on-commit hooks never queue real Celery tasks for
    runs that have no runner."""
    return _create_operator()


SMALL_DEFINITION = {
    "source": {"type": "generator", "seed": 3, "partitions": 2,
               "rate": {"kind": "constant", "records_per_s": 800},
               "keys": {"kind": "zipf", "n": 200, "s": 1.1}},
    "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count", "field": "value"}],
    "sink": {"type": "latency"},
    "key_groups": 4,
}


def make_pipeline_and_policy(user: Any, name: str = "small", max_workers: int = 1,
                             initial_workers: int = 1) -> tuple[Any, Any]:
    from control.models import Policy
    from pipelines import actions
    from pipelines.models import Pipeline

    pipeline = actions.save_pipeline(Pipeline(name=name, definition=SMALL_DEFINITION), user)
    policy = Policy.objects.create(name=f"{name}-policy", latency_bound_ms=5000,
                                   power_budget_w=40, min_workers=1,
                                   initial_workers=initial_workers, max_workers=max_workers)
    return pipeline, policy


def run_status(run_id: int) -> str:
    from pipelines.models import Run

    return Run.objects.get(pk=run_id).status


def stop_and_wait(run_id: int, user: Any) -> None:
    """Leave no run behind: the DB is flushed after each test."""
    from pipelines import actions
    from pipelines.models import Run

    run = Run.objects.get(pk=run_id)
    if not run.is_terminal:
        actions.request_stop(run, user)
        wait_for(lambda: Run.objects.get(pk=run_id).is_terminal, 90, f"run {run_id} to end")
