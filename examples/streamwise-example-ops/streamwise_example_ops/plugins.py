"""An example decision plug-in (entry point group ``streamwise.decision_plugins``): never
scale down during the last minutes of the hour, when this team's hourly reports read
the pipeline's output and a scale-down's migration would slow them.

Its one setting is read from the environment of Streamwise's processes, as a team's
plug-in would read its own configuration: ``QUIET_HOUR_END_MINUTES`` (default 10; 60
makes every minute quiet).

A policy uses it by naming it in its decision plug-ins (``"decision_plugins":
["quiet-hour-end"]``); Streamwise calls ``review`` with each decision of the run's
controller, on a live run, in a dry run and in the Strategy Lab.
"""
from __future__ import annotations

import datetime as dt
import os

from control.plugins import Proposal, Verdict


class NoScaleDownAtHourEnd:
    name = "quiet-hour-end"
    description = ("Never scale down during the last 10 minutes of the hour (UTC); "
                   "scale-ups and frequency changes go through.")

    def __init__(self, minutes: int | None = None) -> None:
        self.minutes = minutes

    def review(self, proposal: Proposal) -> Verdict | None:
        quiet = self.minutes if self.minutes is not None else int(
            os.environ.get("QUIET_HOUR_END_MINUTES", "10"))
        minute = dt.datetime.fromtimestamp(proposal.now, dt.UTC).minute
        if proposal.scales_down and minute >= 60 - quiet:
            return Verdict(f"no scale-down in the last {quiet} minutes of the hour "
                           f"(it is :{minute:02d})")
        return None


QUIET_HOUR_END = NoScaleDownAtHourEnd()
