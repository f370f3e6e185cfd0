"""Pipelines as files (issue 47): one YAML (or JSON) document holds pipelines, policies
and connections; ``manage.py apply -f FILE [--dry-run]`` makes the database hold what it
says, idempotently, and prints what changed and which versions that made;
``manage.py export [NAMES]`` writes the same format. The document's JSON Schema is
:func:`json_schema` (published as ``docs/streamwise-document.schema.json``).

A connection's password is never in a document: ``password_env`` names the environment
variable holding it when the document is applied (an exported document names
``STREAMWISE_PASSWORD_<NAME>``).

Applying goes through the pages' own forms (field checks) and domain actions (versions,
the audit as the applying user): one code path. Every entry is checked before anything
is kept; a document with any error changes nothing, and each error names its path, e.g.
``pipelines[2].definition.nodes[3].left: unknown node 'ghost' (nodes: ...)``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError

API_VERSION = "streamwise/v1"
POLICY_FIELDS = ("description", "latency_bound_ms", "throughput_floor_rps", "power_budget_w",
                 "control_step_s", "min_workers", "initial_workers", "max_workers",
                 "strategy", "strategy_params", "violation_steps", "alert_webhook",
                 "priority", "guaranteed_workers", "max_share_workers", "excluded_periods",
                 "max_reconfigurations_per_hour", "cooldown_up_s", "cooldown_down_s",
                 "decision_plugins")
CONNECTION_FIELDS = ("kind", "url", "username", "description")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PipelineEntry(_Strict):
    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    definition: dict[str, Any] = Field(description="a chain, a dataflow (nodes) or a "
                                                   "pipeline module (app): docs/")


class PolicyEntry(_Strict):
    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    latency_bound_ms: float
    throughput_floor_rps: float = 0.0
    power_budget_w: float
    control_step_s: float | None = None
    min_workers: int | None = None
    initial_workers: int | None = None
    max_workers: int | None = None
    strategy: str | None = None
    strategy_params: dict[str, Any] = Field(default_factory=dict)
    violation_steps: int | None = None
    alert_webhook: str = ""
    priority: int | None = None
    guaranteed_workers: int | None = None
    max_share_workers: int | None = None
    excluded_periods: list[str] = Field(default_factory=list,
                                        description="cron expressions, UTC")
    max_reconfigurations_per_hour: int | None = None
    cooldown_up_s: float | None = None
    cooldown_down_s: float | None = None
    decision_plugins: list[str] = Field(default_factory=list)


class ConnectionEntry(_Strict):
    name: str = Field(min_length=1, max_length=63)
    kind: Literal["redis", "nats", "postgres"]
    url: str
    username: str = ""
    description: str = ""
    password_env: str | None = Field(
        default=None, description="the environment variable holding the password")


class Document(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              title="Streamwise document")
    api_version: Literal["streamwise/v1"] = Field(alias="apiVersion")
    connections: list[ConnectionEntry] = Field(default_factory=list)
    pipelines: list[PipelineEntry] = Field(default_factory=list)
    policies: list[PolicyEntry] = Field(default_factory=list)


def json_schema() -> dict[str, Any]:
    return Document.model_json_schema(by_alias=True)


class DocumentError(ValueError):
    """Every problem of a document, each as ``path: message``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass
