"""The admin site's view of pipelines and runs: read-only but for a pipeline's own
fields. A run changes through its actions (start, stop, reconfigure: each a RunEvent
and an audit entry), a version is what a pipeline's edit made, samples and events are
measurements and history: editing them here would skip what the actions check and
record."""
from typing import Any

from django.contrib import admin

from pipelines.models import MetricSample, Pipeline, PipelineVersion, Run, RunEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown to those who may view the model; added, changed and deleted by no one
    here (superusers included)."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class VersionInline(admin.TabularInline):
    model = PipelineVersion
    extra = 0
    readonly_fields = ("version", "definition", "created_by", "created_at")
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # a version is made by editing the pipeline (actions.save_pipeline)


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "updated_at")
    search_fields = ("name",)
    inlines = [VersionInline]


@admin.register(PipelineVersion)
class PipelineVersionAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "version", "created_at")


class EventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "kind", "actor", "message", "payload")
    fields = readonly_fields

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "pipeline_version", "policy", "status", "workers", "created_at")
    list_filter = ("status",)
    inlines = [EventInline]


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):  # append-only
    list_display = ("run", "at", "kind", "actor", "message")
    list_filter = ("kind",)


@admin.register(MetricSample)
class MetricSampleAdmin(ReadOnlyAdmin):
    list_display = ("run", "batch_id", "t", "latency_p95_ms", "output_rate", "workers",
                    "power_w", "power_measured")
    list_filter = ("power_measured",)
