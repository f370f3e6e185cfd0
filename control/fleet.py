"""One cluster, many runs: the arbiter that shares the cluster's cores between the runs'
controllers, and the guards that keep a controller from acting (pure Python, no Django).

Each control step every run's controller proposes a number of workers for its own run, as
if it were alone (``control.live``). When the proposals together ask for more cores than
the cluster offers, an arbiter decides who gets what. Its inputs are :class:`Claim`\\ s,
one per run: the run's priority, its guaranteed minimum, the workers it holds and asks
for, and — from the run's own fitted model, the one its MPC plans with — the predicted
cost of its QoS violations at each number of workers (:func:`violation_cost`).

Arbiters (``ARBITERS``, a registry that lists and builds them):

* ``priority`` — guaranteed minimums first; then the cores go where they cut the
  priority-weighted predicted violation cost the most, found exactly by dynamic
  programming over (run, cores); a run keeps the cores it holds unless a run of strictly
  higher priority wants more than it holds (then its cores above its guarantee may be
  taken back, by a planned scale-down, never a kill). Ties keep cores where they are.
* ``fcfs`` — first come, first served: each run keeps what it holds (up to what it asks);
  the free cores go to the runs that ask, in the order they asked; nobody is preempted.
  The baseline of the Flink autoscaler and of Streamwise before the arbiter.

:func:`brute_force` enumerates every allocation under the same rules; the tests check
the dynamic programme against it.

Guards (:class:`Guards`) are per policy and cluster-wide: excluded periods (cron
expressions, minute resolution, e.g. ``50-59 * * * *`` for the last ten minutes of every
hour — the Flink autoscaler's ``job.autoscaler.excluded.periods`` in cron form), a cap on
reconfigurations per hour, a cooldown per direction, and a maximum share of the cluster.
"""
from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

# A saturated configuration (its modelled utilisation at or over 1) has no finite latency;
# it costs this much per step, more than any finite excess over a bound is likely to.
SATURATED_COST = 100.0
# Taking a core back from a run that holds it costs this much in the objective: among
# allocations of equal benefit, the one that moves the fewest cores wins.
MOVE_PENALTY = 1e-6


class FleetError(ValueError):
    """A claim, an allocation or a guard that makes no sense (a clear message)."""


def violation_cost(latency_s: float | None, bound_s: float, throughput: float | None = None,
                   floor: float = 0.0, rate: float | None = None,
                   utilisation: float | None = None) -> float:
    """The modelled cost of one step's QoS violations: the p95 latency's excess over the
    bound, relative to the bound, plus the throughput's shortfall under the floor,
    relative to the floor. Where the model has no finite latency (saturated),
    ``SATURATED_COST`` times the utilisation: a core that makes a run less overloaded
    still saves something (as the MPC ranks saturated plans by their utilisation)."""
    if latency_s is None or not math.isfinite(latency_s):
        return SATURATED_COST * max(1.0, utilisation or 1.0)
    cost = max(0.0, latency_s / bound_s - 1.0)
    if floor > 0 and throughput is not None:
        wanted = min(floor, rate) if rate is not None else floor
        cost += max(0.0, (wanted - throughput) / floor)
    return min(cost, SATURATED_COST)


@dataclass(frozen=True)
class Claim:
    """One run's proposal at a control step."""

    run: str
    priority: int  # larger is more important; at least 1
    guaranteed: int  # cores the run always gets when it asks for them
    held: int  # cores (workers) it has now
    asked: int  # cores its controller proposes
    # Predicted violation cost per number of workers (violation_cost); a count not in
    # the mapping costs as much as the nearest smaller one that is (a worker that
    # cannot be used changes nothing).
    cost_by_workers: Mapping[int, float] = field(default_factory=dict)
    max_share: int | None = None  # cores it may never exceed (a guard)
    asked_at: float = 0.0  # when it asked (first come, first served)

    def __post_init__(self) -> None:
        if self.priority < 1:
            raise FleetError(f"run {self.run}: priority must be at least 1")
        if min(self.guaranteed, self.held, self.asked) < 0:
            raise FleetError(f"run {self.run}: cores cannot be negative")

    @property
    def demand(self) -> int:
        """What it asks, within its maximum share."""
        return self.asked if self.max_share is None else min(self.asked, self.max_share)

    def cost(self, workers: int) -> float:
        if not self.cost_by_workers:
            return 0.0
        known = [n for n in self.cost_by_workers if n <= workers]
        return self.cost_by_workers[max(known)] if known else SATURATED_COST

    def weighted_cost(self, workers: int) -> float:
        return self.priority * self.cost(workers)


