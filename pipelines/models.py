"""Pipelines (versioned definitions), runs, their audit trail and their metrics."""
from __future__ import annotations

import enum
import secrets
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from pipelines.runtime.spec import definition as pdef
from pipelines.runtime.bus import RunnerEvent


def validate_definition(value: object) -> None:
    try:
        pdef.validate(value)
    except pdef.DefinitionError as exc:
        raise ValidationError(str(exc)) from exc


class Pipeline(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    definition = models.JSONField(validators=[validate_definition])
    version = models.PositiveIntegerField(default=1)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def current_version(self) -> PipelineVersion:
        return self.versions.get(version=self.version)


class PipelineVersion(models.Model):
    """An immutable snapshot of a definition; runs point at one, so editing a
    pipeline never changes what a past or running run executed."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    definition = models.JSONField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pipeline", "-version"]
        constraints = [models.UniqueConstraint(fields=["pipeline", "version"],
                                               name="unique_pipeline_version")]

    def __str__(self) -> str:
        return f"{self.pipeline.name} v{self.version}"


class RunStatus(models.TextChoices):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STALLED = "stalled"  # running, but no batch for many batch times while input waits
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    LOST = "lost"


ACTIVE_STATUSES = (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.STALLED,
                   RunStatus.STOPPING)
TERMINAL_STATUSES = (RunStatus.STOPPED, RunStatus.FAILED, RunStatus.LOST)
# Allowed lifecycle transitions (source -> targets); anything else is refused.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    RunStatus.PENDING: (RunStatus.STARTING, RunStatus.STOPPED, RunStatus.FAILED),
    RunStatus.STARTING: (RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.STOPPED,
                         RunStatus.FAILED, RunStatus.LOST),
    RunStatus.RUNNING: (RunStatus.STALLED, RunStatus.STOPPING, RunStatus.STOPPED,
                        RunStatus.FAILED, RunStatus.LOST),
    RunStatus.STALLED: (RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.STOPPED,
                        RunStatus.FAILED, RunStatus.LOST),
    RunStatus.STOPPING: (RunStatus.STOPPED, RunStatus.FAILED, RunStatus.LOST),
    # Restart from checkpoint (actions.restart_run): a failed or lost run's runner starts
    # again on its own checkpoint and clock.
    RunStatus.FAILED: (RunStatus.PENDING,),
    RunStatus.LOST: (RunStatus.PENDING,),
}


def new_bus_token() -> str:
    return secrets.token_hex(4)


def verification_badge(doc: dict | None) -> tuple[str, str]:
    """(text, css class) of the exactly-once badge for a run's stored verification."""
    doc = doc or {}
    state = doc.get("state")
    if state == "done":
        return ((f"OK · {doc.get('of', 0)} batches", "v-ok") if doc.get("ok")
                else ("FAILED", "v-failed"))
    if state == "running":
        return (f"checking {doc.get('done', 0)} of {doc['of']}" if doc.get("of")
                else "reading", "v-busy")
    if state == "queued":
        return "queued", "v-busy"
    if state == "error":
        return "not checkable", "v-none"
    return "not checked", "v-none"


class Run(models.Model):
    pipeline_version = models.ForeignKey(PipelineVersion, on_delete=models.PROTECT,
                                         related_name="runs")
    policy = models.ForeignKey("control.Policy", on_delete=models.PROTECT, related_name="runs")
    # The version of the policy this run uses (control.PolicyVersion): the one it started
    # with, or one an operator switched it to. Null for runs from before versions.
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    # spark.cores.max of its application: the most workers any version can give it.
    max_workers_cap = models.PositiveIntegerField(null=True, blank=True, editable=False)
    status = models.CharField(max_length=10, choices=RunStatus.choices,
                              default=RunStatus.PENDING, db_index=True)
    status_reason = models.TextField(blank=True)
    spark_app_id = models.CharField(max_length=100, blank=True)
    spark_ui_url = models.CharField(max_length=200, blank=True)
    runner_pid = models.PositiveIntegerField(null=True, blank=True)
    # Current configuration (what the runner last reported).
    workers = models.PositiveIntegerField(default=0)
    frequency_ghz = models.FloatField(null=True, blank=True)
    frequency_source = models.CharField(
        max_length=16, blank=True,
        help_text="cpufreq (DVFS set), emulated (duty cycle), cpuinfo/nominal (read only)")
    frequencies = models.JSONField(default=list, blank=True,
                                   help_text="frequencies (GHz) the runner can set")
    key_groups = models.PositiveIntegerField(default=0)
    checkpoint_dir = models.CharField(max_length=500, blank=True)
    dry_run = models.BooleanField(
        default=False, help_text="the controller decides and shows, but does not act")
    verification = models.JSONField(
        null=True, blank=True, editable=False,
        help_text="the exactly-once check of the kept output: state, ok, line, done, of, "
                  "report (pipelines.runtime.verify)")
    bus_token = models.CharField(max_length=16, default=new_bus_token, editable=False,
                                 help_text="makes this run's Redis keys unique")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    launched_at = models.DateTimeField(null=True, blank=True,
                                       help_text="when the runner process was spawned")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.pipeline_version})"

    @property
    def bus_key(self) -> str:
        return f"{self.pk}.{self.bus_token}"

    @property
    def verification_badge(self) -> tuple[str, str]:
        """(text, css class) of the exactly-once badge (pushed as is to the run page)."""
        return verification_badge(self.verification)

    @property
    def keeps_output(self) -> bool:
        """Whether the run's sink keeps its output (what the exactly-once check reads)."""
        from pipelines.runtime.spec import definition

        try:
            return definition.validate(self.pipeline_version.definition).keep_output
        except definition.DefinitionError:
            return False

    @property
    def policy_in_force(self) -> Any:
        """The policy as this run uses it: its version's settings (a
        ``control.models.Policy``, unsaved); the policy row itself for a run from before
        versions. Everything that steers or bounds the run reads this, not ``policy``."""
        found = self.policy.version_row(self.policy_version)
        return found.as_policy() if found is not None else self.policy

    @property
    def spark_ui_link(self) -> str:
        """The driver's UI address as a link target: http(s) only. The runner reports it
        and a page renders it as ``href``, where ``javascript:`` would run script."""
        url = self.spark_ui_url.strip()
        return url if url.lower().startswith(("http://", "https://")) else ""

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class EventKind(enum.StrEnum):
    """Every kind of RunEvent the control plane records. Two families are composed:
    ``status:<RunStatus>`` (a lifecycle transition, :meth:`status`) and
    ``runner:<RunnerEvent>`` (relayed from the runner's bus, :meth:`runner`)."""

    CREATED = "created"
    STOP_REQUESTED = "stop_requested"
    START_IGNORED = "start_ignored"
    START_REQUEUED = "start_requeued"
    VERIFY_REQUESTED = "verify_requested"
    VERIFIED = "verified"
    STOP_IGNORED = "stop_ignored"
    RUNNER_LAUNCHED = "runner_launched"
    RECONFIGURE_REQUESTED = "reconfigure_requested"
    RECONFIGURE_IGNORED = "reconfigure_ignored"
    RECONFIGURE_REFUSED = "reconfigure_refused"
    RECONFIGURE_TIMEOUT = "reconfigure_timeout"
    RECONFIGURED = "reconfigured"
    RECONFIGURE_FAILED = "reconfigure_failed"
    CONTROLLER_REFUSED = "controller_refused"
    ALERT = "alert"
    DRY_RUN_ON = "dry_run_on"
    DRY_RUN_OFF = "dry_run_off"
    POLICY_SWITCHED = "policy_switched"
    RESTART_REQUESTED = "restart_requested"
    PREEMPTED = "preempted"  # the arbiter took cores back for a higher-priority run
    HELD = "held"  # a guard, a plug-in or the arbiter held the controller's decisions

    @staticmethod
    def status(to: str) -> str:
        return f"status:{RunStatus(to).value}"

    @staticmethod
    def runner(kind: str) -> str:
        return f"runner:{RunnerEvent(kind).value}"

    @classmethod
    def check(cls, kind: str) -> str:
        """``kind`` if it is one of the kinds above (or a composed one); else ValueError."""
        family, colon, rest = kind.partition(":")
        if colon and family == "status":
            return cls.status(rest)
        if colon and family == "runner":
            return cls.runner(rest)
        return cls(kind).value


