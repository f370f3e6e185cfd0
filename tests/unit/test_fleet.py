"""The fleet's arbiter and guards (control/fleet.py) against brute force and by hand."""
from __future__ import annotations

import datetime as dt
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control import fleet
from control.fleet import Applied, Claim, Guards


def _claim(run: str, priority: int, held: int, asked: int, costs: dict[int, float],
           guaranteed: int = 1, **kw) -> Claim:
    return Claim(run=run, priority=priority, guaranteed=guaranteed, held=held, asked=asked,
                 cost_by_workers=costs, **kw)


def test_a_higher_priority_run_takes_a_core_back_from_a_lower_one() -> None:
    """Four cores, three runs: the high-priority run's rate step makes it ask for a
    second core; the low-priority run holds two. The priority arbiter takes one back,
    first come first served refuses the high-priority run."""
    claims = [
        _claim("high", 3, held=1, asked=2, costs={1: 1.4, 2: 0.0}, asked_at=3.0),
        _claim("mid", 2, held=1, asked=1, costs={1: 0.0}),
        _claim("low", 1, held=2, asked=2, costs={1: 0.3, 2: 0.0}, asked_at=1.0),
    ]
    by_priority = fleet.arbiter("priority").allocate(4, claims)
    assert {r: s.granted for r, s in by_priority.shares.items()} == {"high": 2, "mid": 1,
                                                                      "low": 1}
    assert by_priority.shares["low"].preempted == 1
    assert "preempted" in by_priority.shares["low"].reason
    assert "run high (priority 3 > 1)" in by_priority.shares["low"].reason
    assert by_priority.shares["high"].reason.startswith("granted 1 core(s), 1 taken back")
    first_come = fleet.arbiter("fcfs").allocate(4, claims)
    assert first_come.granted("high") == 1 and first_come.granted("low") == 2
    assert first_come.shares["high"].reason.startswith("refused 1 of 1 core(s)")


def test_equal_priorities_never_preempt_and_ties_keep_cores_where_they_are() -> None:
    claims = [_claim("a", 2, held=1, asked=2, costs={1: 5.0, 2: 0.0}),
              _claim("b", 2, held=2, asked=2, costs={1: 0.1, 2: 0.0})]
    shares = fleet.arbiter("priority").allocate(3, claims).shares
    assert (shares["a"].granted, shares["b"].granted) == (1, 2)
    # Free cores go where they save the most weighted cost.
    claims = [_claim("a", 1, held=1, asked=2, costs={1: 5.0, 2: 0.0}),
              _claim("b", 2, held=1, asked=2, costs={1: 2.0, 2: 0.0})]
    shares = fleet.arbiter("priority").allocate(3, claims).shares
    assert (shares["a"].granted, shares["b"].granted) == (2, 1)  # 5 x 1 > 2 x 2


def test_guarantees_come_first_and_the_lowest_priority_gives_way_when_they_cannot_all_be_met() -> None:
    claims = [_claim("a", 1, held=0, asked=2, costs={}, guaranteed=2),
              _claim("b", 5, held=0, asked=2, costs={}, guaranteed=2)]
    alloc = fleet.arbiter("priority").allocate(3, claims)
    assert alloc.granted("b") == 2 and alloc.granted("a") == 1


def test_a_maximum_share_caps_a_run_and_says_so() -> None:
    alloc = fleet.arbiter("priority").allocate(
        8, [_claim("a", 1, held=1, asked=4, costs={1: 9.0, 4: 0.0}, max_share=2)])
    assert alloc.granted("a") == 2
    assert "maximum share of 2" in alloc.shares["a"].reason


claims_strategy = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 2), st.integers(0, 3), st.integers(0, 4),
              st.lists(st.floats(0, 20), min_size=5, max_size=5), st.one_of(
                  st.none(), st.integers(1, 4))),
    min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 8), rows=claims_strategy)
def test_the_dynamic_programme_equals_brute_force(capacity: int, rows: list) -> None:
    claims = []
    for i, (priority, guaranteed, held, asked, costs, share) in enumerate(rows):
        # A cost curve that does not rise with workers (saturated at few, then less).
        curve = sorted(costs, reverse=True)
        claims.append(Claim(f"r{i}", priority, guaranteed, held, asked,
                            {n: curve[n] for n in range(5)}, share, asked_at=float(i)))
    alloc = fleet.arbiter("priority").allocate(capacity, claims)
    reference = fleet.brute_force(capacity, claims)
    grants = {r: s.granted for r, s in alloc.shares.items()}
    assert sum(grants.values()) <= capacity
    assert fleet.objective(claims, grants) == pytest.approx(fleet.objective(claims, reference),
                                                            abs=1e-7)
    lo = fleet.lower_bounds(capacity, claims)
    for c in claims:
        assert lo[c.run] <= grants[c.run] <= max(lo[c.run], c.demand)
        # Never below what it keeps unless a strictly higher priority wanted more.
        if grants[c.run] < min(c.held, c.demand, max(c.guaranteed, grants[c.run] + 1)):
            assert any(o.priority > c.priority and o.demand > o.held for o in claims) \
                or sum(lo.values()) >= capacity


