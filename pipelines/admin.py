from django.contrib import admin

from pipelines.models import MetricSample, Pipeline, PipelineVersion, Run, RunEvent


class VersionInline(admin.TabularInline):
    model = PipelineVersion
    extra = 0
    readonly_fields = ("version", "definition", "created_by", "created_at")
    can_delete = False


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "updated_at")
    search_fields = ("name",)
    inlines = [VersionInline]


@admin.register(PipelineVersion)
class PipelineVersionAdmin(admin.ModelAdmin):
    list_display = ("pipeline", "version", "created_at")


class EventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "kind", "actor", "message", "payload")
    fields = readonly_fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "pipeline_version", "policy", "status", "workers", "created_at")
    list_filter = ("status",)
    inlines = [EventInline]

    def has_delete_permission(self, request, obj=None):
        return False  # deleting a run would delete its audit trail (RunEvent)


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ("run", "at", "kind", "actor", "message")
    list_filter = ("kind",)

    def has_change_permission(self, request, obj=None):
        return False  # append-only

    def has_delete_permission(self, request, obj=None):
        return False  # append-only


@admin.register(MetricSample)
class MetricSampleAdmin(admin.ModelAdmin):
    list_display = ("run", "batch_id", "t", "latency_p95_ms", "output_rate", "workers",
                    "power_w", "power_measured")
    list_filter = ("power_measured",)
