"""The audit log page: newest first, filtered by who, what kind of thing, action, and
time; 50 entries a page."""
from __future__ import annotations

from datetime import datetime, time

from django import forms
from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from audit.models import AuditEntry

PAGE_SIZE = 50


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=150,
                            widget=forms.TextInput(attrs={"placeholder": "user:alice"}))
    target_type = forms.ChoiceField(required=False, label="What")
    action = forms.CharField(required=False, max_length=60,
                             widget=forms.TextInput(attrs={"placeholder": "changed"}))
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        kinds = AuditEntry.objects.order_by().values_list("target_type", flat=True).distinct()
        self.fields["target_type"].choices = [("", "anything")] + [(k, k) for k in sorted(kinds)]

    def clean(self) -> dict:
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("'since' is after 'until'.")
        return data


@login_required
@permission_required("audit.view_auditentry", raise_exception=True)
def entry_list(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    entries = AuditEntry.objects.all()
    if form.is_valid():
        f = form.cleaned_data
        if f["actor"]:
            entries = entries.filter(actor__icontains=f["actor"])
        if f["target_type"]:
            entries = entries.filter(target_type=f["target_type"])
        if f["action"]:
            entries = entries.filter(action__icontains=f["action"])
        zone = timezone.get_current_timezone()
        if f["since"]:
            entries = entries.filter(at__gte=datetime.combine(f["since"], time.min, zone))
        if f["until"]:
            entries = entries.filter(at__lte=datetime.combine(f["until"], time.max, zone))
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "audit/entry_list.html",
                  {"form": form, "page": page, "query": query.urlencode()})
