"""The fleet's gate in the product's control loop without Spark (real Redis, the real
database): excluded periods, the example decision plug-in, the arbiter's refusals and
preemptions, each a decision with its reason and an audited event."""
from __future__ import annotations

import pytest

from tests.conftest import make_pipeline_and_policy
from tests.web.test_control_loop import _publish


def _run(user, name: str = "loop", **policy_fields):
    """A running run under lat-node whose first control step has been taken (the
    controller's first step holds), so that the next one decides on the load."""
    from control import ticks
    from control.models import Policy
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name=name, max_workers=2)
    Policy.objects.filter(pk=policy.pk).update(strategy="lat-node", control_step_s=2,
                                               strategy_params={"horizon": 2},
                                               **policy_fields)
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=user, workers=1, key_groups=4,
                             frequencies=[1.2, 1.6, 2.0], frequency_ghz=2.0)
    run = Run.objects.select_related("policy").get(pk=run.pk)
    _publish(run, range(0, 6), rate=RATE, duration=1.0)
    ticks.tick(run)
    return run


# One worker takes 8 s for a second's records (saturated), two take 4 (not): the rate is
# the same as in the first step, so the forecast is the rate.
RATE = 20_000


def _overloaded(run, first: int = 6) -> None:
    _publish(run, range(first, first + 6), rate=RATE, duration=8.0)


@pytest.mark.django_db
def test_an_excluded_period_holds_the_controller_and_scaling_resumes_after_it(
        local_operator, clean_bus, settings) -> None:
    from control import ticks
    from control.models import Policy

    settings.CLUSTER_CORES = 8
    run = _run(local_operator, excluded_periods=["* * * * *"])
    _overloaded(run)
    first = ticks.tick(run)
    assert first.action != "hold" and first.outcome == "excluded"
    assert "excluded period '* * * * *'" in first.outcome_message
    _overloaded(run, 12)
    assert ticks.tick(run).outcome == "excluded"
    held = run.events.filter(kind="held")
    assert held.count() == 1  # once per streak, not every step
    assert "excluded period" in held.get().message
    # The period ends (the policy's list emptied): the next step scales.
    Policy.objects.filter(pk=run.policy_id).update(excluded_periods=[])
    _overloaded(run, 18)
    resumed = ticks.tick(run)
    assert resumed.outcome == "pending" and resumed.chosen_workers == 2


@pytest.mark.django_db
def test_the_cluster_wide_excluded_periods_hold_every_run(local_operator, clean_bus,
                                                          settings) -> None:
    from control import ticks

    from control.models import FleetSettings

    FleetSettings.objects.update_or_create(pk=1, defaults={"excluded_periods": ["* * * * *"]})
    run = _run(local_operator)
    _overloaded(run)
    assert ticks.tick(run).outcome == "excluded"


@pytest.mark.django_db
def test_the_example_plugin_vetoes_a_scale_down_live_and_in_a_dry_run(
        local_operator, clean_bus, monkeypatch) -> None:
    from control import ticks
    from pipelines.models import Run

    monkeypatch.setenv("QUIET_HOUR_END_MINUTES", "60")  # every minute is the hour's end
    run = _run(local_operator, decision_plugins=["quiet-hour-end"])
    Run.objects.filter(pk=run.pk).update(workers=2)
    run.refresh_from_db()
    _publish(run, range(6, 12), rate=50)  # nearly idle: two workers are one too many
    d = ticks.tick(run)
    assert d.chosen_workers == 1 and d.outcome == "vetoed"
    assert d.outcome_message.startswith("plug-in quiet-hour-end: no scale-down in the last "
                                        "60 minutes of the hour")
    assert run.events.filter(kind="held", message__contains="vetoed").exists()
    ticks.set_dry_run(run, True, local_operator)
    _publish(run, range(12, 18), rate=50)
    dry = ticks.tick(run)
    assert dry.outcome == "vetoed" and dry.outcome_message.startswith(
        "dry run: plug-in quiet-hour-end")
    monkeypatch.setenv("QUIET_HOUR_END_MINUTES", "0")
    _publish(run, range(18, 24), rate=50)
    assert ticks.tick(run).outcome == "dry-run"  # no longer vetoed


def _two_runs(user, settings, cores: int):
    from django.utils import timezone

    from control.models import Policy
    from pipelines.models import MetricSample, Run

    settings.CLUSTER_CORES = cores
    high = _run(user, priority=5)
    low = _run(user, name="low")
    Policy.objects.filter(pk=low.policy_id).update(priority=1, strategy="manual")
    Run.objects.filter(pk=low.pk).update(workers=2)
    low.refresh_from_db()
    # Its query has run a batch: its key groups are placed, so they can move.
    MetricSample.objects.create(run=low, t=timezone.now(), batch_id=0, workers=2)
    return high, low


