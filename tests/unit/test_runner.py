"""Runner guards that need no Spark session."""
from __future__ import annotations

import json

import pytest

from pipelines.runtime import bus as busmod
from pipelines.runtime.spec.definition import DEMO_DEFINITION
from pipelines.runtime.query.compiler import BatchCommit
from pipelines.runtime.runner.runner import Runner, RunnerConfig

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass


def _runner(tmp_path, t0=None) -> Runner:
    cfg = RunnerConfig(run_id=1, bus_key="1.test", redis_url="redis://127.0.0.1:6379/14",
                       master_url="spark://127.0.0.1:1", checkpoint_dir=str(tmp_path),
                       definition=DEMO_DEFINITION, t0=t0)
    return Runner(cfg, busmod.RunnerBus(busmod.connect(cfg.redis_url), cfg.bus_key))


def test_a_new_run_never_resumes_an_existing_checkpoint(tmp_path) -> None:
    assert _runner(tmp_path)._checkpoint() == tmp_path / "checkpoint"
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="already has offsets"):
        _runner(tmp_path)._checkpoint()
    # A deliberate resume pins the original schedule clock.
    assert _runner(tmp_path, t0=1.0e9)._checkpoint() == tmp_path / "checkpoint"


def test_bad_config_is_refused_with_one_line(tmp_path, capsys) -> None:
    from pipelines.runtime.runner.runner import main

    (tmp_path / "cfg.json").write_text('{"run_id": 1}')
    assert main([str(tmp_path / "cfg.json")]) == 2
    assert capsys.readouterr().err.startswith("error: bad runner config")


def test_the_control_plane_waits_for_an_ack_as_long_as_a_migration_may_run() -> None:
    """A scale-up's ack comes after the executor started and the migration finished; a
    shorter wait marked it failed while the runner went on to apply it."""
    from django.conf import settings

    from pipelines.runtime.elastic.reconfigure import MIGRATION_TIMEOUT_S

    assert settings.COMMAND_ACK_TIMEOUT_S >= MIGRATION_TIMEOUT_S + 60


def test_a_runner_event_kind_outside_the_contract_is_refused() -> None:
    bus = busmod.RunnerBus(busmod.connect("redis://127.0.0.1:6379/14"), "1.kinds")
    try:
        with pytest.raises(ValueError):
            bus.publish_event("scaled", workers=2)  # type: ignore[arg-type]
        bus.publish_event(busmod.RunnerEvent.WORKERS_CHANGED, workers=2)
        entry = bus.r.xrange(busmod.events_key("1.kinds"))[-1][1]
        assert '"type": "workers_changed"' in entry["e"]
    finally:
        busmod.ControlBus(bus.r, bus.key).reset()


def test_only_the_runners_commands_can_be_sent() -> None:
    control = busmod.ControlBus(busmod.connect("redis://127.0.0.1:6379/14"), "1.commands")
    bus = busmod.RunnerBus(control.r, control.key)
    try:
        with pytest.raises(ValueError):
            control.send_command("scale", workers=2)
        cid = control.send_command(busmod.RunnerCommand.SET_WORKERS, workers=2)
        (_entry, command), = bus.read_commands("0-0", block_ms=10)
        assert command == {"id": cid, "name": "set_workers", "args": {"workers": 2},
                           "sent_at": command["sent_at"],
                           "deadline": command["sent_at"] + busmod.COMMAND_TTL_S}
        bus.ack(cid, True, "done", workers=2)
        assert control.wait_ack(cid, 5)["workers"] == 2
    finally:
        control.reset()


def _acks(bus: busmod.RunnerBus) -> list[dict]:
    return [json.loads(f["a"]) for _id, f in bus.r.xrange(busmod.acks_key(bus.key))]


