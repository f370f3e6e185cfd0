"""Audit every saved change of the models that steer or record what runs — pipelines
and their versions, policies, runs, Lab runs, users, their roles and permissions, and
the roles' permissions — whichever path saved it (a view, the admin, a CLI, a shell):
before → after of the fields that changed. Changes made with ``QuerySet.update`` do not
send signals; the actions that use it record their own entries (runs: every RunEvent,
with the fields before and after; Lab status changes), and an action that records its
own entry for a save says so with ``recorded_by_caller``. Measurements (metric samples,
the controller's decisions) and the run events themselves are not changes: they are
appended, never edited (the admin shows them read-only)."""
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
# Set while a caller records its own entry for what it saves (a user's roles changed in
# several steps, a run created by its action).
_recorded_by_caller: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "recorded_by_caller", default=False)


@contextlib.contextmanager
def recorded_by_caller() -> Iterator[None]:
    """Saves inside record no entry of their own: the caller records one."""
    token = _recorded_by_caller.set(True)
    try:
        yield
    finally:
        _recorded_by_caller.reset(token)


@contextlib.contextmanager
def one_roles_entry(user: Any) -> Iterator[None]:
    """Change ``user``'s groups in several steps inside; one "roles changed" entry."""
    before = sorted(user.groups.values_list("name", flat=True))
    with recorded_by_caller():
        yield
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
    if raw or instance.pk is None or _recorded_by_caller.get():
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
    if raw or _recorded_by_caller.get():
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
    if not _recorded_by_caller.get():
        record("deleted", instance, before=snapshot(instance))


def _names(relation: Any) -> list[str]:
    """A user's groups by name, or permissions as ``app_label.codename``."""
    if relation.model is Group:
        return sorted(relation.values_list("name", flat=True))
    return sorted(f"{a}.{c}" for a, c in relation.values_list("content_type__app_label",
                                                               "codename"))


# The many-to-many relations whose changes are audited: (attribute, entry's action,
# the key of its before/after).
RELATIONS = {"groups": ("roles changed", "groups"),
             "user_permissions": ("permissions changed", "permissions"),
             "permissions": ("permissions changed", "permissions")}


def _relation_changed(attribute: str) -> Any:
    """A receiver of ``m2m_changed`` for ``instance.<attribute>``: before → after as
    names, one entry per add, remove or clear (whichever side's manager made it)."""
    action_name, key = RELATIONS[attribute]

    def receiver(sender: Any, instance: Any, action: str, reverse: bool, model: Any,
                 pk_set: set[int] | None, **_: Any) -> None:
        if _recorded_by_caller.get() or not action.startswith(("pre_", "post_")):
            return
        # From the other side (a group's user_set, a permission's group_set) the owners
        # whose relation changes are the other side's objects: an entry for each.
        if not reverse:
            owners = [instance]
        elif action == "pre_clear":
            owners = instance._audit_owners = list(
                model._default_manager.filter(**{attribute: instance}))
        elif action == "post_clear":
            owners = getattr(instance, "_audit_owners", [])
        else:
            owners = list(model._default_manager.filter(pk__in=pk_set or ()))
        # The signal's instance is the same object before and after the change.
        kept = instance.__dict__.setdefault("_audit_relations", {})
        for owner in owners:
            if action.startswith("pre_"):
                kept[attribute, owner.pk] = _names(getattr(owner, attribute))
                continue
            before = kept.pop((attribute, owner.pk), None)
            after = _names(getattr(owner, attribute))
            if before != after:
                record(action_name, owner, before={key: before}, after={key: after})

    return receiver


def tracked_models() -> list[type[models.Model]]:
    from control.models import FleetSettings, LabRun, Policy
    from pipelines.models import Connection, Pipeline, PipelineVersion, Run

    return [Pipeline, PipelineVersion, Policy, Run, LabRun, Connection, FleetSettings,
            get_user_model(), Group]


def connect() -> None:
    for model in tracked_models():
        uid = f"audit-{model._meta.label}"
        pre_save.connect(_before, sender=model, dispatch_uid=uid)
        post_save.connect(_after, sender=model, dispatch_uid=uid)
        post_delete.connect(_deleted, sender=model, dispatch_uid=uid)
    user = get_user_model()
    for through, attribute in ((user.groups.through, "groups"),
                               (user.user_permissions.through, "user_permissions"),
                               (Group.permissions.through, "permissions")):
        m2m_changed.connect(_relation_changed(attribute), sender=through, weak=False,
                            dispatch_uid=f"audit-{attribute}")