@dataclass(frozen=True)
class Share:
    """What the arbiter gives one run, and why."""

    run: str
    granted: int
    held: int
    asked: int
    reason: str

    @property
    def preempted(self) -> int:
        """Cores taken back from it (it asked to keep them)."""
        return max(0, min(self.held, self.asked) - self.granted)

    @property
    def refused(self) -> int:
        return max(0, self.asked - self.granted)


@dataclass(frozen=True)
class Allocation:
    capacity: int
    shares: dict[str, Share]
    arbiter: str

    def granted(self, run: str) -> int:
        return self.shares[run].granted

    @property
    def used(self) -> int:
        return sum(s.granted for s in self.shares.values())


def _check(capacity: int, claims: Sequence[Claim]) -> None:
    if capacity < 0:
        raise FleetError("the cluster's capacity cannot be negative")
    names = [c.run for c in claims]
    if len(set(names)) != len(names):
        raise FleetError("one claim per run")


def protected(claims: Sequence[Claim]) -> dict[str, int]:
    """The cores each run keeps whatever the others want: what it holds (up to what it
    asks) unless a run of strictly higher priority wants more than it holds, then only
    its guarantee."""
    wanting = [c.priority for c in claims if c.demand > c.held]
    out = {}
    for c in claims:
        keep = min(c.held, c.demand)
        if any(p > c.priority for p in wanting):
            keep = min(keep, c.guaranteed)
        out[c.run] = keep
    return out


def lower_bounds(capacity: int, claims: Sequence[Claim]) -> dict[str, int]:
    """Each run's floor: its protected cores, raised to its guarantee where it asks for
    that much; when the floors exceed the cluster, the lowest priorities give way first
    (their guarantee cannot be met: the reason says so)."""
    keep = protected(claims)
    lo = {c.run: max(keep[c.run], min(c.guaranteed, c.demand)) for c in claims}
    excess = sum(lo.values()) - capacity
    for c in sorted(claims, key=lambda c: (c.priority, -c.asked_at)):
        if excess <= 0:
            break
        cut = min(excess, lo[c.run])
        lo[c.run] -= cut
        excess -= cut
    return lo


def objective(claims: Sequence[Claim], grants: Mapping[str, int]) -> float:
    """What the priority arbiter maximises: the priority-weighted violation cost saved
    against each run's cost at the cores it holds, less a tiny price per core taken
    back."""
    total = 0.0
    for c in claims:
        g = grants[c.run]
        total += c.weighted_cost(c.held) - c.weighted_cost(g)
        total -= MOVE_PENALTY * max(0, min(c.held, c.demand) - g)
    return total


def _feasible(capacity: int, claims: Sequence[Claim], lo: Mapping[str, int]
              ) -> list[tuple[int, ...]]:
    ranges = [range(lo[c.run], max(lo[c.run], c.demand) + 1) for c in claims]
    return [g for g in itertools.product(*ranges) if sum(g) <= capacity]


def brute_force(capacity: int, claims: Sequence[Claim]) -> dict[str, int]:
    """The reference for ``priority``: every allocation within the floors and demands,
    the best by :func:`objective` (ties: the most cores used, then the first found)."""
    _check(capacity, claims)
    lo = lower_bounds(capacity, claims)
    best: tuple[float, int] | None = None
    chosen: tuple[int, ...] = tuple(lo[c.run] for c in claims)
    for g in _feasible(capacity, claims, lo):
        grants = {c.run: n for c, n in zip(claims, g)}
        key = (round(objective(claims, grants), 9), sum(g))
        if best is None or key > best:
            best, chosen = key, g
    return {c.run: n for c, n in zip(claims, chosen)}


