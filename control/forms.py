from __future__ import annotations

import json

from django import forms

from control.models import Policy


class PolicyForm(forms.ModelForm):
    strategy_params = forms.CharField(
        required=False, initial="{}", widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="JSON object of strategy parameters.")

    class Meta:
        model = Policy
        fields = ["name", "description", "latency_bound_ms", "throughput_floor_rps",
                  "power_budget_w", "control_step_s", "min_workers", "initial_workers",
                  "max_workers", "strategy", "strategy_params"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        value = self.initial.get("strategy_params")
        if isinstance(value, dict):
            self.initial["strategy_params"] = json.dumps(value)

    def clean_strategy_params(self) -> dict:
        text = (self.cleaned_data.get("strategy_params") or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"Invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be a JSON object, e.g. {} or {\"horizon\": 2}.")
        return value
