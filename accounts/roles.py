"""The three roles, as Django groups of permissions (created by this app's migration,
kept in step by ``manage.py set_role`` and ``sync_roles``):

* **viewer** watches: every list and page, the run's live charts.
* **operator** also starts, stops and reconfigures runs, edits pipelines and policies,
  runs Lab comparisons, and reads the audit log.
* **admin** also manages users and their roles (the admin site: ``is_staff``).

A logged-in user in no role sees nothing but a 403 page."""
from __future__ import annotations

from typing import Any

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

_VIEW = ["pipelines.view_pipeline", "pipelines.view_pipelineversion", "pipelines.view_run",
         "pipelines.view_runevent", "pipelines.view_metricsample", "control.view_policy",
         "control.view_labrun", "control.view_decision"]
_OPERATE = ["pipelines.add_pipeline", "pipelines.change_pipeline", "pipelines.add_run",
            "pipelines.change_run", "control.add_policy", "control.change_policy",
            "control.add_labrun", "audit.view_auditentry"]
_ADMINISTER = ["auth.view_user", "auth.add_user", "auth.change_user", "auth.delete_user",
               "auth.view_group"]

PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _VIEW,
    OPERATOR: _VIEW + _OPERATE,
    ADMIN: _VIEW + _OPERATE + _ADMINISTER,
}


def sync_roles(group_model: Any, permission_model: Any) -> None:
    """Create the groups and give each exactly its permissions (idempotent). Takes the
    models as arguments so that a migration can pass its historical ones."""
    for role, names in PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=role)
        wanted = []
        for name in names:
            app_label, codename = name.split(".")
            wanted.append(permission_model.objects.get(content_type__app_label=app_label,
                                                       codename=codename))
        group.permissions.set(wanted)