def _dynamic_programme(capacity: int, claims: Sequence[Claim], lo: Mapping[str, int]
                       ) -> dict[str, int]:
    """Exact: best[i][k] = the best objective of the first i runs using k cores."""
    neg = -math.inf
    best: list[list[tuple[float, int]]] = [[(0.0, 0)] + [(neg, 0)] * capacity]
    pick: list[list[int]] = []
    for c in claims:
        row = [(neg, 0)] * (capacity + 1)
        choice = [0] * (capacity + 1)
        for used in range(capacity + 1):
            if best[-1][used][0] == neg:
                continue
            for g in range(lo[c.run], max(lo[c.run], c.demand) + 1):
                if used + g > capacity:
                    break
                gain = (c.weighted_cost(c.held) - c.weighted_cost(g)
                        - MOVE_PENALTY * max(0, min(c.held, c.demand) - g))
                value = (round(best[-1][used][0] + gain, 9), best[-1][used][1] + g)
                if value > row[used + g]:
                    row[used + g], choice[used + g] = value, g
        best.append(row)
        pick.append(choice)
    end = max(range(capacity + 1), key=lambda k: (best[-1][k], -k))
    grants: dict[str, int] = {}
    for i in range(len(claims) - 1, -1, -1):
        g = pick[i][end]
        grants[claims[i].run] = g
        end -= g
    return grants


def _reasons(capacity: int, claims: Sequence[Claim], grants: Mapping[str, int],
             arbiter: str) -> dict[str, Share]:
    gainers = [c for c in claims if grants[c.run] > c.held]
    free = capacity - sum(min(c.held, c.demand) for c in claims)
    shares = {}
    for c in claims:
        g = grants[c.run]
        if g < min(c.held, c.demand):
            takers = sorted((t for t in gainers if t.priority > c.priority),
                            key=lambda t: -t.priority)
            taker = takers[0] if takers else None
            who = (f"run {taker.run} (priority {taker.priority} > {c.priority}) needs it: "
                   f"its predicted violation cost falls from {taker.cost(taker.held):.3g} "
                   f"to {taker.cost(grants[taker.run]):.3g}" if taker else
                   "the cluster's guarantees need it")
            reason = (f"preempted: {min(c.held, c.demand) - g} core(s) taken back by planned "
                      f"migration; {who}; this run's rises from {c.cost(c.held):.3g} to "
                      f"{c.cost(g):.3g}")
        elif g < c.demand:
            rivals = [o for o in claims if o.run != c.run and grants[o.run] > 0]
            top = max(rivals, key=lambda o: (o.priority, grants[o.run]), default=None)
            reason = (f"refused {c.demand - g} of {c.demand - c.held} core(s): the "
                      f"cluster's {capacity} cores are in use"
                      + (f" (run {top.run}, priority {top.priority}, holds "
                         f"{grants[top.run]})" if top else "")
                      + (f"; a core here would save "
                         f"{c.weighted_cost(g) - c.weighted_cost(g + 1):.3g} (weighted), "
                         "no more than where it is" if arbiter == "priority" else
                         "; first come, first served"))
        elif g > c.held:
            taken = max(0, g - c.held - max(free, 0))
            reason = (f"granted {g - c.held} core(s)"
                      + (f", {taken} taken back from lower-priority runs" if taken else
                         " from the cluster's free cores")
                      + f"; predicted violation cost {c.cost(c.held):.3g} -> {c.cost(g):.3g}")
        else:
            reason = "within its share"
        if c.max_share is not None and c.asked > c.max_share and g == c.max_share:
            reason += f"; capped at its maximum share of {c.max_share} core(s)"
        shares[c.run] = Share(c.run, g, c.held, c.asked, reason)
    return shares


class PriorityArbiter:
    name = "priority"
    label = "Priority-weighted MPC: cores where they cut weighted violations most"

    def allocate(self, capacity: int, claims: Sequence[Claim]) -> Allocation:
        _check(capacity, claims)
        lo = lower_bounds(capacity, claims)
        grants = _dynamic_programme(capacity, list(claims), lo)
        return Allocation(capacity, _reasons(capacity, claims, grants, self.name), self.name)


