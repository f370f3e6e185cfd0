"""QoS policies: what operators ask of a run."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from control.live import LoopError, check_params, json_safe
from control.strategies import STRATEGIES

MAX_WORKERS_LIMIT = 64
# The fields a policy version fixes for the runs that use it (name and description are
# labels: renaming a policy is not a new version).
VERSIONED_FIELDS = ("latency_bound_ms", "throughput_floor_rps", "power_budget_w",
                    "control_step_s", "min_workers", "max_workers", "initial_workers",
                    "strategy", "strategy_params", "violation_steps", "alert_webhook")
# ... and how the run shares the cluster (control/fleet.py, control/plugins.py).
FLEET_FIELDS = ("priority", "guaranteed_workers", "max_share_workers", "excluded_periods",
                "max_reconfigurations_per_hour", "cooldown_up_s", "cooldown_down_s",
                "decision_plugins")
VERSIONED_FIELDS += FLEET_FIELDS


class Policy(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    latency_bound_ms = models.FloatField(
        "p95 latency bound (ms)",
        validators=[MinValueValidator(1.0), MaxValueValidator(3_600_000.0)],
        help_text="Upper bound on the 95th percentile end-to-end latency.")
    throughput_floor_rps = models.FloatField(
        "throughput floor (records/s)", default=0.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1e9)])
    power_budget_w = models.FloatField(
        "power budget (W)", validators=[MinValueValidator(0.1), MaxValueValidator(100_000.0)])
    control_step_s = models.FloatField(
        "control step (s)", default=2.0,
        validators=[MinValueValidator(0.5), MaxValueValidator(3600.0)])
    min_workers = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_WORKERS_LIMIT)])
    max_workers = models.PositiveIntegerField(
        default=2, validators=[MinValueValidator(1), MaxValueValidator(MAX_WORKERS_LIMIT)])
    initial_workers = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_WORKERS_LIMIT)])
    strategy = models.CharField(max_length=40, choices=sorted(STRATEGIES.items()),
                                default="manual")
    strategy_params = models.JSONField(default=dict, blank=True)
    violation_steps = models.PositiveIntegerField(
        "alert after violating steps", default=3,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="A QoS alert is raised when the p95 bound (or the throughput floor) is "
                  "broken for this many control steps in a row.")
    alert_webhook = models.URLField(
        blank=True, help_text="Optional: alerts are also POSTed here as JSON.")
    # One cluster, many runs (control/fleet.py): the arbiter's inputs and the guards.
    priority = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="When the runs ask for more cores than the cluster has, a run of higher "
                  "priority may take back a lower one's cores above its guarantee.")
    guaranteed_workers = models.PositiveIntegerField(
        "guaranteed workers", default=1,
        validators=[MinValueValidator(0), MaxValueValidator(MAX_WORKERS_LIMIT)],
        help_text="Cores the run gets whenever it asks for them, whatever the others' "
                  "priorities.")
    max_share_workers = models.PositiveIntegerField(
        "maximum share (workers)", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_WORKERS_LIMIT)],
        help_text="Optional: the most cores of the cluster the run may hold.")
    excluded_periods = models.JSONField(
        default=list, blank=True,
        help_text="Cron expressions (minute hour day month weekday, UTC); no scaling in "
                  "a minute any of them matches, e.g. 50-59 * * * * or * 9-17 * * mon-fri.")
    max_reconfigurations_per_hour = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text="Optional: the controller holds once this many reconfigurations were "
                  "applied in the last hour.")
    cooldown_up_s = models.FloatField(
        "cooldown after a scale-up (s)", default=0.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(86_400.0)])
    cooldown_down_s = models.FloatField(
        "cooldown after a scale-down (s)", default=0.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(86_400.0)])
    decision_plugins = models.JSONField(
        default=list, blank=True,
        help_text="Installed decision plug-ins (entry point group "
                  "streamwise.decision_plugins) that review each decision and may veto "
                  "or change it.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The latest of its versions (PolicyVersion); saved by control.policies.save_policy.
    version = models.PositiveIntegerField(default=1, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "policies"

    def control_settings(self) -> dict[str, Any]:
        """What a version fixes: everything that steers or bounds a run."""
        return {name: json_safe(getattr(self, name)) for name in VERSIONED_FIELDS}

    def version_row(self, version: int | None) -> PolicyVersion | None:
        """Version ``version`` of this policy, if it exists."""
        if version is None:
            return None
        return self.versions.filter(version=version).first()

    def current_version(self, user: Any = None) -> PolicyVersion:
        """The version row of the policy's settings as saved now: the latest one, or a
        new one when the row was changed since (a first save; an edit that did not go
        through control.policies.save_policy, e.g. the shell)."""
        latest = self.versions.order_by("-version").first()
        values = self.control_settings()
        if latest is not None and latest.values == values:
            return latest
        number = latest.version + 1 if latest is not None else 1
        made = PolicyVersion.objects.create(policy=self, version=number, values=values,
                                            created_by=user if getattr(user, "pk", None)
                                            else None)
        Policy.objects.filter(pk=self.pk).update(version=number)
        self.version = number
        return made

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.min_workers and self.max_workers and self.min_workers > self.max_workers:
            errors["max_workers"] = "must be at least min workers"
        if self.initial_workers and self.max_workers and self.min_workers and not (
                self.min_workers <= self.initial_workers <= self.max_workers):
            errors["initial_workers"] = (f"must be between min ({self.min_workers}) and "
                                         f"max ({self.max_workers}) workers")
        errors.update(fleet_errors(self))
        if not isinstance(self.strategy_params, dict):
            errors["strategy_params"] = "must be a JSON object, e.g. {} or {\"horizon\": 2}"
        elif self.strategy == "manual" and self.strategy_params:
            errors["strategy_params"] = "The manual strategy takes no parameters."
        elif self.strategy and self.strategy != "manual":
            # The closed loop's own checks (horizon 1-5, weights > 0, thresholds
            # ordered, ...), for every path that saves a policy: form, admin, Lab.
            try:
                check_params(self.strategy, self.strategy_params)
            except LoopError as exc:
                errors["strategy_params"] = str(exc)
        if errors:
            raise ValidationError(errors)


def fleet_errors(policy: Policy) -> dict[str, str]:
    """The fleet fields' own checks (form, admin, API and documents all save through
    ``clean``): cron expressions that parse, plug-ins that are installed and load, a
    guarantee and a share within the worker limits."""
    from control import fleet, plugins

    errors: dict[str, str] = {}
    periods = policy.excluded_periods
    if not isinstance(periods, list) or not all(isinstance(p, str) for p in periods):
        errors["excluded_periods"] = "must be a list of cron expressions"
    else:
        try:
            policy.excluded_periods = [fleet.check_cron(p) for p in periods]
        except fleet.FleetError as exc:
            errors["excluded_periods"] = str(exc)
    names = policy.decision_plugins
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        errors["decision_plugins"] = "must be a list of installed plug-in names"
    else:
        try:
            plugins.load(names)
        except plugins.PluginError as exc:
            errors["decision_plugins"] = str(exc)
    if policy.max_workers and policy.guaranteed_workers is not None \
            and policy.guaranteed_workers > policy.max_workers:
        errors["guaranteed_workers"] = f"must be at most max workers ({policy.max_workers})"
    if policy.max_share_workers is not None and policy.min_workers \
            and policy.max_share_workers < policy.min_workers:
        errors["max_share_workers"] = f"must be at least min workers ({policy.min_workers})"
    return errors


class FleetSettings(models.Model):
    """How the runs share the cluster (one row, ``current()``): the arbiter, the cores it
    shares (all the master's alive cores, or fewer: cores kept for other Spark
    applications) and the cluster-wide excluded periods, which every policy's own join.
    Edited on the Cluster page by admins; its first values come from the environment
    (ARBITER, EXCLUDED_PERIODS)."""

    arbiter = models.CharField(max_length=20, default="priority",
                               help_text="priority: cores where the priority-weighted "
                                         "modelled violations fall most, taking cores back "
                                         "from lower priorities; fcfs: first come, first "
                                         "served, no preemption.")
    cores_limit = models.PositiveIntegerField(
        "cores shared by runs", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100_000)],
        help_text="Empty: every alive core of the Spark master.")
    excluded_periods = models.JSONField(
        default=list, blank=True,
        help_text="Cron expressions (UTC): no run scales in a minute any of them matches.")
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "fleet settings"

    def __str__(self) -> str:
        return "fleet settings"

    @classmethod
    def current(cls) -> FleetSettings:
        found = cls.objects.filter(pk=1).first()
        if found is not None:
            return found
        made, _ = cls.objects.get_or_create(pk=1, defaults={
            "arbiter": settings.ARBITER, "excluded_periods": list(settings.EXCLUDED_PERIODS)})
        return made

    def clean(self) -> None:
        from control import fleet

        errors: dict[str, str] = {}
        if self.arbiter not in fleet.ARBITERS:
            errors["arbiter"] = f"one of {', '.join(fleet.ARBITERS)}"
        try:
            self.excluded_periods = [fleet.check_cron(p) for p in self.excluded_periods or []]
        except fleet.FleetError as exc:
            errors["excluded_periods"] = str(exc)
        if errors:
            raise ValidationError(errors)


class PolicyVersion(models.Model):
    """One version of a policy's settings. A run keeps the version it started with; an
    edit of the policy makes a new version, which a running run uses only when an
    operator switches it (control.policies.switch_version)."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    values = models.JSONField(help_text="the VERSIONED_FIELDS of the policy")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["policy", "-version"]
        constraints = [models.UniqueConstraint(fields=["policy", "version"],
                                               name="one_row_per_policy_version")]

    def __str__(self) -> str:
        return f"{self.policy.name} v{self.version}"

    def as_policy(self) -> Policy:
        """The policy as this version had it (unsaved: a view, never written back)."""
        return Policy(pk=self.policy.pk, name=self.policy.name,
                      description=self.policy.description, version=self.version,
                      created_by_id=self.policy.created_by_id,
                      created_at=self.policy.created_at, updated_at=self.created_at,
                      **self.values)


class LabStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class LabRun(models.Model):
    """One Strategy Lab comparison: the scenario as submitted (the simulator's JSON
    document, ``control/sim/README.md``), its progress, and the stored result."""

    name = models.CharField(max_length=100)
    scenario = models.JSONField()
    status = models.CharField(max_length=10, choices=LabStatus.choices,
                              default=LabStatus.PENDING)
    progress = models.PositiveIntegerField(default=0)  # strategies finished
    total = models.PositiveIntegerField(default=0)  # strategies to run
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)  # when a worker claimed it

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"lab {self.pk}: {self.name}"

    @property
    def percent(self) -> int:
        return int(100 * self.progress / self.total) if self.total else 0


class DecisionOutcome(models.TextChoices):
    HOLD = "hold"  # the strategy keeps the configuration
    DRY_RUN = "dry-run"  # decided and shown, not sent (the run's dry-run switch)
    BUSY = "busy"  # a previous reconfiguration is still under way
    PENDING = "pending"  # sent to the runner, not acknowledged yet
    APPLIED = "applied"  # the runner acknowledged and it took effect
    FAILED = "failed"  # the runner refused or did not acknowledge
    EXCLUDED = "excluded"  # a guard held it: an excluded period, a cap, a cooldown
    VETOED = "vetoed"  # a decision plug-in vetoed it
    REFUSED = "refused"  # the arbiter gave the cores to other runs