def test_a_runner_applies_no_command_twice_and_none_past_its_deadline(tmp_path) -> None:
    """A redelivered request (same id) is acknowledged, not applied again; a
    reconfiguration past its deadline is refused, on receipt or after waiting in the
    runner's queue; a stop is never too late."""
    import time

    runner = _runner(tmp_path)
    bus = runner.bus
    control = busmod.ControlBus(bus.r, bus.key)
    control.reset()
    try:
        runner.phase = "running"
        now = time.time()
        fresh = {"id": "fresh", "name": "set_workers", "args": {"workers": 2},
                 "sent_at": now, "deadline": now + 60}
        runner._dispatch(fresh)
        runner._dispatch(dict(fresh))
        runner._dispatch({**fresh, "id": "stale", "deadline": now - 5})
        assert runner.reconfig.queue.get_nowait() == fresh
        assert runner.reconfig.queue.empty()
        duplicate, stale = _acks(bus)
        assert (duplicate["command_id"], duplicate["ok"], duplicate["duplicate"]) == \
            ("fresh", False, True)
        assert (stale["command_id"], stale["ok"], stale["expired"]) == ("stale", False, True)
        # Queued in time, then waited behind a long migration past its deadline.
        runner.reconfig.submit({**fresh, "id": "waited", "deadline": time.time() + 0.05})
        runner.reconfig.submit(None)
        time.sleep(0.1)
        runner.reconfig.loop()
        waited = _acks(bus)[-1]
        assert waited["command_id"] == "waited" and waited["expired"]
        assert "queued behind" in waited["message"]
        runner._dispatch({"id": "stop", "name": "stop", "args": {}, "sent_at": now - 600,
                          "deadline": now - 480})
        assert _acks(bus)[-1]["ok"] and runner.stop_event.is_set()
    finally:
        control.reset()


def test_a_batchs_metrics_record_is_the_typed_contract_the_control_plane_reads(tmp_path) -> None:
    """The record the runner builds from Spark's progress and the sink's commit has
    exactly the fields ``bus.MetricsRecord`` declares, and every field the relay stores
    or pushes (``pipelines.actions``) is one of them."""
    from types import SimpleNamespace
    from typing import get_type_hints

    from pipelines.actions import GROUP_FIELDS, SAMPLE_FIELDS
    from pipelines.runtime.elastic.placement import BatchTasks, TaskRecord

    runner = _runner(tmp_path, t0=1000.0)
    metrics, groups = runner.metrics, runner.spec.key_groups
    runner.workers = 2
    metrics.on_commit(BatchCommit(batch_id=3, output_rows=40, started_at=1009.5,
                                  committed_at=1010.0, generation=0, epoch=3))
    row = SimpleNamespace(asDict=lambda: {"records": 40, "first_emit": 1009.0,
                                          "q": [1009.1, 1009.2, 1009.5]})
    progress = SimpleNamespace(
        batchId=3, runId="run-3", observedMetrics={"sw_latency": row}, numInputRows=40,
        inputRowsPerSecond=80.0, processedRowsPerSecond=90.0,
        durationMs={"triggerExecution": 400, "addBatch": 300},
        stateOperators=[SimpleNamespace(numRowsTotal=12)],
        timestamp="2026-11-25T10:00:00.000Z",
        sources=[SimpleNamespace(startOffset='{"offset": 100}', endOffset='{"offset": 140}',
                                 latestOffset='{"offset": 150}')])
    record = metrics.on_progress(progress)
    assert record is not None and metrics.queue.get_nowait() is record
    assert record["latency_p50_ms"] == pytest.approx(500.0)
    assert (record["source_start"], record["source_end"], record["source_latest"]) == \
        (100, 140, 150)
    tasks = BatchTasks(batch_id=3, tasks={
        g: TaskRecord(group=g, executor=str(g % 2), duration_ms=20, run_ms=10 + g,
                      records=5, locality="PROCESS_LOCAL", status="SUCCESS", attempt=0)
        for g in range(groups)})
    metrics.enrich(record, tasks)
    declared = get_type_hints(busmod.MetricsRecord)
    optional = busmod.MetricsRecord.__optional_keys__
    assert set(record) <= set(declared)
    assert set(declared) - set(record) <= {"monitor_error", "run_id", "written_at"}
    # A sample's ``groups`` is built from the record's GROUP_FIELDS.
    assert (set(SAMPLE_FIELDS) - {"groups"}) | set(GROUP_FIELDS) <= set(declared)
    assert busmod.MetricsRecord.__required_keys__.isdisjoint(optional)
    assert metrics.loads() == [float(10 + g) for g in range(groups)]
    # The heartbeat's progress facts: ~2,000 events/s scheduled since t0 = 1000, 140 read.
    assert metrics.progress_facts(1010.0) == {"last_batch_at": 1010.0, "input_waiting": True,
                                              "expected_batch_s": 0.4}
    assert metrics.progress_facts(1000.01)["input_waiting"] is False


