from __future__ import annotations

import json

from django import forms

from control.models import Policy
from pipelines.models import Pipeline
from pipelines.runtime import definition as pdef


class PipelineForm(forms.ModelForm):
    definition = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24, "cols": 90, "spellcheck": "false",
                                     "class": "mono"}),
        help_text="JSON: a generator source, stateless filter/map steps, exactly one "
                  "keyed_aggregate, and the latency sink.")

    class Meta:
        model = Pipeline
        fields = ["name", "description", "definition"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        value = self.initial.get("definition")
        if isinstance(value, dict):
            self.initial["definition"] = json.dumps(value, indent=2)

    def clean_definition(self) -> dict:
        text = self.cleaned_data["definition"]
        try:
            spec = pdef.parse(text)
        except pdef.DefinitionError as exc:
            where = f" at {exc.path}" if exc.path else ""
            raise forms.ValidationError(f"Invalid definition{where}: {exc.message}") from exc
        return spec.raw


class StartRunForm(forms.Form):
    # No empty "---------" choice: starting a run always names a pipeline and a policy.
    pipeline = forms.ModelChoiceField(queryset=Pipeline.objects.all(), empty_label=None)
    policy = forms.ModelChoiceField(queryset=Policy.objects.all(), empty_label=None)


class WorkersForm(forms.Form):
    workers = forms.IntegerField(min_value=1)

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
