"""The elastic runtime in the web app, without Spark: runner events and per-group
samples through the relay into the database and the wire, and the run page's
reconfiguration forms (errors on bad input, audited requests on good input)."""
from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import make_pipeline_and_policy


def _run(user, status="running", **fields):
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(user, name="web-elastic", max_workers=2)
    return Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                              status=status, created_by=user, **fields)


@pytest.mark.django_db
def test_runner_events_update_the_run_and_read_well(local_operator) -> None:
    from pipelines.relay import apply_runner_event

    run = _run(local_operator, status="starting")
    apply_runner_event(run.pk, "1-0", {"type": "query_started", "workers": 1, "key_groups": 4,
                                       "frequency_source": "cpuinfo",
                                       "frequencies": [1.2, 1.6, 2.0]})
    apply_runner_event(run.pk, "2-0", {"type": "frequency_changed", "ghz": 1.6,
                                       "source": "emulated"})
    apply_runner_event(run.pk, "3-0", {
        "type": "migration_done", "migration_id": "ab12", "verified": True, "steps": 2,
        "groups_moved": 3, "bytes_moved": 2_500_000, "duration_s": 4.2, "failed": ""})
    apply_runner_event(run.pk, "4-0", {"type": "migration_step", "index": 0, "steps": 2,
                                       "moves": [{"group": 1}], "bytes": 10, "batch_id": 9,
                                       "batch_duration_ms": 812, "verified": False,
                                       "ran_on": {"1": "3"}})
    run.refresh_from_db()
    assert (run.status, run.frequency_ghz, run.frequency_source) == ("running", 1.6, "emulated")
    assert run.frequencies == [1.2, 1.6, 2.0]
    done = run.events.get(kind="runner:migration_done")
    assert done.message == "migration ab12 verified: 3 groups, 2.50 MB in 2 steps, 4.2 s"
    assert done.payload["groups_moved"] == 3
    step = run.events.get(kind="runner:migration_step")
    assert "NOT on target" in step.message and "812 ms" in step.message


@pytest.mark.django_db
def test_group_fields_travel_from_the_runner_record_to_the_db_and_back(local_operator) -> None:
    from pipelines import actions

    run = _run(local_operator)
    record = {"batch_id": 7, "t": 1.8e9, "workers": 2, "records": 10, "input_rows": 10,
              "placement": ["0", "3", "0", "3"], "ran_on": ["0", "3", "0", "0"],
              "group_bytes": [1, 2, 3, 4], "group_ms": [5, 6, 7, 8],
              "group_records": [1, 1, 1, 1], "drift": 1, "group_moves": 1,
              "failed_tasks": 0, "frequency_source": "emulated", "frequency_ghz": 1.4,
              "migration": {"id": "x", "steps": 3, "applied": 1}}
    wire = actions.sample_from_record(record)
    assert wire["groups"]["ran_on"] == ["0", "3", "0", "0"] and wire["drift"] == 1
    actions.store_samples(run.pk, [wire])
    sample = run.samples.get()
    assert sample.groups["placement"] == ["0", "3", "0", "3"]
    assert (sample.drift, sample.frequency_source, sample.migration["applied"]) == \
        (1, "emulated", 1)
    assert actions.sample_to_wire(sample)["groups"] == wire["groups"]


@pytest.mark.django_db
def test_reconfiguration_forms_say_what_is_wrong_and_audit_what_is_right(local_operator) -> None:
    from pipelines.models import RunEvent

    from pipelines import actions

    run = _run(local_operator, frequencies=[1.2, 2.0], key_groups=4)
    actions.store_samples(run.pk, [actions.sample_from_record(
        {"batch_id": 3, "t": 1.8e9, "workers": 2, "placement": ["0", "3", "0", "3"]})])
    client = Client()
    client.force_login(local_operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="placement"' in page and 'id="rebalance"' in page and "settable: 1.2, 2.0" in page

    r = client.post(f"/runs/{run.pk}/frequency/", {"ghz": "3.5"}, follow=True)
    assert "Frequency must be between 1.2 and 2.0 GHz" in r.content.decode()
    r = client.post(f"/runs/{run.pk}/rebalance/", {"planner": "magic", "schedule": "fluid",
                                                   "tau": "0.2"}, follow=True)
    assert "planner: Select a valid choice" in r.content.decode()
    r = client.post(f"/runs/{run.pk}/workers/", {"workers": "2", "schedule": "sometimes"},
                    follow=True)
    assert "Select a valid choice" in r.content.decode()
    for groups, executor, words in (("7", "0", "this run&#x27;s key groups are 0 to 3"),
                                    ("1,x", "0", "&#x27;x&#x27; is not a group number"),
                                    ("1", "9", "Select a valid choice")):
        r = client.post(f"/runs/{run.pk}/move-groups/", {"groups": groups, "executor": executor,
                                                         "schedule": "batched"}, follow=True)
        assert words in r.content.decode(), (groups, executor)
    assert not RunEvent.objects.filter(run=run, kind="reconfigure_requested").exists()

    client.post(f"/runs/{run.pk}/rebalance/", {"planner": "ding-table", "schedule": "fluid",
                                               "tau": "0.3"})
    client.post(f"/runs/{run.pk}/frequency/", {"ghz": "1.2"})
    client.post(f"/runs/{run.pk}/move-groups/", {"groups": "1-2, 1", "executor": "0",
                                                 "schedule": "fluid"})
    requested = RunEvent.objects.filter(run=run, kind="reconfigure_requested").order_by("id")
    assert [e.payload["command"] for e in requested] == ["rebalance", "set_frequency",
                                                         "move_groups"]
    assert requested[0].payload == {"command": "rebalance", "planner": "ding-table",
                                    "schedule": "fluid", "tau": 0.3}
    assert requested[2].payload == {"command": "move_groups", "moves": {"1": "0", "2": "0"},
                                    "schedule": "fluid"}
    assert requested[2].message == "move key groups 1, 2 to executor 0 (fluid)"

    run.status = "stopped"
    run.save()
    r = client.post(f"/runs/{run.pk}/rebalance/", {"planner": "flux", "schedule": "fluid",
                                                   "tau": "0.2"}, follow=True)
    assert "can be rebalanced only while it is running" in r.content.decode()


@pytest.mark.django_db
def test_an_event_kind_outside_the_audit_vocabulary_is_refused(local_operator) -> None:
    from pipelines import actions
    from pipelines.models import EventKind, Run

    pipeline, policy = make_pipeline_and_policy(local_operator, "kinds")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             created_by=local_operator)
    for bad in ("scaled", "status:sleeping", "runner:scaled", "other:created"):
        with pytest.raises(ValueError):
            actions.record_event(run, bad, "test")
    for good in (EventKind.ALERT, EventKind.status("running"), "runner:workers_changed"):
        assert actions.record_event(run, good, "test") is not None
    assert run.events.filter(kind="status:running").exists()
