from typing import Any

from django.contrib import admin

from control import policies
from control.models import Decision, LabRun, Policy


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "latency_bound_ms", "throughput_floor_rps",
                    "power_budget_w", "min_workers", "max_workers", "strategy")
    search_fields = ("name",)

    def save_model(self, request: Any, obj: Policy, form: Any, change: bool) -> None:
        policies.save_policy(obj, request.user)  # a new version when settings changed


@admin.register(LabRun)
class LabRunAdmin(admin.ModelAdmin):
    list_display = ("pk", "name", "status", "progress", "total", "created_by", "created_at")
    readonly_fields = ("scenario", "result")


@admin.register(Decision)
class DecisionAdmin(admin.ModelAdmin):
    """Read-only: decisions are the controller's audit trail."""

    list_display = ("run", "step", "at", "strategy", "current_workers", "chosen_workers",
                    "chosen_freq_ghz", "action", "outcome", "predicted_latency_ms",
                    "measured_latency_ms", "solve_ms")
    list_filter = ("strategy", "action", "outcome")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
