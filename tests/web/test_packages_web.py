"""Operator packages on the pages (issue 46): the pipeline form lists every installed
operator with what it reads and adds, its parameters and doc; the Cluster page lists the
packages with their versions, and one that failed to load with its error."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from pipelines.runtime.operators import packages


def _admin() -> Client:
    from accounts.roles import sync_roles

    sync_roles(Group, Permission)
    user = User.objects.create_user("pkg-admin", password="pkg-admin-pass-1")
    user.groups.add(Group.objects.get(name="admin"))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_form_and_the_cluster_page_list_the_installed_operators(monkeypatch) -> None:
    client = _admin()
    page = client.get("/pipelines/new/").content.decode()
    assert 'data-operator="order_gross"' in page and 'data-operator="quote_fit"' in page
    assert "tax_pct = 21 (0..100)" in page and "gross_cents (long)" in page
    module = "streamwise_example_ops.jobs:customer_totals"
    assert f'data-module="{module}"' in page and "tax_pct = 21 (0..100): tax added" in page
    assert "no live re-plan (no state horizon declared)" in page
    real = packages._entry_points
    monkeypatch.setattr(packages, "_entry_points", lambda group=packages.ENTRY_POINT_GROUP: [
        *real(group), ("broken", "broken-dist", "0.3", "no_such_module_here:OPERATORS")])
    packages.reload()
    try:
        page = client.get("/cluster/").content.decode()
    finally:
        monkeypatch.undo()
        packages.reload()
    assert "streamwise-example-ops 0.1.0" in page
    assert 'data-package-error="broken"' in page and "ModuleNotFoundError" in page


MODULE = "streamwise_example_ops.jobs:customer_totals"
MODULE_DOC = {"app": MODULE, "params": {"tax_pct": 7.5},
              "source": {"type": "generator", "partitions": 2,
                         "rate": {"kind": "constant", "records_per_s": 500}},
              "key_groups": 4}


@pytest.mark.django_db
def test_the_form_takes_a_pipeline_module_and_says_what_the_runtime_cannot_do() -> None:
    """A module path that does not exist, bad parameters, a source without its columns:
    each a field error on the form (no 500) and nothing stored; a good one is saved as
    written, and the form and the list say it will not be re-planned live (and why)."""
    import json

    from pipelines.models import Pipeline

    client = _admin()
    for doc, message in [
        ({**MODULE_DOC, "app": "my_team.jobs:build"},
         "app: &quot;my_team.jobs:build&quot; is not an installed pipeline module"),
        ({**MODULE_DOC, "params": {"tax_pct": "high"}}, "params.tax_pct: must be a number"),
        ({**MODULE_DOC, "params": {"min_amount": -1}},
         "params.min_amount: must be between 0 and 1000, got -1"),
    ]:
        response = client.post("/pipelines/new/", {"name": "mod", "description": "",
                                                   "definition": json.dumps(doc)})
        assert response.status_code == 200, response.status_code
        assert message in response.content.decode()
        assert not Pipeline.objects.filter(name="mod").exists()
    response = client.post("/pipelines/new/", {"name": "mod", "description": "",
                                               "definition": json.dumps(MODULE_DOC)})
    assert response.status_code == 302
    stored = Pipeline.objects.get(name="mod")
    assert stored.definition["app"] == MODULE and "nodes" not in stored.definition
    assert stored.definition["params"] == {"tax_pct": 7.5, "min_amount": 0.0}
    edit = client.get(f"/pipelines/{stored.pk}/edit/").content.decode()
    assert 'id="elastic-limits"' in edit and "No live re-plan" in edit
    assert "declares no state horizon" in edit
    assert 'data-node="app"' in edit  # its DAG: source -> app -> sink
    listed = client.get("/pipelines/").content.decode()
    assert "No live re-plan" in listed
