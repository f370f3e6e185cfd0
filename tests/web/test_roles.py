"""Roles (viewer / operator / admin), the audit log and login throttling (issue 17):
the permission matrix over every view, POST endpoint and the run WebSocket; audit
entries for each kind of change, append-only; django-axes lockout."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from tests.conftest import make_pipeline_and_policy, run_async

ROLES = ("viewer", "operator", "admin")
WHO = ("anonymous", "none", *ROLES)  # "none": logged in, in no role


def _user(name: str, role: str | None) -> User:
    from accounts.roles import sync_roles

    sync_roles(Group, Permission)  # a flushed test database has no groups
    user = User.objects.create_user(name, password=f"{name}-pass-123")
    if role:
        user.groups.add(Group.objects.get(name=role))
        user.is_staff = role == "admin"
        user.save()
    return user


def _client(who: str) -> Client:
    client = Client()
    if who != "anonymous":
        client.force_login(_user(f"u-{who}", None if who == "none" else who))
    return client


@pytest.fixture
def world(db: Any) -> dict[str, Any]:
    """One of each thing a page or a POST can name."""
    from control.models import LabRun
    from pipelines import actions

    owner = User.objects.create_superuser("owner", "o@example.com", "owner-pass-123")
    pipeline, policy = make_pipeline_and_policy(owner, name="matrix")
    run = actions.create_run(pipeline, policy, owner)  # its start task is queued on commit:
    lab = LabRun.objects.create(name="lab", scenario={}, created_by=owner)  # never here
    from pipelines.models import Connection

    conn = Connection.objects.create(name="orders", kind="redis",
                                     url="redis://127.0.0.1:6399/0", password="hunter2")
    return {"pipeline": pipeline, "policy": policy, "run": run, "lab": lab, "conn": conn}


def _pages(w: dict[str, Any]) -> list[tuple[str, str, dict[str, int]]]:
    """(method, path, expected status per who). 302 for anonymous is the login redirect;
    a POST a role may make answers with its result (a redirect or the form again)."""
    r, p, pol, lab = w["run"].pk, w["pipeline"].pk, w["policy"].pk, w["lab"].pk
    watch = {"anonymous": 302, "none": 403, "viewer": 200, "operator": 200, "admin": 200}
    operate = {"anonymous": 302, "none": 403, "viewer": 403, "operator": 200, "admin": 200}
    post = {"anonymous": 302, "none": 403, "viewer": 403, "operator": 302, "admin": 302}
    staff = {"anonymous": 302, "none": 302, "viewer": 302, "operator": 302, "admin": 200}
    administer = {"anonymous": 302, "none": 403, "viewer": 403, "operator": 403, "admin": 200}
    c = w["conn"].pk
    return [
        ("get", "/connections/", watch), ("get", "/connections/new/", administer),
        ("get", f"/connections/{c}/edit/", administer),
        ("post", f"/connections/{c}/test/", administer),  # (its answer: cannot reach)
        ("post", "/pipelines/test-source/", operate),  # (the generator: nothing to test)
        ("get", "/runs/", watch), ("get", f"/runs/{r}/", watch),
        ("get", "/pipelines/", watch), ("get", "/policies/", watch),
        ("get", "/cluster/", watch),  # it names the runs on each host (issue 48)
        ("get", "/lab/", watch), ("get", f"/lab/{lab}/", watch),
        ("get", f"/lab/{lab}/status.json", watch),
        ("get", f"/lab/{lab}/bundle.zip", {**watch, **{k: 302 for k in ROLES}}),  # no result yet
        ("get", "/pipelines/new/", operate), ("get", f"/pipelines/{p}/edit/", operate),
        ("get", "/policies/new/", operate), ("get", f"/policies/{pol}/edit/", operate),
        ("get", "/lab/new/", operate), ("get", "/audit/", operate),
        ("post", "/runs/start/", post), ("post", f"/runs/{r}/stop/", post),
        ("post", f"/runs/{r}/restart/", post),  # (refused with a message: not failed)
        ("post", f"/runs/{r}/workers/", post), ("post", f"/runs/{r}/rebalance/", post),
        ("post", f"/runs/{r}/frequency/", post), ("post", f"/runs/{r}/move-groups/", post),
        ("post", f"/runs/{r}/dry-run/", post), ("post", f"/lab/{lab}/policy/", post),
        ("get", f"/runs/{r}/plan/", watch), ("post", f"/runs/{r}/plan/", post),
        ("post", "/pipelines/new/", {**post, "operator": 200, "admin": 200}),  # form errors
        ("post", "/policies/new/", {**post, "operator": 200, "admin": 200}),
        ("post", "/lab/new/", {**post, "operator": 200, "admin": 200}),
        ("get", "/admin/", staff), ("get", "/admin/auth/user/", staff),
        ("get", "/admin/audit/auditentry/", staff),
        # Anyone signed in makes tokens; a token acts only with its user's role.
        ("get", "/account/tokens/", {**{k: 200 for k in WHO}, "anonymous": 302}),
        ("post", "/account/tokens/new/", {k: 302 for k in WHO}),
    ]


@pytest.mark.django_db
def test_every_view_and_post_allows_exactly_the_roles_that_may_use_it(world) -> None:
    clients = {who: _client(who) for who in WHO}
    wrong = []
    for method, path, expected in _pages(world):
        for who in WHO:
            response = getattr(clients[who], method)(path)
            if response.status_code != expected[who]:
                wrong.append(f"{who} {method.upper()} {path}: {response.status_code}, "
                             f"expected {expected[who]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.django_db
def test_pages_show_only_the_controls_the_role_may_use(world) -> None:
    r = world["run"].pk
    controls = {f"/runs/{r}/": ['id="stop-run"', 'id="set-workers"', 'id="reconfigure-card"',
                                'id="set-dry-run"'],
                "/runs/": ['action="/runs/start/"'],
                "/pipelines/": ['id="new-pipeline"', "start-run", "/edit/"],
                "/policies/": ['id="new-policy"', "/edit/"],
                "/lab/": ['id="new-lab"']}
    for who in ("viewer", "operator"):
        client = _client(who)
        for path, marks in controls.items():
            html = client.get(path).content.decode()
            for mark in marks:
                assert (mark in html) == (who == "operator"), (who, path, mark)
        nav = client.get("/runs/").content.decode()
        assert ('href="/audit/"' in nav) == (who == "operator")


@pytest.mark.django_db(transaction=True)
def test_the_run_websocket_admits_the_roles_that_watch_and_refuses_the_others() -> None:
    from channels.testing import WebsocketCommunicator

    from pipelines.models import Run
    from webapp.asgi import application

    owner = _user("owner", "operator")
    pipeline, policy = make_pipeline_and_policy(owner, name="ws")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=owner)

    def cookie(who: str) -> bytes | None:
        if who == "anonymous":
            return None
        client = Client()
        client.force_login(_user(f"ws-{who}", None if who == "none" else who))
        return f"{settings.SESSION_COOKIE_NAME}=" \
               f"{client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    async def connect(value: bytes | None) -> tuple[bool, Any]:
        headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
        if value:
            headers.append((b"cookie", value))
        comm = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
        connected, code = await comm.connect(timeout=10)
        first = await comm.receive_json_from(timeout=10) if connected else code
        await comm.disconnect()
        return connected, first

    for who in WHO:
        connected, first = run_async(connect(cookie(who)))
        if who in ROLES:
            assert connected and first["kind"] == "snapshot", who
        else:
            assert not connected and first == (4401 if who == "anonymous" else 4403), who


# ------------------------------------------------------------------------- the log
@pytest.mark.django_db
def test_changes_made_through_the_views_are_audited_with_who_and_before_after(world) -> None:
    import json

    from audit.models import AuditEntry
    from tests.conftest import SMALL_DEFINITION

    operator = _client("operator")
    pipeline = world["pipeline"]
    changed = dict(SMALL_DEFINITION, key_groups=6)
    response = operator.post(f"/pipelines/{pipeline.pk}/edit/", {
        "name": pipeline.name, "description": "now six groups",
        "definition": json.dumps(changed)})
    assert response.status_code == 302
    entry = AuditEntry.objects.filter(target_type="pipeline", action="changed").first()
    assert entry.actor == "user:u-operator"
    assert entry.before["description"] == "" and entry.after["description"] == "now six groups"
    assert entry.before["version"] == 1 and entry.after["version"] == 2
    assert entry.after["definition"]["key_groups"] == 6

    policy = world["policy"]
    form = {"name": policy.name, "latency_bound_ms": 1234, "throughput_floor_rps": 0,
            "power_budget_w": policy.power_budget_w, "control_step_s": 2, "min_workers": 1,
            "max_workers": 1, "initial_workers": 1, "strategy": "manual",
            "strategy_params": "{}", "violation_steps": 3}
    response = operator.post(f"/policies/{policy.pk}/edit/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    entry = AuditEntry.objects.filter(target_type="policy", action="changed").first()
    assert (entry.before["latency_bound_ms"], entry.after["latency_bound_ms"]) == (5000, 1234)
    assert "power_budget_w" not in entry.after  # only what changed

    run = world["run"]
    assert operator.post(f"/runs/{run.pk}/stop/").status_code == 302
    entry = AuditEntry.objects.filter(target_type="run", action="run.stop_requested").first()
    assert entry.actor == "user:u-operator" and entry.target_id == str(run.pk)
    created = AuditEntry.objects.filter(target_type="run", action="run.created").first()
    assert created.actor == "user:owner"

    page = operator.get("/audit/", {"actor": "u-operator", "target_type": "policy"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "latency_bound_ms" in html and "1234.0" in html and "now six groups" not in html
    bad = operator.get("/audit/", {"since": "2026-02-02", "until": "2026-01-01"})
    assert bad.status_code == 200 and "&#x27;since&#x27; is after &#x27;until&#x27;" in \
        bad.content.decode()


@pytest.mark.django_db
def test_run_status_and_configuration_changes_are_audited(world) -> None:
    from audit.models import AuditEntry
    from pipelines import actions

    run = world["run"]
    assert actions.transition(run, "starting", "launcher")
    actions.update_config(run, workers=2)
    actions.update_config(run, workers=2)  # no change: no entry
    status = AuditEntry.objects.get(action="run.status:starting")
    assert (status.actor, status.before, status.after) == \
        ("launcher", {"status": "pending"}, {"status": "starting"})
    config = AuditEntry.objects.filter(action="run.configured")
    assert [(e.before, e.after) for e in config] == [({"workers": 0}, {"workers": 2})]


@pytest.mark.django_db
def test_user_and_role_changes_are_audited_from_the_cli_and_the_admin() -> None:
    from django.core.management import call_command

    from audit.models import AuditEntry

    admin_client = _client("admin")
    alice = _user("alice", "viewer")
    call_command("set_role", "alice", "operator")
    entry = AuditEntry.objects.filter(action="roles changed", target_repr="alice").first()
    assert entry.actor == "cli"
    assert (entry.before, entry.after) == ({"groups": ["viewer"]}, {"groups": ["operator"]})

    response = admin_client.post(f"/admin/auth/user/{alice.pk}/change/", {
        "username": "alice", "first_name": "Alice", "last_name": "", "email": "",
        "is_active": "on", "groups": [], "user_permissions": [],
        "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00"})
    assert response.status_code == 302, response.content.decode()[:3000]
    changed = AuditEntry.objects.filter(action="changed", target_repr="alice").first()
    assert changed.actor == "user:u-admin"
    assert changed.after == {"first_name": "Alice"}
    roles = AuditEntry.objects.filter(action="roles changed", target_repr="alice").first()
    assert roles.actor == "user:u-admin" and roles.after == {"groups": []}

    bad = subprocess.run([sys.executable, "manage.py", "set_role", "alice", "root"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'root'" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.django_db
@pytest.mark.both_engines  # a trigger on PostgreSQL, the model on SQLite
def test_the_audit_log_cannot_be_edited_or_deleted(world, django_db_blocker) -> None:
    from django.db import DatabaseError, connection, transaction

    from audit.models import AppendOnlyError, AuditEntry

    entry = AuditEntry.objects.first()
    entry.message = "rewritten"
    for attempt in (entry.save, entry.delete, lambda: AuditEntry.objects.update(message="x"),
                    lambda: AuditEntry.objects.all().delete()):
        with pytest.raises(AppendOnlyError):
            attempt()
    admin_client = _client("admin")
    assert admin_client.get(f"/admin/audit/auditentry/{entry.pk}/delete/").status_code == 403
    assert admin_client.post(f"/admin/audit/auditentry/{entry.pk}/change/",
                             {"message": "x"}).status_code == 403
    if connection.vendor == "postgresql":  # the database refuses too
        for sql in ("UPDATE audit_auditentry SET message = 'x'", "DELETE FROM audit_auditentry"):
            with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(sql)
    assert AuditEntry.objects.get(pk=entry.pk).message == ""
    # RunEvents, the run's own trail, cannot be deleted either
    event = world["run"].events.first()
    with pytest.raises(ValueError, match="append-only"):
        event.delete()
    assert admin_client.get(f"/admin/pipelines/runevent/{event.pk}/delete/").status_code == 403


@pytest.mark.django_db
def test_the_admin_site_shows_runs_versions_samples_and_events_read_only(world) -> None:
    """Issue 48: an admin changed a run's status, dry_run, checkpoint_dir and runner_pid
    and a superuser a version's definition in the admin, with no audit entry. Now no
    one changes, adds or deletes them there; the pipeline's page adds no version."""
    from django.contrib import admin
    from django.test import RequestFactory
    from django.utils import timezone

    from pipelines.models import MetricSample, Pipeline, Run

    run = world["run"]
    MetricSample.objects.create(run=run, batch_id=0, t=timezone.now(), latency_p95_ms=10.0)
    sample = MetricSample.objects.get(run=run)
    version = world["pipeline"].current_version
    event = run.events.first()
    for who in ("admin", "superuser"):
        client = Client()
        if who == "superuser":
            client.force_login(User.objects.get(username="owner"))
        else:
            client = _client("admin")
        for model, pk in (("run", run.pk), ("pipelineversion", version.pk),
                          ("metricsample", sample.pk), ("runevent", event.pk)):
            page = client.get(f"/admin/pipelines/{model}/{pk}/change/")
            assert page.status_code == 200, (who, model)  # shown, as a view
            assert 'type="submit"' not in page.content.decode().split("<form")[-1], (who, model)
            assert client.post(f"/admin/pipelines/{model}/{pk}/change/", {
                "status": "running", "dry_run": "on", "checkpoint_dir": "/tmp/x",
                "runner_pid": "1", "definition": "{}"}).status_code == 403, (who, model)
            assert client.get(f"/admin/pipelines/{model}/add/").status_code == 403
            assert client.get(f"/admin/pipelines/{model}/{pk}/delete/").status_code == 403
    fresh = Run.objects.get(pk=run.pk)
    assert (fresh.status, fresh.dry_run, fresh.checkpoint_dir) == (
        run.status, run.dry_run, run.checkpoint_dir)
    assert version.__class__.objects.get(pk=version.pk).definition == version.definition
    request = RequestFactory().get("/")
    request.user = User.objects.get(username="owner")
    inline = admin.site._registry[Pipeline].get_inline_instances(request, world["pipeline"])
    assert [i.has_add_permission(request, world["pipeline"]) for i in inline] == [False]


