"""Writing the audit log: ``record`` from a domain action (in its transaction, so the
entry and the change commit or roll back together), the acting user from the request
(``ActorMiddleware``) or from ``acting_as`` (CLI, tasks)."""
from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Callable, Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from audit.models import AuditEntry

# The acting user of this request / command: a User, a label such as "runner", or a
# callable giving one (the request's user is resolved lazily, as Django does).
_actor: contextvars.ContextVar[Any] = contextvars.ContextVar("audit_actor", default=None)


@contextlib.contextmanager
def acting_as(actor: Any) -> Iterator[None]:
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


class ActorMiddleware:
    """Makes the request's user the actor of every change the request makes."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        with acting_as(lambda: getattr(request, "user", None)):
            return self.get_response(request)


def _who(actor: Any) -> tuple[str, int | None]:
    if callable(actor):
        actor = actor()
    if actor is None:
        return "system", None
    if isinstance(actor, str):  # "runner", "reconciler", an action's "user:<name>"
        return actor, None
    if getattr(actor, "is_authenticated", False):
        return f"user:{actor.get_username()}", actor.pk
    return "anonymous", None


def jsonable(value: Any) -> Any:
    """Dates, decimals and UUIDs as Django's JSON encoder writes them."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def record(action: str, target: models.Model | tuple[str, Any, str], *,
           before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
           message: str = "", actor: Any = None) -> AuditEntry:
    """One audit entry. ``target`` is a model instance or ``(type, id, text)``;
    ``actor`` defaults to the request's user (or ``acting_as``), else "system"."""
    if isinstance(target, models.Model):
        target_type = target._meta.verbose_name
        target_id, target_repr = str(target.pk or ""), str(target)
    else:
        target_type, target_id, target_repr = target[0], str(target[1]), target[2]
    name, user_id = _who(actor if actor is not None else _actor.get())
    return AuditEntry.objects.create(
        actor=name[:150], actor_id=user_id, action=action[:60],
        target_type=str(target_type)[:40], target_id=target_id[:40],
        target_repr=target_repr[:200], message=message,
        before=jsonable(before) if before is not None else None,
        after=jsonable(after) if after is not None else None)