def test_first_come_first_served_serves_in_order_and_never_preempts() -> None:
    rng = random.Random(7)
    for _ in range(200):
        claims = [Claim(f"r{i}", rng.randint(1, 3), 1, rng.randint(0, 3), rng.randint(0, 4),
                        {}, asked_at=rng.random()) for i in range(rng.randint(1, 4))]
        capacity = max(sum(min(c.held, c.asked) for c in claims), rng.randint(0, 8))
        alloc = fleet.arbiter("fcfs").allocate(capacity, claims)
        assert alloc.used <= capacity
        for c in claims:
            assert alloc.granted(c.run) >= min(c.held, c.asked)
        # A later asker gets a core only when every earlier one has all it asked for.
        order = sorted(claims, key=lambda c: c.asked_at)
        for i, c in enumerate(order):
            if alloc.granted(c.run) > min(c.held, c.asked):
                assert all(alloc.granted(e.run) == e.asked for e in order[:i]
                           if e.asked > e.held)


def test_unknown_arbiter_and_bad_claims_are_clear_errors() -> None:
    with pytest.raises(fleet.FleetError, match="unknown arbiter 'x'; one of priority, fcfs"):
        fleet.arbiter("x")
    with pytest.raises(fleet.FleetError, match="priority must be at least 1"):
        Claim("a", 0, 1, 1, 1)
    with pytest.raises(fleet.FleetError, match="one claim per run"):
        fleet.arbiter("fcfs").allocate(2, [Claim("a", 1, 1, 1, 1), Claim("a", 1, 1, 1, 1)])


def test_violation_cost_is_the_relative_excess_and_saturation_reads_as_such() -> None:
    assert fleet.violation_cost(1.0, 2.0) == 0.0
    assert fleet.violation_cost(3.0, 2.0) == pytest.approx(0.5)
    assert fleet.violation_cost(None, 2.0) == fleet.SATURATED_COST
    assert fleet.violation_cost(float("inf"), 2.0) == fleet.SATURATED_COST
    # More overloaded costs more: a core that halves the overload still saves.
    assert fleet.violation_cost(None, 2.0, utilisation=2.0) == 2 * fleet.SATURATED_COST
    assert fleet.violation_cost(None, 2.0, utilisation=0.99) == fleet.SATURATED_COST
    assert fleet.violation_cost(1.0, 2.0, throughput=50, floor=100, rate=200) == \
        pytest.approx(0.5)


def _at(hour: int, minute: int) -> float:
    return dt.datetime(2026, 12, 7, hour, minute, 30, tzinfo=dt.UTC).timestamp()


def test_an_excluded_period_forbids_scaling_inside_it_only() -> None:
    guards = Guards(excluded_periods=("50-59 * * * *", "* 2 * * *"))
    assert "excluded period '50-59 * * * *' (10:55 UTC)" == fleet.guard(
        guards, 1, 2, _at(10, 55), [])
    assert fleet.guard(guards, 1, 2, _at(10, 49), []) is None
    assert fleet.guard(guards, 2, 1, _at(2, 5), []) is not None
    with pytest.raises(fleet.FleetError, match="has 5 fields"):
        Guards(excluded_periods=("* * *",))
    with pytest.raises(fleet.FleetError, match="not a valid cron expression"):
        Guards(excluded_periods=("61 * * * *",))


def test_the_reconfiguration_cap_and_the_cooldowns_per_direction() -> None:
    now = _at(12, 0)
    history = [Applied(now - 4000, "up"), Applied(now - 1000, "up"), Applied(now - 100, "down")]
    assert "2 reconfigurations in the last hour, the cap is 2" == fleet.guard(
        Guards(max_reconfigurations_per_hour=2), 1, 2, now, history)
    assert fleet.guard(Guards(max_reconfigurations_per_hour=3), 1, 2, now, history) is None
    cool = Guards(cooldown_up_s=600, cooldown_down_s=300)
    assert fleet.guard(cool, 1, 2, now, history) is None  # last up 1000 s ago
    assert fleet.guard(cool, 2, 1, now, history) == \
        "cooldown: last scale-down 100 s ago, the policy waits 300 s"