@pytest.mark.django_db
def test_a_spark_ui_address_is_a_link_only_when_it_is_http(world) -> None:
    """Issue 48: a ``javascript:`` URL in a run's spark_ui_url was rendered as a link
    (the runner reports the address; the page must not trust it)."""
    from pipelines.models import Run

    run, client = world["run"], _client("viewer")
    for stored, shown in (("javascript:alert(1)", False), (" JavaScript:alert(1)", False),
                          ("data:text/html,x", False), ("http://127.0.0.1:4040", True),
                          ("https://spark.example.com/ui", True)):
        Run.objects.filter(pk=run.pk).update(spark_ui_url=stored)
        html = client.get(f"/runs/{run.pk}/").content.decode()
        assert ("Spark UI</a>" in html) is shown, stored
        assert f'href="{stored.strip()}"' not in html or shown, stored


@pytest.mark.django_db
def test_the_admin_role_makes_no_superuser_and_gives_no_single_permission() -> None:
    """Issue 48: the admin role could tick is_superuser on its own account and give a
    viewer single permissions (change_run, add_pipeline) outside the roles."""
    client = _client("admin")
    me = User.objects.get(username="u-admin")
    viewer = _user("vera", "viewer")
    change_run = Permission.objects.get(codename="change_run")
    for user in (me, viewer):
        response = client.post(f"/admin/auth/user/{user.pk}/change/", {
            "username": user.username, "first_name": "", "last_name": "", "email": "",
            "is_active": "on", "is_staff": "on" if user == me else "",
            "is_superuser": "on", "groups": [g.pk for g in user.groups.all()],
            "user_permissions": [change_run.pk],
            "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00"})
        assert response.status_code == 302, response.content.decode()[:2000]
        user.refresh_from_db()
        assert not user.is_superuser and not user.user_permissions.exists(), user
    assert not viewer.has_perm("pipelines.change_run")
    form = client.get(f"/admin/auth/user/{viewer.pk}/change/").content.decode()
    assert 'name="is_superuser"' not in form and 'name="user_permissions"' not in form


