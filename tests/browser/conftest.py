"""tests/browser/: headless Chromium driving the pages. Every test here carries the ``browser`` marker."""
from __future__ import annotations

from tests.conftest import folder_marker

pytest_collection_modifyitems = folder_marker(__file__, "browser")
