"""Celery tasks of the control app."""
from __future__ import annotations

from celery import shared_task

from control import lab


@shared_task
def run_lab(lab_id: int) -> str:
    """A Strategy Lab comparison (idempotent: only a pending lab is run)."""
    return lab.execute(lab_id)
