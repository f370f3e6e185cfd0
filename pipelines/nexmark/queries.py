"""NEXMark queries as Streamwise dataflow pipelines (``pipelines.runtime.spec.dataflow``).

Each returns a definition over the ``nexmark`` source at a given rate; its results are
checked against ``reference.py``. Windows are Beam's defaults (fixed 10 s; sliding 10 s
every 5 s), epoch-aligned like Beam's; the watermark trails the largest event time by
``watermark_s`` (0: the generator emits in event-time order, so nothing is late).
"""
from __future__ import annotations

import math
from typing import Any

from pipelines.nexmark import generator as gen
from pipelines.nexmark import reference as ref

WINDOW = {"kind": "tumbling", "size_s": ref.WINDOW_S}
SLIDING = {"kind": "sliding", "size_s": ref.WINDOW_S, "slide_s": ref.PERIOD_S}
BID_COLUMNS = ("auction", "bidder", "price", "dateTime", "extra")
# Events until numInFlightAuctions more auctions (Beam's auction length horizon).
IN_FLIGHT_EVENTS = (gen.NexmarkConfig().num_in_flight_auctions * gen.PROPORTION_DENOMINATOR
                    // gen.AUCTION_PROPORTION)


def _source(rate: float, partitions: int) -> dict[str, Any]:
    return {"id": "events", "type": "nexmark", "partitions": partitions,
            "rate": {"kind": "constant", "records_per_s": rate}}


def _bids(source: str = "events") -> dict[str, Any]:
    return {"id": "bids", "type": "filter", "input": source, "where": "type == 'bid'"}


def _definition(nodes: list[dict[str, Any]], key_groups: int, keep_output: bool
                ) -> dict[str, Any]:
    nodes = [*nodes, {"id": "out", "type": "sink", "input": nodes[-1]["id"],
                      "keep_output": keep_output}]
    return {"nodes": nodes, "key_groups": key_groups}


def _with_reference(doc: dict[str, Any], query: str) -> dict[str, Any]:
    return {**doc, "reference": f"nexmark:{query}"}


def q0(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q0 'Pass through': every event."""
    return [_source(rate, partitions),
            {"id": "passthrough", "type": "filter", "input": "events", "where": "True"}]


def q1(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q1 'Currency conversion': bids with the price in euro cents."""
    cols = {c: c for c in BID_COLUMNS}
    cols["price"] = "price * 89 // 100"
    return [_source(rate, partitions), _bids(),
            {"id": "euro", "type": "project", "input": "bids", "columns": cols}]


def q2(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q2 'Selection': bids on every 123rd auction."""
    return [_source(rate, partitions), _bids(),
            {"id": "every123rd", "type": "filter", "input": "bids",
             "where": f"auction % {ref.AUCTION_SKIP} == 0"},
            {"id": "selected", "type": "project", "input": "every123rd",
             "columns": {"auction": "auction", "price": "price"}}]


def q3(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q3 'Local item suggestion': sellers in OR/ID/CA and their category-10 auctions.
    Beam's join has no window and drops a key's state after 600 s idle; here the join is
    bounded in event time: an auction from 60 s before its seller registered (Beam's
    generator names people up to 10 ahead) to 600 s after — the same result for any run
    where no seller opens a category-10 auction more than 600 s after registering."""
    return [_source(rate, partitions),
            {"id": "sellers", "type": "filter", "input": "events",
             "where": "type == 'person' and state in ('OR', 'ID', 'CA')"},
            {"id": "auctions10", "type": "filter", "input": "events",
             "where": f"type == 'auction' and category == {ref.Q3_CATEGORY}"},
            {"id": "joined", "type": "join", "left": "sellers", "right": "auctions10",
             "on": [["id", "seller"]], "within": {"lower_s": -60, "upper_s": 600}},
            {"id": "suggest", "type": "project", "input": "joined",
             "columns": {"name": "name", "city": "city", "state": "state",
                         "id": "right_id"}}]


# An offer's rank: its price first, then the earlier bid (Beam's WinningBids keeps the
# earliest of equal bids). Exact in a long while a bid comes less than RANK_MS after
# its auction opened (2.8 h: every auction at a rate above 1 event/s).
RANK_MS = 10_000_000


def _winning_bids(rate: float, partitions: int, carried: str) -> list[dict[str, Any]]:
    """Beam's WinningBids in Spark's vocabulary, up to ``winners`` (columns ``id``,
    ``carried``, ``price``, ``bid_time``): an auction is re-stamped with its closing
    time (``expires``) as event time; a bid joins it when it falls in the auction's
    lifetime (the join keeps state for the longest auction the generator makes: twice
    the time of ``numInFlightAuctions`` auctions at this rate), at or above the reserve;
    the highest such price per auction — the earliest bid among equal prices — is final
    once the watermark passes the second that holds ``expires``."""
    longest_s = math.ceil(2 * IN_FLIGHT_EVENTS / rate) + 1
    valid = "right_dateTime >= dateTime and right_dateTime < expires and price >= reserve"
    return [_source(rate, partitions),
            {"id": "auctions", "type": "filter", "input": "events", "where": "type == 'auction'"},
            {"id": "closing", "type": "project", "input": "auctions", "event_time": "expires",
             "columns": {"id": "id", carried: carried, "reserve": "reserve",
                         "dateTime": "dateTime", "expires": "expires"}},
            _bids(),
            {"id": "offers", "type": "join", "left": "closing", "right": "bids",
             "on": [["id", "auction"]], "within": {"lower_s": -longest_s, "upper_s": 0}},
            # A projection, not a filter: Spark would push a filter over both sides
            # into the join condition, whose watermark analysis cannot evaluate it.
            {"id": "valid", "type": "project", "input": "offers",
             "columns": {"id": "id", carried: carried,
                         "offer": f"price if {valid} else None",
                         "rank": f"price * {RANK_MS} - (right_dateTime - dateTime) "
                                 f"if {valid} else None",
                         "bid_time": "right_dateTime"}},
            {"id": "best", "type": "window_aggregate", "input": "valid",
             "key": ["id", carried], "window": {"kind": "tumbling", "size_s": 1},
             "aggregates": {"price": ["max", "offer"],
                            "bid_time": ["max_by", "bid_time", "rank"]}},
            {"id": "winners", "type": "filter", "input": "best", "where": "price is not None"}]


def q4(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q4 'Average price for a category': Beam's WinningBids (``_winning_bids``), then
    the mean winning price per category over sliding windows of the auctions' closing
    times, rounded half up."""
    return [*_winning_bids(rate, partitions, "category"),
            {"id": "means", "type": "window_aggregate", "input": "winners",
             "key": ["category"], "window": SLIDING, "aggregates": {"mean": ["mean", "price"]}},
            {"id": "rounded", "type": "project", "input": "means",
             "columns": {"category": "category", "price": "(mean + 0.5) // 1"}}]


def q5(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q5 'Hot items': per sliding window, the auctions with the most bids."""
    return [_source(rate, partitions), _bids(),
            {"id": "counts", "type": "window_aggregate", "input": "bids",
             "key": ["auction"], "window": SLIDING, "aggregates": {"num": ["count"]}},
            {"id": "hottest", "type": "window_top", "input": "counts", "by": "num",
             "window": SLIDING}]


def q6(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q6 'Average selling price by seller': Beam's WinningBids (``_winning_bids``),
    then per seller the mean price of their latest 10 winning bids by bid time then
    price (Beam's ``MovingMeanSellingPrice``), rounded half up. Beam emits a seller's
    mean again at every winning bid; a ``moving_mean`` emits it once per micro-batch in
    which the seller won (Beam's value after that batch's last winner), with
    ``count``, the seller's winning auctions so far, which the verifier checks it by."""
    return [*_winning_bids(rate, partitions, "seller"),
            {"id": "latest10", "type": "moving_mean", "input": "winners", "key": ["seller"],
             "value": "price", "order": ["bid_time", "price"], "last": ref.Q6_LAST_AUCTIONS},
            {"id": "rounded", "type": "project", "input": "latest10",
             "columns": {"seller": "seller", "price": "(mean + 0.5) // 1",
                         "count": "count"}}]


def q7(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q7 'Highest bid': per fixed window, the bids at the highest price."""
    return [_source(rate, partitions), _bids(),
            {"id": "highest", "type": "window_top", "input": "bids", "by": "price",
             "window": WINDOW}]


def q8(rate: float, partitions: int = 2) -> list[dict[str, Any]]:
    """Q8 'Monitor new users': people and the auctions they opened in the same window."""
    return [_source(rate, partitions),
            {"id": "people", "type": "filter", "input": "events", "where": "type == 'person'"},
            {"id": "auctions", "type": "filter", "input": "events",
             "where": "type == 'auction'"},
            {"id": "joined", "type": "join", "left": "people", "right": "auctions",
             "on": [["id", "seller"]], "window": WINDOW},
            {"id": "newusers", "type": "project", "input": "joined",
             "columns": {"id": "id", "name": "name", "reserve": "right_reserve"}}]


QUERIES = {"Q0": q0, "Q1": q1, "Q2": q2, "Q3": q3, "Q4": q4, "Q5": q5, "Q6": q6, "Q7": q7,
           "Q8": q8}
# The columns of each query's result rows that the reference lists.
RESULT_COLUMNS = {
    "Q0": None, "Q1": BID_COLUMNS, "Q2": ("auction", "price"),
    "Q3": ("name", "city", "state", "id"), "Q4": ("category", "price", "windowStart"),
    "Q5": ("auction", "num", "windowStart"), "Q6": ("seller", "price", "count"),
    "Q7": (*BID_COLUMNS, "windowStart"), "Q8": ("id", "name", "reserve", "windowStart"),
}


def definition(query: str, rate: float, *, partitions: int = 2, key_groups: int = 4,
               keep_output: bool = True, stream: dict[str, Any] | None = None,
               to: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pipeline definition of NEXMark query ``query`` (e.g. ``"Q3"``). ``stream``:
    read the events from a broker instead (a source node's fields, e.g. ``{"type":
    "redis_stream", "url": ..., "stream": ...}``; ``rate`` is then the rate it is
    expected to carry); ``to``: the sink node's target (a PostgreSQL table ...)."""
    query = query.upper()
    doc = _with_reference(_definition(QUERIES[query](rate, partitions), key_groups,
                                      keep_output), query)
    if stream is not None:
        source = doc["nodes"][0]
        doc["nodes"][0] = {"id": source["id"], "partitions": partitions,
                           "rate": source["rate"], "events": "nexmark", **stream}
    if to is not None:
        doc["nodes"][-1] = {**doc["nodes"][-1], "to": to}
    return doc
