"""tests/spark/: real Spark runs (1-core executors, few partitions). Every test here carries the ``spark`` marker."""
from __future__ import annotations

from tests.conftest import folder_marker

pytest_collection_modifyitems = folder_marker(__file__, "spark")
