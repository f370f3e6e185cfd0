"""Connections (issue 45): an admin keeps the servers definitions name, their passwords
write-only (never in a page, "(set)" in the audit log), a pipeline's source and sink
chosen in form sections naming them, Test connection reading the real Redis stream a
source names, and a run's runner given the connection in its private runner.json."""
from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from pipelines.models import Connection, Pipeline

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
SECRET = "s3cret-for-the-test"


def _admin() -> Client:
    from accounts.roles import sync_roles

    sync_roles(Group, Permission)
    user = User.objects.create_user("conn-admin", password="conn-admin-pass-1")
    user.groups.add(Group.objects.get(name="admin"))
    user.is_staff = True
    user.save()
    client = Client()
    client.force_login(user)
    return client


def _create(client: Client, **fields: Any) -> Any:
    return client.post("/connections/new/", {"name": "orders", "kind": "redis",
                                             "url": REDIS_URL, "username": "",
                                             "password": SECRET, "description": "",
                                             **fields})


@pytest.mark.django_db
def test_a_connections_password_is_write_only_and_absent_from_the_audit_log() -> None:
    from audit.models import AuditEntry

    client = _admin()
    assert _create(client).status_code == 302
    conn = Connection.objects.get(name="orders")
    assert conn.password == SECRET
    for path in ("/connections/", f"/connections/{conn.pk}/edit/"):
        page = client.get(path).content.decode()
        assert SECRET not in page and "orders" in page
    # Saved again with the password left blank: kept. Changed: "(old)" -> "(new)".
    form = {"name": "orders", "kind": "redis", "url": REDIS_URL, "username": "",
            "password": "", "description": "the orders stream"}
    assert client.post(f"/connections/{conn.pk}/edit/", form).status_code == 302
    assert Connection.objects.get(pk=conn.pk).password == SECRET
    client.post(f"/connections/{conn.pk}/edit/", {**form, "password": "another-one"})
    assert Connection.objects.get(pk=conn.pk).password == "another-one"
    entries = AuditEntry.objects.filter(target_type="connection").order_by("pk")
    assert entries.count() == 3
    dumped = json.dumps([[e.before, e.after] for e in entries])
    assert SECRET not in dumped and "another-one" not in dumped
    assert entries.first().after["password"] == "(set)"
    assert any((e.after or {}).get("password") == "(new)" for e in entries)


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "error"), [
    ({"url": "redis://:pw@127.0.0.1:6379/0"}, "password"),
    ({"url": "postgres://127.0.0.1/db"}, "redis://"),
    ({"url": "redis://bob@127.0.0.1:6379/0"}, "user name in its own field"),
    ({"name": "Has Spaces"}, "lower-case"),
])
def test_a_connection_that_is_wrong_is_refused_with_the_reason(fields: dict, error: str
                                                               ) -> None:
    response = _create(_admin(), **fields)
    assert response.status_code == 200 and error in response.content.decode()
    assert not Connection.objects.exists()


