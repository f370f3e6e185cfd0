"""tests/web/: the Django apps on a real database: views, forms, actions, tasks on a real Celery worker, WebSockets. Every test here carries the ``web`` marker."""
from __future__ import annotations

from tests.conftest import folder_marker

pytest_collection_modifyitems = folder_marker(__file__, "web")
