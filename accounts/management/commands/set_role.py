"""``manage.py set_role USER ROLE``: viewer, operator, admin, or none (no role)."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.roles import ADMIN, ROLES, sync_roles
from audit.log import acting_as
from audit.tracking import one_roles_entry


class Command(BaseCommand):
    help = "Give a user one role (viewer, operator, admin) or none."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("role", choices=[*ROLES, "none"])

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        role = options["role"]
        with acting_as("cli"), transaction.atomic():
            sync_roles(Group, Permission)
            with one_roles_entry(user):
                user.groups.remove(*Group.objects.filter(name__in=ROLES))
                if role != "none":
                    user.groups.add(Group.objects.get(name=role))
            if user.is_staff != (role == ADMIN):
                user.is_staff = role == ADMIN
                user.save(update_fields=["is_staff"])
        self.stdout.write(f"{user.get_username()}: {role}")
