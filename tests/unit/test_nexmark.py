"""The NEXMark generator against Apache Beam's: the JVM's java.util.Random and Math on
this machine, the events Beam documents, and the stream's structure over 20,000 events."""
from __future__ import annotations

import collections
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.nexmark import generator as gen
from pipelines.nexmark.javarandom import JavaRandom, java_div, java_rem, java_round

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass

ORACLE = Path(__file__).resolve().parents[1] / "java" / "RandomOracle.java"
EVENTS_CHECKED = 20_000


def test_java_random_and_math_match_the_jvm_for_every_seed_of_the_first_20000_events() -> None:
    """Each event is drawn from ``new Random(eventId)``: for every id of the first
    20,000 events, the JVM's draws (ints with and without a bound, incl. a bound that
    forces rejections, a power of two, longs, doubles, a price through Math.pow and
    Math.round, Java's % and /) equal ours."""
    out = subprocess.run(["java", str(ORACLE), "0", str(EVENTS_CHECKED)], check=True,
                         capture_output=True, text=True, timeout=300).stdout.splitlines()
    assert len(out) == EVENTS_CHECKED
    for seed, line in enumerate(out):
        price, bits, any_int, i13, i64, big, a_long, rem, div = map(int, line.split())
        r = JavaRandom(seed)
        d = r.next_double()
        assert struct.unpack("<q", struct.pack("<d", d))[0] == bits, seed
        assert java_round(10.0 ** (d * 6.0) * 100.0) == price, seed
        assert gen.next_price(JavaRandom(seed)) == price, seed
        assert (r.next_int(), r.next_int(13), r.next_int(64), r.next_int(1_500_000_000),
                r.next_long(), java_rem(r.next_int(), 26), java_div(r.next_int(), 26)) == \
            (any_int, i13, i64, big, a_long, rem, div), seed


def test_the_first_events_are_the_ones_beam_documents() -> None:
    """Beam's Python NEXMark launcher (``nexmark_launcher.py``, ``ParseJsonEventFn``)
    quotes the Java generator's events 0 (person), 1 (auction) and 4 (bid) of a run whose
    base time was 1528098831026; its ``extra`` strings are shortened in the middle.
    Event times there are base + 10 ms per event, as here."""
    base = gen.BASE_TIME_MS
    person, auction, bid = gen.event(0), gen.event(1), gen.event(4)
    assert {k: v for k, v in person.items() if k != "extra"} == {
        "type": "person", "id": 1000, "name": "Peter Jones", "emailAddress": "nhd@xcat.com",
        "creditCard": "7241 7320 9143 4888", "city": "Portland", "state": "WY",
        "dateTime": base}
    assert person["extra"].startswith("WN_HS_bnp") and person["extra"].endswith("VQ\\[[")
    assert {k: v for k, v in auction.items() if k != "extra"} == {
        "type": "auction", "id": 1000, "itemName": "wkx mgee",
        "description": "eszpqxtdxrvwmmywkmogoahf", "initialBid": 28873, "reserve": 29448,
        "dateTime": base + 10, "expires": base + 10 + (1528098840451 - 1528098831036),
        "seller": 1000, "category": 13}
    assert auction["extra"].startswith("zcu") and auction["extra"].endswith("piz")
    assert {k: v for k, v in bid.items() if k != "extra"} == {
        "type": "bid", "auction": 1000, "bidder": 1001, "price": 32530001,
        "dateTime": base + 40}
    # Its negative draws give characters below 'a' (Java's % keeps the sign).
    assert bid["extra"].startswith("fdiysaV^]NLVsbolvyqwgticfdrwdyiyof")
    assert bid["extra"].endswith("WPYTOuwogvszlxjrcNOORM")


