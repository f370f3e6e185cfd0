"""tests/faults/: faults caused for real (a Redis killed and restarted, a runner SIGKILLed, a process ignoring SIGTERM). Every test here carries the ``faults`` marker."""
from __future__ import annotations

from tests.conftest import folder_marker

pytest_collection_modifyitems = folder_marker(__file__, "faults")
