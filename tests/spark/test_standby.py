"""Warm standby runners (pipelines.runtime.runner.standby): what a standby's application
can serve; what it cannot starts cold. A run that adopts the live stack's standby,
scales from it and hands it to the next run is the browser's first run
(tests/browser/test_browser.py)."""
from __future__ import annotations

import pytest


def _offer(**changes):
    from pipelines.runtime.runner.standby import Offer

    doc = {"standby_id": "s1", "pid": 1, "master_url": "spark://127.0.0.1:7077",
           "max_workers": 4, "executor_memory": "512m", "app_id": "app-1", "ready_at": 0.0}
    return Offer(**{**doc, **changes})


@pytest.mark.dbless
def test_a_standby_fits_only_runs_its_application_can_serve() -> None:
    from pipelines.runtime.runner.standby import Offer, fits

    offer = _offer()
    run = {"master_url": "spark://127.0.0.1:7077", "max_workers": 2,
           "executor_memory": "512m"}
    assert fits(offer, run) is None
    assert fits(offer, {**run, "max_workers": 4}) is None
    assert "5 workers" in fits(offer, {**run, "max_workers": 5})
    assert "executor memory 1g" in fits(offer, {**run, "executor_memory": "1g"})
    # A run's own locality wait is set on the adopted session's live context
    # (session.set_locality_wait), and the standby's reset removes it again.
    assert fits(offer, {**run, "locality_wait": "120s"}) is None
    assert "spark://other:7077" in fits(_offer(master_url="spark://other:7077"), run)
    assert Offer.from_json(offer.to_json()) == offer
