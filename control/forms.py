from __future__ import annotations

import json

from django import forms
from django.conf import settings

from control import jsonio, lab, sim, webhooks
from control.models import Policy


def json_from_field(text: str | None) -> object:
    """A textarea's JSON (empty means {}), or a form error naming line and column."""
    try:
        return jsonio.loads((text or "").strip() or "{}")
    except jsonio.InputError as exc:
        raise forms.ValidationError(str(exc)[0].upper() + str(exc)[1:]) from exc


class CronLinesField(forms.CharField):
    """Excluded periods as a textarea, one cron expression a line; a list in and out
    (the models' ``clean`` checks each expression)."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 2, "class": "mono"}))
        super().__init__(**kwargs)

    def prepare_value(self, value: object) -> object:
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value: object) -> list[str]:  # type: ignore[override]
        if isinstance(value, list):
            return [str(v).strip() for v in value if str(v).strip()]
        return [line.strip() for line in str(value or "").splitlines() if line.strip()]


# A trace of one rate per second for a day is ~100 KB of CSV.
MAX_TRACE_UPLOAD_BYTES = 4 * 1024 * 1024

class PolicyForm(forms.ModelForm):
    strategy_params = forms.CharField(
        required=False, initial="{}", widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text='JSON object of strategy parameters, e.g. {"horizon": 2, "alpha": 2, '
                  '"beta": 0.5, "gamma": 0.4} for an MPC strategy, {"theta_max": 0.9, '
                  '"theta_min": 0.8} for th-rule; "violation_steps", '
                  '"rebalance_threshold", "warmup_batches" (default 20), "migration_planner" ("ding-table" or '
                  '"mtm-table": Ding\'s look-ahead with the run\'s own transition matrix) '
                  'and "mtm_gamma" for any.')
    # A webhook typed without a scheme is https (Django 6's default; explicit now).
    alert_webhook = forms.URLField(required=False, assume_scheme="https",
                                   help_text=Policy._meta.get_field("alert_webhook").help_text)

    excluded_periods = CronLinesField(
        help_text=Policy._meta.get_field("excluded_periods").help_text + " One per line.")
    decision_plugins = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple,
        help_text=Policy._meta.get_field("decision_plugins").help_text)

    class Meta:
        model = Policy
        fields = ["name", "description", "latency_bound_ms", "throughput_floor_rps",
                  "power_budget_w", "control_step_s", "min_workers", "initial_workers",
                  "max_workers", "strategy", "strategy_params", "violation_steps",
                  "alert_webhook", "priority", "guaranteed_workers", "max_share_workers",
                  "excluded_periods", "max_reconfigurations_per_hour", "cooldown_up_s",
                  "cooldown_down_s", "decision_plugins"]

    def __init__(self, *args, **kwargs) -> None:
        from control import plugins

        super().__init__(*args, **kwargs)
        value = self.initial.get("strategy_params")
        if isinstance(value, dict):
            self.initial["strategy_params"] = json.dumps(value)
        # Every installed plug-in with its description; one that does not load is
        # listed with its error and cannot be chosen (Policy.clean says why).
        self.fields["decision_plugins"].choices = [
            (i.name, f"{i.name} ({i.distribution} {i.version}): "
                     f"{i.error or i.description}") for i in plugins.installed()]
        for name in self.OPTIONAL_WITH_DEFAULT:
            self.fields[name].required = False

    # Left out (a form, a document or an API call from before them): the model's default.
    OPTIONAL_WITH_DEFAULT = ("priority", "guaranteed_workers", "cooldown_up_s",
                             "cooldown_down_s")

    def clean(self) -> dict:
        cleaned = super().clean()
        for name in self.OPTIONAL_WITH_DEFAULT:
            if cleaned.get(name) is None and name not in self.errors:
                cleaned[name] = Policy._meta.get_field(name).get_default()
        return cleaned

    def clean_strategy_params(self) -> dict:
        value = json_from_field(self.cleaned_data.get("strategy_params"))
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be a JSON object, e.g. {} or {\"horizon\": 2}.")
        return value

    def clean_alert_webhook(self) -> str:
        url = self.cleaned_data.get("alert_webhook") or ""
        if url:
            try:
                webhooks.check(url, settings.WEBHOOK_ALLOWED_HOSTS)
            except webhooks.WebhookRefused as exc:
                raise forms.ValidationError(f"Not usable as a webhook: {exc}.") from exc
        return url

    def clean_max_workers(self) -> int:
        from pipelines.cluster_status import cluster_cores

        n = self.cleaned_data["max_workers"]
        cores, source = cluster_cores()
        if n > cores:
            raise forms.ValidationError(
                f"At most {cores}: the Spark cluster offers {cores} cores ({source}) and "
                "every worker is a 1-core executor.")
        return n



class LabForm(forms.Form):
    """The Strategy Lab form: a workload, the platform, and the strategies to compare.
    ``clean`` builds the simulator's scenario document and validates it with the
    simulator itself, so every error the CLI would give shows here, on its field."""

    WORKLOADS = [("random_walk", "Thesis random walk (180 s, 135K–458K tuples/s)"),
                 ("step", "Step"), ("sine", "Sine"), ("spike", "Spike"),
                 ("trace", "Uploaded CSV trace (one rate per row)")]
    KEYS = [("file", "HFT symbols (2,836, thesis artifact)"), ("zipf", "Zipf"),
            ("uniform", "Uniform")]

    name = forms.CharField(max_length=100, initial="comparison")
    workload = forms.ChoiceField(choices=WORKLOADS, initial="random_walk")
    rate_scale = forms.FloatField(
        initial=0.04, min_value=0.0, max_value=1e3,
        help_text="Multiplies the trace: 0.04 = 1/25, one triggering tuple in δ = 25.")
    base_rate = forms.FloatField(initial=8000, min_value=0, max_value=1e9, required=False,
                                 help_text="Step/sine/spike: base rate (tuples/s).")
    peak_rate = forms.FloatField(initial=16000, min_value=0, max_value=1e9, required=False,
                                 help_text="Step: rate after; sine: amplitude; spike: peak.")
    at_s = forms.FloatField(initial=60, min_value=0, max_value=1e6, required=False,
                            help_text="Step/spike: when (s); sine: period (s).")
    trace_file = forms.FileField(required=False, help_text="CSV for the uploaded trace.")
    keys = forms.ChoiceField(choices=KEYS, initial="file")
    key_count = forms.IntegerField(initial=2836, min_value=1, max_value=1_000_000)
    zipf_s = forms.FloatField(initial=1.0, min_value=0, max_value=10)
    service_ms = forms.FloatField(initial=0.5, min_value=1e-6, max_value=1e6,
                                  help_text="Time per triggering tuple at the top frequency.")
    steps = forms.IntegerField(initial=180, min_value=1, max_value=10_000)
    step_s = forms.FloatField(initial=1.0, min_value=0.01, max_value=3600,
                              help_text="Control step (s).")
    seed = forms.IntegerField(initial=1, min_value=0, max_value=2**63 - 1)
    latency_bound_ms = forms.FloatField(initial=1.5, min_value=1e-6, max_value=1e9)
    max_workers = forms.IntegerField(initial=12, min_value=1, max_value=1000)
    mode = forms.ChoiceField(choices=[("queue", "Queues (record at a time)"),
                                      ("microbatch", "Micro-batches (Spark)")])
    strategies = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple)
    parameters = forms.CharField(
        required=False, initial="{}", widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text='Per strategy name, e.g. {"lat-node": {"alpha": 3, "forecaster": "ma3"}}.')
    calibrate_from = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Calibrate from run",
        help_text="Replaces the workload, service time, mode, step, bound and worker range "
                  "by what this run measured (its batch model and arrival rate): a policy "
                  "made from the result can steer live runs.")

    def __init__(self, *args, user: object = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.user = user  # whose comparisons the queue cap counts (None: not checked)
        self.fields["strategies"].choices = [(k, k) for k in lab.PRESETS]
        self.fields["strategies"].initial = list(lab.DEFAULT_PRESETS)
        # A callable: read when the field is drawn or given a run, not for every form.
        self.fields["calibrate_from"].choices = _calibration_choices
        self.scenario: dict | None = None

    def clean_parameters(self) -> dict:
        value = json_from_field(self.cleaned_data.get("parameters"))
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise forms.ValidationError('Must map strategy names to objects, e.g. '
                                        '{"lat-node": {"alpha": 3}}.')
        return value

    def clean(self) -> dict:
        data = super().clean()
        if self.errors:
            return data
        kind = data["workload"]
        rate: dict = {"kind": kind, "scale": data["rate_scale"]}
        base, peak, at = data.get("base_rate"), data.get("peak_rate"), data.get("at_s")
        if kind == "step":
            rate.update(before=base, after=peak, at_s=at)
        elif kind == "sine":
            rate.update(base=base, amplitude=peak, period_s=at)
        elif kind == "spike":
            rate.update(base=base, peak=peak, at_s=at, length_s=max(1.0, (at or 0) / 4))
        elif kind == "trace":
            upload = data.get("trace_file")
            if upload is None:
                self.add_error("trace_file", "Upload a CSV trace for this workload.")
                return data
            if upload.size > MAX_TRACE_UPLOAD_BYTES:
                # Django spools a large upload to a temporary file: refused unread.
                self.add_error("trace_file", f"The trace is {upload.size:,} bytes; at most "
                               f"{MAX_TRACE_UPLOAD_BYTES:,} are accepted.")
                return data
            try:
                rates = sim.workloads.parse_csv_trace(
                    upload.read().decode("utf-8", errors="replace"))
            except sim.ScenarioError as exc:
                self.add_error("trace_file", str(exc))
                return data
            # One rate a second, of which the comparison reads one per control step:
            # only those are kept (the rest would only be stored, and copied into the
            # audit log), one a step.
            rate["rates"] = [rates[min(int(k * data["step_s"]), len(rates) - 1)]
                             for k in range(data["steps"])]
            rate["seconds_per_value"] = data["step_s"]
        keys: dict = {"kind": data["keys"]}
        if data["keys"] != "file":
            keys.update(n=data["key_count"], s=data["zipf_s"])
        params = data.get("parameters") or {}
        unknown = sorted(set(params) - set(sim.STRATEGY_NAMES))
        if unknown:
            self.add_error("parameters", f"Unknown strategy name(s): {', '.join(unknown)}.")
            return data
        specs = []
        for preset in data["strategies"]:
            spec = dict(lab.PRESETS[preset])
            spec.update(params.get(spec["name"], {}))
            spec["label"] = preset
            specs.append(spec)
        scenario = {
            "steps": data["steps"], "step_s": data["step_s"], "seed": data["seed"],
            "workload": {"rate": rate, "keys": keys, "service": {"mean_ms": data["service_ms"]}},
            "qos": {"latency_bound_ms": data["latency_bound_ms"]},
            "system": {"max_workers": data["max_workers"], "mode": data["mode"],
                       "initial_workers": max(1, data["max_workers"] // 2),
                       "rebalancer": "flux" if data["max_workers"] <= 64 else "balanced"},
            "strategies": specs,
        }
        if data.get("calibrate_from") is not None:
            try:
                scenario = lab.calibrated_scenario(scenario, data["calibrate_from"])
            except sim.ScenarioError as exc:
                self.add_error("calibrate_from", str(exc))
                return data
        try:
            scn = sim.parse_scenario(scenario)
            for i, spec in enumerate(specs):
                sim.build_controller(spec, scn, i)
        except sim.ScenarioError as exc:
            field = _field_for(str(exc))
            self.add_error(field, str(exc))
            return data
        limit = settings.LAB_TIME_LIMIT_S
        estimate = lab.estimate_seconds(scenario, stop_above=limit)
        if estimate > limit:
            self.add_error("steps", (
                f"This comparison would take at least {estimate:,.0f} s here (measured "
                f"on its first steps), over the Lab's limit of {limit:g} s: "
                "compare fewer strategies, steps, workers or keys."))
            return data
        if _queue_full(self):
            return data
        self.scenario = scenario
        return data


class FleetSettingsForm(forms.ModelForm):
    """The Cluster page's fleet settings (admins): arbiter, cores shared, cluster-wide
    excluded periods (one cron expression a line)."""

    arbiter = forms.ChoiceField(choices=[])
    excluded_periods = CronLinesField(
        help_text="One cron expression a line (minute hour day month weekday, UTC), e.g. "
                  "* 2 * * * for 02:00-02:59 every day.")

    class Meta:
        from control.models import FleetSettings

        model = FleetSettings
        fields = ["arbiter", "cores_limit", "excluded_periods"]

    def __init__(self, *args, **kwargs) -> None:
        from control import fleet

        super().__init__(*args, **kwargs)
        self.fields["arbiter"].choices = [(name, build().label)
                                          for name, build in fleet.ARBITERS.items()]


class FleetLabForm(forms.Form):
    """A Lab comparison of several runs on one cluster (``control/sim/fleet.py``): the
    scenario as JSON, prefilled with an example of three runs of different priorities,
    checked by the simulator's own parser (errors name the path)."""

    name = forms.CharField(max_length=100, initial="arbiters")
    scenario = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24, "class": "mono"}),
        help_text="runs: each with priority, guaranteed_workers, max_share_workers, "
                  "excluded_periods, decision_plugins, strategy, workload, qos, system "
                  "(as a single-run scenario); cluster.cores; arbiters to compare "
                  "(priority, fcfs); start: the simulated clock's start (ISO 8601).")

    def __init__(self, *args, user: object = None, **kwargs) -> None:
        from control.sim import fleet as fleetsim

        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["scenario"].initial = json.dumps(fleetsim.EXAMPLE, indent=1)
        self.scenario: dict | None = None

    def clean_scenario(self) -> dict:
        from control.sim import fleet as fleetsim

        value = json_from_field(self.cleaned_data.get("scenario"))
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be a JSON object with a list of runs.")
        value.setdefault("runs", [])
        try:
            fleetsim.parse_fleet(value)
        except sim.ScenarioError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return value

    def clean(self) -> dict:
        data = super().clean()
        if self.errors:
            return data
        if _queue_full(self):
            return data
        self.scenario = data["scenario"]
        return data


def _queue_full(form: forms.Form) -> bool:
    """Whether the form's user has the most comparisons queued or running that one user
    may (a form-wide error says so): one user cannot hold the Lab's queue."""
    user = getattr(form, "user", None)
    if user is None or lab.active_labs(user) < settings.LAB_MAX_ACTIVE_PER_USER:
        return False
    form.add_error(None, (f"You have {settings.LAB_MAX_ACTIVE_PER_USER} comparisons queued "
                          "or running; start this one when one of them has ended."))
    return True


def _calibration_choices() -> list[tuple[object, str]]:
    return [("", "— none: the workload above —"), *lab.runs_to_calibrate_from()]


def _field_for(message: str) -> str | None:
    """The form field a simulator error names (None: a form-wide error)."""
    for prefix, field in (("strategies", "parameters"), ("workload.rate", "workload"),
                          ("workload.keys", "keys"), ("qos.", "latency_bound_ms"),
                          ("system.", "max_workers"), ("steps", "steps")):
        if message.startswith(prefix):
            return field
    return None
