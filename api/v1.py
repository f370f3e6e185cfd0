"""The REST API, ``/api/v1/`` (issue 47), with django-ninja: its OpenAPI 3 schema at
``/api/v1/openapi.json`` and browsable docs at ``/api/v1/docs``.

Every write goes through the pages' own forms and domain actions (one code path: the
same validation, roles, audit and live pushes). A request carries a user's API token
(``Authorization: Bearer sw_…``, :class:`api.models.ApiToken`) and acts with that user's
role: a missing permission is 403. Errors are JSON with field paths (``{"detail":
[{"loc": ["body", "definition", "nodes", 3, "left"], "msg": …}]}``, 422); lists paginate
(``limit``/``offset``); writes are throttled per token.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, NinjaAPI, Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.pagination import LimitOffsetPagination, paginate
from ninja.security import HttpBearer
from ninja.throttling import AuthRateThrottle

from api.documents import POLICY_FIELDS, PolicyEntry, definition_path, policy_form

WRITE_RATE = "120/min"


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        from api.models import ApiToken

        found = ApiToken.find(token)
        if found is None:
            return None
        now = timezone.now()
        if found.last_used_at is None or now - found.last_used_at > dt.timedelta(minutes=1):
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        request.api_token = found  # type: ignore[attr-defined]
        return found


api = NinjaAPI(title="Streamwise", version="1", urls_namespace="api-v1",
               auth=TokenAuth(), description=__doc__)
writes = [AuthRateThrottle(WRITE_RATE)]


class Problem(Exception):
    """A 422 with field paths."""

    def __init__(self, loc: list[Any], msg: str) -> None:
        self.loc, self.msg = loc, msg
        super().__init__(msg)


@api.exception_handler(Problem)
def _problem(request: HttpRequest, exc: Problem) -> Any:
    return api.create_response(request, {"detail": [{"loc": exc.loc, "msg": exc.msg}]},
                               status=422)


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise HttpError(403, f"your role does not allow this ({perm})")


def _check_form(form: Any, where: list[Any]) -> None:
    if not form.is_valid():
        name, messages = next(iter(form.errors.items()))
        raise Problem([*where, name] if name != "__all__" else where, " ".join(messages))


def _definition_loc(path: str) -> list[Any]:
    """``nodes[3] (joined).left`` -> ["nodes", 3, "left"]."""
    loc: list[Any] = []
    for part in definition_path(path).split("."):
        m = re.fullmatch(r"([^\[]*)((?:\[\d+\])*)", part)
        if m is None:
            loc.append(part)
            continue
        if m.group(1):
            loc.append(m.group(1))
        loc.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return loc


# ------------------------------------------------------------------------- schemas
class PipelineOut(Schema):
    name: str
    description: str
    version: int
    definition: dict[str, Any]
    updated_at: dt.datetime


class PipelineIn(Schema):
    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    definition: dict[str, Any]


class PipelineUpdate(Schema):
    description: str | None = None
    definition: dict[str, Any] | None = None


class VersionOut(Schema):
    version: int
    definition: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    created_at: dt.datetime


class PolicyOut(Schema):
    name: str
    description: str
    version: int
    latency_bound_ms: float
    throughput_floor_rps: float
    power_budget_w: float
    control_step_s: float
    min_workers: int
    initial_workers: int
    max_workers: int
    strategy: str
    strategy_params: dict[str, Any]
    violation_steps: int
    alert_webhook: str
    priority: int
    guaranteed_workers: int
    max_share_workers: int | None
    excluded_periods: list[str]
    max_reconfigurations_per_hour: int | None
    cooldown_up_s: float
    cooldown_down_s: float
    decision_plugins: list[str]


# A policy as a client gives it: the document's own entry (api/documents.py).
PolicyIn = PolicyEntry


class ConnectionOut(Schema):
    name: str
    kind: str
    url: str
    username: str
    description: str
    has_password: bool


class ConnectionIn(Schema):
    name: str = Field(min_length=1, max_length=63)
    kind: str
    url: str
    username: str = ""
    description: str = ""
    password: str | None = Field(default=None, description="write-only; omitted: kept")


class RunOut(Schema):
    id: int
    pipeline: str
    pipeline_version: int
    policy: str
    policy_version: int | None
    status: str
    status_reason: str
    workers: int
    key_groups: int
    frequency_ghz: float | None
    dry_run: bool
    verification: dict[str, Any] | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    url: str


class RunIn(Schema):
    pipeline: str
    policy: str


class Accepted(Schema):
    ok: bool
    message: str


class WorkersIn(Schema):
    workers: int
    schedule: str = "batched"


class RebalanceIn(Schema):
    planner: str = "ding-table"
    schedule: str = "batched"
    tau: float = 0.2


class MoveIn(Schema):
    groups: list[int]
    executor: str
    schedule: str = "batched"


class ReplanIn(Schema):
    key_groups: int
    scheme: str = "seamless"


class PlanIn(Schema):
    plan: dict[str, Any]


class DryRunIn(Schema):
    on: bool


class PolicyVersionIn(Schema):
    version: int


class DecisionOut(Schema):
    at: dt.datetime
    step: int
    strategy: str
    action: str
    outcome: str
    outcome_message: str
    current_workers: int
    chosen_workers: int
    measured_latency_ms: float | None
    predicted_latency_ms: float | None


class EventOut(Schema):
    id: int
    at: dt.datetime
    kind: str
    actor: str
    message: str
    payload: dict[str, Any]


class MetricOut(Schema):
    t: dt.datetime
    batches: int
    input_rows: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    input_rate: float | None
    output_rate: float | None
    workers: int | None
    power_w: float | None
    power: str = Field(description="measured or modelled")


class AuditOut(Schema):
    at: dt.datetime
    actor: str
    action: str
    target_type: str
    target_id: str
    target_repr: str
    message: str
    before: Any = None
    after: Any = None


class ClusterOut(Schema):
    master_url: str
    cores: int
    cores_free: int
    error: str
    workers: list[dict[str, Any]]
    runs: list[dict[str, Any]]


class ShareOut(Schema):
    run: int
    pipeline: str
    priority: int
    guaranteed: int | None
    max_share: int | None
    holds: int
    asked: int
    last_outcome: str | None


class FleetOut(Schema):
    arbiter: str
    cores_limit: int | None
    cores_shared: int
    cores_source: str
    excluded_periods: list[str]
    shares: list[ShareOut]


class FleetIn(Schema):
    arbiter: str | None = None
    cores_limit: int | None = Field(default=None, description="empty: all alive cores")
    excluded_periods: list[str] | None = None


class ErrorOut(Schema):
    detail: str


class FieldProblem(Schema):
    loc: list[str | int]
    msg: str


class ProblemsOut(Schema):
    detail: list[FieldProblem]


# Every operation may answer these (documented, so that a client and the schema test
# know them): a body that is not JSON, no or a revoked token, a role without the permission, an unknown name or
# id, a state that does not allow it, a field error, too many writes.
ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut,
                          422: ProblemsOut, 429: ErrorOut}


# ----------------------------------------------------------------------- pipelines
pipelines = Router(tags=["pipelines"])


def _pipeline_out(p: Any) -> dict[str, Any]:
    return {"name": p.name, "description": p.description, "version": p.version,
            "definition": p.definition, "updated_at": p.updated_at}


def _get_pipeline(name: str) -> Any:
    from pipelines.models import Pipeline

    found = Pipeline.objects.filter(name=name).first()
    if found is None:
        raise HttpError(404, f"no pipeline {name!r}")
    return found


def _save_pipeline(request: HttpRequest, existing: Any, name: str, description: str,
                   definition: dict[str, Any]) -> Any:
    from pipelines import actions
    from pipelines.forms import PipelineForm
    from pipelines.runtime.spec import definition as pdef

    try:
        pdef.validate(definition)
    except pdef.DefinitionError as exc:
        raise Problem(["body", "definition", *_definition_loc(exc.path)], exc.message) \
            from None
    form = PipelineForm({"name": name, "description": description,
                         "definition": json.dumps(definition)}, instance=existing)
    _check_form(form, ["body"])
    with transaction.atomic():
        return actions.save_pipeline(form.save(commit=False), request.user)


@pipelines.get("", response={**ERRORS, 200: list[PipelineOut]})
@paginate(LimitOffsetPagination)
def list_pipelines(request: HttpRequest) -> Any:
    from pipelines.models import Pipeline

    _require(request, "pipelines.view_pipeline")
    return [_pipeline_out(p) for p in Pipeline.objects.order_by("name")]


@pipelines.get("/{name}", response={**ERRORS, 200: PipelineOut})
def get_pipeline(request: HttpRequest, name: str) -> Any:
    _require(request, "pipelines.view_pipeline")
    return _pipeline_out(_get_pipeline(name))


@pipelines.post("", response={**ERRORS, 201: PipelineOut}, throttle=writes)
def create_pipeline(request: HttpRequest, body: PipelineIn) -> Any:
    from pipelines.models import Pipeline

    _require(request, "pipelines.add_pipeline")
    if Pipeline.objects.filter(name=body.name).exists():
        raise Problem(["body", "name"], f"a pipeline named {body.name!r} exists")
    return Status(201, _pipeline_out(_save_pipeline(request, None, body.name, body.description,
                                             body.definition)))


@pipelines.put("/{name}", response={**ERRORS, 200: PipelineOut}, throttle=writes)
def update_pipeline(request: HttpRequest, name: str, body: PipelineUpdate) -> Any:
    _require(request, "pipelines.change_pipeline")
    existing = _get_pipeline(name)
    return _pipeline_out(_save_pipeline(
        request, existing, name,
        existing.description if body.description is None else body.description,
        existing.definition if body.definition is None else body.definition))


@pipelines.get("/{name}/versions", response={**ERRORS, 200: list[VersionOut]})
@paginate(LimitOffsetPagination)
def pipeline_versions(request: HttpRequest, name: str) -> Any:
    _require(request, "pipelines.view_pipeline")
    return [{"version": v.version, "definition": v.definition, "created_at": v.created_at}
            for v in _get_pipeline(name).versions.order_by("-version")]


# ------------------------------------------------------------------------ policies
policies = Router(tags=["policies"])

def _policy_out(p: Any) -> dict[str, Any]:
    return {"name": p.name, "version": p.version, **{f: getattr(p, f) for f in POLICY_FIELDS}}


def _get_policy(name: str) -> Any:
    from control.models import Policy

    found = Policy.objects.filter(name=name).first()
    if found is None:
        raise HttpError(404, f"no policy {name!r}")
    return found


def _save_policy(request: HttpRequest, existing: Any, body: PolicyIn) -> Any:
    from control.policies import save_policy

    form = policy_form(body, existing)
    _check_form(form, ["body"])
    saved = save_policy(form.save(commit=False), request.user)
    saved.refresh_from_db()
    return saved


@policies.get("", response={**ERRORS, 200: list[PolicyOut]})
@paginate(LimitOffsetPagination)
def list_policies(request: HttpRequest) -> Any:
    from control.models import Policy

    _require(request, "control.view_policy")
    return [_policy_out(p) for p in Policy.objects.order_by("name")]


@policies.get("/{name}", response={**ERRORS, 200: PolicyOut})
def get_policy(request: HttpRequest, name: str) -> Any:
    _require(request, "control.view_policy")
    return _policy_out(_get_policy(name))


@policies.post("", response={**ERRORS, 201: PolicyOut}, throttle=writes)
def create_policy(request: HttpRequest, body: PolicyIn) -> Any:
    from control.models import Policy

    _require(request, "control.add_policy")
    if Policy.objects.filter(name=body.name).exists():
        raise Problem(["body", "name"], f"a policy named {body.name!r} exists")
    return Status(201, _policy_out(_save_policy(request, None, body)))


@policies.put("/{name}", response={**ERRORS, 200: PolicyOut}, throttle=writes)
def update_policy(request: HttpRequest, name: str, body: PolicyIn) -> Any:
    _require(request, "control.change_policy")
    existing = _get_policy(name)
    if body.name != name:
        raise Problem(["body", "name"], "a policy keeps its name")
    return _policy_out(_save_policy(request, existing, body))


@policies.get("/{name}/versions", response={**ERRORS, 200: list[VersionOut]})
@paginate(LimitOffsetPagination)
def policy_versions(request: HttpRequest, name: str) -> Any:
    _require(request, "control.view_policy")
    return [{"version": v.version, "values": v.values, "created_at": v.created_at}
            for v in _get_policy(name).versions.order_by("-version")]


# --------------------------------------------------------------------- connections
connections = Router(tags=["connections"])


def _connection_out(c: Any) -> dict[str, Any]:
    return {"name": c.name, "kind": c.kind, "url": c.url, "username": c.username,
            "description": c.description, "has_password": bool(c.password)}


@connections.get("", response={**ERRORS, 200: list[ConnectionOut]})
@paginate(LimitOffsetPagination)
def list_connections(request: HttpRequest) -> Any:
    from pipelines.models import Connection

    _require(request, "pipelines.view_connection")
    return [_connection_out(c) for c in Connection.objects.order_by("name")]


@connections.put("/{name}", response={**ERRORS, 200: ConnectionOut}, throttle=writes)
def put_connection(request: HttpRequest, name: str, body: ConnectionIn) -> Any:
    """Create or update a connection; its password is write-only (omitted: kept)."""
    from pipelines import actions
    from pipelines.forms import ConnectionForm
    from pipelines.models import Connection

    existing = Connection.objects.filter(name=name).first()
    _require(request, "pipelines.change_connection" if existing else
             "pipelines.add_connection")
    if body.name != name:
        raise Problem(["body", "name"], "must be the name in the path")
    data = body.model_dump()
    if data["password"] is None:
        data["password"] = ""  # (the form keeps the saved one when left blank)
    form = ConnectionForm(data, instance=existing)
    _check_form(form, ["body"])
    with transaction.atomic():
        return _connection_out(actions.save_connection(form.save(commit=False),
                                                       request.user))


# ---------------------------------------------------------------------------- runs
runs = Router(tags=["runs"])


def _run_out(run: Any) -> dict[str, Any]:
    from api.management.commands.runs import run_url

    return {"id": run.pk, "pipeline": run.pipeline_version.pipeline.name,
            "pipeline_version": run.pipeline_version.version, "policy": run.policy.name,
            "policy_version": run.policy_version, "status": run.status,
            "status_reason": run.status_reason, "workers": run.workers,
            "key_groups": run.key_groups, "frequency_ghz": run.frequency_ghz,
            "dry_run": run.dry_run, "verification": run.verification,
            "created_at": run.created_at, "started_at": run.started_at,
            "ended_at": run.ended_at, "url": run_url(run.pk)}


def _get_run(run_id: int) -> Any:
    from pipelines.models import Run

    found = (Run.objects.select_related("pipeline_version__pipeline", "policy")
             .filter(pk=run_id).first())
    if found is None:
        raise HttpError(404, f"no run {run_id}")
    return found


def _running(run: Any, what: str) -> None:
    if run.status != "running":
        raise HttpError(409, f"run {run.pk} is {run.status}; {what} only while it is running")


@runs.get("", response={**ERRORS, 200: list[RunOut]})
@paginate(LimitOffsetPagination)
def list_runs(request: HttpRequest, status: str | None = None) -> Any:
    from pipelines.models import Run

    _require(request, "pipelines.view_run")
    query = Run.objects.select_related("pipeline_version__pipeline", "policy").order_by("-pk")
    if status:
        query = query.filter(status=status)
    return [_run_out(r) for r in query]


@runs.get("/{run_id}", response={**ERRORS, 200: RunOut})
def get_run(request: HttpRequest, run_id: int) -> Any:
    _require(request, "pipelines.view_run")
    return _run_out(_get_run(run_id))


@runs.post("", response={**ERRORS, 201: RunOut}, throttle=writes)
def start_run(request: HttpRequest, body: RunIn) -> Any:
    from control.models import Policy
    from pipelines import actions
    from pipelines.forms import StartRunForm
    from pipelines.models import Pipeline

    _require(request, "pipelines.add_run")
    pipeline = Pipeline.objects.filter(name=body.pipeline).first()
    policy = Policy.objects.filter(name=body.policy).first()
    if pipeline is None:
        raise Problem(["body", "pipeline"], f"no pipeline {body.pipeline!r}")
    if policy is None:
        raise Problem(["body", "policy"], f"no policy {body.policy!r}")
    form = StartRunForm({"pipeline": pipeline.pk, "policy": policy.pk})
    _check_form(form, ["body"])
    with transaction.atomic():
        run = actions.create_run(pipeline, policy, request.user)
    return Status(201, _run_out(_get_run(run.pk)))


@runs.post("/{run_id}/stop", response={**ERRORS, 202: Accepted}, throttle=writes)
def stop_run(request: HttpRequest, run_id: int) -> Any:
    from pipelines import actions

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    if run.is_terminal:
        return Status(202, {"ok": False, "message": f"run {run.pk} has ended ({run.status})"})
    with transaction.atomic():
        actions.request_stop(run, request.user)
    return Status(202, {"ok": True, "message": f"stop requested for run {run.pk}"})


@runs.post("/{run_id}/workers", response={**ERRORS, 202: Accepted}, throttle=writes)
def set_workers(request: HttpRequest, run_id: int, body: WorkersIn) -> Any:
    from pipelines import actions
    from pipelines.forms import WorkersForm

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    form = WorkersForm(body.model_dump(), policy=run.policy_in_force)
    _check_form(form, ["body"])
    _running(run, "workers can change")
    with transaction.atomic():
        actions.request_workers(run, form.cleaned_data["workers"], request.user,
                                form.cleaned_data["schedule"])
    return Status(202, {"ok": True, "message": f"asked run {run.pk} for "
                                        f"{form.cleaned_data['workers']} workers"})


@runs.post("/{run_id}/rebalance", response={**ERRORS, 202: Accepted}, throttle=writes)
def rebalance(request: HttpRequest, run_id: int, body: RebalanceIn) -> Any:
    from pipelines import actions
    from pipelines.forms import RebalanceForm

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    form = RebalanceForm(body.model_dump())
    _check_form(form, ["body"])
    _running(run, "it can be rebalanced")
    data = form.cleaned_data
    with transaction.atomic():
        actions.request_rebalance(run, data["planner"], data["schedule"], data["tau"],
                                  request.user)
    return Status(202, {"ok": True, "message": f"asked run {run.pk} to rebalance"})


@runs.post("/{run_id}/move-groups", response={**ERRORS, 202: Accepted}, throttle=writes)
def move_groups(request: HttpRequest, run_id: int, body: MoveIn) -> Any:
    from pipelines import actions
    from pipelines.forms import MoveGroupsForm

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    form = MoveGroupsForm({"groups": ",".join(map(str, body.groups)),
                           "executor": body.executor, "schedule": body.schedule},
                          key_groups=run.key_groups or 1,
                          executors=actions.current_executors(run))
    _check_form(form, ["body"])
    _running(run, "key groups can move")
    data = form.cleaned_data
    with transaction.atomic():
        actions.request_move_groups(run, data["groups"], data["executor"], data["schedule"],
                                    request.user)
    return Status(202, {"ok": True, "message": f"asked run {run.pk} to move {len(data['groups'])} "
                                        "key groups"})


@runs.post("/{run_id}/replan", response={**ERRORS, 202: Accepted}, throttle=writes)
def replan(request: HttpRequest, run_id: int, body: ReplanIn) -> Any:
    from pipelines import actions
    from pipelines.forms import ReplanForm
    from pipelines.views import replan_refusal

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    form = ReplanForm(body.model_dump())
    _check_form(form, ["body"])
    refusal = replan_refusal(run)
    if refusal:
        raise HttpError(409, f"run {run.pk} cannot be re-planned: {refusal}")
    _running(run, "it can be re-planned")
    with transaction.atomic():
        actions.request_replan(run, form.cleaned_data["key_groups"],
                               form.cleaned_data["scheme"], request.user)
    return Status(202, {"ok": True, "message": f"asked run {run.pk} to re-plan"})


@runs.post("/{run_id}/plan", response={**ERRORS, 202: Accepted}, throttle=writes)
def apply_plan(request: HttpRequest, run_id: int, body: PlanIn) -> Any:
    """Apply a grouping of the run's Python operators (as the plan page's Apply)."""
    from pipelines import actions
    from pipelines.runtime.spec import definition as pdef

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    try:
        pdef.validate({**run.pipeline_version.definition, "plan": body.plan})
    except pdef.DefinitionError as exc:
        raise Problem(["body", *_definition_loc(exc.path)], exc.message) from None
    _running(run, "a plan can be applied")
    with transaction.atomic():
        actions.request_plan(run, body.plan, request.user)
    return Status(202, {"ok": True, "message": f"asked run {run.pk} to apply the plan"})


@runs.post("/{run_id}/dry-run", response={**ERRORS, 200: Accepted}, throttle=writes)
def dry_run(request: HttpRequest, run_id: int, body: DryRunIn) -> Any:
    from control import ticks

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    ticks.set_dry_run(run, body.on, request.user)
    return {"ok": True, "message": f"run {run.pk}: dry run {'on' if body.on else 'off'}"}


@runs.post("/{run_id}/verify", response={**ERRORS, 202: Accepted, 409: Accepted}, throttle=writes)
def verify(request: HttpRequest, run_id: int) -> Any:
    from pipelines import actions

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    queued, message = actions.request_verification(run, actions.actor_for(request.user))
    return Status((202 if queued else 409), {"ok": queued, "message": message})


@runs.post("/{run_id}/policy-version", response={**ERRORS, 200: Accepted, 409: Accepted},
           throttle=writes)
def switch_policy_version(request: HttpRequest, run_id: int, body: PolicyVersionIn) -> Any:
    from control import policies as policy_actions

    _require(request, "pipelines.change_run")
    run = _get_run(run_id)
    ok, message = policy_actions.switch_version(run, body.version, request.user)
    return Status((200 if ok else 409), {"ok": ok, "message": message})


@runs.get("/{run_id}/decisions", response={**ERRORS, 200: list[DecisionOut]})
@paginate(LimitOffsetPagination)
def decisions(request: HttpRequest, run_id: int) -> Any:
    _require(request, "pipelines.view_run")
    return list(_get_run(run_id).decisions.order_by("-step"))


@runs.get("/{run_id}/events", response={**ERRORS, 200: list[EventOut]})
@paginate(LimitOffsetPagination)
def events(request: HttpRequest, run_id: int) -> Any:
    _require(request, "pipelines.view_run")
    return list(_get_run(run_id).events.order_by("-at", "-pk"))


@runs.get("/{run_id}/metrics", response={**ERRORS, 200: list[MetricOut]})
def metrics(request: HttpRequest, run_id: int, since: dt.datetime | None = None,
            until: dt.datetime | None = None,
            bucket_s: float = Query(10.0, ge=1.0, le=86_400.0)) -> Any:
    """The run's samples in ``[since, until)``, in buckets of ``bucket_s`` seconds: the
    latency quantiles' worst batch of each bucket, rates and power their mean."""
    _require(request, "pipelines.view_run")
    run = _get_run(run_id)
    query = run.samples.order_by("t")
    if since is not None:
        query = query.filter(t__gte=since)
    if until is not None:
        query = query.filter(t__lt=until)
    buckets: dict[int, list[Any]] = {}
    for s in query[:100_000]:
        buckets.setdefault(int(s.t.timestamp() // bucket_s), []).append(s)
    out = []
    for key in sorted(buckets):
        rows = buckets[key]

        def worst(field: str, rows: list[Any] = rows) -> float | None:
            values = [getattr(r, field) for r in rows if getattr(r, field) is not None]
            return max(values) if values else None

        def mean(field: str, rows: list[Any] = rows) -> float | None:
            values = [getattr(r, field) for r in rows if getattr(r, field) is not None]
            return sum(values) / len(values) if values else None

        out.append({"t": dt.datetime.fromtimestamp(key * bucket_s, tz=dt.UTC),
                    "batches": len(rows), "input_rows": sum(r.input_rows for r in rows),
                    "latency_p50_ms": worst("latency_p50_ms"),
                    "latency_p95_ms": worst("latency_p95_ms"),
                    "latency_p99_ms": worst("latency_p99_ms"),
                    "input_rate": mean("input_rate"), "output_rate": mean("output_rate"),
                    "workers": rows[-1].workers, "power_w": mean("power_w"),
                    "power": "measured" if all(r.power_measured for r in rows)
                    else "modelled"})
    return out


# --------------------------------------------------------------- audit and cluster
misc = Router(tags=["audit and cluster"])


@misc.get("/audit", response={**ERRORS, 200: list[AuditOut]})
@paginate(LimitOffsetPagination)
def audit_entries(request: HttpRequest, actor: str | None = None,
                  target_type: str | None = None) -> Any:
    from audit.models import AuditEntry

    _require(request, "audit.view_auditentry")
    query = AuditEntry.objects.order_by("-at", "-pk")
    if actor:
        query = query.filter(actor=actor)
    if target_type:
        query = query.filter(target_type=target_type)
    return list(query)


@misc.get("/cluster", response={**ERRORS, 200: ClusterOut})
def cluster(request: HttpRequest) -> Any:
    from dataclasses import asdict

    from pipelines import cluster_status

    _require(request, "pipelines.view_run")
    view = cluster_status.overview()
    return {"master_url": view.master_url, "cores": view.cores, "cores_free": view.cores_free,
            "error": view.error, "workers": [asdict(w) for w in view.workers],
            "runs": [{"run": r.run.pk, "executors": [{"id": e, "host": h}
                                                     for e, h in r.executors]}
                     for r in view.runs]}


def _fleet_out() -> dict[str, Any]:
    from control import ticks
    from control.models import FleetSettings

    shared = FleetSettings.current()
    cores, source = ticks.fleet_capacity(shared)
    return {"arbiter": shared.arbiter, "cores_limit": shared.cores_limit,
            "cores_shared": cores, "cores_source": source,
            "excluded_periods": shared.excluded_periods,
            "shares": [{"run": r["run"].pk, "pipeline": r["run"].pipeline_version.pipeline.name,
                        "priority": r["priority"], "guaranteed": r["guaranteed"],
                        "max_share": r["max_share"], "holds": r["holds"] or 0,
                        "asked": r["asked"] or 0,
                        "last_outcome": r["last"].outcome if r["last"] else None}
                       for r in ticks.fleet_shares()]}


@misc.get("/fleet", response={**ERRORS, 200: FleetOut})
def fleet_settings(request: HttpRequest) -> Any:
    """How the runs share the cluster: the fleet settings and each running run's share."""
    _require(request, "pipelines.view_run")
    return _fleet_out()


@misc.put("/fleet", response={**ERRORS, 200: FleetOut}, throttle=writes)
def update_fleet(request: HttpRequest, body: FleetIn) -> Any:
    """Change the fleet settings (admins): fields left out keep their value."""
    from control import fleetview

    _require(request, "control.change_fleetsettings")
    data = body.dict(exclude_unset=True)
    if "cores_limit" in data and data["cores_limit"] is None:
        data["cores_limit"] = ""
    saved, form = fleetview.update_fleet_settings(data, request.user)
    if not saved:
        _check_form(form, ["body"])
    return _fleet_out()


api.add_router("/pipelines", pipelines)
api.add_router("/policies", policies)
api.add_router("/connections", connections)
api.add_router("/runs", runs)
api.add_router("", misc)
