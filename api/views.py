"""API tokens on a page: a user makes tokens (each shown once) and revokes them; an
admin sees and revokes everyone's."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from api.models import ApiToken
from audit.log import record

MAX_NAME = 100


def _may_manage_all(user) -> bool:  # noqa: ANN001
    return user.is_superuser or user.groups.filter(name="admin").exists()


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    shown = ApiToken.objects.select_related("user")
    if not _may_manage_all(request.user):
        shown = shown.filter(user=request.user)
    return render(request, "api/tokens.html", {
        "tokens": shown, "all": _may_manage_all(request.user),
        "new_token": request.session.pop("new_api_token", None)})


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "").strip()
    if not name or len(name) > MAX_NAME:
        messages.error(request, f"name: 1 to {MAX_NAME} characters, e.g. ci-deploy")
        return redirect("api-tokens")
    token, text = ApiToken.issue(request.user, name)
    record("api_token.create", ("api_token", token.pk, str(token)),
           message=f"token {name!r} made")
    # Shown once, on the next page; only its hash is kept.
    request.session["new_api_token"] = text
    return redirect("api-tokens")


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk)
    if token.user_id != request.user.pk and not _may_manage_all(request.user):
        messages.error(request, "only its owner or an admin revokes a token")
        return redirect("api-tokens")
    if token.active:
        token.revoke(request.user)
        record("api_token.revoke", ("api_token", token.pk, str(token)),
               message=f"token {token.name!r} of {token.user} revoked")
        messages.success(request, f"Token {token.name} revoked.")
    return redirect("api-tokens")
