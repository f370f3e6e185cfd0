"""Thin views: validate input with a form, call a domain action, redirect."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from control import ticks
from control.models import Policy
from pipelines import actions, plans
from pipelines.forms import (
    ConnectionForm,
    FrequencyForm,
    MoveGroupsForm,
    PipelineForm,
    RebalanceForm,
    ReplanForm,
    StartRunForm,
    WorkersForm,
)
from pipelines.models import Connection, Pipeline, Run
from pipelines.runtime.spec import definition as pdef
from pipelines.runtime.spec.definition import DEMO_DEFINITION


@login_required
@permission_required("pipelines.view_pipeline", raise_exception=True)
def pipeline_list(request: HttpRequest) -> HttpResponse:
    pipelines = list(Pipeline.objects.all())
    for p in pipelines:
        p.limits = elastic_limits(p.definition)
    return render(request, "pipelines/pipeline_list.html", {
        "pipelines": pipelines, "policies": Policy.objects.all()})


def elastic_limits(doc: Any) -> list[str]:
    """What the elastic runtime cannot do for a pipeline, said before a run starts (the
    pipeline list and form): no key groups to place, no live re-plan (and why), no
    exactly-once check."""
    from pipelines.runtime.replan import gloss as replan

    try:
        spec = pdef.validate(doc)
    except pdef.DefinitionError as exc:
        return [f"It does not validate any more: {exc}"]
    out = []
    if not spec.keyed_state:
        out.append("No key groups: scaling adds executors to the source's tasks, there is "
                   "no state to place or migrate.")
    refusal = replan.replan_refusal(spec)
    if refusal:
        out.append(f"No live re-plan: {refusal}.")
    if not spec.keep_output:
        out.append("No exactly-once check: its sink keeps no output.")
    return out


def _operator_packages() -> list[dict[str, Any]]:
    """Every installed operator package with its operators (what each reads and adds,
    its parameters and doc) or the error that kept it out: the pipeline form's and the
    Cluster page's list (``operators/packages.py``)."""
    from pipelines.runtime.operators import packages

    installed, modules = packages.operators(), packages.modules()
    out = []
    for package in packages.packages():
        ops = [installed[name] for name in package.operators]
        out.append({"package": package, "operators": [
            {"name": op.name, "needs": ", ".join(op.needs),
             "adds": ", ".join(f"{c} ({t})" for c, t in op.adds.items()),
             "params": _params_text(op.params),
             "doc": " ".join((op.doc or "").split())} for op in ops] + [
            {"name": m.path, "module": True, "needs": ", ".join(m.needs),
             "adds": ", ".join(f"{c} ({t})" for c, t in m.columns.items())
             + (f"; one row per {', '.join(m.key)}, updated" if m.key else "; appended"),
             "params": _params_text(m.params),
             "state": ("keyed state, placed and migrated"
                       + ("" if m.state_horizon_s is not None else "; no live re-plan "
                          "(no state horizon declared)")) if m.stateful else "no state",
             "doc": " ".join((m.doc or "").split())}
            for m in (modules[path] for path in package.modules)]})
    return out


def _params_text(params: dict[str, Any]) -> str:
    return "; ".join(f"{k} = {p.describe()}" + (f": {p.doc}" if p.doc else "")
                     for k, p in params.items())


@login_required
@permission_required("pipelines.add_pipeline", raise_exception=True)
def pipeline_create(request: HttpRequest) -> HttpResponse:
    form = PipelineForm(request.POST or None, initial={"definition": DEMO_DEFINITION})
    if request.method == "POST" and form.is_valid():
        pipeline = actions.save_pipeline(form.save(commit=False), request.user)
        messages.success(request, f"Pipeline {pipeline.name} created (v1).")
        return redirect("pipeline-list")
    return render(request, "pipelines/pipeline_form.html", {
        "form": form, "creating": True, "operator_packages": _operator_packages()})


@login_required
@permission_required("pipelines.change_pipeline", raise_exception=True)
def pipeline_edit(request: HttpRequest, pk: int) -> HttpResponse:
    pipeline = get_object_or_404(Pipeline, pk=pk)
    form = PipelineForm(request.POST or None, instance=pipeline)
    if request.method == "POST" and form.is_valid():
        pipeline = actions.save_pipeline(form.save(commit=False), request.user)
        messages.success(request, f"Pipeline {pipeline.name} saved (v{pipeline.version}).")
        return redirect("pipeline-list")
    return render(request, "pipelines/pipeline_form.html",
                  {"form": form, "pipeline": pipeline, "creating": False,
                   "dag": _picture(pipeline.definition),
                   "limits": elastic_limits(pipeline.definition),
                   "operator_packages": _operator_packages()})


