"""Users on the admin site: the admin role manages accounts and their roles (groups),
and nothing above its own standing. Only a superuser makes superusers or gives a user
single permissions outside the roles (``accounts.roles``); every such change is
audited (``audit.tracking``)."""
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

# Fields of the user form that would lift a user above the roles.
SUPERUSER_ONLY = ("is_superuser", "user_permissions")

User = get_user_model()


class RoleBoundUserAdmin(UserAdmin):
    def get_readonly_fields(self, request: Any, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        if request.user.is_superuser:
            return fields
        return fields + SUPERUSER_ONLY


admin.site.unregister(User)
admin.site.register(User, RoleBoundUserAdmin)
