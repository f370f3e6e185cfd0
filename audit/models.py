"""The audit log: one row per change to anything an operator cares about — who, when,
what, before → after. Append-only: the model and its querysets refuse to edit or delete
a row (the admin included), and on PostgreSQL a trigger refuses UPDATE and DELETE to
anything that goes around Django (``migrations/0002_append_only.py``)."""
from __future__ import annotations

from typing import Any

from django.db import models


class AppendOnlyError(RuntimeError):
    pass


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("the audit log is append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("the audit log is append-only")


class AuditEntry(models.Model):
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Who: "user:<name>", "system", "runner", ... The user's id is kept as a plain
    # number, not a foreign key: the log outlives the user, and deleting a user must not
    # rewrite its rows.
    actor = models.CharField(max_length=150, db_index=True)
    actor_id = models.IntegerField(null=True, blank=True)
    action = models.CharField(max_length=60, db_index=True,
                              help_text="created, changed, deleted, run.<event>, ...")
    target_type = models.CharField(max_length=40, db_index=True)
    target_id = models.CharField(max_length=40, blank=True)
    target_repr = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["target_type", "target_id"])]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target_repr}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise AppendOnlyError("the audit log is append-only")

    @property
    def changes(self) -> list[tuple[str, Any, Any]]:
        """(field, before, after) for every field either side names."""
        before, after = self.before or {}, self.after or {}
        keys = list(before) + [k for k in after if k not in before]
        return [(k, before.get(k), after.get(k)) for k in keys]
