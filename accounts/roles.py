"""The three roles, as Django groups of permissions (created by this app's migration,
kept in step by ``manage.py set_role`` and ``sync_roles``):

* **viewer** watches: every list and page, the run's live charts, the connections'
  names and URLs (never their passwords).
* **operator** also starts, stops and reconfigures runs, edits pipelines and policies,
  runs Lab comparisons, and reads the audit log.
* **admin** also manages users and their roles (the admin site: ``is_staff``), the
  connections to brokers and databases (their passwords), and how the runs share the
  cluster (the fleet settings).

A logged-in user in no role sees nothing but a 403 page."""
from __future__ import annotations

from typing import Any

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

_VIEW = ["pipelines.view_pipeline", "pipelines.view_pipelineversion", "pipelines.view_run",
         "pipelines.view_runevent", "pipelines.view_metricsample", "control.view_policy",
         "control.view_labrun", "control.view_decision", "pipelines.view_connection"]
_OPERATE = ["pipelines.add_pipeline", "pipelines.change_pipeline", "pipelines.add_run",
            "pipelines.change_run", "control.add_policy", "control.change_policy",
            "control.add_labrun", "audit.view_auditentry"]
_ADMINISTER = ["auth.view_user", "auth.add_user", "auth.change_user", "auth.delete_user",
               "auth.view_group", "pipelines.add_connection", "pipelines.change_connection",
               "pipelines.delete_connection", "control.change_fleetsettings"]

PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _VIEW,
    OPERATOR: _VIEW + _OPERATE,
    ADMIN: _VIEW + _OPERATE + _ADMINISTER,
}


def sync_roles(group_model: Any, permission_model: Any, skip_missing: bool = False) -> None:
    """Create the groups and give each exactly its permissions (idempotent). Takes the
    models as arguments so that a migration can pass its historical ones; a migration
    skips the permissions of models later migrations add (every migrate ends with a
    full sync, ``accounts.apps``)."""
    for role, names in PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=role)
        wanted = []
        for name in names:
            app_label, codename = name.split(".")
            found = permission_model.objects.filter(content_type__app_label=app_label,
                                                    codename=codename).first()
            if found is None and skip_missing:
                continue
            if found is None:
                raise LookupError(f"no permission {name}")
            wanted.append(found)
        group.permissions.set(wanted)
