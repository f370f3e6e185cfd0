"""Planners (pure Python, no Django): which key groups move where (Ding et al.), how the
moves are paced (Megaphone), and which operators fuse into one processing element and
where each runs (COLA). Schemas of the CLI documents: ``control/planning/README.md``."""
from __future__ import annotations


class PlanningError(ValueError):
    """Bad planner input, with a one-line message that names the field."""
