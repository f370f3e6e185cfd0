"""The login form."""
from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm


class LoginForm(AuthenticationForm):
    """Django's login form, with the user name's length checked before any login is
    tried: AuthenticationForm sets ``max_length`` on its field after the field's
    validators are made, so a longer name reached ``authenticate`` and the login
    throttle's record of the failure (a 255-character column) failed on PostgreSQL."""

    def clean_username(self) -> str:
        username = self.cleaned_data["username"]
        limit = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD).max_length
        if limit and len(username) > limit:
            raise forms.ValidationError(f"A user name has at most {limit} characters.")
        return username
