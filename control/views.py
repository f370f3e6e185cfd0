from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from control import lab, policies
from control.forms import FleetLabForm, LabForm, PolicyForm
from control.models import LabRun, LabStatus, Policy


@login_required
@permission_required("pipelines.view_run", raise_exception=True)
def fleet_page(request: HttpRequest) -> HttpResponse:
    """The landing page: every active run at a glance (p95 against its bound as a
    sparkline, rate, workers and share, recent alerts, the last decision) and the
    cluster's cores in use."""
    from control import fleetview

    return render(request, "control/fleet.html", fleetview.overview())


@login_required
@permission_required("control.view_policy", raise_exception=True)
def policy_list(request: HttpRequest) -> HttpResponse:
    return render(request, "control/policy_list.html", {"policies": Policy.objects.all()})


@login_required
def policy_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    # Creating needs add_policy, editing change_policy.
    if not request.user.has_perm("control.change_policy" if pk else "control.add_policy"):
        raise PermissionDenied
    policy = get_object_or_404(Policy, pk=pk) if pk else None
    form = PolicyForm(request.POST or None, instance=policy)
    if request.method == "POST" and form.is_valid():
        saved = policies.save_policy(form.save(commit=False), request.user)
        messages.success(request, f"Policy {saved.name} saved as v{saved.version}; running "
                                  "runs keep their version until switched on their page.")
        return redirect("policy-list")
    return render(request, "control/policy_form.html", {"form": form, "policy": policy})


@login_required
@permission_required("control.view_labrun", raise_exception=True)
def lab_list(request: HttpRequest) -> HttpResponse:
    return render(request, "control/lab_list.html", {"labs": LabRun.objects.all()[:100]})


@login_required
@permission_required("control.add_labrun", raise_exception=True)
def lab_new(request: HttpRequest) -> HttpResponse:
    form = LabForm(request.POST or None, request.FILES or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        run = lab.start_lab(request.user, form.cleaned_data["name"], form.scenario)
        return redirect("lab-detail", pk=run.pk)
    return render(request, "control/lab_form.html", {"form": form})


@login_required
@permission_required("control.add_labrun", raise_exception=True)
def lab_fleet_new(request: HttpRequest) -> HttpResponse:
    form = FleetLabForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        run = lab.start_lab(request.user, form.cleaned_data["name"], form.scenario)
        return redirect("lab-detail", pk=run.pk)
    return render(request, "control/lab_form.html", {"form": form, "fleet": True})


@login_required
@permission_required("control.view_labrun", raise_exception=True)
def lab_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(LabRun, pk=pk)
    fleet = bool(run.result and run.result.get("kind") == "fleet") or \
        "runs" in (run.scenario or {})
    return render(request, "control/lab_detail.html",
                  {"lab": run, "rows": lab.summary_rows(run), "result": run.result,
                   "fleet": fleet, "totals": lab.fleet_totals(run) if fleet else []})


@login_required
@permission_required("control.view_labrun", raise_exception=True)
def lab_status(request: HttpRequest, pk: int) -> JsonResponse:
    run = get_object_or_404(LabRun, pk=pk)
    return JsonResponse({"status": run.status, "progress": run.progress, "total": run.total,
                         "percent": run.percent, "error": run.error})


@login_required
@permission_required("control.view_labrun", raise_exception=True)
def lab_bundle(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(LabRun, pk=pk)
    if run.status != LabStatus.DONE:
        messages.error(request, "The comparison has no result yet.")
        return redirect("lab-detail", pk=pk)
    response = HttpResponse(lab.bundle(run), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="streamwise-lab-{pk}.zip"'
    return response


@login_required
@permission_required("control.add_policy", raise_exception=True)
@require_POST
def lab_make_policy(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(LabRun, pk=pk)
    policy, message = lab.policy_from_lab(run, request.POST.get("label", ""), request.user)
    if policy is None:
        messages.error(request, message)
        return redirect("lab-detail", pk=pk)
    messages.success(request, message)
    return redirect("policy-edit", pk=policy.pk)
