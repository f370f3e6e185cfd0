"""Definition, model and form validation: bad input gets a message that says what and
where, and nothing stored is lost."""
from __future__ import annotations

import copy
import json

import pytest

from pipelines.runtime.spec import definition as pdef

GOOD = pdef.DEMO_DEFINITION


def broken(path: list, value) -> dict:
    doc = copy.deepcopy(GOOD)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize("doc, where, words", [
    (broken(["source", "rate", "records_per_s"], 5), "source.rate.records_per_s", "unknown"),
    (broken(["source", "rate"], {"kind": "constant", "records_per_s": -3}),
     "source.rate.records_per_s", "> 0"),
    (broken(["source", "rate"], {"kind": "warp"}), "source.rate.kind", "not one of"),
    (broken(["source", "keys"], {"kind": "zipf", "n": 0, "s": 1}), "source.keys.n", ">= 1"),
    (broken(["source", "keys"], {"kind": "file", "file": "nope/missing"}), "source.keys.file",
     "cannot read"),
    (broken(["operators"], []), "operators", "non-empty"),
    (broken(["operators", 2], KeyError), "operators", "exactly one keyed_aggregate"),
    (broken(["operators", 0, "op"], "=~"), "operators[0].op", "not one of"),
    (broken(["operators", 1, "arg"], "two"), "operators[1].arg", "must be a number"),
    (broken(["key_groups"], 0), "key_groups", ">= 1"),
    (broken(["source", "rate"], {"kind": "step", "steps": [[0, 10], [0, 20]]}),
     "source.rate.steps[1]", "twice"),
])
def test_bad_definitions_name_the_place(doc, where, words) -> None:
    with pytest.raises(pdef.DefinitionError) as exc:
        pdef.validate(doc)
    assert exc.value.path == where
    assert words in exc.value.message


def test_json_syntax_error_gives_line_and_column() -> None:
    with pytest.raises(pdef.DefinitionError, match="line 2, column"):
        pdef.parse('{"source":\n  {oops}')


