from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _sync_roles(sender: Any, **kwargs: Any) -> None:
    """After every migrate (and a test database's flush): the role groups exist and hold
    exactly their permissions, including permissions of models added since."""
    from django.contrib.auth.models import Group, Permission

    from accounts.roles import sync_roles

    sync_roles(Group, Permission)


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts and roles"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Sent once per app after migrate; "accounts" is installed last, so every other
        # app's permissions exist by then.
        post_migrate.connect(_sync_roles, sender=self, dispatch_uid="accounts-sync-roles")
