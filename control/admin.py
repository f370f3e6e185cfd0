from django.contrib import admin

from control.models import Policy


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "latency_bound_ms", "throughput_floor_rps", "power_budget_w",
                    "min_workers", "max_workers", "strategy")
    search_fields = ("name",)
