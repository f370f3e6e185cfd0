"""The REST API (issue 47): tokens (shown once, stored hashed, revoked), the user's role
on every endpoint, JSON errors with field paths, the same actions as the pages."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.conftest import SMALL_DEFINITION


def _user(name: str, role: str | None):
    from django.contrib.auth.models import Group, Permission, User

    from accounts.roles import sync_roles

    sync_roles(Group, Permission)
    user = User.objects.create_user(name, password=f"{name}-pass-123")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def _client(user) -> tuple[Client, str]:
    from api.models import ApiToken

    _token, text = ApiToken.issue(user, "test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {text}"), text


@pytest.mark.django_db
def test_a_token_acts_with_its_users_role_and_errors_name_their_fields() -> None:
    from api.models import ApiToken, token_hash
    from pipelines.models import Pipeline

    operator, viewer = _user("api-op", "operator"), _user("api-viewer", "viewer")
    op, text = _client(operator)
    stored = ApiToken.objects.get(user=operator)
    assert stored.hashed == token_hash(text) and text not in stored.hashed  # hashed
    assert Client().get("/api/v1/pipelines").status_code == 401
    made = op.post("/api/v1/pipelines", json.dumps(
        {"name": "api-small", "definition": SMALL_DEFINITION}), content_type="application/json")
    assert made.status_code == 201, made.content
    assert made.json()["version"] == 1
    assert Pipeline.objects.get(name="api-small").created_by == operator
    listed = op.get("/api/v1/pipelines?limit=1").json()
    assert listed["count"] == 1 and listed["items"][0]["name"] == "api-small"

    ghost = {"nodes": [{"id": "e", "type": "generator", "partitions": 1,
                        "rate": {"kind": "constant", "records_per_s": 5}},
                       {"id": "out", "type": "sink", "input": "ghost"}]}
    bad = op.put("/api/v1/pipelines/api-small", json.dumps({"definition": ghost}),
                 content_type="application/json")
    assert bad.status_code == 422
    detail = bad.json()["detail"][0]
    assert detail["loc"] == ["body", "definition", "nodes", 1, "input"]
    assert "unknown node 'ghost'" in detail["msg"]
    assert Pipeline.objects.get(name="api-small").version == 1  # nothing stored
    typed = op.post("/api/v1/pipelines", json.dumps({"name": "x", "definition": 5}),
                    content_type="application/json")
    assert typed.status_code == 422 and typed.json()["detail"][0]["loc"][-1] == "definition"

    view, _ = _client(viewer)
    assert view.get("/api/v1/pipelines/api-small").status_code == 200
    refused = view.post("/api/v1/pipelines", json.dumps(
        {"name": "v", "definition": SMALL_DEFINITION}), content_type="application/json")
    assert refused.status_code == 403 and "pipelines.add_pipeline" in refused.json()["detail"]
    assert view.get("/api/v1/audit").status_code == 403  # admins read the audit

    stored.revoke(operator)
    assert op.get("/api/v1/pipelines").status_code == 401  # revoked


@pytest.mark.django_db
def test_runs_start_and_scale_through_the_api_and_the_schema_is_served(
        django_capture_on_commit_callbacks, monkeypatch) -> None:
    from pipelines.models import Run

    operator = _user("api-op2", "operator")
    op, _ = _client(operator)
    monkeypatch.setattr("pipelines.actions.enqueue", lambda *a: None)
    op.post("/api/v1/pipelines", json.dumps({"name": "p", "definition": SMALL_DEFINITION}),
            content_type="application/json")
    made = op.post("/api/v1/policies", json.dumps(
        {"name": "q", "latency_bound_ms": 3000, "power_budget_w": 40, "max_workers": 2}),
        content_type="application/json")
    assert made.status_code == 201, made.content
    with django_capture_on_commit_callbacks(execute=True):
        started = op.post("/api/v1/runs", json.dumps({"pipeline": "p", "policy": "q"}),
                          content_type="application/json")
    assert started.status_code == 201, started.content
    run_id = started.json()["id"]
    assert Run.objects.get(pk=run_id).events.get(kind="created").actor == "user:api-op2"
    busy = op.post(f"/api/v1/runs/{run_id}/workers", json.dumps({"workers": 2}),
                   content_type="application/json")
    assert busy.status_code == 409 and "only while it is running" in busy.json()["detail"]
    Run.objects.filter(pk=run_id).update(status="running")
    too_many = op.post(f"/api/v1/runs/{run_id}/workers", json.dumps({"workers": 9}),
                       content_type="application/json")
    assert too_many.status_code == 422
    assert too_many.json()["detail"][0]["loc"] == ["body", "workers"]
    scaled = op.post(f"/api/v1/runs/{run_id}/workers", json.dumps({"workers": 2}),
                     content_type="application/json")
    assert scaled.status_code == 202, scaled.content
    requested = Run.objects.get(pk=run_id).events.get(kind="reconfigure_requested")
    assert requested.actor == "user:api-op2" and requested.payload["workers"] == 2
    schema = Client().get("/api/v1/openapi.json").json()
    assert schema["openapi"].startswith("3.") and "/api/v1/runs/{run_id}/workers" in schema["paths"]


@pytest.mark.django_db
def test_tokens_are_made_shown_once_and_revoked_on_their_page() -> None:
    from api.models import ApiToken
    from audit.models import AuditEntry

    owner, other, admin = (_user("tok-op", "operator"), _user("tok-other", "operator"),
                           _user("tok-admin", "admin"))
    page = Client()
    page.force_login(owner)
    made = page.post("/account/tokens/new/", {"name": "ci-deploy"}, follow=True)
    text = made.content.decode()
    token = ApiToken.objects.get(user=owner)
    shown = text.split('id="new-token"')[1].split("<code>")[1].split("</code>")[0]
    assert shown.startswith(f"sw_{token.prefix}_") and ApiToken.find(shown) == token
    assert shown not in page.get("/account/tokens/").content.decode()  # once
    assert AuditEntry.objects.filter(action="api_token.create", actor="user:tok-op").exists()
    bearer = Client(HTTP_AUTHORIZATION=f"Bearer {shown}")
    assert bearer.get("/api/v1/runs").status_code == 200
    intruder = Client()
    intruder.force_login(other)
    intruder.post(f"/account/tokens/{token.pk}/revoke/")
    assert ApiToken.objects.get(pk=token.pk).active  # not theirs
    boss = Client()
    boss.force_login(admin)
    assert f'data-token="{token.prefix}"' in boss.get("/account/tokens/").content.decode()
    boss.post(f"/account/tokens/{token.pk}/revoke/")
    assert not ApiToken.objects.get(pk=token.pk).active
    assert bearer.get("/api/v1/runs").status_code == 401
