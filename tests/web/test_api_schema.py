"""The whole REST API against its own OpenAPI schema (issue 47), property-based with
schemathesis: on every operation, as viewer, operator and admin, generated requests
never get a 5xx and every response matches the schema (status documented, body of its
declared shape), with PostgreSQL (and SQLite) behind it."""
from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.conftest import SMALL_DEFINITION


@pytest.fixture()
def api_schema() -> Any:
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    # As Django's test client does: a request must not close the test's own database
    # connection (its transaction holds the test's data).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture()
def tokens(db: Any) -> dict[str, str]:
    """A token per role, and one of each thing the API names (a pipeline, a policy, a
    run, a connection), so that generated requests also reach existing objects."""
    from django.contrib.auth.models import Group, Permission, User

    from accounts.roles import ROLES, sync_roles
    from api.models import ApiToken
    from control.models import Policy
    from pipelines import actions
    from pipelines.models import Connection, Pipeline

    sync_roles(Group, Permission)
    out = {}
    for role in ROLES:
        user = User.objects.create_user(f"schema-{role}")
        user.groups.add(Group.objects.get(name=role))
        out[role] = ApiToken.issue(user, "schema")[1]
    owner = User.objects.get(username="schema-admin")
    pipeline = actions.save_pipeline(Pipeline(name="p", definition=SMALL_DEFINITION), owner)
    policy = Policy.objects.create(name="q", latency_bound_ms=3000, power_budget_w=40,
                                   min_workers=1, initial_workers=1, max_workers=2)
    actions.create_run(pipeline, policy, owner)
    Connection.objects.create(name="c", kind="redis", url="redis://127.0.0.1:6399/0")
    return out


@schema.parametrize()
@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@pytest.mark.django_db
def test_every_operation_answers_as_its_schema_says(case: Any, tokens: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # (a run created here must not reach Celery: nothing runs it)
    monkeypatch.setattr("pipelines.actions.enqueue", lambda *a, **k: None)
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    # "Schema-valid" requests the API refuses on their meaning (an unknown pipeline's
    # name, a run not running) answer 4xx by design: the checks are the acceptance's,
    # no 5xx and every answer as the schema documents it.
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    # The coverage phase's cases (1,115 of 1,260: each parameter of the wrong type, at
    # its bounds, each method the operation lacks) test the API's validation, which a
    # role refused first never reaches: they run as admin, whom every check lets
    # through; the generated cases run as each role (the test took 19 s alone with
    # every case as each role, 12 s so).
    phase = case.meta.phase.name if case.meta else None
    roles = ("admin",) if phase == "coverage" else ("viewer", "operator", "admin")
    for role in roles:
        case.call_and_validate(headers={"Authorization": f"Bearer {tokens[role]}"},
                               checks=checks)