class RunEvent(models.Model):
    """Append-only audit trail of a run: who or what did what, when (its ``kind`` is an
    :class:`EventKind`)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=40)
    actor = models.CharField(max_length=100, help_text="user:<name>, runner, reconciler, ...")
    message = models.TextField(blank=True)
    payload = models.JSONField(default=dict, blank=True)
    # Redis stream entry id for events relayed from the runner (dedupes re-reads).
    source_id = models.CharField(max_length=40, blank=True)

    class Meta:
        ordering = ["at", "id"]
        constraints = [models.UniqueConstraint(
            fields=["run", "source_id"], condition=~models.Q(source_id=""),
            name="unique_relayed_event")]

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("RunEvent is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("RunEvent is append-only")

    def as_dict(self) -> dict:
        return {"id": self.pk, "at": self.at.isoformat(), "kind": self.kind, "actor": self.actor,
                "message": self.message, "payload": self.payload}


class MetricSample(models.Model):
    """One micro-batch of a run, as measured by the runner (power may be modelled)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="samples")
    t = models.DateTimeField(help_text="when the sink committed the batch")
    batch_id = models.BigIntegerField()
    input_rows = models.BigIntegerField(default=0)
    records = models.BigIntegerField(default=0, help_text="records committed by the sink")
    input_rate = models.FloatField(null=True, help_text="Spark's inputRowsPerSecond")
    scheduled_rate = models.FloatField(null=True)
    output_rate = models.FloatField(null=True)
    batch_duration_ms = models.IntegerField(null=True)
    latency_p50_ms = models.FloatField(null=True)
    latency_p95_ms = models.FloatField(null=True)
    latency_p99_ms = models.FloatField(null=True)
    latency_max_ms = models.FloatField(null=True)
    workers = models.PositiveIntegerField(default=0)
    frequency_ghz = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    power_measured = models.BooleanField(default=False)
    state_rows = models.BigIntegerField(null=True)
    frequency_source = models.CharField(max_length=16, blank=True)
    # Elastic runtime (measured from Spark's REST API and the checkpoint each batch).
    drift = models.IntegerField(null=True, help_text="groups that ran off their placement")
    group_moves = models.IntegerField(null=True,
                                      help_text="groups on another executor than last batch")
    failed_tasks = models.IntegerField(null=True)
    dead_letters = models.BigIntegerField(
        null=True, help_text="a broker source's entries that did not convert, so far")
    backlog_s = models.FloatField(
        null=True, blank=True,
        help_text="how far a broker source's newest entry is ahead of what the batch read (s)")
    groups = models.JSONField(null=True, blank=True,
                              help_text="per key group: placement, ran_on, bytes, ms")
    migration = models.JSONField(null=True, blank=True, help_text="migration in progress")

    class Meta:
        ordering = ["run", "batch_id"]
        constraints = [models.UniqueConstraint(fields=["run", "batch_id"],
                                               name="unique_run_batch")]
        indexes = [models.Index(fields=["run", "t"])]


