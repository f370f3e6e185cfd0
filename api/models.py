"""Per-user API tokens (issue 47): made and revoked by their user (an admin may revoke
any), shown once, stored as a SHA-256 hash. A token acts with its user's role."""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX_CHARS = 8


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="what it is for, e.g. ci-deploy")
    prefix = models.CharField(max_length=PREFIX_CHARS, unique=True, editable=False,
                              help_text="the token's first characters, to tell it apart")
    hashed = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.CharField(max_length=150, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} (sw_{self.prefix}…, {self.user})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def issue(cls, user: Any, name: str) -> tuple[ApiToken, str]:
        """A new token for ``user``: the row and the token text (shown once)."""
        while True:
            prefix = secrets.token_hex(PREFIX_CHARS // 2)
            if not cls.objects.filter(prefix=prefix).exists():
                break
        secret = secrets.token_urlsafe(32)
        text = f"sw_{prefix}_{secret}"
        token = cls.objects.create(user=user, name=name, prefix=prefix,
                                   hashed=token_hash(text))
        return token, text

    @classmethod
    def find(cls, text: str) -> ApiToken | None:
        """The active token whose text this is, or None."""
        import hmac

        parts = text.split("_", 2)
        if len(parts) != 3 or parts[0] != "sw" or len(parts[1]) != PREFIX_CHARS:
            return None
        token = cls.objects.select_related("user").filter(prefix=parts[1]).first()
        if token is None or not token.active or not token.user.is_active:
            return None
        if not hmac.compare_digest(token.hashed, token_hash(text)):
            return None
        return token

    def revoke(self, by: Any) -> None:
        self.revoked_at = timezone.now()
        self.revoked_by = getattr(by, "username", str(by))
        self.save(update_fields=["revoked_at", "revoked_by"])
