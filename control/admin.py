from django.contrib import admin

from control.models import LabRun, Policy


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "latency_bound_ms", "throughput_floor_rps", "power_budget_w",
                    "min_workers", "max_workers", "strategy")
    search_fields = ("name",)


@admin.register(LabRun)
class LabRunAdmin(admin.ModelAdmin):
    list_display = ("pk", "name", "status", "progress", "total", "created_by", "created_at")
    readonly_fields = ("scenario", "result")
