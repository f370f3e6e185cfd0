"""The REST API (issue 47): tokens (shown once, stored hashed, revoked), the user's role
on every endpoint, JSON errors with field paths, the same actions as the pages."""
from __future__ import annotations

import json
import re

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
    assert view.get("/api/v1/audit").status_code == 403  # as on the pages: not viewers

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


def _api_calls(run_id: int) -> list[tuple[str, str, dict | None, dict[str, set[int]]]]:
    """(method, path, body, statuses per who) for every operation of the API."""
    read = {"none": {403}, "viewer": {200}, "operator": {200}, "admin": {200}}
    write = {"none": {403}, "viewer": {403}, "operator": {200, 201, 202, 409},
             "admin": {200, 201, 202, 409}}
    audit = {"none": {403}, "viewer": {403}, "operator": {200}, "admin": {200}}  # (pages')
    conn_write = {"none": {403}, "viewer": {403}, "operator": {403}, "admin": {200}}
    admin_only = conn_write  # (the fleet settings, as on the Cluster page)
    r = run_id
    policy = {"name": "m-q", "latency_bound_ms": 3000, "power_budget_w": 40}
    return [
        ("get", "/api/v1/pipelines", None, read),
        ("get", "/api/v1/pipelines/m-p", None, read),
        ("get", "/api/v1/pipelines/m-p/versions", None, read),
        ("post", "/api/v1/pipelines", {"name": "m-new", "definition": SMALL_DEFINITION},
         {**write, "admin": {201, 422}}),  # (the operator made it first: a name taken)
        ("put", "/api/v1/pipelines/m-p", {"description": "changed"}, write),
        ("get", "/api/v1/policies", None, read),
        ("get", "/api/v1/policies/m-q", None, read),
        ("get", "/api/v1/policies/m-q/versions", None, read),
        ("post", "/api/v1/policies", {**policy, "name": "m-q2"},
         {**write, "admin": {201, 422}}),
        ("put", "/api/v1/policies/m-q", policy, write),
        ("get", "/api/v1/connections", None, read),
        ("put", "/api/v1/connections/m-c", {"name": "m-c", "kind": "redis",
                                            "url": "redis://127.0.0.1:6399/1"}, conn_write),
        ("get", "/api/v1/runs", None, read),
        ("get", f"/api/v1/runs/{r}", None, read),
        ("get", f"/api/v1/runs/{r}/decisions", None, read),
        ("get", f"/api/v1/runs/{r}/events", None, read),
        ("get", f"/api/v1/runs/{r}/metrics", None, read),
        ("post", "/api/v1/runs", {"pipeline": "m-p", "policy": "m-q"}, write),
        ("post", f"/api/v1/runs/{r}/workers", {"workers": 1}, write),
        ("post", f"/api/v1/runs/{r}/rebalance", {}, write),
        ("post", f"/api/v1/runs/{r}/move-groups", {"groups": [0], "executor": "0"},
         {**write, "operator": {409, 422}, "admin": {409, 422}}),  # (no executor yet)
        ("post", f"/api/v1/runs/{r}/replan", {"key_groups": 8}, write),
        ("post", f"/api/v1/runs/{r}/plan", {"plan": {}},
         {**write, "operator": {409, 422}, "admin": {409, 422}}),
        ("post", f"/api/v1/runs/{r}/dry-run", {"on": True}, write),
        ("post", f"/api/v1/runs/{r}/verify", None, write),
        ("post", f"/api/v1/runs/{r}/policy-version", {"version": 1}, write),
        ("post", f"/api/v1/runs/{r}/stop", None, write),
        ("get", "/api/v1/audit", None, audit),
        ("get", "/api/v1/cluster", None, read),
        ("get", "/api/v1/fleet", None, read),
        ("put", "/api/v1/fleet", {"arbiter": "fcfs"}, admin_only),
    ]


@pytest.mark.django_db
def test_every_api_operation_allows_exactly_the_roles_that_may_use_it(monkeypatch) -> None:
    """The permission matrix of the pages, on the API: every operation x no token, a
    revoked token, a user in no role, viewer, operator, admin."""
    from api.models import ApiToken
    from control.models import Policy
    from pipelines import actions
    from pipelines.models import Pipeline

    monkeypatch.setattr("pipelines.actions.enqueue", lambda *a, **k: None)
    owner = _user("m-owner", "admin")
    pipeline = actions.save_pipeline(Pipeline(name="m-p", definition=SMALL_DEFINITION), owner)
    policy = Policy.objects.create(name="m-q", latency_bound_ms=3000, power_budget_w=40,
                                   min_workers=1, initial_workers=1, max_workers=2)
    run = actions.create_run(pipeline, policy, owner)
    clients = {who: _client(_user(f"m-{who}", None if who == "none" else who))[0]
               for who in ("none", "viewer", "operator", "admin")}
    revoked_user = _user("m-revoked", "admin")
    revoked, _ = _client(revoked_user)
    ApiToken.objects.get(user=revoked_user).revoke(revoked_user)
    wrong = []
    calls = _api_calls(run.pk)
    covered = {(m.upper(), p) for m, p, _b, _e in calls}
    for method, path, body, expected in calls:
        for who, client in [("anonymous", Client()), ("revoked", revoked),
                            *clients.items()]:
            kwargs = {"data": json.dumps(body), "content_type": "application/json"} \
                if body is not None else {}
            status = getattr(client, method)(path, **kwargs).status_code
            want = expected.get(who, {401})
            if status not in want:
                wrong.append(f"{who} {method.upper()} {path}: {status}, expected {want}")
    assert not wrong, "\n".join(wrong)
    # ... and the matrix covers every operation the schema lists.
    schema = Client().get("/api/v1/openapi.json").json()
    listed = {(m.upper(), p.replace("{run_id}", str(run.pk)).replace("{name}", "X"))
              for p, ops in schema["paths"].items() for m in ops}
    names = {(m, re.sub(r"/m-[a-z0-9]+", "/X", p)) for m, p in covered}
    assert listed <= names, listed - names