@pytest.mark.django_db
def test_permission_run_and_version_changes_are_audited_whatever_path_made_them(
        world) -> None:
    """Issue 48: single permissions, a role's permissions, a run's fields and a
    version's definition changed without an entry. Each path now leaves one: the admin
    (a superuser), either side of a many-to-many relation, a shell's save."""
    from audit.models import AuditEntry

    # (the migrations' own role syncs are audited too: entries from before this test)
    before_test = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    owner = Client()
    owner.force_login(User.objects.get(username="owner"))
    viewer = _user("vic", "viewer")
    change_run = Permission.objects.get(codename="change_run")
    response = owner.post(f"/admin/auth/user/{viewer.pk}/change/", {
        "username": "vic", "first_name": "", "last_name": "", "email": "",
        "is_active": "on", "groups": [Group.objects.get(name="viewer").pk],
        "user_permissions": [change_run.pk], "last_login_0": "", "last_login_1": "",
        "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00"})
    assert response.status_code == 302, response.content.decode()[:2000]
    entry = AuditEntry.objects.get(action="permissions changed", target_repr="vic",
                                   pk__gt=before_test)
    assert (entry.actor, entry.before, entry.after) == (
        "user:owner", {"permissions": []}, {"permissions": ["pipelines.change_run"]})

    add_pipeline = Permission.objects.get(codename="add_pipeline")
    add_pipeline.user_set.add(viewer)  # from the permission's side
    viewers = Group.objects.get(name="viewer")
    viewers.permissions.remove(Permission.objects.get(codename="view_run"))
    Permission.objects.get(codename="view_policy").group_set.clear()
    entries = AuditEntry.objects.filter(action="permissions changed",
                                        pk__gt=before_test).order_by("pk")
    assert [(e.target_repr, e.after["permissions"]) for e in entries][1] == (
        "vic", ["pipelines.add_pipeline", "pipelines.change_run"])
    group_entries = [e for e in entries if e.target_type == "group"]
    assert {e.target_repr for e in group_entries} >= {"viewer", "operator", "admin"}
    first = group_entries[0]
    assert set(first.before["permissions"]) - set(first.after["permissions"]) == {
        "pipelines.view_run"}

    run = world["run"]
    assert AuditEntry.objects.filter(target_type="run", target_id=str(run.pk),
                                     action="created").count() == 0  # run.created says it
    run.runner_pid, run.checkpoint_dir = 4242, "/elsewhere"
    run.save()
    changed = AuditEntry.objects.get(target_type="run", action="changed")
    assert changed.after == {"runner_pid": 4242, "checkpoint_dir": "/elsewhere"}
    version = world["pipeline"].current_version
    version.definition = {**version.definition, "key_groups": 99}
    version.save()
    changed = AuditEntry.objects.get(target_type="pipeline version", action="changed")
    assert changed.after["definition"]["key_groups"] == 99