class ConnectionKind(models.TextChoices):
    REDIS = "redis", "Redis"
    NATS = "nats", "NATS JetStream"
    POSTGRES = "postgres", "PostgreSQL"


class Connection(models.Model):
    """A server that definitions name (``"connection": "<name>"`` in a source or a sink)
    instead of a URL: its URL without credentials, and its password apart — write-only
    in the forms, "(set)" in the audit log's before/after, given to a run's runner in
    its private runner.json (0600), never on a command line. An admin keeps them."""

    name = models.CharField(max_length=63, unique=True,
                            validators=[RegexValidator(pdef.CONNECTION_NAME.pattern,
                                                       "lower-case letters, digits, - and _ "
                                                       "(at most 63)")])
    kind = models.CharField(max_length=16, choices=ConnectionKind.choices)
    url = models.CharField(max_length=500, help_text="without a password")
    username = models.CharField(max_length=200, blank=True)
    password = models.CharField(max_length=500, blank=True)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        try:
            pdef.server_url({"url": self.url}, "url", pdef.SERVER_SCHEMES.get(self.kind, ()),
                            "redis://127.0.0.1:6379/0")
        except pdef.DefinitionError as exc:
            raise ValidationError({"url": exc.message}) from None
        if self.url and "@" in self.url.split("//", 1)[-1].split("/", 1)[0]:
            raise ValidationError({"url": "give the user name in its own field"})

    def runtime(self) -> dict[str, str]:
        """What a runner gets: the URL with the user name in it, and the password."""
        from urllib.parse import quote, urlsplit, urlunsplit

        url = self.url
        if self.username:
            parts = urlsplit(url)
            url = urlunsplit((parts.scheme, f"{quote(self.username, safe='')}@{parts.netloc}",
                              parts.path, parts.query, parts.fragment))
        return {"kind": self.kind, "url": url, "password": self.password}
