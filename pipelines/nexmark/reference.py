"""NEXMark queries Q0–Q8 computed outside Spark: the reference each run is checked against.

Semantics are those of Apache Beam's NEXMark (``queries/QueryN.java``, ``QueryNModel.java``,
``WinningBids.java``); no code is carried over. Each function takes the events in
generation order (``generator.events``) and the *watermark*: the event time up to which
the input is complete. A result is final, and listed here, only when Beam would emit it
by that watermark: a window ``[start, end)`` when ``end <= watermark``, an auction's
winner when ``expires <= watermark``. Without a watermark the last event's time is used
(the generator's events arrive in time order, so it is the generator's own watermark).

Windows are aligned to the epoch, as both Beam's and Spark's are: fixed windows of
``WINDOW_S`` seconds, sliding windows of ``WINDOW_S`` every ``PERIOD_S`` seconds
(Beam's ``windowSizeSec`` 10 and ``windowPeriodSec`` 5). Windowed result rows carry
``windowStart`` (epoch ms), which Beam's result types leave implicit in the pane.
Late events: none — the generator emits in event-time order (``outOfOrderGroupSize`` 1),
so no event is behind the watermark.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from pipelines.nexmark.javarandom import java_round

Event = dict[str, Any]
Row = dict[str, Any]

WINDOW_S = 10  # Beam's windowSizeSec (Q3's cleanup aside, every windowed query)
PERIOD_S = 5  # Beam's windowPeriodSec (Q4, Q5 sliding windows)
AUCTION_SKIP = 123  # Beam's auctionSkip (Q2)
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
Q3_STATE_TTL_MS = 600_000  # Beam's maxAuctionsWaitingTime: idle join state is dropped
Q6_LAST_AUCTIONS = 10
EURO_PER_DOLLAR_PERCENT = 89  # Q1: price * 89 / 100


def _bids(events: Iterable[Event]) -> list[Event]:
    return [e for e in events if e["type"] == "bid"]


def _watermark(events: list[Event], watermark: int | None) -> int:
    if watermark is not None:
        return watermark
    return events[-1]["dateTime"] if events else 0


def fixed_window(t: int, size_ms: int = WINDOW_S * 1000) -> int:
    return t - t % size_ms


def sliding_windows(t: int, size_ms: int = WINDOW_S * 1000,
                    period_ms: int = PERIOD_S * 1000) -> list[int]:
    """Starts of every sliding window holding time ``t``."""
    last = t - t % period_ms
    return [s for s in range(last - size_ms + period_ms, last + 1, period_ms) if s <= t]


# ------------------------------------------------------------------------ queries
def q0(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q0 'Pass through': every event, unchanged (the cost of the plumbing alone)."""
    return [dict(e) for e in events]


