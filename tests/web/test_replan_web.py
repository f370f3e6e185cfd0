"""The live re-plan in the web app and the control plane, without Spark: the run page's
form (errors on bad input, an audited request on good input, a refusal with the reason
for a pipeline it does not cover), the runner's re-plan events on the timeline and the
run, and the controller re-planning before it scales past the key groups."""
from __future__ import annotations

import pytest
from django.test import Client

from control import live
from tests.conftest import make_pipeline_and_policy


def _run(user, definition=None, name="web-replan-df", **fields):
    from pipelines import actions
    from pipelines.models import Pipeline, Run

    if definition is None:
        pipeline, policy = make_pipeline_and_policy(user, name="web-replan", max_workers=8)
    else:
        _, policy = make_pipeline_and_policy(user, name=f"{name}-policy", max_workers=8)
        pipeline = actions.save_pipeline(Pipeline(name=name, definition=definition), user)
    return Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                              created_by=user, **{"status": "running", **fields})


@pytest.mark.django_db
def test_the_replan_form_refuses_bad_input_and_audits_a_request(local_operator) -> None:
    from pipelines.models import RunEvent

    run = _run(local_operator, key_groups=4)
    client = Client()
    client.force_login(local_operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="replan"' in page and "seamless hand-over" in page
    for groups, scheme, words in (("0", "seamless", "greater than or equal to 1"),
                                  ("5000", "seamless", "less than or equal to 1024"),
                                  ("x", "seamless", "Enter a whole number"),
                                  ("8", "teleport", "Select a valid choice")):
        r = client.post(f"/runs/{run.pk}/replan/", {"key_groups": groups, "scheme": scheme},
                        follow=True)
        assert words in r.content.decode(), (groups, scheme)
    assert not RunEvent.objects.filter(run=run, kind="reconfigure_requested").exists()
    r = client.post(f"/runs/{run.pk}/replan/", {"key_groups": "16", "scheme": "stop-restart"},
                    follow=True)
    assert "re-plan to 16 key groups (stop-restart)" in r.content.decode()
    requested = RunEvent.objects.get(run=run, kind="reconfigure_requested")
    assert requested.payload == {"command": "replan", "key_groups": 16,
                                 "scheme": "stop-restart"}
    assert requested.message == "re-plan 4 -> 16 key groups (stop-restart)"
    run.status = "stopped"
    run.save()
    r = client.post(f"/runs/{run.pk}/replan/", {"key_groups": "8", "scheme": "seamless"},
                    follow=True)
    assert "can be re-planned only while it is running" in r.content.decode()


@pytest.mark.django_db
def test_a_pipeline_without_a_state_hand_over_is_refused_with_the_reason(local_operator) -> None:
    from pipelines.models import RunEvent
    from pipelines.nexmark import queries

    # Q4 re-stamps auctions with their expiry: their state cannot be rebuilt by a replay.
    run = _run(local_operator, definition=queries.definition("Q4", 1000))
    client = Client()
    client.force_login(local_operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="replan" disabled' in page and "re-stamps the event time" in page
    r = client.post(f"/runs/{run.pk}/replan/", {"key_groups": "8", "scheme": "seamless"},
                    follow=True)
    assert "cannot be re-planned" in r.content.decode()
    assert not RunEvent.objects.filter(run=run, kind="reconfigure_requested").exists()


@pytest.mark.django_db
def test_replan_events_read_well_and_change_the_runs_key_groups(local_operator) -> None:
    from pipelines.relay import apply_runner_event

    run = _run(local_operator, key_groups=8)
    apply_runner_event(run.pk, "1-0", {"type": "replan_started", "scheme": "seamless",
                                       "generation": 1, "from_groups": 8, "to_groups": 16})
    apply_runner_event(run.pk, "2-0", {"type": "replan_switched", "generation": 1,
                                       "key_groups": 16, "epoch": 120, "after_batch": 3})
    apply_runner_event(run.pk, "3-0", {
        "type": "replan_done", "scheme": "seamless", "generation": 1, "from_groups": 8,
        "to_groups": 16, "downtime_s": 0.0, "disrupted_s": 4.5, "overlap_s": 7.2,
        "catch_up_s": 7.2, "snapshot_rows": 608582, "snapshot_s": 3.1,
        "worst_p95_ms": 2400.0, "overlap_from": 1.8e9, "overlap_to": 1.8e9 + 7.2})
    run.refresh_from_db()
    assert run.key_groups == 16
    done = run.events.get(kind="runner:replan_done")
    assert done.message == ("re-plan 8 → 16 key groups (seamless): downtime 0.0 s, disrupted "
                            "4.5 s, overlap 7.2 s, catch-up 7.2 s, state 608582 keys read in "
                            "3.1 s, worst p95 2400.0 ms")
    assert done.payload["overlap_to"] - done.payload["overlap_from"] == pytest.approx(7.2)
    # A dataflow pipeline's state is replayed; the message says where.
    apply_runner_event(run.pk, "4-0", {
        "type": "replan_done", "scheme": "seamless", "generation": 2, "from_groups": 16,
        "to_groups": 8, "downtime_s": 0.0, "disrupted_s": 1.0, "overlap_s": 5.0,
        "catch_up_s": 5.0, "snapshot_rows": 25000, "replayed": True,
        "state_built_in": "application", "worst_p95_ms": 1800.0})
    replayed = run.events.filter(kind="runner:replan_done").order_by("-at", "-pk").first()
    assert "state rebuilt from 25000 replayed records in the run's application" in (
        replayed.message)


@pytest.mark.django_db
def test_the_controller_may_want_more_workers_than_key_groups_and_replans_first(
        local_operator) -> None:
    from control import ticks
    from pipelines.nexmark import queries

    keyed = _run(local_operator, key_groups=2)
    assert ticks.loop_policy(keyed.policy_in_force, keyed).max_workers == 8
    dataflow = _run(local_operator, definition=queries.definition("Q4", 1000), key_groups=2)
    assert ticks.loop_policy(dataflow.policy_in_force, dataflow).max_workers == 2
    windowed = _run(local_operator, definition=queries.definition("Q5", 1000), key_groups=2,
                    name="web-replan-q5")
    assert ticks.loop_policy(windowed.policy_in_force, windowed).max_workers == 8
    commands = live.reconfiguration_commands({"workers": 2, "freq_ghz": 2.0},
                                             {"workers": 3, "freq_ghz": 2.0}, "scale", None,
                                             key_groups=2)
    assert commands == [("replan", {"key_groups": 4, "scheme": "seamless"}),
                        ("set_workers", {"workers": 3})]
    assert live.reconfiguration_commands({"workers": 2, "freq_ghz": 2.0},
                                         {"workers": 2, "freq_ghz": 2.0}, "hold", None,
                                         key_groups=2) == []
    assert live.replan_target(9, 4) == 9 and live.replan_target(3, 600) == 1024