def test_the_stream_has_beams_proportions_ids_times_and_references() -> None:
    events = gen.events(EVENTS_CHECKED)
    kinds = collections.Counter(e["type"] for e in events)
    assert kinds == {"person": 400, "auction": 1200, "bid": 18400}  # 1 : 3 : 46
    people = [e for e in events if e["type"] == "person"]
    auctions = [e for e in events if e["type"] == "auction"]
    assert [p["id"] for p in people] == list(range(1000, 1400))
    assert [a["id"] for a in auctions] == list(range(1000, 2200))
    # Beam's default: 10,000 events/s over 100 generators -> 10 ms apart in one.
    assert all(e["dateTime"] == gen.BASE_TIME_MS + 10 * i for i, e in enumerate(events))
    last_person = last_auction = 999
    hot_bids = 0
    for e in events:
        if e["type"] == "person":
            last_person = e["id"]
        elif e["type"] == "auction":
            last_auction = e["id"]
            assert e["seller"] <= last_person + gen.PERSON_ID_LEAD
            assert e["expires"] > e["dateTime"] and e["reserve"] >= e["initialBid"]
            assert gen.FIRST_CATEGORY_ID <= e["category"] < gen.FIRST_CATEGORY_ID + 5
        else:
            assert e["auction"] <= last_auction + gen.AUCTION_ID_LEAD
            assert e["bidder"] <= last_person + gen.PERSON_ID_LEAD
            hot_bids += e["auction"] == 1000 + (last_auction - 1000) // 100 * 100
            assert 100 <= e["price"] <= 100_000_000
    # hotAuctionRatio 2 "means" half the bids go to the hot auction; but the draw is
    # the first nextInt(2) of Random(eventId), and first draws of neighbouring seeds are
    # correlated (a known java.util.Random weakness), so Beam's stream has ~37 %.
    assert 0.3 < hot_bids / kinds["bid"] < 0.6
    sizes = [len(json.dumps(e)) for e in events if e["type"] == "bid"]
    assert 100 < sum(sizes) / len(sizes) < 250


def test_rate_shapes_and_a_custom_rate_follow_beams_timestamps() -> None:
    one = gen.NexmarkConfig.at_rate(1000)
    assert [one.timestamp_ms(n) - one.base_time_ms for n in (0, 1, 999, 1000)] == \
        [0, 1, 999, 1000]
    square = gen.NexmarkConfig(first_event_rate=100, next_event_rate=200,
                               rate_shape="square", rate_period_s=20, num_event_generators=1)
    # 10 s at 100/s (1000 events), then 10 s at 200/s (2000 events), then again.
    assert square.inter_event_delays_us == (10_000, 5_000)
    assert square.events_per_epoch == 3000 and square.epoch_period_ms == 20_000
    assert square.timestamp_ms(1000) - square.base_time_ms == 10_000
    assert square.timestamp_ms(3000) - square.base_time_ms == 20_000
    sine = gen.NexmarkConfig(first_event_rate=100, next_event_rate=300, rate_period_s=100,
                             num_event_generators=1)
    assert len(sine.inter_event_delays_us) == gen.SINE_STEPS
    assert sine.inter_event_delays_us[0] == 10_000  # starts at the first rate
    times = [sine.timestamp_ms(n) for n in range(5000)]
    assert times == sorted(times)
    with pytest.raises(ValueError, match="first_event_rate"):
        gen.NexmarkConfig(first_event_rate=0)