def q1(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q1 'Currency conversion': every bid with its price in euro cents
    (``price * 89 / 100``, integer division as Beam's longs)."""
    return [dict(b, price=b["price"] * EURO_PER_DOLLAR_PERCENT // 100) for b in _bids(events)]


def q2(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q2 'Selection': auction and price of the bids on every 123rd auction."""
    return [{"auction": b["auction"], "price": b["price"]} for b in _bids(events)
            if b["auction"] % AUCTION_SKIP == 0]


def q3(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q3 'Local item suggestion': sellers in OR, ID or CA and their auctions in
    category 10 — an incremental stream–stream join on ``seller = person.id`` with no
    window. An auction seen before its seller waits for them; a person is kept for
    later auctions. As in Beam, a key's state (person and waiting auctions) is dropped
    once 600 s of event time pass with no event for it."""
    person: dict[int, Event] = {}
    waiting: dict[int, list[Event]] = defaultdict(list)
    last_seen: dict[int, int] = {}
    out: list[Row] = []

    def emit(auction: Event, who: Event) -> None:
        out.append({"name": who["name"], "city": who["city"], "state": who["state"],
                    "id": auction["id"]})

    for e in events:
        if e["type"] == "person" and e["state"] in Q3_STATES:
            key = e["id"]
        elif e["type"] == "auction" and e["category"] == Q3_CATEGORY:
            key = e["seller"]
        else:
            continue
        if key in last_seen and e["dateTime"] > last_seen[key] + Q3_STATE_TTL_MS:
            person.pop(key, None)
            waiting.pop(key, None)
        last_seen[key] = e["dateTime"]
        if e["type"] == "person":
            if key not in person:
                person[key] = e
                for auction in waiting.pop(key, []):
                    emit(auction, e)
        elif key in person:
            emit(e, person[key])
        else:
            waiting[key].append(e)
    return out


def winning_bids(events: list[Event], watermark: int | None = None) -> list[tuple[Event, Event]]:
    """Beam's ``WinningBids``: for each auction that closed by the watermark
    (``expires <= watermark``), the highest bid at or above its reserve made while it was
    open (``dateTime <= bid < expires``), the earliest of equal bids; in closing order."""
    horizon = _watermark(events, watermark)
    auctions = {e["id"]: e for e in events if e["type"] == "auction"}
    best: dict[int, Event] = {}
    for b in _bids(events):
        a = auctions.get(b["auction"])
        if a is None or not a["dateTime"] <= b["dateTime"] < a["expires"] \
                or b["price"] < a["reserve"]:
            continue
        held = best.get(a["id"])
        if held is None or b["price"] > held["price"] or \
                (b["price"] == held["price"] and b["dateTime"] < held["dateTime"]):
            best[a["id"]] = b
    closed = [(auctions[i], b) for i, b in best.items() if auctions[i]["expires"] <= horizon]
    return sorted(closed, key=lambda ab: (ab[0]["expires"], ab[0]["id"]))


def q4(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q4 'Average price for a category': the mean winning price per category over
    sliding windows (10 s every 5 s) of the auctions' closing times, rounded half up
    (Java's ``Math.round``)."""
    horizon = _watermark(events, watermark)
    prices: dict[tuple[int, int], list[int]] = defaultdict(list)
    for auction, bid in winning_bids(events, horizon):
        for start in sliding_windows(auction["expires"]):
            prices[(start, auction["category"])].append(bid["price"])
    return [{"category": category, "price": java_round(sum(p) / len(p)),
             "windowStart": start}
            for (start, category), p in sorted(prices.items())
            if start + WINDOW_S * 1000 <= horizon]


def q5(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q5 'Hot items': per sliding window (10 s every 5 s), the auctions with the most
    bids (every auction tied for the top count), with that count."""
    horizon = _watermark(events, watermark)
    counts: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for b in _bids(events):
        for start in sliding_windows(b["dateTime"]):
            counts[start][b["auction"]] += 1
    out: list[Row] = []
    for start in sorted(counts):
        if start + WINDOW_S * 1000 > horizon:
            continue
        top = max(counts[start].values())
        out.extend({"auction": auction, "num": n, "windowStart": start}
                   for auction, n in sorted(counts[start].items()) if n == top)
    return out


def q6(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q6 'Average selling price by seller': per seller, the mean price of their last
    10 winning bids (by bid time, then price), rounded half up. Beam emits it again at
    every new winning bid (``q6_running``); this lists each seller's value at the
    watermark, which is the last update a run emits for that seller."""
    return [{"seller": seller, "price": prices[-1]}
            for seller, prices in sorted(q6_running(events, watermark).items())]


def q6_running(events: list[Event], watermark: int | None = None) -> dict[int, list[int]]:
    """Every value Beam's Q6 emits, per seller: element k-1 is the seller's mean after
    their k-th winning auction in closing order (auctions closing at the same instant in
    id order)."""
    latest: dict[int, list[Event]] = defaultdict(list)
    running: dict[int, list[int]] = defaultdict(list)
    for auction, bid in winning_bids(events, watermark):
        kept = latest[auction["seller"]]
        kept.append(bid)
        kept.sort(key=lambda b: (b["dateTime"], b["price"]))
        del kept[:-Q6_LAST_AUCTIONS]
        running[auction["seller"]].append(
            java_round(sum(b["price"] for b in kept) / len(kept)))
    return dict(running)


def q7(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q7 'Highest bid': per fixed 10 s window, every bid at the window's highest price."""
    horizon = _watermark(events, watermark)
    windows: dict[int, list[Event]] = defaultdict(list)
    for b in _bids(events):
        windows[fixed_window(b["dateTime"])].append(b)
    out: list[Row] = []
    for start in sorted(windows):
        if start + WINDOW_S * 1000 > horizon:
            continue
        top = max(b["price"] for b in windows[start])
        out.extend(dict(b, windowStart=start) for b in windows[start] if b["price"] == top)
    return out


def q8(events: list[Event], watermark: int | None = None) -> list[Row]:
    """Q8 'Monitor new users': people who opened auctions in the same fixed 10 s window
    in which they registered — a windowed join of persons (by id) and auctions (by
    seller); one row per such auction with the person's id and name and its reserve."""
    horizon = _watermark(events, watermark)
    people: dict[tuple[int, int], Event] = {}
    auctions: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in events:
        if e["type"] == "person":
            people[(fixed_window(e["dateTime"]), e["id"])] = e
        elif e["type"] == "auction":
            auctions[(fixed_window(e["dateTime"]), e["seller"])].append(e)
    out: list[Row] = []
    for (start, pid), person in sorted(people.items()):
        if start + WINDOW_S * 1000 > horizon:
            continue
        out.extend({"id": pid, "name": person["name"], "reserve": a["reserve"],
                    "windowStart": start} for a in auctions.get((start, pid), []))
    return out


QUERIES: dict[str, Callable[[list[Event], int | None], list[Row]]] = {
    "Q0": q0, "Q1": q1, "Q2": q2, "Q3": q3, "Q4": q4, "Q5": q5, "Q6": q6, "Q7": q7, "Q8": q8,
}


def expected(query: str, events: list[Event], watermark: int | None = None) -> list[Row]:
    """The final result rows of ``query`` (``Q0``..``Q8``) over ``events``."""
    try:
        model = QUERIES[query.upper()]
    except KeyError:
        raise ValueError(f"unknown query {query!r}; known: {', '.join(QUERIES)}") from None
    return model(events, watermark)
