"""Audit every saved change of the models operators edit — pipelines, policies, Lab
runs, users and their roles — whichever path saved it (a view, the admin, a CLI):
before → after of the fields that changed. Changes made with ``QuerySet.update`` do not
send signals; the actions that use it record their own entries (runs: every RunEvent,
with the fields before and after; Lab status changes)."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from audit.log import record

# Fields whose changes are not worth an entry (timestamps the save itself sets, secrets
# shown only as "changed", bulky results).
SKIP = {"updated_at", "created_at", "last_login", "date_joined", "result", "progress",
        "total", "duration_s"}
SECRET = {"password"}
# Set while a caller changes a user's roles in several steps and records one entry itself.
_roles_recorded_by_caller: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "roles_recorded_by_caller", default=False)


@contextlib.contextmanager
def one_roles_entry(user: Any) -> Iterator[None]:
    """Change ``user``'s groups in several steps inside; one "roles changed" entry."""
    before = sorted(user.groups.values_list("name", flat=True))
    token = _roles_recorded_by_caller.set(True)
    try:
        yield
    finally:
        _roles_recorded_by_caller.reset(token)
    after = sorted(user.groups.values_list("name", flat=True))
    if before != after:
        record("roles changed", user, before={"groups": before}, after={"groups": after})


def snapshot(instance: models.Model) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in instance._meta.concrete_fields:
        if f.name in SKIP or f.primary_key:
            continue
        value = getattr(instance, f.attname)
        out[f.name] = "(set)" if f.name in SECRET and value else value
    return out


def _before(sender: type[models.Model], instance: models.Model, raw: bool = False,
            **_: Any) -> None:
    if raw or instance.pk is None:
        instance._audit_before = None
        return
    old = sender._default_manager.filter(pk=instance.pk).first()
    instance._audit_before = snapshot(old) if old is not None else None
    if old is not None:
        for f in SECRET & {f.name for f in sender._meta.concrete_fields}:
            if getattr(old, f) != getattr(instance, f):
                instance._audit_before[f] = "(old)"


def _after(sender: type[models.Model], instance: models.Model, created: bool,
           raw: bool = False, **_: Any) -> None:
    if raw:
        return
    now = snapshot(instance)
    before = getattr(instance, "_audit_before", None)
    if created or before is None:
        record("created", instance, after=now)
        return
    for f in SECRET & set(before):
        if before[f] == "(old)":
            now[f] = "(new)"
    changed = [k for k in now if before.get(k) != now[k]]
    if changed:
        record("changed", instance, before={k: before.get(k) for k in changed},
               after={k: now[k] for k in changed})


def _deleted(sender: type[models.Model], instance: models.Model, **_: Any) -> None:
    record("deleted", instance, before=snapshot(instance))


def _groups_changed(sender: Any, instance: Any, action: str, reverse: bool,
                    pk_set: set[int] | None, **_: Any) -> None:
    """A user's roles (groups): before → after as names."""
    if reverse or _roles_recorded_by_caller.get() or action not in ("pre_add", "pre_remove", "pre_clear", "post_add",
                                 "post_remove", "post_clear"):
        return
    if action.startswith("pre_"):
        instance._audit_groups = sorted(instance.groups.values_list("name", flat=True))
        return
    before = getattr(instance, "_audit_groups", None)
    after = sorted(instance.groups.values_list("name", flat=True))
    if before != after:
        record("roles changed", instance, before={"groups": before},
               after={"groups": after})


def tracked_models() -> list[type[models.Model]]:
    from control.models import LabRun, Policy
    from pipelines.models import Pipeline

    return [Pipeline, Policy, LabRun, get_user_model(), Group]


def connect() -> None:
    for model in tracked_models():
        uid = f"audit-{model._meta.label}"
        pre_save.connect(_before, sender=model, dispatch_uid=uid)
        post_save.connect(_after, sender=model, dispatch_uid=uid)
        post_delete.connect(_deleted, sender=model, dispatch_uid=uid)
    m2m_changed.connect(_groups_changed, sender=get_user_model().groups.through,
                        dispatch_uid="audit-user-groups")
