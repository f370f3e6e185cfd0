"""Queue a Celery task by its registered name.

The tasks call the domain actions (``pipelines.actions``, ``control.lab``,
``control.ticks``); the actions queue the tasks that carry their work on. Queuing by name
keeps the imports one way (tasks -> actions), and ``Task`` is the one list of what may be
queued (a test checks each name against the worker's registry).
"""
from __future__ import annotations

from enum import StrEnum
from typing import Any

from celery import current_app


class Task(StrEnum):
    START_RUN = "pipelines.tasks.start_run"
    STOP_RUN = "pipelines.tasks.stop_run"
    RECONFIGURE_RUN = "pipelines.tasks.reconfigure_run"
    VERIFY_RUN = "pipelines.tasks.verify_run"
    RUN_LAB = "control.tasks.run_lab"
    APPLY_DECISION = "control.tasks.apply_decision"
    SEND_WEBHOOK = "control.tasks.send_webhook"


def enqueue(task: Task, *args: Any) -> None:
    """Send ``task(*args)`` to the worker now (call it in ``transaction.on_commit`` when
    the task reads rows this transaction writes)."""
    current_app.send_task(task.value, args=args)
