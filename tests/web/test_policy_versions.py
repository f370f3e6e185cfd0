"""Policy versions: an edit is a new version, a run keeps the version it started with,
an operator switches it on the run page (audited), and a version the run's Spark
application cannot reach is refused with the reason."""
from __future__ import annotations

import pytest

from tests.conftest import make_pipeline_and_policy


def _running_run(user, **policy_fields):
    from control import policies
    from pipelines import actions
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name="versioned", max_workers=2)
    for name, value in policy_fields.items():
        setattr(policy, name, value)
    policies.save_policy(policy, user)
    run = actions.create_run(pipeline, policy, user)
    Run.objects.filter(pk=run.pk).update(status="running", max_workers_cap=policy.max_workers)
    return Run.objects.select_related("policy").get(pk=run.pk), policy


@pytest.mark.django_db
def test_an_edit_is_a_new_version_and_a_rename_is_not(local_operator) -> None:
    from control import policies
    from control.models import PolicyVersion

    _pipeline, policy = make_pipeline_and_policy(local_operator, name="p")
    policies.save_policy(policy, local_operator)
    assert policy.version == 1
    policy.description = "a label only"
    policy.name = "p-renamed"
    policies.save_policy(policy, local_operator)
    assert policy.version == 1 and policy.versions.count() == 1
    policy.latency_bound_ms = 2500
    policies.save_policy(policy, local_operator)
    assert policy.version == 2
    assert PolicyVersion.objects.get(policy=policy, version=1).values["latency_bound_ms"] == 5000
    assert PolicyVersion.objects.get(policy=policy, version=2).values["latency_bound_ms"] == 2500


@pytest.mark.django_db
def test_a_run_keeps_its_version_after_the_policy_is_edited(local_operator) -> None:
    from control import policies, ticks

    run, policy = _running_run(local_operator, strategy="lat-node", control_step_s=2.0)
    assert run.policy_version == 1
    policy.control_step_s = 10.0
    policy.strategy = "manual"
    policies.save_policy(policy, local_operator)
    run.refresh_from_db()
    in_force = run.policy_in_force
    assert (in_force.version, in_force.control_step_s, in_force.strategy) == \
        (1, 2.0, "lat-node")
    # The controller still ticks it under v1 (a manual v2 would have stopped it).
    assert run in ticks.due_runs(now=1e12)
    assert ticks.loop_policy(in_force, run).control_step_s == 2.0


@pytest.mark.django_db
def test_switching_the_version_is_audited_and_an_unreachable_limit_refused(
        local_operator) -> None:
    from control import policies

    run, policy = _running_run(local_operator)
    policy.latency_bound_ms = 1234
    policies.save_policy(policy, local_operator)
    ok, message = policies.switch_version(run, 2, local_operator)
    assert ok, message
    run.refresh_from_db()
    assert run.policy_version == 2 and run.policy_in_force.latency_bound_ms == 1234
    event = run.events.get(kind="policy_switched")
    assert event.actor == "user:operator" and event.payload["from"] == 1
    # v3 wants more workers than the run's application was started with.
    policy.max_workers = 4
    policies.save_policy(policy, local_operator)
    ok, message = policies.switch_version(run, 3, local_operator)
    assert not ok and "at most 2 (spark.cores.max)" in message and "new run" in message
    run.refresh_from_db()
    assert run.policy_version == 2
    assert policies.switch_version(run, 9, local_operator) == (
        False, f"policy {policy.name} has no version 9")


@pytest.mark.django_db
def test_the_run_page_offers_the_latest_version(client, local_operator) -> None:
    from control import policies

    run, policy = _running_run(local_operator)
    client.force_login(local_operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"policy {policy.name} v1" in page and "switch-policy-version" not in page
    policy.power_budget_w = 33
    policies.save_policy(policy, local_operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "(latest v2)" in page and 'id="switch-policy-version"' in page
    response = client.post(f"/runs/{run.pk}/policy-version/", {"version": "2"}, follow=True)
    assert f"now uses {policy.name} v2" in response.content.decode()
    response = client.post(f"/runs/{run.pk}/policy-version/", {"version": "x"}, follow=True)
    assert "version: a whole number" in response.content.decode()
