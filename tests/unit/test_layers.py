"""Tasks are queued by name (pipelines.queue); each name must be a task the worker has.
The layer contracts themselves are checked by ``make lint`` (.importlinter)."""
from __future__ import annotations

import pytest

@pytest.mark.dbless
def test_every_queued_task_name_is_a_registered_task() -> None:
    from pipelines.queue import Task
    from webapp.celery import app

    app.loader.import_default_modules()
    missing = [t.value for t in Task if t.value not in app.tasks]
    assert not missing, f"queued by name but not registered: {missing}"


def test_every_periodic_task_is_registered_and_stores_no_result() -> None:
    """The beat sends its tasks every second or so: a stored result (kept a day) a call
    is ~170,000 Redis keys a day that nothing reads and that ``standby_ids``' SCAN
    walks."""
    from django.conf import settings

    from webapp.celery import app

    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks, entry
        assert app.tasks[entry["task"]].ignore_result, entry["task"]