@pytest.mark.parametrize("text, words", [
    ('{"key_groups": 1' + "0" * 5000 + "}", "more than 19 digits"),
    ('{"key_groups": 10000000000000000000}', "more than 19 digits"),
    ('{"key_groups": 9999999999999999999}', "outside a 64-bit integer"),
    ('{"key_groups": NaN}', "NaN is not a number JSON allows"),
    ('{"key_groups": -Infinity}', "-Infinity is not a number JSON allows"),
    ('{"key_groups": 1e999}', "out of range"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
])
def test_numbers_json_does_not_allow_are_one_line_errors(text, words) -> None:
    """Python's json takes NaN, Infinity and whole numbers of any length: they failed
    later, as a server error (int/float limits) or deep in a computation."""
    with pytest.raises(pdef.DefinitionError) as exc:
        pdef.parse(text)
    assert words in exc.value.message and "\n" not in exc.value.message
    assert len(exc.value.message) < 200
    # A whole number past a double's range given as a dict (not JSON text) is a field error.
    with pytest.raises(pdef.DefinitionError, match="key_groups: must be a number"):
        pdef.validate({**GOOD, "key_groups": 10 ** 400})


def test_demo_and_all_rate_kinds_validate() -> None:
    assert pdef.validate(GOOD).key_groups == 8
    for rate in ({"kind": "constant", "records_per_s": 10},
                 {"kind": "step", "steps": [[0, 10], [5, 20]]},
                 {"kind": "sine", "base": 100, "amplitude": 50, "period_s": 30},
                 {"kind": "random_walk", "start": 100, "sigma": 0.1, "low": 50, "high": 200},
                 {"kind": "trace", "file": "elastic-hft/random_walk_rates", "scale": 0.01}):
        spec = pdef.validate(broken(["source", "rate"], rate))
        assert spec.schedule().rate_at(0.5) > 0


@pytest.mark.django_db
def test_pipeline_form_shows_definition_errors_and_keeps_stored_version() -> None:
    from django.contrib.auth.models import User

    from pipelines import actions
    from pipelines.forms import PipelineForm
    from pipelines.models import Pipeline

    user = User.objects.create_user("u")
    pipeline = actions.save_pipeline(Pipeline(name="p", definition=GOOD), user)
    form = PipelineForm({"name": "p", "description": "",
                         "definition": json.dumps(broken(["key_groups"], 5000))},
                        instance=pipeline)
    assert not form.is_valid()
    assert "key_groups: must be <= 1024" in form.errors["definition"][0]
    pipeline.refresh_from_db()
    assert pipeline.definition == GOOD and pipeline.version == 1

    huge = json.dumps(GOOD).replace('"key_groups": 8', '"key_groups": 1' + "0" * 5000)
    form = PipelineForm({"name": "p", "description": "", "definition": huge},
                        instance=pipeline)
    assert not form.is_valid()
    assert "more than 19 digits" in form.errors["definition"][0]

    form = PipelineForm({"name": "p", "description": "",
                         "definition": json.dumps(broken(["key_groups"], 16))},
                        instance=pipeline)
    assert form.is_valid(), form.errors
    saved = actions.save_pipeline(form.save(commit=False), user)
    assert saved.version == 2
    assert [v.version for v in saved.versions.all()] == [2, 1]
    assert saved.versions.get(version=1).definition["key_groups"] == 8


@pytest.mark.django_db
@pytest.mark.parametrize("field, value, message", [
    ("latency_bound_ms", 0, "greater than or equal to 1"),
    ("power_budget_w", -5, "greater than or equal to 0.1"),
    ("control_step_s", 0.1, "greater than or equal to 0.5"),
    ("max_workers", 9, "At most 8: the Spark cluster offers 8 cores"),
    ("strategy_params", '{"horizon": 2}', "The manual strategy takes no parameters"),
    ("initial_workers", 5, "between min (1) and max (2)"),
    ("strategy", "oracle", "not one of the available choices"),
    ("strategy_params", "[1, 2]", "JSON object"),
    ("strategy_params", "{bad", "Invalid JSON"),
    ("alert_webhook", "http://127.0.0.1:8080/api/v1/submissions/kill/x",
     "not a public address"),
    ("alert_webhook", "http://169.254.169.254/latest/meta-data/", "not a public address"),
    ("alert_webhook", "ftp://203.0.113.9/alerts", "http or https, not ftp"),
    ("strategy_params", '{"alpha": NaN}', "NaN is not a number JSON allows"),
    ("strategy_params", '{"horizon": 1' + "0" * 5000 + "}", "more than 19 digits"),
])
def test_policy_form_rejects_out_of_range(field, value, message) -> None:
    from control.forms import PolicyForm

    data = {"name": "p", "latency_bound_ms": 2000, "throughput_floor_rps": 0,
            "power_budget_w": 30, "control_step_s": 2, "min_workers": 1,
            "initial_workers": 1, "max_workers": 2, "strategy": "manual",
            "strategy_params": "{}", field: value}
    form = PolicyForm(data)
    assert not form.is_valid()
    assert message in " ".join(form.errors[field])


@pytest.mark.django_db
@pytest.mark.parametrize("strategy, params, message", [
    ("lat-power", '{"horizon": 6}', "horizon: must be <= 5, got 6"),
    ("lat-node", '{"alpha": 0}', "alpha: must be > 0"),
    ("lat-node", '{"gamma": -0.4}', "gamma: must be > 0"),
    ("th-rule", '{"theta_max": 0.7, "theta_min": 0.8}', "theta_min: must be below theta_max"),
    ("lat-rule", '{"horizon": 2}', "horizon: unknown for lat-rule"),
])
def test_policy_form_checks_strategy_parameters_with_the_loop(strategy, params,
                                                              message) -> None:
    from control.forms import PolicyForm

    data = {"name": "p", "latency_bound_ms": 2000, "throughput_floor_rps": 0,
            "power_budget_w": 30, "control_step_s": 2, "min_workers": 1,
            "initial_workers": 1, "max_workers": 2, "strategy": strategy,
            "strategy_params": params, "violation_steps": 3}
    form = PolicyForm(data)
    assert not form.is_valid()
    assert message in " ".join(form.errors["strategy_params"])
    assert PolicyForm({**data, "strategy_params": "{}"}).is_valid()


@pytest.fixture
def pending_run(db):
    from django.contrib.auth.models import User

    from control.models import Policy
    from pipelines import actions
    from pipelines.models import Pipeline, Run

    user = User.objects.create_user("u")
    pipeline = actions.save_pipeline(Pipeline(name="p", definition=GOOD), user)
    policy = Policy.objects.create(name="x", latency_bound_ms=1000, power_budget_w=10)
    return Run.objects.create(pipeline_version=pipeline.current_version, policy=policy)


def test_run_event_is_append_only(pending_run) -> None:
    from pipelines.models import RunEvent

    event = RunEvent.objects.create(run=pending_run, kind="k", actor="test")
    event.message = "rewritten"
    with pytest.raises(ValueError, match="append-only"):
        event.save()


def test_lifecycle_refuses_backward_transitions(pending_run) -> None:
    from pipelines import actions
    from pipelines.models import RunStatus

    run = pending_run
    assert actions.transition(run, RunStatus.STARTING, "test")
    assert actions.transition(run, RunStatus.RUNNING, "test")
    assert actions.transition(run, RunStatus.STOPPED, "test")
    assert not actions.transition(run, RunStatus.RUNNING, "test")
    assert run.status == RunStatus.STOPPED and run.ended_at is not None
