from typing import Any

from django.apps import AppConfig
from django.core import checks


class ControlConfig(AppConfig):
    name = "control"
    verbose_name = "Control"

    def ready(self) -> None:
        checks.register(check_fleet_settings)


def check_fleet_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ARBITER and EXCLUDED_PERIODS are read from the environment: a typo is an error at
    start-up (``manage.py check``, ``runserver``, ``up``), not a failing control step."""
    from django.conf import settings

    from control import fleet

    errors: list[checks.CheckMessage] = []
    if settings.ARBITER not in fleet.ARBITERS:
        errors.append(checks.Error(f"ARBITER={settings.ARBITER!r} is not an arbiter",
                                   hint=f"one of {', '.join(fleet.ARBITERS)}",
                                   id="control.E001"))
    for period in settings.EXCLUDED_PERIODS:
        try:
            fleet.check_cron(period)
        except fleet.FleetError as exc:
            errors.append(checks.Error(f"EXCLUDED_PERIODS: {exc}", id="control.E002"))
    return errors