# ------------------------------------------------------------------ login, cookies
@pytest.mark.django_db
def test_logins_are_throttled_per_user_and_address() -> None:
    _user("mallory", "viewer")
    _user("bob", "viewer")
    client = Client(REMOTE_ADDR="127.0.0.1")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post("/login/", {"username": "mallory", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    locked = client.post("/login/", {"username": "mallory", "password": "wrong"})
    assert locked.status_code == 429
    right = client.post("/login/", {"username": "mallory", "password": "mallory-pass-123"})
    assert right.status_code == 429  # locked out: even the right password waits
    other = Client(REMOTE_ADDR="127.0.0.1").post(
        "/login/", {"username": "bob", "password": "bob-pass-123"})
    assert other.status_code == 302  # another user from the same address is not


@pytest.mark.django_db
def test_session_and_csrf_cookies_are_secure_http_only_and_same_site() -> None:
    _user("carol", "viewer")
    client = Client()
    client.get("/login/")
    response = client.post("/login/", {"username": "carol", "password": "carol-pass-123"})
    assert response.status_code == 302
    session = response.cookies[settings.SESSION_COOKIE_NAME]
    assert not settings.DEBUG
    assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"
    csrf = client.cookies[settings.CSRF_COOKIE_NAME]
    assert csrf["secure"] and csrf["httponly"]
