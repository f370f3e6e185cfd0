from django.apps import AppConfig


class ApiConfig(AppConfig):
    """Operate from code (issue 47): the Prometheus exposition so far."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "api"
