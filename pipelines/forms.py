from __future__ import annotations

import json
import logging

from django import forms

from control import jsonio
from control.models import Policy
from pipelines.models import Connection, Pipeline
from pipelines.runtime.spec import definition as pdef
from pipelines.runtime.elastic import migration as elastic

log = logging.getLogger(__name__)


def definition_error(doc_or_text: object) -> tuple[pdef.PipelineSpec | None, str | None]:
    """The definition's spec, or the one-line error a form shows: a DefinitionError
    names its field; anything else the validator raises (a bug: the property tests
    look for them) is logged and shown as the field's error rather than a 500."""
    try:
        spec = (pdef.parse(doc_or_text) if isinstance(doc_or_text, str)
                else pdef.validate(doc_or_text))
    except pdef.DefinitionError as exc:
        where = f" at {exc.path}" if exc.path else ""
        return None, f"Invalid definition{where}: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - shown on the field, logged with its trace
        log.exception("the definition validator failed")
        return None, (f"The definition could not be checked ({type(exc).__name__}); "
                      "nothing was saved.")
    return spec, None


def _check_connections(doc: dict, prefix: str = "") -> None:
    """The connections a definition names exist and are of the kind it needs."""
    from pipelines import connections

    try:
        connections.resolve(doc)
    except connections.ConnectionProblem as exc:
        raise forms.ValidationError(f"{prefix}Invalid definition at {exc.path}: "
                                    f"{str(exc).split(': ', 1)[1]}") from None


SOURCE_TYPES = [("", "as in the JSON below"), ("generator", "generator (the product's own)"),
                ("redis_stream", "Redis stream"), ("jetstream", "NATS JetStream stream"),
                ("files", "files landing in a folder")]
SINK_TYPES = [("", "as in the JSON below"), ("latency", "latency only (rows counted)"),
              ("postgres", "PostgreSQL table"), ("parquet", "Parquet dataset"),
              ("redis_stream", "Redis stream")]
# The form's source and sink fields: which of them each type takes, as definition keys.
SOURCE_WHERE = {"redis_stream": {"source_connection": "connection", "source_stream": "stream"},
                "jetstream": {"source_connection": "connection", "source_stream": "stream"},
                "files": {"source_path": "path", "source_format": "format"}}
SINK_WHERE = {"postgres": {"sink_connection": "connection", "sink_table": "table"},
              "parquet": {"sink_path": "path"},
              "redis_stream": {"sink_connection": "connection", "sink_stream": "stream"}}
# What a source keeps from the JSON when its type changes: the generator's workload, or
# a broker's expected workload and its fields.
KEEP = {"generator": ("seed", "partitions", "rate", "keys"),
        "redis_stream": ("partitions", "rate", "keys", "fields"),
        "jetstream": ("partitions", "rate", "keys", "fields"),
        "files": ("partitions", "rate", "keys", "fields", "max_files_per_trigger")}


def _section_values(fields: dict[str, str], data: dict) -> dict:
    """A section's filled-in form fields as definition keys (a connection by name)."""
    out = {}
    for field_name, key in fields.items():
        value = data.get(field_name)
        if isinstance(value, Connection):
            value = value.name
        if value not in (None, ""):
            out[key] = value
    return out


def with_sections(doc: dict, data: dict) -> dict:
    """A chain definition with the form's source and sink sections written into it
    (a section left "as in the JSON" changes nothing)."""
    if not isinstance(doc, dict) or "nodes" in doc or "app" in doc:
        return doc  # (a dataflow's and a pipeline module's are in their JSON)
    out = dict(doc)
    kind = data.get("source_type")
    if kind:
        old = dict(doc.get("source") or {})
        src = {"type": kind, **{k: old[k] for k in KEEP[kind] if k in old}}
        if kind == "generator":
            src.setdefault("seed", 7)
        src.update(_section_values(SOURCE_WHERE.get(kind, {}), data))
        out["source"] = src
    kind = data.get("sink_type")
    if kind:
        old = dict(doc.get("sink") or {})
        sink = {"type": kind, "keep_output": old.get("keep_output", True)}
        sink.update(_section_values(SINK_WHERE.get(kind, {}), data))
        out["sink"] = sink
    return out