class Change:
    kind: str  # connection, pipeline, policy
    name: str
    action: str  # create, update, unchanged
    fields: list[str] = field(default_factory=list)
    version: int | None = None  # the version it has after (pipelines, policies)

    def line(self) -> str:
        what = {"create": "+", "update": "~", "unchanged": "="}[self.action]
        text = f"{what} {self.kind} {self.name}: {self.action}"
        if self.fields:
            text += f" ({', '.join(self.fields)})"
        if self.version is not None and self.action != "unchanged":
            text += f" -> v{self.version}"
        return text


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse(text: str) -> Document:
    """A document from YAML or JSON text; DocumentError names each problem's path."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise DocumentError([f"{where}not YAML or JSON: {getattr(exc, 'problem', exc)}"]) \
            from None
    if not isinstance(raw, dict):
        raise DocumentError(["the document must be a mapping with apiVersion: "
                             f"{API_VERSION}"])
    try:
        doc = Document.model_validate(raw)
    except ValidationError as exc:
        raise DocumentError([f"{_path(e['loc']) or '(document)'}: {e['msg']}"
                             for e in exc.errors()]) from None
    errors = []
    for kind in ("connections", "pipelines", "policies"):
        seen: set[str] = set()
        for i, entry in enumerate(getattr(doc, kind)):
            if entry.name in seen:
                errors.append(f"{kind}[{i}].name: {entry.name!r} is given twice")
            seen.add(entry.name)
    if errors:
        raise DocumentError(errors)
    return doc


def _form_errors(prefix: str, form: Any) -> list[str]:
    return [f"{prefix}.{name}: {message}" if name != "__all__" else f"{prefix}: {message}"
            for name, messages in form.errors.items() for message in messages]


def definition_path(path: str) -> str:
    """A definition error's path without the node ids it names (``nodes[3] (q).left``
    -> ``nodes[3].left``): a document's and the API's."""
    return re.sub(r" \([A-Za-z_][A-Za-z0-9_]*\)", "", path)


def apply(doc: Document, user: Any, dry_run: bool = False) -> list[Change]:
    """Make the database hold ``doc``: connections first (pipelines name them), then
    pipelines and policies. All or nothing: DocumentError lists every problem and
    nothing changes; with ``dry_run`` the changes are computed and then rolled back."""
    from audit.log import acting_as

    with transaction.atomic(), acting_as(user):
        errors: list[str] = []
        changes = _connections(doc, user, errors)
        changes += _pipelines(doc, user, errors)
        changes += _policies(doc, user, errors)
        if errors:
            raise DocumentError(errors)
        if dry_run:
            transaction.set_rollback(True)
    return changes


def _connections(doc: Document, user: Any, errors: list[str]) -> list[Change]:
    from pipelines import actions
    from pipelines.forms import ConnectionForm
    from pipelines.models import Connection

    changes = []
    for i, entry in enumerate(doc.connections):
        where = f"connections[{i}]"
        existing = Connection.objects.filter(name=entry.name).first()
        password = existing.password if existing else ""
        if entry.password_env is not None:
            if not ENV_NAME.match(entry.password_env):
                errors.append(f"{where}.password_env: not an environment variable's name")
                continue
            if entry.password_env not in os.environ:
                errors.append(f"{where}.password_env: ${entry.password_env} is not set")
                continue
            password = os.environ[entry.password_env]
        data = {**entry.model_dump(exclude={"password_env"}), "password": password}
        # (a ModelForm's validation writes into its instance: the old values first)
        before = {f: getattr(existing, f) for f in (*CONNECTION_FIELDS, "password")} \
            if existing else {}
        form = ConnectionForm(data, instance=existing)
        if not form.is_valid():
            errors.extend(_form_errors(where, form))
            continue
        fields = [f for f in CONNECTION_FIELDS if existing is None
                  or before[f] != form.cleaned_data[f]]
        if existing is not None and before["password"] != password:
            fields.append("password")
        action = "create" if existing is None else "update" if fields else "unchanged"
        if action != "unchanged":
            actions.save_connection(form.save(commit=False), user)
        changes.append(Change("connection", entry.name, action,
                              fields if action == "update" else []))
    return changes


def _pipelines(doc: Document, user: Any, errors: list[str]) -> list[Change]:
    from pipelines import actions
    from pipelines.forms import PipelineForm
    from pipelines.models import Pipeline
    from pipelines.runtime.spec import definition as pdef

    changes = []
    for i, entry in enumerate(doc.pipelines):
        where = f"pipelines[{i}]"
        try:
            pdef.validate(entry.definition)
        except pdef.DefinitionError as exc:
            path = definition_path(exc.path)
            errors.append(f"{where}.definition{'.' + path if path else ''}: {exc.message}")
            continue
        existing = Pipeline.objects.filter(name=entry.name).first()
        before = (existing.description, existing.definition) if existing else None
        form = PipelineForm({"name": entry.name, "description": entry.description,
                             "definition": json.dumps(entry.definition)}, instance=existing)
        if not form.is_valid():
            errors.extend(_form_errors(where, form))
            continue
        if existing is None:
            saved = actions.save_pipeline(form.save(commit=False), user)
            changes.append(Change("pipeline", entry.name, "create", [], saved.version))
            continue
        fields = [name for name, old, new in (
            ("description", before[0], form.cleaned_data["description"]),
            ("definition", before[1], form.cleaned_data["definition"])) if old != new]
        if fields:
            saved = actions.save_pipeline(form.save(commit=False), user)
            changes.append(Change("pipeline", entry.name, "update", fields, saved.version))
        else:
            changes.append(Change("pipeline", entry.name, "unchanged", [], existing.version))
    return changes


def policy_form(entry: PolicyEntry, existing: Any) -> Any:
    """The Policies page's form for ``entry`` (the API's and a document's): fields left
    out keep their value, or the model's default for a new policy."""
    from control.forms import PolicyForm
    from control.models import Policy

    base = {f: getattr(existing, f) for f in POLICY_FIELDS} if existing else {
        f: Policy._meta.get_field(f).get_default() for f in POLICY_FIELDS}
    data = {**base, **entry.model_dump(exclude_none=True), "name": entry.name}
    data["strategy_params"] = json.dumps(data.get("strategy_params") or {})
    return PolicyForm({k: ("" if v is None else v) for k, v in data.items()},
                      instance=existing)


