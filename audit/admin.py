from django.contrib import admin

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only for everyone, superusers included: the log is append-only."""

    list_display = ("at", "actor", "action", "target_type", "target_repr")
    list_filter = ("action", "target_type")
    search_fields = ("actor", "target_repr", "message")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
