"""One cluster, many runs (issue 49), on the real stack: three runs of different
priorities hold all the cores the fleet shares; a rate step on the high-priority run
makes its controller ask for a second worker (the low run's own controller asks to give
one back all along, and the example decision plug-in vetoes it every time). A
cluster-wide excluded period holds that
first scale-up (an ``excluded`` decision, no reconfiguration); once the period ends, the
arbiter takes a core back from the low-priority run by a planned scale-down (its key
groups move first) and grants it in the same control step. Both runs' decisions say why; every run's output passes the verifier.
The scenario is ``manage.py bench shares``'s (pipelines/management/shares.py)."""
from __future__ import annotations

import pytest

from pipelines.management import shares

pytestmark = [pytest.mark.spark, pytest.mark.single_pass, pytest.mark.timeout(900)]


@pytest.mark.django_db(transaction=True)
def test_a_rate_step_on_the_high_priority_run_takes_a_core_from_the_low_priority_one(
        live_stack, operator) -> None:
    from control.models import Decision

    outcome = shares.run_scenario(operator)
    rows = {r["run"]: r for r in shares.report(outcome)}
    story = "\n".join(f"{n}: {r['verifier']}\n  " + "\n  ".join(r["timeline"])
                      for n, r in rows.items())
    # An excluded period held the first scale-up (a decision, no reconfiguration) and
    # the next step after it ended scaled.
    high = outcome.runs["shares-high"]
    assert outcome.excluded_step is not None, story
    held = Decision.objects.get(run=high, step=outcome.excluded_step)
    assert held.chosen_workers == 2 and "excluded period '* * * * *'" in \
        held.outcome_message, story
    assert not high.events.filter(kind="reconfigured",
                                  at__lte=held.at).exists(), story
    assert high.events.filter(kind="held", message__contains="excluded").exists(), story
    assert outcome.asked_step is not None, story
    assert outcome.asked_step > outcome.excluded_step, story
    assert outcome.granted_step is not None, story
    # Within 3 control steps of asking (here: in the same step, the core being released
    # by the low run's migration while the new executor starts).
    assert outcome.granted_step - outcome.asked_step <= 2, story
    assert outcome.carried_at is not None, story
    taken = outcome.preempted
    assert taken is not None, story
    assert (taken.current_workers, taken.chosen_workers, taken.outcome) == (2, 1, "applied"), \
        story
    low = outcome.runs["shares-low"]
    assert taken.reason.startswith("preempted: 1 core(s) taken back by planned migration; "
                                   f"run {high.pk} (priority 3 > 1) needs it"), story
    granted = Decision.objects.get(run=high, step=outcome.granted_step)
    assert granted.outcome == "applied", story
    assert f"1 core(s) being released by run {low.pk}" in granted.inputs["gate"], story
    assert granted.inputs["gate"] in granted.outcome_message, story
    # The low run's scale-down moved its key groups (a planned migration, not a kill).
    moved = low.events.filter(kind="reconfigured", payload__command="set_workers").first()
    assert moved is not None, story
    assert moved.payload["migration"]["groups_moved"] >= 1, (moved.payload, story)
    assert low.events.filter(kind="preempted").exists()
    for name, row in rows.items():
        assert row["verified"], f"{name}: {row['verifier']} {row['problems']}\n{story}"
    assert rows["shares-mid"]["workers_held"] == [1], story  # nobody took the mid run's
    # The low run's own controller (static-min) proposed 2 -> 1 at every step: the
    # example plug-in vetoed each, on the live run, and said so.
    vetoed = Decision.objects.filter(run=low, outcome="vetoed").first()
    assert vetoed is not None and (vetoed.current_workers, vetoed.chosen_workers) == (2, 1), \
        story
    assert vetoed.outcome_message.startswith("plug-in quiet-hour-end: no scale-down in the "
                                             "last 60 minutes of the hour"), story
    assert low.events.filter(kind="held", message__contains="vetoed").exists(), story
