"""Thin views: validate input with a form, call a domain action, redirect."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from control.models import Policy
from pipelines import actions
from pipelines.forms import PipelineForm, StartRunForm, WorkersForm
from pipelines.models import Pipeline, Run
from pipelines.runtime.definition import DEMO_DEFINITION


@login_required
def pipeline_list(request: HttpRequest) -> HttpResponse:
    return render(request, "pipelines/pipeline_list.html", {
        "pipelines": Pipeline.objects.all(), "policies": Policy.objects.all()})


@login_required
@permission_required("pipelines.add_pipeline", raise_exception=True)
def pipeline_create(request: HttpRequest) -> HttpResponse:
    form = PipelineForm(request.POST or None, initial={"definition": DEMO_DEFINITION})
    if request.method == "POST" and form.is_valid():
        pipeline = actions.save_pipeline(form.save(commit=False), request.user)
        messages.success(request, f"Pipeline {pipeline.name} created (v1).")
        return redirect("pipeline-list")
    return render(request, "pipelines/pipeline_form.html", {"form": form, "creating": True})


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
                  {"form": form, "pipeline": pipeline, "creating": False})


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    runs = Run.objects.select_related("pipeline_version__pipeline", "policy")[:200]
    return render(request, "pipelines/run_list.html",
                  {"runs": runs, "start_form": StartRunForm()})


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
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("pipeline_version__pipeline", "policy"),
                            pk=pk)
    return render(request, "pipelines/run_detail.html", {
        "run": run, "policy": run.policy,
        "workers_form": WorkersForm(policy=run.policy, initial={"workers": run.workers or 1})})


@login_required
@require_POST
@permission_required("pipelines.change_run", raise_exception=True)
def run_stop(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    if run.is_terminal:
        messages.info(request, f"Run {run.pk} is already {run.status}.")
    else:
        actions.request_stop(run, request.user)
        messages.success(request, f"Stop requested for run {run.pk}.")
    return redirect("run-detail", pk=run.pk)


@login_required
@require_POST
@permission_required("pipelines.change_run", raise_exception=True)
def run_workers(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("policy"), pk=pk)
    form = WorkersForm(request.POST, policy=run.policy)
    if not form.is_valid():
        messages.error(request, "; ".join(form.errors.get("workers", ["Invalid workers."])))
    elif run.status != "running":
        messages.error(request, f"Run {run.pk} is {run.status}; workers can change only "
                                "while it is running.")
    else:
        actions.request_workers(run, form.cleaned_data["workers"], request.user)
        messages.success(request, f"Asked run {run.pk} for {form.cleaned_data['workers']} "
                                  "workers.")
    return redirect("run-detail", pk=run.pk)
