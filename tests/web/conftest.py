"""tests/web/: the Django apps on a real database: views, forms, actions, tasks on a real Celery worker, WebSockets. Every test here carries the ``web`` marker."""
from __future__ import annotations

import pytest

from tests.conftest import folder_marker

pytest_collection_modifyitems = folder_marker(__file__, "web")


@pytest.fixture
def clean_bus():
    """The control loop's Redis keys (cursors, controllers, locks) removed after the test."""
    import redis
    from django.conf import settings

    r = redis.Redis.from_url(settings.REDIS_URL)
    yield
    for key in r.scan_iter("control:*", count=1000):
        r.delete(key)
