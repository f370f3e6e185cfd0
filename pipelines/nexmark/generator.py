"""The NEXMark event stream, event for event as Apache Beam's NEXMark generator makes it.

NEXMark (Tucker et al., "NEXMark – A Benchmark for Queries over Data Streams", 2008, as
implemented in Apache Beam's ``sdks/java/testing/nexmark``, ``sources/generator/``)
models an online auction: people register, open auctions and bid. Facts carried over
from Beam's generator (no code):

* Event ``i`` is drawn from a ``java.util.Random`` seeded with its id ``i`` (so any
  event can be made on its own, in any order, on any executor); ``i % 50`` picks its
  kind: 0 a person, 1–3 an auction, 4–49 a bid (persons : auctions : bids = 1 : 3 : 46).
* Ids start at 1000 (persons, auctions) and 10 (categories; 5 of them). The person and
  auction an event refers to are derived from ``i``: the last one made so far, a "hot"
  one (the first of the last 100) with probability 1 − 1/ratio, or one of the active
  people (1000) / in-flight auctions (100) plus up to 10 ids not made yet.
* Prices are ``round(10^(6u) · 100)`` cents; strings are lowercase letters with spaces
  (names, descriptions), and ``extra`` pads each event to its average byte size.
* Event time: ``base_time + n · delay``, where the inter-event delay comes from the
  rate (``rateToPeriodUs(rate) · numEventGenerators`` µs) and may follow Beam's
  SQUARE or SINE rate shapes; an auction expires a random time after it opens, on
  average the time the next ``numInFlightAuctions`` auctions take to arrive.

Beam's default configuration (10,000 events/s over 100 generators, base time
2015-07-15T00:00:00Z, one unsplit generator as its query models use) is
:data:`BEAM_DEFAULT`; :func:`event` then yields Beam's event ``i`` field for field.
Field names are Beam's; times are epoch milliseconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pipelines.nexmark.javarandom import JavaRandom, java_rem, java_round

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
PERSON_ID_LEAD = 10  # ids of people not made yet that an event may already name
AUCTION_ID_LEAD = 10
HOT_BATCH = 100  # a hot seller/bidder/auction is the first of the last 100 made
MIN_STRING_LENGTH = 3
SINE_STEPS = 10  # Beam approximates its sine rate shape with 10 constant steps
BASE_TIME_MS = 1_436_918_400_000  # 2015-07-15T00:00:00Z, Beam's NexmarkUtils.BASE_TIME

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")

EventType = Literal["person", "auction", "bid"]


def rate_to_period_us(rate: int, unit_us: int = 1_000_000) -> int:
    """Microseconds between events at ``rate`` per unit, rounded as Beam rounds."""
    return (unit_us + rate // 2) // rate


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's parameters, named after Beam's ``NexmarkConfiguration``; the
    defaults are Beam's defaults."""

    first_event_rate: int = 10_000
    next_event_rate: int = 10_000
    rate_shape: Literal["square", "sine"] = "sine"
    rate_period_s: int = 600
    rate_unit_us: int = 1_000_000  # per second
    num_event_generators: int = 100
    base_time_ms: int = BASE_TIME_MS
    first_event_id: int = 0
    first_event_number: int = 0
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    out_of_order_group_size: int = 1
    # Derived (Beam's GeneratorConfig): the delay steps and one cycle through them.
    inter_event_delays_us: tuple[int, ...] = field(init=False, default=())
    step_length_s: int = field(init=False, default=0)
    events_per_epoch: int = field(init=False, default=0)
    epoch_period_ms: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        for name in ("first_event_rate", "next_event_rate", "num_event_generators",
                     "rate_period_s", "out_of_order_group_size", "hot_auction_ratio",
                     "hot_sellers_ratio", "hot_bidders_ratio", "num_in_flight_auctions",
                     "num_active_people"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.rate_shape not in ("square", "sine"):
            raise ValueError(f"rate_shape must be 'square' or 'sine', got {self.rate_shape!r}")
        def period(rate: int) -> int:
            return rate_to_period_us(rate, self.rate_unit_us) * self.num_event_generators

        if self.first_event_rate == self.next_event_rate:
            delays: tuple[int, ...] = (period(self.first_event_rate),)
        elif self.rate_shape == "square":
            delays = (period(self.first_event_rate), period(self.next_event_rate))
        else:
            mid = (self.first_event_rate + self.next_event_rate) / 2.0
            amp = (self.first_event_rate - self.next_event_rate) / 2.0
            delays = tuple(period(java_round(mid + amp * math.cos(2.0 * math.pi * i
                                                                  / SINE_STEPS)))
                           for i in range(SINE_STEPS))
        steps = 2 if self.rate_shape == "square" else SINE_STEPS
        step_length_s = (self.rate_period_s + steps - 1) // steps
        events_per_epoch = epoch_period_ms = 0
        if len(delays) > 1:
            for delay in delays:
                n = step_length_s * 1_000_000 // delay
                events_per_epoch += n
                epoch_period_ms += n * delay // 1000
        object.__setattr__(self, "inter_event_delays_us", delays)
        object.__setattr__(self, "step_length_s", step_length_s)
        object.__setattr__(self, "events_per_epoch", events_per_epoch)
        object.__setattr__(self, "epoch_period_ms", epoch_period_ms)

    @classmethod
    def at_rate(cls, events_per_s: int, **overrides: Any) -> NexmarkConfig:
        """One generator producing ``events_per_s`` events per second of event time."""
        return cls(first_event_rate=events_per_s, next_event_rate=events_per_s,
                   num_event_generators=1, **overrides)

    # ------------------------------------------------------------ event numbers
    def event_number(self, count: int) -> int:
        """The number of the ``count``-th event this generator makes."""
        return self.first_event_number + count

    def adjusted_event_number(self, count: int) -> int:
        """The event number with Beam's out-of-order jitter inside groups (none for a
        group size of 1, the default)."""
        n = self.out_of_order_group_size
        number = self.event_number(count)
        return (number // n) * n + (number * 953) % n

    def event_id(self, count: int) -> int:
        return self.first_event_id + self.adjusted_event_number(count)

    def timestamp_ms(self, event_number: int) -> int:
        """Event time of the event with this number (Beam's
        ``timestampAndInterEventDelayUsForEvent``): a fixed delay, or the rate shape's
        steps cycled every epoch."""
        delays = self.inter_event_delays_us
        if len(delays) == 1:
            return self.base_time_ms + event_number * delays[0] // 1000
        epoch, n = divmod(event_number, self.events_per_epoch)
        offset_ms = 0
        for delay in delays:
            in_step = self.step_length_s * 1_000_000 // delay
            if n < in_step:
                return (self.base_time_ms + epoch * self.epoch_period_ms + offset_ms
                        + n * delay // 1000)
            n -= in_step
            offset_ms += in_step * delay // 1000
        raise AssertionError("events_per_epoch does not cover the steps")  # unreachable


BEAM_DEFAULT = NexmarkConfig()


# ----------------------------------------------------------------- id arithmetic
def last_base0_person_id(event_id: int) -> int:
    """The newest person id (from 0) at this event: this event's own if it is a person."""
    epoch, offset = divmod(event_id, PROPORTION_DENOMINATOR)
    if offset >= PERSON_PROPORTION:
        offset = PERSON_PROPORTION - 1
    return epoch * PERSON_PROPORTION + offset


def last_base0_auction_id(event_id: int) -> int:
    """The newest auction id (from 0) at this event: this event's own if an auction."""
    epoch, offset = divmod(event_id, PROPORTION_DENOMINATOR)
    if offset < PERSON_PROPORTION:
        epoch -= 1
        offset = AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def _next_long(random: JavaRandom, n: int) -> int:
    """A draw from [0, n): nextInt when n fits an int (always, for sane configs)."""
    if n < 2**31 - 1:
        return random.next_int(n)
    return abs(java_rem(random.next_long(), n))


def next_base0_person_id(event_id: int, random: JavaRandom, config: NexmarkConfig) -> int:
    """One of the active people, or one of the next few not made yet."""
    num_people = last_base0_person_id(event_id) + 1
    active = min(num_people, config.num_active_people)
    return num_people - active + _next_long(random, active + PERSON_ID_LEAD)


def next_base0_auction_id(event_id: int, random: JavaRandom, config: NexmarkConfig) -> int:
    """One of the auctions likely still in flight, or one of the next few."""
    max_auction = last_base0_auction_id(event_id)
    min_auction = max(max_auction - config.num_in_flight_auctions, 0)
    return min_auction + _next_long(random, max_auction - min_auction + 1 + AUCTION_ID_LEAD)


# ----------------------------------------------------------------------- strings
def next_string(random: JavaRandom, max_length: int) -> str:
    length = MIN_STRING_LENGTH + random.next_int(max_length - MIN_STRING_LENGTH)
    chars = []
    for _ in range(length):
        if random.next_int(13) == 0:
            chars.append(" ")
        else:
            chars.append(chr(ord("a") + random.next_int(26)))
    return "".join(chars).strip(" ")


def next_exact_string(random: JavaRandom, length: int) -> str:
    """Six letters per ``nextInt()``; Java's ``%`` and ``/`` keep the sign, so a
    negative draw gives characters just below 'a' (as Beam's do)."""
    chars = []
    rnd = left = 0
    for _ in range(length):
        if left == 0:
            rnd = random.next_int()
            left = 6
        chars.append(chr(ord("a") + java_rem(rnd, 26)))
        rnd = -(abs(rnd) // 26) if rnd < 0 else rnd // 26
        left -= 1
    return "".join(chars)


def next_extra(random: JavaRandom, current_size: int, desired_average_size: int) -> str:
    if current_size > desired_average_size:
        return ""
    desired = desired_average_size - current_size
    delta = java_round(desired * 0.2)
    minimum = desired - delta
    size = minimum + (0 if delta == 0 else random.next_int(2 * delta))
    return next_exact_string(random, size)


def next_price(random: JavaRandom) -> int:
    return java_round(math.pow(10.0, random.next_double() * 6.0) * 100.0)


# ------------------------------------------------------------------------ events
def _person(event_id: int, random: JavaRandom, timestamp: int,
            config: NexmarkConfig) -> dict[str, Any]:
    person_id = last_base0_person_id(event_id) + FIRST_PERSON_ID
    name = (FIRST_NAMES[random.next_int(len(FIRST_NAMES))] + " "
            + LAST_NAMES[random.next_int(len(LAST_NAMES))])
    email = next_string(random, 7) + "@" + next_string(random, 5) + ".com"
    credit_card = " ".join(f"{random.next_int(10000):04d}" for _ in range(4))
    city = US_CITIES[random.next_int(len(US_CITIES))]
    state = US_STATES[random.next_int(len(US_STATES))]
    size = 8 + len(name) + len(email) + len(credit_card) + len(city) + len(state)
    extra = next_extra(random, size, config.avg_person_byte_size)
    return {"type": "person", "id": person_id, "name": name, "emailAddress": email,
            "creditCard": credit_card, "city": city, "state": state, "dateTime": timestamp,
            "extra": extra}


def _auction_length_ms(count: int, random: JavaRandom, own_timestamp: int,
                       config: NexmarkConfig) -> int:
    """On average twice the time until ``num_in_flight_auctions`` more auctions, at
    the configuration's rate (``own_timestamp``: the event's time under it)."""
    number = config.adjusted_event_number(count)
    events_ahead = (config.num_in_flight_auctions * PROPORTION_DENOMINATOR
                    // AUCTION_PROPORTION)
    horizon_ms = config.timestamp_ms(number + events_ahead) - own_timestamp
    return 1 + _next_long(random, max(horizon_ms * 2, 1))


def _auction(count: int, event_id: int, random: JavaRandom, timestamp: int,
             config: NexmarkConfig, own_timestamp: int) -> dict[str, Any]:
    auction_id = last_base0_auction_id(event_id) + FIRST_AUCTION_ID
    if random.next_int(config.hot_sellers_ratio) > 0:
        seller = (last_base0_person_id(event_id) // HOT_BATCH) * HOT_BATCH
    else:
        seller = next_base0_person_id(event_id, random, config)
    seller += FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + random.next_int(NUM_CATEGORIES)
    initial_bid = next_price(random)
    expires = timestamp + _auction_length_ms(count, random, own_timestamp, config)
    item_name = next_string(random, 20)
    description = next_string(random, 100)
    reserve = initial_bid + next_price(random)
    size = 8 + len(item_name) + len(description) + 8 + 8 + 8 + 8 + 8
    extra = next_extra(random, size, config.avg_auction_byte_size)
    return {"type": "auction", "id": auction_id, "itemName": item_name,
            "description": description, "initialBid": initial_bid, "reserve": reserve,
            "dateTime": timestamp, "expires": expires, "seller": seller,
            "category": category, "extra": extra}


def _bid(event_id: int, random: JavaRandom, timestamp: int,
         config: NexmarkConfig) -> dict[str, Any]:
    if random.next_int(config.hot_auction_ratio) > 0:
        auction = (last_base0_auction_id(event_id) // HOT_BATCH) * HOT_BATCH
    else:
        auction = next_base0_auction_id(event_id, random, config)
    auction += FIRST_AUCTION_ID
    if random.next_int(config.hot_bidders_ratio) > 0:
        # The second of the batch, so hot bidders and hot sellers differ.
        bidder = (last_base0_person_id(event_id) // HOT_BATCH) * HOT_BATCH + 1
    else:
        bidder = next_base0_person_id(event_id, random, config)
    bidder += FIRST_PERSON_ID
    price = next_price(random)
    extra = next_extra(random, 8 + 8 + 8 + 8, config.avg_bid_byte_size)
    return {"type": "bid", "auction": auction, "bidder": bidder, "price": price,
            "dateTime": timestamp, "extra": extra}


def event_type(event_id: int) -> EventType:
    rem = event_id % PROPORTION_DENOMINATOR
    if rem < PERSON_PROPORTION:
        return "person"
    return "auction" if rem < PERSON_PROPORTION + AUCTION_PROPORTION else "bid"


def event(count: int, config: NexmarkConfig = BEAM_DEFAULT,
          timestamp_ms: int | None = None) -> dict[str, Any]:
    """The ``count``-th event of the generator (from 0): a person, an auction or a bid
    as a dict with a ``type`` key and Beam's field names, times in epoch ms.

    ``timestamp_ms`` overrides the event time (Streamwise's sources stamp each event
    with its scheduled emission time, whatever the rate shape); an auction's length is
    still drawn from the configuration's own rate, as Beam draws it."""
    event_id = config.event_id(count)
    own = config.timestamp_ms(config.adjusted_event_number(count))
    timestamp = own if timestamp_ms is None else timestamp_ms
    random = JavaRandom(event_id)
    kind = event_type(event_id)
    if kind == "person":
        return _person(event_id, random, timestamp, config)
    if kind == "auction":
        return _auction(count, event_id, random, timestamp, config, own)
    return _bid(event_id, random, timestamp, config)


def events(n: int, config: NexmarkConfig = BEAM_DEFAULT,
           start: int = 0) -> list[dict[str, Any]]:
    """Events ``start`` .. ``start + n - 1``."""
    return [event(count, config) for count in range(start, start + n)]
