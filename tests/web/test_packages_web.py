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
    assert "tax_pct = 21 (0–100)" in page and "gross_cents (long)" in page
    real = packages._entry_points()
    monkeypatch.setattr(packages, "_entry_points", lambda: [
        *real, ("broken", "broken-dist", "0.3", "no_such_module_here:OPERATORS")])
    packages.reload()
    try:
        page = client.get("/cluster/").content.decode()
    finally:
        monkeypatch.undo()
        packages.reload()
    assert "streamwise-example-ops 0.1.0" in page
    assert 'data-package-error="broken"' in page and "ModuleNotFoundError" in page
