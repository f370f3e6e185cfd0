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