class FirstComeArbiter:
    name = "fcfs"
    label = "First come, first served: free cores in the order asked, no preemption"

    def allocate(self, capacity: int, claims: Sequence[Claim]) -> Allocation:
        _check(capacity, claims)
        grants = {c.run: min(c.held, c.demand) for c in claims}
        free = capacity - sum(grants.values())
        for c in sorted(claims, key=lambda c: (c.asked_at, c.run)):
            extra = max(0, min(c.demand - grants[c.run], free))
            grants[c.run] += extra
            free -= extra
        return Allocation(capacity, _reasons(capacity, claims, grants, self.name), self.name)


Arbiter = PriorityArbiter | FirstComeArbiter
ARBITERS: dict[str, Callable[[], Arbiter]] = {
    PriorityArbiter.name: PriorityArbiter,
    FirstComeArbiter.name: FirstComeArbiter,
}


def arbiter(name: str) -> Arbiter:
    try:
        return ARBITERS[name]()
    except KeyError:
        raise FleetError(f"unknown arbiter {name!r}; one of {', '.join(ARBITERS)}") from None


# ------------------------------------------------------------------------- guards
def check_cron(expression: str) -> str:
    """The expression, if it is a 5-field cron expression (minute hour day month
    weekday); FleetError with the parser's reason otherwise."""
    from croniter import croniter

    text = " ".join(str(expression).split())
    if len(text.split()) != 5:
        raise FleetError(f"{expression!r}: a cron expression has 5 fields "
                         "(minute hour day-of-month month day-of-week)")
    if not croniter.is_valid(text):
        raise FleetError(f"{expression!r} is not a valid cron expression")
    return text


def excluded(periods: Sequence[str], when: dt.datetime) -> str | None:
    """The first period whose cron expression matches the minute ``when`` is in."""
    from croniter import croniter

    minute = when.replace(second=0, microsecond=0)
    for period in periods:
        if croniter.match(period, minute):
            return period
    return None


@dataclass(frozen=True)
class Guards:
    """What a policy (and the cluster) forbid a controller, whatever it decides."""

    excluded_periods: tuple[str, ...] = ()
    max_reconfigurations_per_hour: int | None = None
    cooldown_up_s: float = 0.0
    cooldown_down_s: float = 0.0

    def __post_init__(self) -> None:
        for p in self.excluded_periods:
            check_cron(p)


@dataclass(frozen=True)
class Applied:
    """A reconfiguration that was carried out: when, and which way."""

    at: float  # epoch s
    direction: str  # "up" | "down" | "other"


def direction(current: int, chosen: int) -> str:
    return "up" if chosen > current else "down" if chosen < current else "other"


def guard(guards: Guards, current: int, chosen: int, now: float,
          history: Sequence[Applied], timezone: dt.tzinfo = dt.UTC) -> str | None:
    """Why the guards forbid reconfiguring now (a message), or None.

    ``history``: the run's applied reconfigurations (any order)."""
    when = dt.datetime.fromtimestamp(now, timezone)
    period = excluded(guards.excluded_periods, when)
    if period is not None:
        return f"excluded period {period!r} ({when:%H:%M} {when.tzname()})"
    if guards.max_reconfigurations_per_hour is not None:
        recent = [a for a in history if now - a.at < 3600]
        if len(recent) >= guards.max_reconfigurations_per_hour:
            return (f"{len(recent)} reconfigurations in the last hour, the cap is "
                    f"{guards.max_reconfigurations_per_hour}")
    way = direction(current, chosen)
    cooldown = {"up": guards.cooldown_up_s, "down": guards.cooldown_down_s}.get(way, 0.0)
    if cooldown > 0:
        same = [a.at for a in history if a.direction == way]
        if same and now - max(same) < cooldown:
            return (f"cooldown: last scale-{way} {now - max(same):.0f} s ago, "
                    f"the policy waits {cooldown:g} s")
    return None