@pytest.mark.django_db
def test_a_higher_priority_run_takes_a_core_back_by_a_planned_scale_down(
        local_operator, clean_bus, settings) -> None:
    from control import ticks
    from control.models import Decision
    from pipelines.models import Run

    high, low = _two_runs(local_operator, settings, cores=3)
    _overloaded(high)
    asked = ticks.tick(high)
    # Granted at once: the new executor is requested while the low-priority run's key
    # groups move off the core it gives back.
    assert asked.chosen_workers == 2 and asked.outcome == "pending"
    assert f"1 core(s) being released by run {low.pk}" in asked.outcome_message
    taken = Decision.objects.get(run=low, strategy="arbiter")
    assert (taken.outcome, taken.current_workers, taken.chosen_workers) == ("pending", 2, 1)
    assert taken.reason.startswith("preempted: 1 core(s) taken back by planned migration; "
                                   f"run {high.pk} (priority 5 > 1) needs it")
    assert low.events.filter(kind="preempted").exists()
    # Both reconfigurations take effect; the next step holds at 2, and nothing more is
    # taken from the low-priority run.
    ticks.finish(taken.pk, True, "ok")
    ticks.finish(asked.pk, True, "ok")
    Run.objects.filter(pk=low.pk).update(workers=1)
    Run.objects.filter(pk=high.pk).update(workers=2)
    high.refresh_from_db()
    _overloaded(high, 12)
    ticks.tick(high)
    assert Decision.objects.filter(run=low, strategy="arbiter").count() == 1
    low.refresh_from_db()
    claims = [ticks._claim(r, r.policy_in_force) for r in (high, low)]
    assert [(c.held, c.priority) for c in claims] == [(2, 5), (1, 1)]


@pytest.mark.django_db
def test_first_come_first_served_refuses_and_never_preempts(local_operator, clean_bus,
                                                           settings) -> None:
    from control import ticks
    from control.models import Decision

    from control.models import FleetSettings

    FleetSettings.objects.update_or_create(pk=1, defaults={"arbiter": "fcfs"})
    high, low = _two_runs(local_operator, settings, cores=3)
    _overloaded(high)
    d = ticks.tick(high)
    assert d.outcome == "refused" and "first come, first served" in d.outcome_message
    assert not Decision.objects.filter(run=low, strategy="arbiter").exists()


@pytest.mark.django_db
def test_a_dry_run_says_whom_it_would_preempt_and_preempts_nobody(
        local_operator, clean_bus, settings) -> None:
    from control import ticks
    from control.models import Decision

    high, low = _two_runs(local_operator, settings, cores=3)
    ticks.set_dry_run(high, True, local_operator)
    _overloaded(high)
    d = ticks.tick(high)
    assert d.outcome == "refused"
    assert f"would take back 1 from run {low.pk}" in d.outcome_message
    assert not Decision.objects.filter(run=low, strategy="arbiter").exists()


@pytest.mark.django_db
def test_bad_fleet_fields_are_form_errors_and_nothing_is_stored(local_operator) -> None:
    from control.forms import PolicyForm
    from control.models import Policy

    data = {"name": "fleet", "latency_bound_ms": 2000, "throughput_floor_rps": 0,
            "power_budget_w": 30, "control_step_s": 2, "min_workers": 1,
            "initial_workers": 1, "max_workers": 2, "strategy": "lat-node",
            "strategy_params": "{}", "violation_steps": 3}
    for extra, field, message in [
        ({"excluded_periods": "61 * * * *"}, "excluded_periods", "not a valid cron"),
        ({"excluded_periods": "* * *"}, "excluded_periods", "has 5 fields"),
        ({"decision_plugins": ["ghost"]}, "decision_plugins", "not one of the available"),
        ({"guaranteed_workers": 3}, "guaranteed_workers", "at most max workers (2)"),
        ({"priority": 0}, "priority", "greater than or equal to 1"),
    ]:
        form = PolicyForm({**data, **extra})
        assert not form.is_valid()
        assert message in " ".join(form.errors[field]), form.errors
    assert not Policy.objects.filter(name="fleet").exists()
    form = PolicyForm({**data, "excluded_periods": "50-59 * * * *\n* 2 * * *",
                       "decision_plugins": ["quiet-hour-end"], "priority": 3})
    assert form.is_valid(), form.errors
    saved = form.save()
    assert saved.excluded_periods == ["50-59 * * * *", "* 2 * * *"]
    assert saved.decision_plugins == ["quiet-hour-end"] and saved.guaranteed_workers == 1


