"""The closed loop's Django side without Spark: a tick reads the runner's records from
the real Redis stream, stores and pushes a Decision, keeps the controller across ticks,
never overlaps itself, honours dry run and a pending reconfiguration, raises alerts."""
from __future__ import annotations

import json

import pytest
from django.conf import settings

from tests.conftest import make_pipeline_and_policy


def _run(user, **policy_fields):
    from control.models import Policy
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name="loop", max_workers=2)
    Policy.objects.filter(pk=policy.pk).update(strategy="lat-node", control_step_s=2,
                                               strategy_params={"horizon": 2},
                                               **policy_fields)
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=user, workers=1, key_groups=4,
                             frequencies=[1.2, 1.6, 2.0], frequency_ghz=2.0)
    return Run.objects.select_related("policy").get(pk=run.pk)


def _publish(run, batches: range, rate: float, duration: float = 1.0) -> None:
    from control import live
    from pipelines.runtime import bus as busmod

    bus = busmod.RunnerBus(busmod.connect(settings.REDIS_URL), run.bus_key)
    for b in batches:
        t = 1_000.0 + b * duration
        # Batch ids past the start-up batches the controller does not decide on.
        bus.publish_metrics({"batch_id": b + live.WARMUP_BATCHES - 1, "t": t, "trigger_started_at": t - duration,
                             "input_rows": int(rate * duration), "records": int(rate * duration),
                             "batch_duration_ms": duration * 1000, "workers": 1,
                             "latency_p95_ms": 1950 * duration, "frequency_ghz": 2.0,
                             "power_w": 6.9, "source_latest": int(rate * t),
                             "source_end": int(rate * t)})


@pytest.mark.django_db
def test_ticks_store_decisions_and_keep_the_controller(local_operator, clean_bus) -> None:
    from control import ticks
    from control.models import Decision

    run = _run(local_operator)
    ticks.set_dry_run(run, True, local_operator)
    assert ticks.tick(run) is None  # no batch yet: nothing to decide on
    _publish(run, range(0, 6), rate=800)
    first = ticks.tick(run)
    assert first is not None and first.step == 1 and first.strategy == "lat-node"
    assert first.measured_latency_ms == pytest.approx(1950)
    assert first.predicted_latency_ms > 0 and len(first.predictions) == 2
    _publish(run, range(6, 12), rate=800)
    second = ticks.tick(run)
    assert second.step == 2 and second.inputs["batches"] == 6  # only the new batches
    assert second.model_error["last"]["latency"]["predicted"] is not None  # kept state
    assert second.outcome in ("hold", "dry-run")
    assert Decision.objects.filter(run=run).count() == 2
    assert run.events.filter(kind="dry_run_on").exists()
    json.dumps(second.as_dict(), allow_nan=False)


@pytest.mark.django_db
def test_a_tick_never_overlaps_and_waits_for_a_pending_reconfiguration(local_operator,
                                                                      clean_bus) -> None:
    from control import ticks

    run = _run(local_operator)
    _publish(run, range(0, 6), rate=800)
    r = ticks.launch.run_bus(run).r
    r.set(ticks._key(run, "lock"), "1")
    assert ticks.tick(run) is None  # the previous tick still holds the lock
    r.delete(ticks._key(run, "lock"))
    assert ticks.tick(run).step == 1  # an ordinary first step
    r.set(ticks._key(run, "pending"), "41")
    _publish(run, range(6, 12), rate=60_000, duration=8.0)  # overloaded: wants to scale
    d = ticks.tick(run)
    assert d.action != "hold" and d.outcome == "busy" and "41" in d.outcome_message
    assert not r.get(ticks._key(run, "lock"))


@pytest.mark.django_db
def test_alerts_are_audited_when_the_budget_binds(local_operator, clean_bus) -> None:
    from control import ticks
    from pipelines.runtime.host import power

    run = _run(local_operator, power_budget_w=power.modelled_power(1, 2.0) + 0.01,
               violation_steps=1)
    ticks.set_dry_run(run, True, local_operator)
    _publish(run, range(0, 8), rate=40_000, duration=6.0)
    d = ticks.tick(run)
    assert d.chosen_workers == 1  # 2 workers would break the budget
    assert any("QoS violated for 1 consecutive" in a for a in d.alerts)
    assert run.events.filter(kind="alert").count() == len(d.alerts)


@pytest.mark.django_db
def test_a_policy_the_loop_cannot_run_is_refused_once_with_why(local_operator, clean_bus) -> None:
    from control import ticks
    from control.models import Policy

    run = _run(local_operator)
    Policy.objects.filter(pk=run.policy_id).update(strategy_params={"horizon": 9})
    run.refresh_from_db()
    _publish(run, range(0, 4), rate=800)
    assert ticks.tick(run) is None
    refused = run.events.get(kind="controller_refused")
    assert "horizon: must be <= 5" in refused.message
    _publish(run, range(4, 8), rate=800)
    assert ticks.tick(run) is None  # refused again, not said again
    assert run.events.filter(kind="controller_refused").count() == 1


@pytest.mark.django_db
def test_the_controller_state_in_redis_is_json(local_operator, clean_bus) -> None:
    from control import live, ticks

    run = _run(local_operator)
    ticks.set_dry_run(run, True, local_operator)
    _publish(run, range(0, 6), rate=800)
    ticks.tick(run)
    r = ticks.launch.run_bus(run).r
    keys = list(r.scan_iter(ticks._key(run, "controller:*")))
    assert len(keys) == 1
    state = json.loads(r.get(keys[0]))
    assert state["step_index"] == 1 and state["strategy"] == "lat-node"
    r.set(keys[0], b"\x80\x04not json")  # what an older version (a pickle) left
    _publish(run, range(6, 12), rate=800)
    assert ticks.tick(run).step == 2  # a fresh controller, the run's next decision
    assert json.loads(r.get(keys[0]))["step_index"] == 1
    assert live.STATE_VERSION == state["version"]


@pytest.mark.django_db
def test_due_runs_follow_the_control_step(local_operator, clean_bus) -> None:
    from control import ticks

    run = _run(local_operator)
    assert run in ticks.due_runs(now=5_000.0)
    ticks.launch.run_bus(run).r.set(ticks._key(run, "last"), 5_000.0)
    assert run not in ticks.due_runs(now=5_001.0)
    assert run in ticks.due_runs(now=5_002.5)
    # Within half a beat of the step: taken at this beat, not the next one.
    assert run in ticks.due_runs(now=5_001.99)
    # The steps keep the period: a tick taken late stands for its slot...
    assert ticks.next_slot(5_000.0, 5_002.9, 2.0) == 5_002.0
    assert ticks.next_slot(5_000.0, 5_001.6, 2.0) == 5_002.0
    # ...unless a whole step was missed, and the schedule restarts from now.
    assert ticks.next_slot(5_000.0, 5_004.5, 2.0) == 5_004.5
    assert ticks.next_slot(None, 5_000.0, 2.0) == 5_000.0