@login_required
@permission_required("pipelines.change_pipeline", raise_exception=True)
@require_POST
def pipeline_test_source(request: HttpRequest) -> JsonResponse:
    """Test connection: the pipeline form's source (its sections over its JSON) read
    through the connectors a run uses: the fields found, the backlog, the rate."""
    import json

    from pipelines import connections
    from pipelines.forms import with_sections

    form = PipelineForm(request.POST)
    form.is_valid()  # (the sections' values; the name may be missing or taken)
    data = getattr(form, "cleaned_data", {})
    try:
        doc = json.loads(request.POST.get("definition") or "{}")
    except ValueError as exc:
        return JsonResponse({"ok": False, "message": f"the JSON does not parse: {exc}"})
    source = with_sections(doc if isinstance(doc, dict) else {}, data).get("source") or {}
    if not isinstance(source, dict):
        return JsonResponse({"ok": False, "message": "the definition has no source"})
    return JsonResponse(connections.probe(source).as_dict())


@login_required
@permission_required("pipelines.view_connection", raise_exception=True)
def connection_list(request: HttpRequest) -> HttpResponse:
    # Each pipeline's connection names once, not once per connection.
    names = [(p.name, {n for _path, n, _k in _named(p.definition)})
             for p in Pipeline.objects.all()]
    rows = [{"conn": conn, "pipelines": [name for name, used in names if conn.name in used]}
            for conn in Connection.objects.all()]
    return render(request, "pipelines/connection_list.html", {"rows": rows})


def _named(doc: Any) -> list[tuple[str, str, str]]:
    from pipelines import connections

    return connections.named(doc) if isinstance(doc, dict) else []


@login_required
@permission_required("pipelines.add_connection", raise_exception=True)
def connection_create(request: HttpRequest) -> HttpResponse:
    form = ConnectionForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        conn = actions.save_connection(form.save(commit=False), request.user)
        messages.success(request, f"Connection {conn.name} created.")
        return redirect("connection-list")
    return render(request, "pipelines/connection_form.html", {"form": form, "creating": True})


@login_required
@permission_required("pipelines.change_connection", raise_exception=True)
def connection_edit(request: HttpRequest, pk: int) -> HttpResponse:
    conn = get_object_or_404(Connection, pk=pk)
    form = ConnectionForm(request.POST or None, instance=conn)
    if request.method == "POST" and form.is_valid():
        conn = actions.save_connection(form.save(commit=False), request.user)
        messages.success(request, f"Connection {conn.name} saved.")
        return redirect("connection-list")
    return render(request, "pipelines/connection_form.html",
                  {"form": form, "creating": False, "connection": conn})


@login_required
@permission_required("pipelines.change_connection", raise_exception=True)
@require_POST
def connection_test(request: HttpRequest, pk: int) -> JsonResponse:
    from pipelines import connections

    return JsonResponse(connections.reach(get_object_or_404(Connection, pk=pk)).as_dict())


def _picture(doc: Any) -> Any:
    """The stored definition's DAG drawing (None if it no longer validates, e.g. a
    data file was removed: the form then shows why)."""
    try:
        return pdef.picture(pdef.validate(doc))
    except pdef.DefinitionError:
        return None


@login_required
@permission_required("pipelines.view_run", raise_exception=True)
def run_list(request: HttpRequest) -> HttpResponse:
    from pipelines.management.commands.seed_demo import ELASTIC_PIPELINE, ELASTIC_POLICY

    runs = Run.objects.select_related("pipeline_version__pipeline", "policy")[:200]
    # The README's first run is the elastic demo under its MPC policy: chosen already.
    initial = {"pipeline": Pipeline.objects.filter(name=ELASTIC_PIPELINE).first(),
               "policy": Policy.objects.filter(name=ELASTIC_POLICY).first()}
    return render(request, "pipelines/run_list.html",
                  {"runs": runs, "start_form": StartRunForm(
                      initial={k: v for k, v in initial.items() if v is not None})})


@login_required
@require_POST
@permission_required("pipelines.add_run", raise_exception=True)
def run_start(request: HttpRequest) -> HttpResponse:
    form = StartRunForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a pipeline and a policy to start a run.")
        return redirect("run-list")
    run = actions.create_run(form.cleaned_data["pipeline"], form.cleaned_data["policy"],
                             request.user)
    messages.success(request, f"Run {run.pk} created; starting on Spark.")
    return redirect("run-detail", pk=run.pk)


