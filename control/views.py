from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from control.forms import PolicyForm
from control.models import Policy


@login_required
def policy_list(request: HttpRequest) -> HttpResponse:
    return render(request, "control/policy_list.html", {"policies": Policy.objects.all()})


@login_required
@permission_required("control.change_policy", raise_exception=True)
def policy_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk) if pk else None
    form = PolicyForm(request.POST or None, instance=policy)
    if request.method == "POST" and form.is_valid():
        saved = form.save(commit=False)
        if saved.created_by_id is None:
            saved.created_by = request.user
        saved.save()
        messages.success(request, f"Policy {saved.name} saved.")
        return redirect("policy-list")
    return render(request, "control/policy_form.html", {"form": form, "policy": policy})