class Decision(models.Model):
    """One control step of a run: what was observed, predicted, chosen and done.

    ``inputs``/``predictions``/``cost`` are ``control.live.LiveDecision`` as-is; the
    columns copy what the decisions table and the charts need."""

    run = models.ForeignKey("pipelines.Run", on_delete=models.CASCADE,
                            related_name="decisions")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    t = models.FloatField(help_text="runner time (epoch s) of the step's last batch")
    step = models.PositiveIntegerField()
    strategy = models.CharField(max_length=40)
    action = models.CharField(max_length=20)
    outcome = models.CharField(max_length=10, choices=DecisionOutcome.choices)
    outcome_message = models.TextField(blank=True)
    current_workers = models.PositiveIntegerField()
    current_freq_ghz = models.FloatField()
    chosen_workers = models.PositiveIntegerField()
    chosen_freq_ghz = models.FloatField()
    measured_latency_ms = models.FloatField(null=True)
    predicted_latency_ms = models.FloatField(null=True, help_text="for the next step")
    predicted_power_w = models.FloatField(null=True)
    solve_ms = models.FloatField()
    reason = models.TextField(blank=True)
    alerts = models.JSONField(default=list, blank=True)
    inputs = models.JSONField(default=dict)
    predictions = models.JSONField(default=list)
    cost = models.JSONField(default=dict, blank=True)
    model_error = models.JSONField(default=dict, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"],
                                               name="unique_run_decision_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}: {self.action} ({self.outcome})"

    def as_dict(self) -> dict:
        """The wire form (run page, WebSocket): strict JSON, no NaN or infinity."""
        mape = (self.model_error or {}).get("mape") or {}
        return json_safe({"id": self.pk, "step": self.step, "t": self.t, "at": self.at.isoformat(),
                "strategy": self.strategy, "action": self.action, "outcome": self.outcome,
                "outcome_message": self.outcome_message,
                "current": {"workers": self.current_workers, "freq_ghz": self.current_freq_ghz},
                "chosen": {"workers": self.chosen_workers, "freq_ghz": self.chosen_freq_ghz},
                "measured_latency_ms": self.measured_latency_ms,
                "predicted_latency_ms": self.predicted_latency_ms,
                "predicted_power_w": self.predicted_power_w, "solve_ms": self.solve_ms,
                "cost": self.cost, "reason": self.reason, "alerts": self.alerts,
                "rebalance": (self.inputs or {}).get("rebalance"), "mape": mape})
