"""tests/unit/: pure tests: no database, no Spark, no browser (the control library, the runtime's pure parts, validation). Every test here carries the ``unit`` marker."""
from __future__ import annotations

from tests.conftest import folder_marker

pytest_collection_modifyitems = folder_marker(__file__, "unit")