class PipelineForm(forms.ModelForm):
    # The source and the sink as form sections (a chain pipeline's; a dataflow's are
    # its nodes, in the JSON). Written into the definition when saved.
    source_type = forms.ChoiceField(choices=SOURCE_TYPES, required=False, label="Source")
    source_connection = forms.ModelChoiceField(
        Connection.objects.exclude(kind="postgres"), required=False, to_field_name="name",
        label="Source connection", help_text="a Redis or NATS connection an admin keeps "
        "(Connections)")
    source_stream = forms.CharField(required=False, max_length=256, label="Stream")
    source_path = forms.CharField(required=False, max_length=200, label="Folder",
                                  help_text="relative to the files root")
    source_format = forms.ChoiceField(choices=[(f, f) for f in pdef.FILE_FORMATS],
                                      required=False, label="File format")
    sink_type = forms.ChoiceField(choices=SINK_TYPES, required=False, label="Sink")
    sink_connection = forms.ModelChoiceField(
        Connection.objects.filter(kind__in=("postgres", "redis")), required=False,
        to_field_name="name", label="Sink connection",
        help_text="a PostgreSQL connection (a table) or a Redis one (a stream)")
    sink_stream = forms.CharField(required=False, max_length=256, label="Sink stream")
    sink_table = forms.CharField(required=False, max_length=130, label="Table")
    sink_path = forms.CharField(required=False, max_length=200, label="Dataset folder",
                                help_text="relative to the files root")
    definition = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24, "cols": 90, "spellcheck": "false",
                                     "class": "mono"}),
        help_text="JSON. A chain: a generator source, stateless filter/map steps, exactly "
                  "one keyed stateful operator (keyed_aggregate, or hft_window: the thesis' "
                  "HFT kernel), and the latency sink. Or a dataflow: \"nodes\", each with "
                  "an id and its input(s) — sources generator/nexmark, filter, project, "
                  "keyed_aggregate, window_aggregate, window_top, join, one sink. Or a pipeline "
                  "module of an installed package: {\"app\": \"package.module:function\", "
                  "\"params\": {…}, \"source\": {…}, \"sink\": {…}}.")

    class Meta:
        model = Pipeline
        fields = ["name", "description", "source_type", "source_connection", "source_stream",
                  "source_path", "source_format", "sink_type", "sink_connection",
                  "sink_table", "sink_path", "sink_stream", "definition"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        value = self.initial.get("definition")
        if isinstance(value, dict):
            self.initial["definition"] = json.dumps(value, indent=2)
            if "nodes" not in value and "app" not in value:
                self._initial_sections(value)

    def _initial_sections(self, doc: dict) -> None:
        src, sink = doc.get("source") or {}, doc.get("sink") or {}
        self.initial.setdefault("source_type", src.get("type", "generator"))
        for field_name, key in SOURCE_WHERE.get(src.get("type"), {}).items():
            self.initial.setdefault(field_name, src.get(key))
        self.initial.setdefault("sink_type", sink.get("type", "latency"))
        for field_name, key in SINK_WHERE.get(sink.get("type"), {}).items():
            self.initial.setdefault(field_name, sink.get(key))

    def clean_definition(self) -> dict:
        """The JSON with the source and sink sections written into it, validated as one
        (the JSON alone may hold what only the sections make valid: the fields a Test
        connection found, for a generator the form turns into a stream). The sections'
        fields come before this one, so they are cleaned already."""
        text = self.cleaned_data["definition"]
        try:
            doc = jsonio.loads(text)
        except jsonio.InputError:
            doc = None
        merged = with_sections(doc, self.cleaned_data) if isinstance(doc, dict) else text
        spec, error = definition_error(merged)
        if spec is None:
            raise forms.ValidationError(error)
        _check_connections(spec.raw)
        return spec.raw


class StartRunForm(forms.Form):
    # No empty "---------" choice: starting a run always names a pipeline and a policy.
    pipeline = forms.ModelChoiceField(queryset=Pipeline.objects.all(), empty_label=None)
    policy = forms.ModelChoiceField(queryset=Policy.objects.all(), empty_label=None)

    def clean_pipeline(self) -> Pipeline:
        """The stored definition is checked again, its cost included: the bounds may
        have tightened since it was saved."""
        pipeline = self.cleaned_data["pipeline"]
        spec, error = definition_error(pipeline.definition)
        if spec is None:
            raise forms.ValidationError(f"{pipeline.name} cannot start: {error} Edit the "
                                        "pipeline first.")
        _check_connections(pipeline.definition, f"{pipeline.name} cannot start: ")
        return pipeline


SCHEDULE_CHOICES = [(s, s) for s in elastic.STRATEGIES]
PLANNER_CHOICES = [(p, p) for p in elastic.PLANNERS]


class WorkersForm(forms.Form):
    workers = forms.IntegerField(min_value=1)
    schedule = forms.ChoiceField(choices=SCHEDULE_CHOICES, initial="batched",
                                 help_text="how moved key groups are paced (Megaphone)")

    def __init__(self, *args, policy: Policy, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy
        self.fields["workers"].min_value = policy.min_workers
        self.fields["workers"].max_value = policy.max_workers
        self.fields["workers"].widget.attrs.update(min=policy.min_workers,
                                                   max=policy.max_workers)

    def clean_workers(self) -> int:
        n = self.cleaned_data["workers"]
        if not self.policy.min_workers <= n <= self.policy.max_workers:
            raise forms.ValidationError(
                f"Workers must be between {self.policy.min_workers} and "
                f"{self.policy.max_workers} (policy {self.policy.name}).")
        return n


class RebalanceForm(forms.Form):
    planner = forms.ChoiceField(choices=PLANNER_CHOICES, initial="ding-table")
    schedule = forms.ChoiceField(choices=SCHEDULE_CHOICES, initial="batched")
    tau = forms.FloatField(min_value=0.0, max_value=10.0, initial=0.2,
                           help_text="load imbalance allowed: max load <= (1+tau) x mean")


class MoveGroupsForm(forms.Form):
    """Set placement now: these key groups to that worker (the runner checks the
    executor is alive and moves exactly these groups, paced by the schedule)."""

    groups = forms.CharField(max_length=200, help_text="key groups, e.g. 0,3 or 2-5")
    executor = forms.ChoiceField(choices=(), label="to worker")
    schedule = forms.ChoiceField(choices=SCHEDULE_CHOICES, initial="batched")

    def __init__(self, *args, key_groups: int, executors: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.key_groups = key_groups
        self.fields["executor"].choices = [(e, f"executor {e}") for e in executors]
        self.fields["groups"].widget.attrs.update(size=8, placeholder="0,3 or 2-5")

    def clean_groups(self) -> list[int]:
        chosen: set[int] = set()
        for part in self.cleaned_data["groups"].replace(" ", "").split(","):
            if not part:
                continue
            low, dash, high = part.partition("-")
            try:
                first, last = int(low), int(high) if dash else int(low)
            except ValueError:
                raise forms.ValidationError(
                    f"{part!r} is not a group number or a range like 2-5") from None
            if not 0 <= first <= last < self.key_groups:
                raise forms.ValidationError(
                    f"{part}: this run's key groups are 0 to {self.key_groups - 1}")
            chosen.update(range(first, last + 1))
        if not chosen:
            raise forms.ValidationError("Name at least one key group.")
        return sorted(chosen)


class FrequencyForm(forms.Form):
    ghz = forms.FloatField(min_value=0.1, max_value=10.0, label="GHz")

    def __init__(self, *args, choices: list[float] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.choices = sorted(choices or [])
        self.fields["ghz"].widget.attrs.update(step="0.01")
        if self.choices:
            self.fields["ghz"].widget.attrs.update(min=self.choices[0], max=self.choices[-1])

    def clean_ghz(self) -> float:
        ghz = self.cleaned_data["ghz"]
        if self.choices and not self.choices[0] - 1e-9 <= ghz <= self.choices[-1] + 1e-9:
            raise forms.ValidationError(f"Frequency must be between {self.choices[0]} and "
                                        f"{self.choices[-1]} GHz on this run.")
        return ghz


class ReplanForm(forms.Form):
    """A live re-plan: the run's new number of key groups (state partitions), handed
    over seamlessly (Gloss) or by stop and restart (the baseline)."""

    key_groups = forms.IntegerField(min_value=1, max_value=pdef.MAX_KEY_GROUPS,
                                    label="key groups")
    scheme = forms.ChoiceField(choices=[("seamless", "seamless hand-over"),
                                        ("stop-restart", "stop and restart")],
                               initial="seamless")


class ConnectionForm(forms.ModelForm):
    """A connection; its password is write-only: never shown, kept when left blank."""

    password = forms.CharField(required=False, strip=False, max_length=500,
                               widget=forms.PasswordInput(render_value=False),
                               help_text="write-only: leave blank to keep the one saved")
    clear_password = forms.BooleanField(required=False, label="Remove the saved password")

    class Meta:
        model = Connection
        fields = ["name", "kind", "url", "username", "password", "description"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.saved_password = self.instance.password if self.instance.pk else ""

    def clean(self) -> dict:
        data = super().clean()
        if data.get("clear_password"):
            data["password"] = ""
        elif not data.get("password"):
            data["password"] = self.saved_password
        self.instance.password = data["password"]
        return data