def test_the_events_cli_prints_json_lines(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "pipelines.nexmark", "events", "--events", "5"],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    assert [json.loads(line) for line in out] == gen.events(5)
    bad = subprocess.run([sys.executable, "-m", "pipelines.nexmark", "events", "--events",
                          "-3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--events" in bad.stderr


# ------------------------------------------------------------ the reference queries
def _person(pid: int, t: int, state: str = "OR", name: str = "Ann") -> dict:
    return {"type": "person", "id": pid, "name": name, "emailAddress": "", "creditCard": "",
            "city": "Bend", "state": state, "dateTime": t, "extra": ""}


def _auction(aid: int, seller: int, t: int, expires: int, reserve: int = 100,
             category: int = 10) -> dict:
    return {"type": "auction", "id": aid, "itemName": "", "description": "",
            "initialBid": 1, "reserve": reserve, "dateTime": t, "expires": expires,
            "seller": seller, "category": category, "extra": ""}


def _bid(auction: int, price: int, t: int, bidder: int = 7) -> dict:
    return {"type": "bid", "auction": auction, "bidder": bidder, "price": price,
            "dateTime": t, "extra": ""}


def test_reference_windows_are_epoch_aligned_and_final_only_behind_the_watermark() -> None:
    from pipelines.nexmark import reference as ref

    assert ref.sliding_windows(7_000) == [0, 5_000]
    assert ref.sliding_windows(5_000) == [0, 5_000] and ref.sliding_windows(4_999) == [-5_000, 0]
    events = [_bid(1, 5, 1_000), _bid(2, 9, 2_000), _bid(3, 9, 9_999), _bid(1, 50, 10_000)]
    # Window [0, 10 s): both bids at 9 win; [10 s, 20 s) is not final at 10 s.
    assert [(r["auction"], r["windowStart"]) for r in ref.q7(events)] == [(2, 0), (3, 0)]
    assert [(r["auction"], r["windowStart"]) for r in ref.q7(events, watermark=20_000)] == \
        [(2, 0), (3, 0), (1, 10_000)]
    # Q5 over [0, 10 s): every auction has one bid, all tie; [-5 s, 5 s) has two.
    assert {(r["windowStart"], r["auction"], r["num"]) for r in ref.q5(events)} == \
        {(-5_000, 1, 1), (-5_000, 2, 1), (0, 1, 1), (0, 2, 1), (0, 3, 1)}
    assert ref.q1([_bid(1, 1000, 0), _person(1, 0)]) == [_bid(1, 890, 0)]
    assert ref.q2([_bid(123, 5, 0), _bid(124, 5, 0), _bid(246, 6, 0)]) == \
        [{"auction": 123, "price": 5}, {"auction": 246, "price": 6}]


def test_reference_q3_joins_auctions_seen_before_their_seller_and_drops_idle_state() -> None:
    from pipelines.nexmark import reference as ref

    events = [_auction(1, seller=5, t=0, expires=9), _person(5, 10), _auction(2, 5, 20, 30),
              _auction(3, 5, 30, 40, category=11), _person(6, 40, state="WA"),
              _auction(4, 6, 50, 60),
              # 600 s with no event for seller 5: its state is gone.
              _auction(5, 5, 20 + 600_001, 700_000)]
    assert [r["id"] for r in ref.q3(events)] == [1, 2]


def test_reference_winning_bids_q4_q6_follow_beams_rules() -> None:
    from pipelines.nexmark import reference as ref

    events = [_auction(1, seller=5, t=0, expires=10_000, reserve=100),
              _bid(1, 50, 100),  # under the reserve
              _bid(1, 300, 200), _bid(1, 300, 300),  # a tie: the earlier one wins
              _bid(1, 900, 10_000),  # after it closed
              _auction(2, seller=5, t=1_000, expires=12_000, reserve=10),
              _bid(2, 20, 500),  # before it opened
              _bid(2, 40, 2_000),
              _auction(3, seller=6, t=1_000, expires=30_000), _bid(3, 500, 1_500)]
    winners = ref.winning_bids(events, watermark=20_000)
    assert [(a["id"], b["price"], b["dateTime"]) for a, b in winners] == \
        [(1, 300, 200), (2, 40, 2_000)]  # auction 3 is still open
    # Q4: closing times 10 s and 12 s -> windows [5 s, 15 s) and [10 s, 20 s) hold both,
    # [0, 10 s) none (closes at its end is outside it); mean (300 + 40) / 2 = 170.
    assert ref.q4(events, watermark=20_000) == [
        {"category": 10, "price": 170, "windowStart": 5_000},
        {"category": 10, "price": 170, "windowStart": 10_000}]
    assert ref.q6(events, watermark=20_000) == [{"seller": 5, "price": 170}]
    # Q6 keeps the last 10 per seller, by bid time.
    many = []
    for i in range(12):
        many += [_auction(100 + i, seller=9, t=i * 10, expires=i * 10 + 5, reserve=1),
                 _bid(100 + i, 10 * (i + 1), i * 10 + 1)]
    assert ref.q6(many, watermark=1_000) == [{"seller": 9, "price": round(sum(
        10 * (i + 1) for i in range(2, 12)) / 10)}]


def test_reference_q8_joins_people_and_their_auctions_in_the_same_window() -> None:
    from pipelines.nexmark import reference as ref

    events = [_person(5, 1_000, name="Bo"), _auction(1, 5, 2_000, 9, reserve=77),
              _auction(2, 5, 10_500, 9), _person(6, 9_000), _auction(3, 6, 9_500, 9, 3),
              _bid(1, 1, 20_000)]
    assert ref.q8(events) == [{"id": 5, "name": "Bo", "reserve": 77, "windowStart": 0},
                              {"id": 6, "name": "Ann", "reserve": 3, "windowStart": 0}]


def test_the_expected_cli_prints_a_querys_rows() -> None:
    from pipelines.nexmark import reference as ref

    out = subprocess.run([sys.executable, "-m", "pipelines.nexmark", "expected", "q2",
                          "--events", "3000"], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert [json.loads(line) for line in out] == ref.q2(gen.events(3000))
    bad = subprocess.run([sys.executable, "-m", "pipelines.nexmark", "expected", "Q99",
                          "--events", "5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_the_bench_staircase_stops_at_the_first_step_that_is_not_sustainable() -> None:
    """The bench's judgement on made-up batches: 2x the unloaded p95 or a backlog that
    grows by more than a second of input ends the staircase; p95 at half is two √2
    steps below the sustainable rate."""
    from pipelines.runtime.bench import nexmark as nb

    stairs = nb.staircase(100, 10, steps=6)
    assert [r for _a, r in stairs] == [100, 141.4, 200, 282.8, 400, 565.7]
    result = nb.Result("Q1", "plain", 1)
    watch = nb.Staircase(result, stairs, 10)
    p95 = {0: 50, 1: 55, 2: 60, 3: 70, 4: 99, 5: 300}
    backlog = {4: 0}
    go = True
    for tenth in range(1, 600):
        t = tenth / 10 + 0.05  # batches end between the step boundaries
        k = int(t // 10)
        grows = int((t - 10 * k) * 1000) if k == 4 else 0  # step 4: +1000 records/s
        go = watch.add(nb.Batch(t=t, p95_ms=p95[k], backlog=backlog.get(k, 0) + grows, rows=1))
        if not go:
            break
    assert t == pytest.approx(50.05)  # judged as soon as step 4 was over
    assert [s.sustainable for s in result.steps] == [True, True, True, True, False]
    assert result.unloaded_p95_ms == 50
    nb.summarise(result)
    assert result.sustainable_rate == 282.8 and result.p95_at_half_ms == 55
    assert not result.capped


def test_the_bench_staircase_climbs_from_a_given_rate_after_the_unloaded_step() -> None:
    """``--climb-from``: the unloaded step (longer: Spark warms up in it; only its last
    step counts), then the climb; the sustainable rate and the p95 at half come from the climb, and a climb
    that fails at once says so instead of reporting the unloaded rate."""
    from pipelines.runtime.bench import nexmark as nb

    stairs = nb.staircase(100, 10, steps=6, climb_from=800, unloaded_s=20)
    assert stairs == [[0, 100], [20, 800.0], [30, 1131.4], [40, 1600.0], [50, 2262.7],
                      [60, 3200.0]]

    def judged(p95s: list[float]) -> nb.Result:
        result = nb.Result("Q5", "streamwise", 2)
        watch = nb.Staircase(result, stairs, 10)
        for tenth in range(1, 700):
            t = tenth / 10 + 0.05
            step = max(0, int(t // 10) - 1)  # the unloaded step lasts 20 s
            warming = t < 10  # its first 10 s: Spark warming up, not judged
            if not watch.add(nb.Batch(t=t, p95_ms=5000 if warming else p95s[step],
                                      backlog=0, rows=1)):
                break
        nb.summarise(result)
        return result

    climbed = judged([50, 60, 70, 90, 101, 101])
    assert [s.sustainable for s in climbed.steps] == [True, True, True, True, False]
    assert climbed.unloaded_p95_ms == 50  # the warm-up's 5 s p95s did not count
    assert climbed.sustainable_rate == 1600.0 and climbed.p95_at_half_ms == 60
    too_high = judged([50, 101, 101, 101, 101, 101])
    assert too_high.sustainable_rate is None and "lower --climb-from" in too_high.error


def test_the_bench_takes_the_unloaded_p95_from_the_first_climbing_step_when_lower() -> None:
    """A join still catching up at the end of the unloaded step (its p95 30 s) must not
    make "2x unloaded" a minute: the first climbing step's p95 is the floor when lower,
    and that step is then judged on its backlog only."""
    from pipelines.runtime.bench import nexmark as nb

    stairs = nb.staircase(100, 10, steps=6, climb_from=800, unloaded_s=10)
    result = nb.Result("Q4", "plain", 1)
    watch = nb.Staircase(result, stairs, 10, cpu_s=lambda: 0.0)
    p95 = {0: 30_000, 1: 4000, 2: 5000, 3: 9000, 4: 20_000, 5: 20_000}
    for tenth in range(1, 600):
        t = tenth / 10 + 0.05
        if not watch.add(nb.Batch(t=t, p95_ms=p95[int(t // 10)], backlog=0, rows=10)):
            break
    assert result.unloaded_p95_ms == 4000
    assert [s.sustainable for s in result.steps] == [True, True, True, False]
    assert result.steps[1].rows == 1000  # 100 batches of 10 records ended in step 1


def test_the_bench_counts_cpu_of_a_process_tree_and_compares_it_per_event() -> None:
    """``tree_cpu_s`` sees a child's CPU (read from /proc); ``cpu_per_1k`` compares the
    two systems over the climbing steps both held."""
    from pipelines.runtime.bench import nexmark as nb

    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.5: pass\n"
                              "time.sleep(30)"])
    try:
        before = nb.tree_cpu_s([child.pid])
        deadline = time.monotonic() + 60
        while nb.tree_cpu_s([child.pid]) - before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nb.tree_cpu_s([child.pid]) - before >= 0.3
        assert nb.tree_cpu_s([child.pid], exclude_roots=(child.pid,)) == 0.0
    finally:
        child.kill()
        child.wait()

    def steps(cpu: list[float], held: int) -> list[nb.Step]:
        return [nb.Step(rate=100 * 2 ** k, sustainable=k < held, rows=1000 * 2 ** k,
                        cpu_s=c) for k, c in enumerate(cpu)]
    sw = nb.Result("Q0", "streamwise", 1, steps=steps([9.0, 1.1, 2.2, 4.4], held=3))
    plain = nb.Result("Q0", "plain", 1, steps=steps([9.0, 1.0, 2.0, 4.0, 8.0], held=4))
    # steps 1 and 2 both held: 3.3 s vs 3.0 s of CPU over 6,000 events each
    assert nb.cpu_per_1k(sw, plain) == (550.0, 500.0)
    assert "| 550.0 / 500.0 | 1.10 |" in nb.table([sw, plain])


def test_the_bench_table_gives_medians_over_repeated_runs_and_rereads_its_json() -> None:
    """With ``--repeat`` a row shows each configuration's median (and every run's value),
    the ratio of the medians, and the CPU ratio paired run by run; ``--render`` reads
    the results back from ``--json``."""
    import dataclasses

    from pipelines.runtime.bench import nexmark as nb

    def run(system: str, rate: float, rep: int, cpu_s: float) -> nb.Result:
        steps = [nb.Step(rate=100, sustainable=True, rows=1000, cpu_s=9.0),
                 nb.Step(rate=1000, sustainable=True, rows=10_000, cpu_s=cpu_s)]
        return nb.Result("Q1", system, 2, unloaded_p95_ms=1000.0, sustainable_rate=rate,
                         steps=steps, rep=rep)
    results = [run("streamwise", 1000, 0, 5.5), run("plain", 2000, 0, 5.0),
               run("streamwise", 2000, 1, 6.0), run("plain", 2000, 1, 5.0),
               run("streamwise", 2000, 2, 5.0), run("plain", 1000, 2, 5.0)]
    saved = [nb.Result.from_dict(json.loads(json.dumps(dataclasses.asdict(r))))
             for r in results]
    assert saved == results
    text = nb.table(saved)
    assert "| Q1 | 2 | 2000.0 (1000, 2000, 2000) | 2000.0 (2000, 2000, 1000) | 1.00 |" in text
    assert "| 550.0 / 500.0 | 1.10 |" in text  # CPU ratios 1.1, 1.2, 1.0 run by run
    assert "rate ratios Streamwise / plain, sorted: 1.00; median 1.00" in text


def test_the_bench_judges_a_step_failed_when_no_batch_ends_long_after_it() -> None:
    """A stuck query (an executor out of memory, a batch that never ends) fails its step
    instead of holding the bench forever."""
    from pipelines.runtime.bench import nexmark as nb

    stairs = [[0, 100.0], [40, 200.0], [50, 400.0]]
    result = nb.Result("Q7", "streamwise", 2)
    watch = nb.Staircase(result, stairs, 10)
    assert not watch.stalled()  # no batch yet: the start is bounded elsewhere
    for t in range(1, 45):
        assert watch.add(nb.Batch(t=float(t), p95_ms=1000.0, backlog=0, rows=10))
    assert [s.sustainable for s in result.steps] == [True]
    assert not watch.stalled()
    watch._seen_at -= 50 - 44 + nb.STALL_S - 1  # the run's clock: just before the limit
    assert not watch.stalled()
    watch._seen_at -= 2
    assert watch.stalled()
    assert [s.sustainable for s in result.steps] == [True, False]
    assert result.steps[-1].rate == 200.0


def test_the_bench_floor_is_the_lowest_p95_so_far_and_saved_results_are_rejudged() -> None:
    """A query still warming up in its first climbing steps (Q5 x2 once: 26 s, then
    10.7 s, ..., 4.65 s) must not make "2x unloaded" near a minute: every step's p95
    that is the lowest yet becomes the floor. ``rejudge`` applies the same rule to
    results saved under an earlier, laxer one."""
    import copy

    from pipelines.runtime.bench import nexmark as nb

    stairs = nb.staircase(100, 10, steps=10, climb_from=800, unloaded_s=10)
    p95 = [24_000, 26_000, 10_700, 9200, 6400, 4650, 6200, 7500, 9800, 20_000]
    result = nb.Result("Q5", "streamwise", 2)
    watch = nb.Staircase(result, stairs, 10)
    for tenth in range(1, 1000):
        t = tenth / 10 + 0.05
        if not watch.add(nb.Batch(t=t, p95_ms=p95[int(t // 10)], backlog=0, rows=1)):
            break
    nb.summarise(result)
    assert result.unloaded_p95_ms == 4650
    assert [s.sustainable for s in result.steps] == [True] * 8 + [False]  # 9800 > 9300
    assert result.sustainable_rate == stairs[7][1]
    assert result.p95_at_half_ms == 4650

    saved = copy.deepcopy(result)  # as the old rule left it: floor 24 s, all held
    for step in saved.steps:
        step.sustainable = True
    saved.unloaded_p95_ms, saved.sustainable_rate = 24_000, stairs[8][1]
    nb.rejudge(saved)
    assert saved == result
