"""Pipelines as files (issue 47): ``apply`` and ``export`` round trip, a dry run
changes nothing, a bad document names each problem's path and changes nothing, and the
published JSON Schema is the document model's."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from pipelines.nexmark import queries
from tests.conftest import SMALL_DEFINITION

ROOT = Path(__file__).resolve().parents[2]

DOC = f"""\
apiVersion: streamwise/v1
connections:
  - name: orders-redis
    kind: redis
    url: redis://127.0.0.1:6379/3
    password_env: ORDERS_REDIS_PASSWORD
pipelines:
  - name: small-count
    description: a keyed count
    definition: {json.dumps(SMALL_DEFINITION)}
  - name: q3
    definition: {json.dumps(queries.definition("Q3", 200))}
  - name: totals
    definition:
      app: streamwise_example_ops.jobs:customer_totals
      params: {{tax_pct: 7.5}}
      source:
        type: redis_stream
        connection: orders-redis
        stream: orders
        fields: {{key: long, value: double}}
policies:
  - name: tight
    latency_bound_ms: 2000
    power_budget_w: 40
    max_workers: 2
    strategy: lat-node
    strategy_params: {{horizon: 2}}
"""


def _apply(text: str, *flags: str) -> str:
    import tempfile

    out = io.StringIO()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        call_command("apply", "-f", f.name, *flags, stdout=out)
    return out.getvalue()


def _export(*names: str) -> str:
    out = io.StringIO()
    call_command("export", *names, stdout=out)
    return out.getvalue()


@pytest.fixture()
def admin_user(db):
    from django.contrib.auth.models import User

    return User.objects.create_superuser("admin", password="admin-pass-123")


@pytest.mark.django_db
def test_apply_is_idempotent_and_an_export_applies_back_to_itself(
        admin_user, monkeypatch) -> None:
    from control.models import Policy
    from pipelines.models import Connection, Pipeline

    monkeypatch.setenv("ORDERS_REDIS_PASSWORD", "hunter2")
    first = _apply(DOC)
    assert "+ connection orders-redis: create" in first
    assert "+ pipeline q3: create -> v1" in first and "+ policy tight: create -> v1" in first
    assert first.strip().endswith("5 change(s), 0 unchanged")
    assert Connection.objects.get(name="orders-redis").password == "hunter2"
    assert Pipeline.objects.get(name="totals").definition["app"].endswith("customer_totals")
    again = _apply(DOC)
    assert again.strip().endswith("0 change(s), 5 unchanged"), again

    changed = DOC.replace("latency_bound_ms: 2000", "latency_bound_ms: 1500").replace(
        "description: a keyed count", "description: a keyed count per customer")
    dry = _apply(changed, "--dry-run")
    assert "~ policy tight: update (latency_bound_ms) -> v2" in dry
    assert "~ pipeline small-count: update (description) -> v1" in dry
    assert dry.strip().endswith("(dry run: nothing changed)")
    assert Policy.objects.get(name="tight").latency_bound_ms == 2000  # nothing changed
    assert Policy.objects.get(name="tight").version == 1

    exported = _export()
    doc = yaml.safe_load(exported)
    assert doc["connections"][0]["password_env"] == "STREAMWISE_PASSWORD_ORDERS_REDIS"
    assert "hunter2" not in exported  # never a password in a document
    # A fresh database: the export applied there exports the same document.
    Pipeline.objects.all().delete()
    Policy.objects.all().delete()
    Connection.objects.all().delete()
    monkeypatch.setenv("STREAMWISE_PASSWORD_ORDERS_REDIS", "hunter2")
    assert _apply(exported).strip().endswith("5 change(s), 0 unchanged")
    assert _export() == exported
    some = yaml.safe_load(_export("q3", "tight"))
    assert [p["name"] for p in some["pipelines"]] == ["q3"] and not some["connections"]
    assert [p["name"] for p in some["policies"]] == ["tight"]


@pytest.mark.django_db
def test_a_bad_document_names_each_problem_and_changes_nothing(admin_user) -> None:
    from pipelines.models import Pipeline

    q3 = queries.definition("Q3", 200)
    ghost = json.loads(json.dumps(q3))
    ghost["nodes"][3]["left"] = "ghost"
    bad = {"apiVersion": "streamwise/v1", "pipelines": [
        {"name": "fine", "definition": SMALL_DEFINITION},
        {"name": "fine2", "definition": q3},
        {"name": "broken", "definition": ghost},
        {"name": "fine", "definition": SMALL_DEFINITION}],
        "policies": [{"name": "p", "latency_bound_ms": -5, "power_budget_w": 40}],
        "connections": [{"name": "c", "kind": "redis", "url": "redis://h:6379",
                         "password_env": "NOT_SET_ANYWHERE_46"}]}
    with pytest.raises(CommandError) as err:
        _apply(json.dumps(bad))
    text = str(err.value)
    assert "pipelines[3].name: 'fine' is given twice" in text
    bad["pipelines"].pop()
    with pytest.raises(CommandError) as err:
        _apply(json.dumps(bad))
    text = str(err.value)
    assert text.startswith("nothing changed; 3 problem(s):")
    assert "pipelines[2].definition.nodes[3].left: unknown node 'ghost'" in text
    assert "policies[0].latency_bound_ms:" in text
    assert "connections[0].password_env: $NOT_SET_ANYWHERE_46 is not set" in text
    assert not Pipeline.objects.exists()  # the valid ones were not kept either
    for doc, message in [
        ("pipelines: [", "line 1, column"),
        ("[1, 2]", "must be a mapping"),
        ('{"apiVersion": "v0"}', "apiVersion: Input should be 'streamwise/v1'"),
        ('{"apiVersion": "streamwise/v1", "pipelines": [{"name": "x"}]}',
         "pipelines[0].definition: Field required"),
        ('{"apiVersion": "streamwise/v1", "widgets": []}', "widgets: Extra inputs"),
    ]:
        with pytest.raises(CommandError) as err:
            _apply(doc)
        assert message in str(err.value), str(err.value)


def test_the_published_json_schema_is_the_document_models() -> None:
    from api import documents

    published = json.loads((ROOT / "docs" / "streamwise-document.schema.json").read_text())
    assert published == documents.json_schema()


@pytest.mark.django_db
def test_runs_start_and_stop_from_the_command_line_through_the_pages_checks(
        admin_user, monkeypatch, django_capture_on_commit_callbacks) -> None:
    from django.contrib.auth.models import User

    from pipelines.models import Run

    _apply(DOC.replace("    password_env: ORDERS_REDIS_PASSWORD\n", ""))
    queued = []
    monkeypatch.setattr("pipelines.actions.enqueue", lambda *a: queued.append(a))
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("runs", "start", "--pipeline", "small-count", "--policy", "tight",
                     stdout=out)
    run = Run.objects.get()
    assert out.getvalue().strip() == f"run {run.pk} created: http://127.0.0.1:8000/runs/{run.pk}/"
    assert run.events.get(kind="created").actor == "user:admin"
    assert queued and queued[0][1] == run.pk
    for args, message in [
        (("--pipeline", "nope", "--policy", "tight"), "no pipeline named 'nope'"),
        (("--pipeline", "q3", "--policy", "tight", "--wait", "flying"), "--wait: one of"),
        (("--pipeline", "q3", "--policy", "tight", "--user", "ghost"), "no user 'ghost'"),
    ]:
        with pytest.raises(CommandError) as err:
            call_command("runs", "start", *args, stdout=io.StringIO())
        assert message in str(err.value)
    User.objects.create_user("reader")
    with pytest.raises(CommandError) as err:
        call_command("runs", "stop", str(run.pk), "--user", "reader", stdout=io.StringIO())
    assert "reader may not stop runs" in str(err.value)
    out = io.StringIO()
    call_command("runs", "stop", str(run.pk), stdout=out)
    assert out.getvalue().startswith(f"run {run.pk} stopping")
    assert run.events.filter(kind="stop_requested", actor="user:admin").exists()