@pytest.mark.django_db
def test_a_pipeline_names_connections_in_its_sections_and_the_runner_gets_them(
        tmp_path: Path) -> None:
    from pipelines import connections, launch

    client = _admin()
    _create(client)
    Connection.objects.create(name="warehouse", kind="postgres",
                              url="postgres://127.0.0.1:5432/postgres", username="postgres",
                              password="pg-secret")
    from pipelines.runtime.spec.definition import DEMO_DEFINITION

    form = {"name": "orders-count", "description": "", "definition": json.dumps(DEMO_DEFINITION),
            "source_type": "redis_stream", "source_connection": "orders",
            "source_stream": "orders", "sink_type": "postgres",
            "sink_connection": "warehouse", "sink_table": "order_counts"}
    response = client.post("/pipelines/new/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    saved = Pipeline.objects.get(name="orders-count").definition
    assert saved["source"]["connection"] == "orders" and "url" not in saved["source"]
    assert "seed" not in saved["source"] and saved["source"]["rate"]
    assert saved["sink"] == {"type": "postgres", "connection": "warehouse",
                             "table": "order_counts", "keep_output": True}
    assert SECRET not in json.dumps(saved)
    # Fields found by Test connection, written into a JSON whose source is still the
    # generator's, are valid once the section makes it a stream.
    with_fields = json.loads(json.dumps(DEMO_DEFINITION))
    with_fields["source"]["fields"] = {"key": "long", "value": "double"}
    response = client.post("/pipelines/new/", {**form, "name": "with-fields",
                                               "definition": json.dumps(with_fields)})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Pipeline.objects.get(name="with-fields").definition["source"]["fields"] == {
        "key": "long", "value": "double"}
    # The edit page shows the sections as saved.
    page = client.get(f"/pipelines/{Pipeline.objects.get(name='orders-count').pk}/edit/")
    assert 'value="order_counts"' in page.content.decode()
    # A connection of the wrong kind, or none of that name: the form says which field.
    for bad, message in (({"sink_connection": "orders"},
                          "Invalid definition at sink.connection: &#x27;orders&#x27; is a Redis "
                          "connection; this needs postgres"),
                         ({"source_connection": "nope"}, "Select a valid choice")):
        response = client.post("/pipelines/new/", {**form, "name": f"x-{uuid.uuid4().hex[:6]}",
                                                   **bad})
        assert response.status_code == 200 and message in response.content.decode()
    # The runner's config: the connections with their passwords, in a 0600 file.
    resolved = connections.resolve(saved)
    assert resolved["orders"]["password"] == SECRET
    assert resolved["warehouse"]["url"] == "postgres://postgres@127.0.0.1:5432/postgres"
    path = launch.write_runner_config({"definition": saved, "connections": resolved,
                                       "redis_url": REDIS_URL}, tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["connections"]["orders"]["password"] == SECRET
    # A dataflow names them in its source node and its sink node's "to".
    from pipelines.nexmark import queries

    q5 = queries.definition("Q5", 500, stream={"type": "redis_stream", "connection": "orders",
                                               "stream": "bids"},
                            to={"type": "postgres", "connection": "warehouse",
                                "table": "hot_items"})
    assert set(connections.resolve(q5)) == {"orders", "warehouse"}
    q5["nodes"][-1]["to"]["connection"] = "orders"
    with pytest.raises(connections.ConnectionProblem) as err:
        connections.resolve(q5)
    assert err.value.path == "nodes[4] (out).to.connection"


@pytest.mark.django_db
def test_test_connection_reads_the_stream_a_source_names(tmp_path: Path) -> None:
    client = _admin()
    _create(client, password="")
    stream = f"sw-probe-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(REDIS_URL)
    try:
        for i in range(50):
            r.xadd(stream, {"key": str(i % 7), "value": f"{i * 1.5}", "note": "x"})
        r.xadd(stream, {"key": "seven"})
        from pipelines.runtime.spec.definition import DEMO_DEFINITION

        answer = client.post("/pipelines/test-source/", {
            "definition": json.dumps(DEMO_DEFINITION), "source_type": "redis_stream",
            "source_connection": "orders", "source_stream": stream}).json()
        assert answer["ok"], answer
        assert answer["fields"] == {"key": "string", "value": "double", "note": "string"} \
            or answer["fields"]["value"] == "double"
        assert answer["backlog"] == 51 and answer["dead_in_sample"] == 1
        assert answer["rate_per_s"] == 0
        # A server that does not answer: the reason, not a 500.
        conn = Connection.objects.get(name="orders")
        conn.url = "redis://127.0.0.1:1/0"
        conn.save()
        answer = client.post("/pipelines/test-source/", {
            "definition": json.dumps(DEMO_DEFINITION), "source_type": "redis_stream",
            "source_connection": "orders", "source_stream": stream}).json()
        assert not answer["ok"] and "ConnectionError" in answer["message"], answer
        tested = client.post(f"/connections/{conn.pk}/test/").json()
        assert not tested["ok"] and "cannot reach" in tested["message"]
    finally:
        r.delete(stream)