@pytest.mark.django_db
def test_the_cluster_page_shows_each_runs_share_and_admins_edit_the_fleet_settings(
        local_operator, clean_bus, settings) -> None:
    from django.test import Client

    from audit.models import AuditEntry
    from control.models import FleetSettings
    from tests.web.test_roles import _user

    settings.CLUSTER_CORES = 3
    high, low = _two_runs(local_operator, settings, cores=3)
    _overloaded(high)
    from control import ticks

    ticks.tick(high)
    viewer = Client()
    viewer.force_login(_user("watcher", "viewer"))
    page = viewer.get("/cluster/").content.decode()
    assert 'id="fleet-shares"' in page and f'data-run="{low.pk}"' in page
    assert "arbiter" in page and "preempted" in page  # the low run's latest decision
    assert 'id="fleet-settings"' not in page  # not an admin
    assert viewer.post("/cluster/", {"arbiter": "fcfs"}).status_code == 403
    assert "quiet-hour-end" in page  # the installed plug-ins
    admin = Client()
    admin.force_login(local_operator)
    bad = admin.post("/cluster/", {"arbiter": "priority", "cores_limit": "2",
                                   "excluded_periods": "99 * * * *"})
    assert bad.status_code == 200 and "not a valid cron expression" in bad.content.decode()
    assert FleetSettings.current().excluded_periods == []
    ok = admin.post("/cluster/", {"arbiter": "fcfs", "cores_limit": "2",
                                  "excluded_periods": "* 2 * * *"})
    assert ok.status_code == 302
    shared = FleetSettings.current()
    assert (shared.arbiter, shared.cores_limit, shared.excluded_periods) == \
        ("fcfs", 2, ["* 2 * * *"])
    assert ticks.fleet_capacity(shared)[0] == 2
    entry = AuditEntry.objects.filter(target_type__icontains="fleet").latest("at")
    assert entry.actor == "user:operator" and entry.after["arbiter"] == "fcfs"


@pytest.mark.django_db
def test_the_fleet_page_shows_every_active_run_at_a_glance(local_operator, clean_bus,
                                                           settings) -> None:
    from django.test import Client

    from control import fleetview, ticks
    from pipelines.models import MetricSample

    high, low = _two_runs(local_operator, settings, cores=3)
    for i, p95 in enumerate((1200.0, 4000.0, 6100.0)):
        MetricSample.objects.create(run=high, t=ticks.timezone.now(), batch_id=i,
                                    latency_p95_ms=p95, output_rate=880.0, input_rate=900.0,
                                    workers=1)
    _overloaded(high)
    ticks.tick(high)
    client = Client()
    client.force_login(local_operator)
    response = client.get("/")
    assert response.status_code == 302 and response.url == "/fleet/"
    page = client.get("/fleet/").content.decode()
    assert 'id="fleet-runs"' in page and f'data-run="{high.pk}"' in page
    assert f'data-run="{low.pk}"' in page
    assert "3 of 3 cores in use" in page.replace("<strong>", "").replace("</strong>", "")
    assert "6100 / 5000 ms" in page and 'class="spark over"' in page
    assert "880" in page and "being released by run" in page
    # The sparkline: every batch a point, the bound a line inside the box.
    line = fleetview.sparkline([1200.0, None, 6100.0], 5000.0)
    assert line.points.count(",") == 2 and line.over and 0 < line.bound_y < line.height
    assert fleetview.sparkline([], 5000.0).points == ""


@pytest.mark.django_db
def test_the_runs_page_preselects_the_readmes_first_run(local_operator) -> None:
    from django.test import Client

    from control.models import Policy
    from pipelines import actions
    from pipelines.management.commands.seed_demo import ELASTIC_PIPELINE, ELASTIC_POLICY
    from pipelines.models import Pipeline
    from tests.conftest import SMALL_DEFINITION

    for name in ("A first pipeline", ELASTIC_PIPELINE):
        actions.save_pipeline(Pipeline(name=name, definition=SMALL_DEFINITION), local_operator)
    for name in ("a-policy", ELASTIC_POLICY):
        Policy.objects.create(name=name, latency_bound_ms=5000, power_budget_w=40)
    client = Client()
    client.force_login(local_operator)
    page = client.get("/runs/").content.decode()
    pipeline = Pipeline.objects.get(name=ELASTIC_PIPELINE)
    policy = Policy.objects.get(name=ELASTIC_POLICY)
    assert f'<option value="{pipeline.pk}" selected>' in page
    assert f'<option value="{policy.pk}" selected>' in page


@pytest.mark.django_db
def test_a_stalled_run_still_holds_its_cores_and_is_not_preempted(local_operator, clean_bus,
                                                                   settings) -> None:
    """A slow batch makes a run "stalled" for a moment: its executors are still there,
    so the arbiter counts them, and it takes nothing back from a run that cannot migrate
    now."""
    from control import ticks
    from control.models import Decision
    from pipelines.models import Run

    high, low = _two_runs(local_operator, settings, cores=3)
    Run.objects.filter(pk=low.pk).update(status="stalled")
    _overloaded(high)
    d = ticks.tick(high)
    assert d.outcome == "refused" and d.chosen_workers == 2
    assert not Decision.objects.filter(run=low, strategy="arbiter").exists()


@pytest.mark.django_db
def test_a_run_whose_query_has_run_no_batch_keeps_its_cores(local_operator, clean_bus,
                                                             settings) -> None:
    """Its key groups are not placed yet: nothing could move off the core."""
    from control import ticks
    from control.models import Decision
    from pipelines.models import MetricSample

    high, low = _two_runs(local_operator, settings, cores=3)
    MetricSample.objects.filter(run=low).delete()
    _overloaded(high)
    assert ticks.tick(high).outcome == "refused"
    assert not Decision.objects.filter(run=low, strategy="arbiter").exists()