def _policies(doc: Document, user: Any, errors: list[str]) -> list[Change]:
    from control.models import Policy
    from control.policies import save_policy

    changes = []
    for i, entry in enumerate(doc.policies):
        where = f"policies[{i}]"
        existing = Policy.objects.filter(name=entry.name).first()
        before = {f: getattr(existing, f) for f in POLICY_FIELDS} if existing else {}
        form = policy_form(entry, existing)
        if not form.is_valid():
            errors.extend(_form_errors(where, form))
            continue
        fields = [f for f in POLICY_FIELDS if existing is None
                  or before[f] != form.cleaned_data.get(f, before[f])]
        if existing is None:
            saved = save_policy(form.save(commit=False), user)
            changes.append(Change("policy", entry.name, "create", [], saved.version))
        elif fields:
            saved = save_policy(form.save(commit=False), user)
            saved.refresh_from_db()
            changes.append(Change("policy", entry.name, "update", fields, saved.version))
        else:
            changes.append(Change("policy", entry.name, "unchanged", [], existing.version))
    return changes


def export(names: list[str] | None = None) -> dict[str, Any]:
    """The document of the named pipelines, policies and connections (all if None):
    what ``apply`` takes, passwords as ``password_env`` names."""
    from control.models import Policy
    from pipelines.models import Connection, Pipeline

    def wanted(query: Any) -> list[Any]:
        return list(query.order_by("name") if names is None
                    else query.filter(name__in=names).order_by("name"))

    doc: dict[str, Any] = {"apiVersion": API_VERSION, "connections": [], "pipelines": [],
                           "policies": []}
    for c in wanted(Connection.objects.all()):
        entry = {"name": c.name, **{f: getattr(c, f) for f in CONNECTION_FIELDS}}
        if c.password:
            entry["password_env"] = password_env_name(c.name)
        doc["connections"].append(entry)
    for p in wanted(Pipeline.objects.all()):
        doc["pipelines"].append({"name": p.name, "description": p.description,
                                 "definition": p.definition})
    for p in wanted(Policy.objects.all()):
        doc["policies"].append({"name": p.name, **{f: getattr(p, f) for f in POLICY_FIELDS}})
    return doc


def password_env_name(connection: str) -> str:
    return "STREAMWISE_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", connection).upper()


def dump(doc: dict[str, Any], fmt: str = "yaml") -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