def test_checkpoint_files_go_through_the_filesystem_api_unless_set_and_a_bad_name_is_refused(
        monkeypatch) -> None:
    """``$STREAMWISE_CHECKPOINT_FILES`` names the checkpoint file manager every session
    uses (session.py: FileContext's rename forks `readlink` per file here); both classes
    are in the PySpark this installation pins."""
    import zipfile
    from pathlib import Path

    import pyspark

    from pipelines.runtime.query import session

    monkeypatch.delenv(session.CHECKPOINT_FILES_ENV, raising=False)
    assert session.checkpoint_file_manager() == session.CHECKPOINT_FILE_MANAGERS["filesystem"]
    monkeypatch.setenv(session.CHECKPOINT_FILES_ENV, "filecontext")
    assert session.checkpoint_file_manager().endswith(".FileContextBasedCheckpointFileManager")
    monkeypatch.setenv(session.CHECKPOINT_FILES_ENV, "hdfs")
    with pytest.raises(ValueError, match="STREAMWISE_CHECKPOINT_FILES must be one of "
                                         "filesystem, filecontext, not 'hdfs'"):
        session.checkpoint_file_manager()
    [jar] = (Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar")
    classes = set(zipfile.ZipFile(jar).namelist())
    for name in session.CHECKPOINT_FILE_MANAGERS.values():
        assert name.replace(".", "/") + ".class" in classes, name


def test_a_failing_operators_traceback_puts_the_users_frames_first() -> None:
    """What a run page shows when a package's operator raised: the exception, then the
    frames outside Streamwise and PySpark (innermost first), then Spark's account."""
    from pipelines.runtime.runner.runner import query_failure

    spark_says = (
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback "
        "(most recent call last):\n"
        '  File "/work/main/pipelines/runtime/operators/catalogue.py", line 330, in run_pe\n'
        "    df = op.fn(df, step.params)\n"
        '  File "/srv/team/orders_ops/__init__.py", line 40, in order_receipt\n'
        "    digest = sign(key)\n"
        '  File "/srv/team/orders_ops/crypto.py", line 7, in sign\n'
        '    raise ValueError("customer 17 has no key")\n'
        "ValueError: customer 17 has no key\n SQLSTATE: 38000\n=== Streaming Query ===\n")
    text = query_failure(spark_says)
    head = text.splitlines()
    assert head[0] == "a Python operator raised ValueError: customer 17 has no key"
    assert head[1] == "user code, innermost frame first:"
    assert head[2].endswith("crypto.py\", line 7, in sign")
    assert "orders_ops/__init__.py" in head[4] and "catalogue.py" not in "\n".join(head[:7])
    assert text.endswith(spark_says)  # Spark's whole account after it
    assert query_failure("Job aborted: executor lost") == \
        "streaming query ended: Job aborted: executor lost"


def test_the_cluster_follows_its_master_ui_to_the_port_it_bound(tmp_path) -> None:
    """A free port found, then taken by another process before the master bound it:
    the master moves on (Spark's port retry) and its log says where; the cluster's
    readiness check asks there (as in a CI run on 2026-12-07, where it asked the
    taken port for 60 s)."""
    from pipelines.runtime.cluster.standalone import bound_ui_port

    log = tmp_path / "master.log"
    assert bound_ui_port(log) is None
    earlier = "26/12/07 01:27:51 INFO Utils: Successfully started service 'MasterUI' on port 56077.\n"
    log.write_text(earlier)  # (a master of an earlier run: the log is appended to)
    assert bound_ui_port(log, len(earlier)) is None
    with open(log, "a") as f:
        f.write(
        "26/12/07 03:25:31 INFO JettyUtils: Start Jetty 127.0.0.1:36473 for MasterUI\n"
        "26/12/07 03:25:31 WARN Utils: Service 'MasterUI' could not bind on port 36473. "
        "Attempting port 36474.\n"
        "26/12/07 03:25:31 INFO Utils: Successfully started service 'MasterUI' on port "
        "36474.\n")
    assert bound_ui_port(log, len(earlier)) == 36474