@login_required
@permission_required("pipelines.view_run", raise_exception=True)
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("pipeline_version__pipeline", "policy"),
                            pk=pk)
    policy = run.policy_in_force
    return render(request, "pipelines/run_detail.html", {
        "run": run, "policy": policy, "latest_version": run.policy.version,
        "workers_form": WorkersForm(policy=policy, initial={"workers": run.workers or 1}),
        "rebalance_form": RebalanceForm(),
        "move_form": MoveGroupsForm(key_groups=run.key_groups or 1,
                                    executors=actions.current_executors(run)),
        "replan_form": ReplanForm(initial={"key_groups": run.key_groups or 8}),
        "replan_refusal": replan_refusal(run),
        "has_python_operators": plans.has_python_operators(run),
        **_source_facts(run),
        "frequency_form": FrequencyForm(choices=run.frequencies, initial={
            "ghz": run.frequency_ghz or (max(run.frequencies) if run.frequencies else None)})})


def run_command(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A POST that changes a run: login, POST only, and the change_run permission."""
    return login_required(require_POST(
        permission_required("pipelines.change_run", raise_exception=True)(view)))


@run_command
def run_stop(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    if run.is_terminal:
        messages.info(request, f"Run {run.pk} is already {run.status}.")
    else:
        actions.request_stop(run, request.user)
        messages.success(request, f"Stop requested for run {run.pk}.")
    return redirect("run-detail", pk=run.pk)


@run_command
def run_restart(request: HttpRequest, pk: int) -> HttpResponse:
    """Restart a failed or lost run from its checkpoint (audited)."""
    run = get_object_or_404(Run, pk=pk)
    ok, message = actions.restart_run(run, request.user)
    (messages.success if ok else messages.error)(
        request, message if ok else f"Run {run.pk} cannot restart: {message}.")
    return redirect("run-detail", pk=run.pk)


def _form_errors(form: Any) -> str:
    return "; ".join(f"{name}: {' '.join(errs)}" for name, errs in form.errors.items())


def _reconfigure(request: HttpRequest, run: Run, form: Any, what: str,
                 act: Callable[[dict[str, Any]], str]) -> HttpResponse:
    """The three reconfiguration forms: field errors, or a refusal unless the run is
    running, or the domain action (``act`` returns the success message)."""
    if not form.is_valid():
        messages.error(request, _form_errors(form))
    elif run.status != "running":
        messages.error(request, f"Run {run.pk} is {run.status}; {what} only while it is "
                                "running.")
    else:
        messages.success(request, act(form.cleaned_data))
    return redirect("run-detail", pk=run.pk)


@run_command
def run_workers(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("policy"), pk=pk)

    def act(data: dict[str, Any]) -> str:
        actions.request_workers(run, data["workers"], request.user, data["schedule"])
        return f"Asked run {run.pk} for {data['workers']} workers."

    return _reconfigure(request, run, WorkersForm(request.POST, policy=run.policy_in_force),
                        "workers can change", act)


@run_command
def run_policy_version(request: HttpRequest, pk: int) -> HttpResponse:
    """Switch the run to another version of its policy (audited; refused with the reason
    when the run's Spark application cannot reach the version's worker limit)."""
    from control import policies

    run = get_object_or_404(Run.objects.select_related("policy"), pk=pk)
    try:
        version = int(request.POST.get("version", ""))
    except ValueError:
        messages.error(request, "version: a whole number, e.g. 2")
        return redirect("run-detail", pk=run.pk)
    ok, message = policies.switch_version(run, version, request.user)
    (messages.success if ok else messages.error)(request, message)
    return redirect("run-detail", pk=run.pk)


@run_command
def run_rebalance(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)

    def act(data: dict[str, Any]) -> str:
        actions.request_rebalance(run, data["planner"], data["schedule"], data["tau"],
                                  request.user)
        return f"Asked run {run.pk} to rebalance its key groups."

    return _reconfigure(request, run, RebalanceForm(request.POST), "it can be rebalanced",
                        act)


@run_command
def run_move_groups(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)

    def act(data: dict[str, Any]) -> str:
        actions.request_move_groups(run, data["groups"], data["executor"], data["schedule"],
                                    request.user)
        return (f"Asked run {run.pk} to move {len(data['groups'])} key groups to executor "
                f"{data['executor']}.")

    form = MoveGroupsForm(request.POST, key_groups=run.key_groups or 1,
                          executors=actions.current_executors(run))
    return _reconfigure(request, run, form, "its key groups can move", act)


@run_command
def run_frequency(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)

    def act(data: dict[str, Any]) -> str:
        actions.request_frequency(run, data["ghz"], request.user)
        return f"Asked run {run.pk} for {data['ghz']:g} GHz."

    return _reconfigure(request, run, FrequencyForm(request.POST, choices=run.frequencies),
                        "its frequency can change", act)


def _source_facts(run: Run) -> dict[str, Any]:
    """The run's source type, where its records' latency is measured from, and where
    its dead letters go (a source whose records may not convert)."""
    source = pdef.source_doc_of(run.pipeline_version.definition)
    kind = str(source.get("type", "generator"))
    facts: dict[str, Any] = {"source_type": kind, "latency_from": "the scheduled emission"}
    if kind == "files":
        facts["latency_from"] = "the file's arrival"
        facts["dead_letter_stream"] = "_dead-letter/ in the source's folder"
    elif kind in pdef.BROKER_SOURCES:
        facts["latency_from"] = "the broker's timestamp"
    if kind == "redis_stream":
        from pipelines.runtime.connectors import redis_stream as rs

        facts["dead_letter_stream"] = rs.dead_letter_stream(str(source.get("stream", "")))
    elif kind == "jetstream":
        from pipelines.runtime.connectors import jetstream as jsc

        facts["dead_letter_stream"] = jsc.dead_letter_stream(str(source.get("stream", "")))
    return facts


def replan_refusal(run: Run) -> str | None:
    """Why this run's pipeline cannot be re-planned live, or None."""
    from pipelines.runtime.replan import gloss as replan

    try:
        return replan.replan_refusal(pdef.validate(run.pipeline_version.definition))
    except pdef.DefinitionError as exc:
        return str(exc)


@run_command
def run_replan(request: HttpRequest, pk: int) -> HttpResponse:
    """Re-plan the running query to another number of key groups (audited)."""
    run = get_object_or_404(Run.objects.select_related("pipeline_version"), pk=pk)
    refusal = replan_refusal(run)
    if refusal:
        messages.error(request, f"Run {run.pk} cannot be re-planned: {refusal}.")
        return redirect("run-detail", pk=run.pk)

    def act(data: dict[str, Any]) -> str:
        actions.request_replan(run, data["key_groups"], data["scheme"], request.user)
        return (f"Asked run {run.pk} to re-plan to {data['key_groups']} key groups "
                f"({data['scheme']}).")

    return _reconfigure(request, run, ReplanForm(request.POST), "it can be re-planned", act)


@login_required
@permission_required("pipelines.view_run", raise_exception=True)
def run_plan(request: HttpRequest, pk: int) -> HttpResponse:
    """"Optimise plan": the measured profile on the DAG, the current plan beside COLA's
    proposal and the baselines; a POST applies a plan by a seamless re-plan."""
    import json


    run = get_object_or_404(Run.objects.select_related("pipeline_version"), pk=pk)
    if request.method == "POST":
        if not request.user.has_perm("pipelines.change_run"):
            raise PermissionDenied
        return _apply_plan(request, run)
    page = plans.plan_page(run)
    context: dict[str, Any] = {"run": run, "page": page}
    if not page.refusal:
        assert page.measured is not None and page.proposed is not None
        titles = {"current": "Current", "cola": "Proposed (COLA)", "fuse-all": "Fuse all",
                  "none": "One PE per operator", "greedy-merge": "Greedy merging"}
        rows = [("current", page.current)] + list(page.proposals.items())
        context.update(
            dag=page.picture, crossing_ns=page.measured.crossing_s_per_byte * 1e9,
            crossing_ms=page.measured.crossing_s_per_task * 1e3,
            nodes=[{"node": n, "facts": page.node_facts.get(n.id)}
                   for n in page.picture.nodes],
            rows=[{"key": k, "title": titles[k], "p": p, "mb_s": p.crossing_bytes_per_s / 1e6,
                   "pes_json": json.dumps([list(pe) for pe in p.pes])}
                  for k, p in rows if p is not None],
            proposed_json=json.dumps({"pes": [list(pe) for pe in page.proposed.pes],
                                      "partitions": page.proposed.partitions}))
    return render(request, "pipelines/run_plan.html", context)


def _apply_plan(request: HttpRequest, run: Run) -> HttpResponse:
    from control import jsonio
    from pipelines.runtime.spec import dataflow

    if run.status != "running":
        messages.error(request, f"Run {run.pk} is {run.status}; its plan changes only while "
                                "it is running.")
        return redirect("run-plan", pk=run.pk)
    try:
        doc = jsonio.loads(request.POST.get("plan") or "")
        spec = pdef.validate(run.pipeline_version.definition)
        if spec.graph is None or spec.pe_plan is None:
            raise pdef.DefinitionError("", "the pipeline has no Python operator")
        # The pipeline's constraints stay; the PEs and partitions are the new ones.
        plan = dataflow.validate_plan({**spec.pe_plan.as_dict(), **doc,
                                       "colocate": [list(p) for p in spec.pe_plan.colocate],
                                       "exlocate": [list(p) for p in spec.pe_plan.exlocate]},
                                      spec.graph)
    except (ValueError, TypeError, pdef.DefinitionError, dataflow.GraphError) as exc:
        messages.error(request, f"Run {run.pk}: not a plan for this pipeline: {exc}")
        return redirect("run-plan", pk=run.pk)
    actions.request_plan(run, plan.as_dict(), request.user)
    messages.success(request, f"Asked run {run.pk} to run {len(plan.pes)} PE(s) over "
                              f"{plan.partitions or spec.partitions} partition(s) "
                              "(seamless re-plan).")
    return redirect("run-detail", pk=run.pk)


@run_command
def run_verify(request: HttpRequest, pk: int) -> HttpResponse:
    """Check the run's kept output for loss, duplicates and wrong values (a job)."""
    run = get_object_or_404(Run, pk=pk)
    queued, message = actions.request_verification(run, actions.actor_for(request.user))
    if queued:
        messages.success(request, f"Run {run.pk}: {message}.")
    else:
        messages.error(request, f"Run {run.pk} cannot be checked now: {message}.")
    return redirect("run-detail", pk=run.pk)


@run_command
def run_dry_run(request: HttpRequest, pk: int) -> HttpResponse:
    """The dry-run switch: the controller keeps deciding and showing, but does not act."""
    run = get_object_or_404(Run, pk=pk)
    on = request.POST.get("dry_run") == "on"
    ticks.set_dry_run(run, on, request.user)
    messages.success(request, f"Run {run.pk}: dry run {'on' if on else 'off'}.")
    return redirect("run-detail", pk=run.pk)


@login_required
@permission_required("pipelines.view_run", raise_exception=True)  # it names the runs
def cluster_page(request: HttpRequest) -> HttpResponse:
    """The Spark master's workers (hosts, cores, memory) and which runs' executors are
    on each (issue: runs beyond one machine)."""
    from pipelines import cluster_status

    from control import fleetview, plugins
    from control.forms import FleetSettingsForm
    from control.models import FleetSettings

    shared = FleetSettings.current()
    form = FleetSettingsForm(instance=shared)
    if request.method == "POST":
        if not request.user.has_perm("control.change_fleetsettings"):
            raise PermissionDenied
        saved, form = fleetview.update_fleet_settings(request.POST.dict(), request.user)
        if saved:
            messages.success(request, "Fleet settings saved.")
            return redirect("cluster")
    overview = cluster_status.overview()
    cores, source = cluster_status.cluster_cores()
    workers = [{"status": w, "runs": overview.runs_on(w.host)} for w in overview.workers]
    shared_cores, shared_source = ticks.fleet_capacity(shared)
    return render(request, "pipelines/cluster.html",
                  {"cluster": overview, "workers": workers, "cores": cores,
                   "cores_source": source, "operator_packages": _operator_packages(),
                   "fleet": shared, "fleet_form": form, "shares": ticks.fleet_shares(),
                   "shared_cores": shared_cores, "shared_source": shared_source,
                   "decision_plugins": plugins.installed()})


@login_required
def retention_page(request: HttpRequest) -> HttpResponse:
    """What Streamwise keeps and for how long, and what the next hourly pass would
    delete (admins: the same people as the admin site)."""
    from django.core.exceptions import PermissionDenied
    from django.utils import timezone

    from pipelines import retention

    if not request.user.is_staff:
        raise PermissionDenied
    policy = retention.RetentionPolicy.from_settings()
    return render(request, "pipelines/retention.html",
                  {"policy": policy.describe(),
                   "next_pass": retention.pending(timezone.now(), policy)})
