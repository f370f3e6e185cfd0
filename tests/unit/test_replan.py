"""The live re-plan's parts that need no Spark: the output arbiter forwards every range
once whoever runs it, the sources of two generations agree on batch ends, Gloss' §9.1
metrics, and the throttle."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from pipelines.runtime.spec import definition
from pipelines.runtime.replan import gloss as replan
from pipelines.runtime.query.source import GeneratorStreamReader, source_options

pytestmark = [pytest.mark.dbless]


class _Gen(replan.Generation):
    """A generation whose batches read the given ranges (no checkpoint)."""

    def __init__(self, number: int, ranges: dict[int, tuple[int, int]]) -> None:
        super().__init__(number, 4, Path("/nonexistent"))
        self.ranges = ranges

    def batch_range(self, batch: int) -> tuple[int, int]:
        return self.ranges[batch]


def _forwarded(log: list[tuple[int, int, int | None]]) -> list[tuple[int, int]]:
    return [(gen, epoch) for gen, epoch, _ in log if epoch is not None]


def test_the_arbiter_forwards_every_range_once_and_switches_at_a_shared_boundary(
        tmp_path: Path) -> None:
    bounds = [0, 10, 25, 40, 55, 70, 90]
    old = _Gen(0, {b: (bounds[b], bounds[b + 1]) for b in range(6)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert [arbiter.claim(old, b) for b in range(3)] == [0, 1, 2]  # up to 40
    # The new generation starts at 25 (the snapshot after batch 1): its batch 0 loaded
    # the state elsewhere (reseed.py), batch 1 covers [25, 40) in one go (catching up).
    new = _Gen(1, {1: (25, 40), 2: (40, 55), 3: (55, 70)})
    arbiter.propose(new)
    arbiter.begin(new, 1)
    assert arbiter.claim(new, 1) is None  # behind: the old one forwarded [25, 40)
    # Both compute [40, 55): the old one finishes first and waits for the new one.
    arbiter.begin(new, 2)
    got: list[int | None] = []
    waiting = threading.Thread(target=lambda: got.append(arbiter.claim(old, 3)))
    waiting.start()
    time.sleep(0.1)
    assert waiting.is_alive()  # its output is ready; the candidate is on the same range
    assert arbiter.claim(new, 2) == 3  # [40, 55) forwarded by the new generation
    waiting.join(5)
    assert got == [None] and arbiter.switched.is_set()
    assert arbiter.claim(old, 4) is None  # the old one's later batches are discarded
    assert arbiter.claim(new, 3) == 4
    doc = json.loads((tmp_path / replan.GENERATIONS_FILE).read_text())
    assert [(g["generation"], g["first_batch"], g["last_batch"], g["epoch_offset"])
            for g in doc["generations"]] == [(0, 0, 2, 0), (1, 2, None, 1)]


def test_the_forwarding_generation_runs_in_the_pool_that_gets_slots_first(
        tmp_path: Path) -> None:
    old = _Gen(0, {0: (0, 10), 1: (10, 20)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert arbiter.pool_for(old) == replan.POOL_FORWARDING
    new = _Gen(1, {1: (10, 20), 2: (20, 30)})
    arbiter.propose(new)
    assert arbiter.claim(old, 0) == 0
    assert (arbiter.pool_for(old), arbiter.pool_for(new)) == (
        replan.POOL_FORWARDING, replan.POOL_CATCHING_UP)
    assert arbiter.claim(new, 1) == 1  # it takes over at [10, 20)
    assert (arbiter.pool_for(old), arbiter.pool_for(new)) == (
        replan.POOL_CATCHING_UP, replan.POOL_FORWARDING)
    # The pools the runner names are the ones Spark is given, weighted that way round.
    from xml.etree import ElementTree

    from pipelines.runtime.query.session import FAIR_POOLS

    weights = {p.get("name"): int(p.findtext("weight"))
               for p in ElementTree.parse(FAIR_POOLS).getroot().iter("pool")}
    assert weights[replan.POOL_FORWARDING] > 100 * weights[replan.POOL_CATCHING_UP]


def test_whoever_finishes_the_next_range_first_forwards_it(tmp_path: Path) -> None:
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert arbiter.claim(old, 0) == 0
    new = _Gen(1, {1: (10, 20), 2: (20, 30)})
    arbiter.propose(new)
    arbiter.begin(new, 1)
    assert arbiter.claim(new, 1) == 1  # the new one finished [10, 20) first
    assert arbiter.claim(old, 1) is None and arbiter.claim(old, 2) is None
    assert arbiter.claim(new, 2) == 2


def test_a_candidate_ahead_waits_for_the_range_before_its_own(tmp_path: Path) -> None:
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert arbiter.claim(old, 0) == 0
    new = _Gen(1, {1: (20, 30)})  # throttled, the old one is still on [10, 20)
    arbiter.propose(new)
    got: list[int | None] = []
    waiting = threading.Thread(target=lambda: got.append(arbiter.claim(new, 1)))
    waiting.start()
    time.sleep(0.1)
    assert waiting.is_alive()
    assert arbiter.claim(old, 1) == 1
    waiting.join(5)
    assert got == [2] and arbiter.claim(old, 2) is None


def test_an_aligned_candidate_takes_over_only_after_a_batch_that_began_with_the_old_ones(
        tmp_path: Path) -> None:
    # A watermark query emits, in a batch, the windows closed by the batch before: the
    # new generation's output equals the old one's only after a batch both began alike.
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30), 3: (30, 40)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert [arbiter.claim(old, b) for b in range(2)] == [0, 1]  # [10, 20) forwarded last
    new = _Gen(1, {0: (0, 20), 1: (20, 30), 2: (30, 40)})  # a replay up to 20 first
    arbiter.propose(new, aligned=True)
    assert arbiter.claim(new, 0) is None
    assert arbiter.claim(new, 1) is None  # level, but its batch before began at 0, not 10
    assert arbiter.claim(old, 2) == 2
    assert arbiter.claim(new, 2) == 3  # its batch before, [20, 30), was the old one's too


def test_a_generation_is_stopped_only_once_its_forwarded_batches_are_written(
        tmp_path: Path) -> None:
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert arbiter.claim(old, 0) == 0
    arbiter.written(old, 0)
    assert arbiter.claim(old, 1) == 1  # claimed once computed; still being written
    assert not arbiter.wait_written(old, 0.1)
    threading.Timer(0.2, arbiter.written, args=(old, 1)).start()
    assert arbiter.wait_written(old, 5)
    arbiter.retire(old)  # stop-and-restart: nothing more of it is forwarded
    assert arbiter.claim(old, 2) is None


def test_the_old_generations_wait_for_a_slow_candidate_lapses_without_a_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replan, "HANDOVER_WAIT_S", 0.2)
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert arbiter.claim(old, 0) == 0
    new = _Gen(1, {1: (10, 20), 2: (20, 30)})
    arbiter.propose(new)
    arbiter.begin(new, 1)  # level, but it never finishes in time
    started = time.monotonic()
    assert arbiter.claim(old, 1) == 1  # after the wait the old one forwards on
    assert time.monotonic() - started >= 0.18
    assert arbiter.claim(new, 1) is None
    arbiter.begin(new, 2)
    started = time.monotonic()
    assert arbiter.claim(old, 2) == 2 and not arbiter.switched.is_set()
    assert time.monotonic() - started >= 0.38  # each miss lengthens the next wait


def test_stop_and_restart_switches_at_the_old_generations_last_forwarded_end(
        tmp_path: Path) -> None:
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert [arbiter.claim(old, b) for b in range(3)] == [0, 1, 2]
    # Batch 2 was forwarded but never committed: the snapshot is after batch 1, so
    # the new generation reads [10, 20) again (discarded) and forwards from 30.
    new = _Gen(1, {0: (10, 10), 1: (10, 20), 2: (20, 30), 3: (30, 45)})
    arbiter.propose(new)
    assert [arbiter.claim(new, b) for b in range(3)] == [None, None, None]
    assert arbiter.claim(new, 3) == 3


def _reader(plan_dir: Path, start: int = 0, max_rows: int = 1000) -> GeneratorStreamReader:
    doc = json.loads(json.dumps(definition.DEMO_DEFINITION))
    doc["max_records_per_batch"] = max_rows
    spec = definition.validate(doc)
    return GeneratorStreamReader(source_options(spec, time.time() - 3600, plan_dir, start))


def test_a_generation_behind_covers_planned_batches_and_ends_on_their_boundaries(
        tmp_path: Path) -> None:
    old, new = _reader(tmp_path), _reader(tmp_path, start=100)
    assert old._agree(0, 100) == 100
    assert old._agree(100, 130) == 130
    assert old._agree(130, 170) == 170
    assert old._agree(170, 300) == 300
    # The new generation (from 100) takes as many planned batches as its own limit
    # allows, and always ends where one of them ends.
    assert new._agree(100, 200) == 170
    assert new._agree(170, 1000) == 300
    # At the frontier it plans, and the old one follows.
    assert new._agree(300, 340) == 340
    assert old._agree(300, 400) == 340


def test_a_source_with_nothing_new_plans_no_batch_and_moves_on_when_records_come(
        tmp_path: Path) -> None:
    """A schedule that starts at 0 records/s: the first triggers find nothing, plan no
    empty batch (one from 0 to 0 once made the next trigger's walk loop for ever), and
    the batch after plans normally."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    doc = json.loads(json.dumps(definition.DEMO_DEFINITION))
    doc["source"]["rate"] = {"kind": "step", "steps": [[0, 0], [2, 500]]}
    spec = definition.validate(doc)
    reader = GeneratorStreamReader(source_options(spec, time.time(), tmp_path / "plan"))
    for _ in range(3):
        assert reader.latestOffset({"offset": 0}, ReadMaxRows(10_000)) == {"offset": 0}
    assert not list((tmp_path / "plan").glob("*"))
    behind = _reader(tmp_path / "plan")  # a reader an hour ahead finds records at once
    first = behind.latestOffset({"offset": 0}, ReadMaxRows(100))["offset"]
    assert first == 100
    assert reader._agree(0, 0) == 0 and reader._agree(0, 50) == 100


def test_the_source_holds_until_the_snapshot_is_loaded(tmp_path: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    doc = json.loads(json.dumps(definition.DEMO_DEFINITION))
    spec = definition.validate(doc)
    hold = tmp_path / "hold"
    reader = GeneratorStreamReader(source_options(spec, time.time() - 60, tmp_path / "plan",
                                                  start=50, hold=hold))
    assert reader.initialOffset() == {"offset": 50}
    assert reader.latestOffset({"offset": 50}, ReadMaxRows(10_000)) == {"offset": 50}
    hold.touch()
    assert reader.latestOffset({"offset": 50}, ReadMaxRows(10_000))["offset"] > 50


def test_a_catching_up_generation_plans_once_the_forwarded_batch_of_the_interval_is_written(
        tmp_path: Path) -> None:
    """The arbiter writes the gate as the forwarding query's batches are written; the
    candidate's source waits for the one of the current trigger interval, not for ever,
    and not at all once it reaches the forwarded end (the hand-over batch)."""
    from pipelines.runtime.query.source import wait_for_forwarded

    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30)})
    arbiter = replan.Arbiter(tmp_path, old)
    arbiter.claim(old, 0)
    arbiter.written(old, 0)
    # On an hourly trigger, its batch 0 was written in the interval before this one.
    trigger_s = 3600.0
    arbiter.written_at = time.time() - trigger_s
    gate = tmp_path / "gate.json"
    new = _Gen(1, {0: (5, 10)})
    arbiter.propose(new, aligned=True, gate=gate, trigger_s=trigger_s)
    doc = json.loads(gate.read_text())
    assert doc["forwarded_end"] == 10 and doc["trigger_s"] == trigger_s
    assert wait_for_forwarded(gate, 10) < 1.0  # at the forwarded end: no turn to wait
    waited: list[float] = []
    waiter = threading.Thread(target=lambda: waited.append(wait_for_forwarded(gate, 5)))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # the forwarding query's batch of this interval is not out
    assert arbiter.claim(old, 1) == 1
    written_at = time.monotonic()
    arbiter.written(old, 1)
    waiter.join(30)
    assert not waiter.is_alive() and waited[0] >= 0.3
    assert time.monotonic() - written_at < 30
    # Gone with the switch: the new generation forwards and plans freely.
    assert arbiter.claim(old, 2) == 2
    new.ranges.update({1: (20, 30), 2: (30, 40)})
    assert arbiter.claim(new, 1) is None  # the same range as the old one's, after it
    assert gate.exists()
    assert arbiter.claim(new, 2) == 3 and arbiter.switched.is_set()
    assert not gate.exists()
    assert wait_for_forwarded(gate, 5) < 1.0


def test_a_turn_is_not_waited_for_past_the_next_trigger_instant(tmp_path: Path) -> None:
    """A forwarding query that writes nothing in the interval (overloaded, or stopped
    without the file removed) holds the candidate up to the next trigger instant."""
    from pipelines.runtime.query.source import wait_for_forwarded

    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps({"committed_at": 0.0, "forwarded_end": 100,
                                "trigger_s": 0.5}))
    entered = time.time()
    wait_for_forwarded(gate, 50)
    assert time.time() >= entered - entered % 0.5 + 0.5  # held until the next instant


def _caught_up(tmp_path: Path) -> tuple[replan.Arbiter, _Gen, _Gen]:
    """An old generation that forwarded [0, 20) and an aligned candidate that has just
    computed [10, 20) too: its next batch is the hand-over."""
    old = _Gen(0, {0: (0, 10), 1: (10, 20), 2: (20, 30), 3: (30, 40)})
    arbiter = replan.Arbiter(tmp_path, old)
    assert [arbiter.claim(old, b) for b in (0, 1)] == [0, 1]
    new = _Gen(1, {0: (5, 10), 1: (10, 20), 2: (20, 30)})
    arbiter.propose(new, aligned=True)
    for batch in (0, 1):
        assert arbiter.begin(new, batch)
        assert arbiter.claim(new, batch) is None
    return arbiter, old, new


def test_the_old_generation_leaves_the_hand_over_batch_to_a_caught_up_candidate(
        tmp_path: Path) -> None:
    arbiter, old, new = _caught_up(tmp_path)
    began: list[bool] = []
    old_batch = threading.Thread(target=lambda: began.append(arbiter.begin(old, 2)))
    old_batch.start()
    time.sleep(0.2)
    assert old_batch.is_alive()  # it does not compute [20, 30) beside the candidate
    assert arbiter.begin(new, 2)
    assert arbiter.claim(new, 2) == 2 and arbiter.switched.is_set()
    old_batch.join(30)
    assert began == [False] and arbiter.yielded == 1  # nothing to compute: never forwarded
    assert arbiter.begin(old, 3) is False  # nor after it, until it is stopped


def test_the_old_generation_computes_the_hand_over_batch_if_the_candidate_is_late(
        tmp_path: Path) -> None:
    arbiter, old, new = _caught_up(tmp_path)
    waited_from = time.monotonic()
    assert arbiter.begin(old, 2) is True
    assert time.monotonic() - waited_from >= replan.HANDOVER_ALONE_MIN_S
    assert arbiter.claim(old, 2) == 2 and not arbiter.switched.is_set()
    # A candidate that is not caught up never holds the old generation up.
    arbiter.withdraw(new)
    assert arbiter.begin(old, 2) is True


def test_offset_lines_name_the_generator_whatever_their_order() -> None:
    text = 'v1\n{"batchWatermarkMs":0}\n{"logOffset":0}\n{"offset": 123}\n'
    assert replan.generator_offset(text) == 123
    assert replan.generator_offset('v1\n{}\n{"offset": 7}\n') == 7
    assert replan.generator_offset('v1\n{}\n-\n') is None


def test_gloss_metrics_count_silent_and_slow_buckets() -> None:
    # 100 s at 100 records/s (one batch every 0.4 s, each running 0.3 s: 1-s buckets),
    # then a 3-s gap, a large catch-up batch and a slow second.
    batches = [(1000.0 + 0.4 * i, 40, 200.0, 999.7 + 0.4 * i) for i in range(250)]
    t_request = 1100.0
    batches += [(1100.2, 50, 300.0, 1099.9), (1104.3, 300, 4000.0, 1103.8),
                (1105.2, 20, 900.0, 1104.9), (1106.1, 60, 250.0, 1105.8),
                (1106.6, 60, 250.0, 1106.3)]
    m = replan.gloss_metrics(batches, t_request, 1107.0, lambda t: int(100 * t))
    assert m.bucket_s == 1.0 and m.buckets == 7
    assert m.baseline_rate == pytest.approx(100.0, rel=0.02)
    assert m.downtime_s == 3 and m.down_at_s == [1.0, 2.0, 3.0]  # no output, input came
    # Records processed per second: 33, 0, 0, 120, 187, 53 (up to the last commit):
    # the catch-up batch ran in seconds 3-4 only, so it does not fill the gap.
    rates = replan.throughput_per_second([(b[0], b[1], b[3]) for b in batches],
                                         t_request, 1107.0)
    assert [round(r) for r in rates] == [33, 0, 0, 120, 187, 53]
    assert m.disrupted_s == 4 and m.disrupted_strict_s == 4
    assert m.disrupted_at_s == [0, 1, 2, 5]
    assert m.worst_p95_ms == 4000.0
    # No input in a silent second is not downtime.
    assert replan.gloss_metrics(batches, t_request, 1107.0, lambda t: 0).downtime_s == 0


def test_a_steady_run_is_never_disrupted_at_one_batch_more_or_less_per_second() -> None:
    # Batches every 0.95 s (1 or 2 commits per 1.5-s bucket): steady throughput.
    batches = [(1000.0 + 0.95 * i, 95, 900.0, 1000.0 + 0.95 * i - 0.8) for i in range(200)]
    m = replan.gloss_metrics(batches, 1100.0, 1150.0, lambda t: int(100 * t))
    assert m.downtime_s == 0 and m.disrupted_s == 0


def test_buckets_widen_with_a_slow_cadence_so_steady_output_is_never_down() -> None:
    # Batches every 1.4 s: 1-s buckets would be empty in steady state.
    batches = [(1000.0 + 1.4 * i, 140, 900.0) for i in range(100)]
    t_request = 1100.0
    m = replan.gloss_metrics(batches, t_request, 1130.0, lambda t: int(100 * t))
    assert m.bucket_s == 3.0
    assert m.downtime_s == 0 and m.disrupted_s == 0
    assert replan.bucket_width([]) == 1.0
    # Measured mid-bucket (the runner measures at switch + SETTLE_S): the batches due in
    # the bucket's remainder have not committed yet, which is no downtime.
    t_end = 1131.2
    so_far = [b for b in batches if b[0] <= t_end]
    m = replan.gloss_metrics(so_far, t_request, t_end, lambda t: int(100 * t))
    assert m.buckets == 10 and m.downtime_s == 0


def test_a_replan_right_after_another_measures_a_triggered_run_in_two_trigger_buckets(
        ) -> None:
    # A 2-s trigger, a commit every 2 s; the re-plan is requested 0.5 s after the last
    # one's measurement ended, so no commit lies in its baseline.
    batches = [(1000.0 + 2 * i + 0.9, 200, 900.0, 1000.0 + 2 * i) for i in range(60)]
    m = replan.gloss_metrics(batches, 1060.5, 1090.0, lambda t: int(100 * t),
                             baseline_from=1060.0, trigger_s=2.0)
    assert m.bucket_s == 4.0 and m.downtime_s == 0
    # Without a trigger the commits alone set the width, as before.
    assert replan.gloss_metrics(batches, 1060.5, 1090.0, lambda t: int(100 * t),
                                baseline_from=1060.0).bucket_s == 1.0


def test_the_throttle_halves_the_old_generations_share_and_keeps_it_emitting() -> None:
    assert replan.throttle_pause(1.0, 0.2) == 0.0  # not before THROTTLE_AFTER_S
    first = replan.throttle_pause(replan.THROTTLE_AFTER_S, 0.1)
    second = replan.throttle_pause(replan.THROTTLE_AFTER_S + replan.THROTTLE_STEP_S, 0.1)
    assert first == pytest.approx(0.1) and second == pytest.approx(0.3)
    # Never a period past the cap: a batch of 0.7 s gets at most 0.1 s of pause.
    assert replan.throttle_pause(60.0, 0.7) == pytest.approx(replan.THROTTLE_PERIOD_CAP_S - 0.7)
    assert replan.throttle_pause(60.0, 0.9) == 0.0


def test_a_starved_transfer_is_raised_from_idle_to_low_priority_with_its_children() -> None:
    """``reseed.raise_priority`` moves every thread of the transfer and of the processes
    under it (its JVM and Python workers), off SCHED_IDLE (real processes)."""
    import os
    import subprocess
    import sys

    from pipelines.runtime.replan import transfer as reseed

    if os.geteuid() != 0:
        pytest.skip("raising a priority needs root or CAP_SYS_NICE")
    code = ("import os, subprocess, time\n"
            "from pipelines.runtime.replan import transfer as reseed\n"
            "reseed.set_own_priority(reseed.IDLE)\n"
            "child = subprocess.Popen(['sleep', '30'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True, text=True)
    try:
        child = int(proc.stdout.readline())
        for pid in (proc.pid, child):
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
            assert os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert reseed.raise_priority(proc.pid) >= 2
        for pid in (proc.pid, child):
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, pid) == reseed.PRIORITIES[reseed.LOW]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def _process_cpu_s(pid: int) -> float:
    """utime + stime of one process, read from /proc here (not through ``procs``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_transfer_is_starving_when_its_group_gets_almost_no_cpu() -> None:
    """``StarvationWatch`` reads the CPU time of the transfer's process tree from /proc:
    a tree that sleeps starves, one that computes does not (real processes).

    What a computing process gets depends on the machine's load (in a suite run beside
    a busy loop one got less than 10 % of a core over 1.6 s, and the watch rightly said
    starving), so the verdict is checked against the share the process had, measured
    here from /proc: windows where it clearly computed (at least twice the starving
    share) must not read as starving, windows where it clearly did not (under half)
    must. Where the test may, the busy loop's session gets a larger CPU weight, so that
    such a window comes soon."""
    import subprocess
    import sys

    from pipelines.runtime.replan import transfer as reseed

    sleeping = subprocess.Popen(["sleep", "30"], start_new_session=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            start_new_session=True)
    try:
        try:  # as root: its autogroup (the session's share of the CPU) weighs more
            Path(f"/proc/{busy.pid}/autogroup").write_text("-10")
        except OSError:
            pass
        watches = {p: reseed.StarvationWatch(p.pid, window_s=1.5) for p in (sleeping, busy)}
        assert not any(w.starved() for w in watches.values())  # the window has not passed
        time.sleep(1.6)
        assert watches[sleeping].starved()
        computed = 0
        for _window in range(30):
            before, began = _process_cpu_s(busy.pid), time.monotonic()
            watch = reseed.StarvationWatch(busy.pid, window_s=1.0)
            time.sleep(1.1)
            verdict = watch.starved()
            share = (_process_cpu_s(busy.pid) - before) / (time.monotonic() - began)
            if share >= 2 * reseed.STARVED_SHARE:
                assert not verdict, share
                computed += 1
                if computed == 2:
                    break
            elif share < reseed.STARVED_SHARE / 2:
                assert verdict, share
        assert computed == 2, "the busy loop never had 20 % of a core for a second"
        # Held stopped by the transfer gate for the whole window: not starving.
        stopped = reseed.StarvationWatch(sleeping.pid, window_s=1.5)
        time.sleep(1.6)
        assert not stopped.starved(stopped_s=1.6)
    finally:
        for p in (sleeping, busy):
            os.killpg(p.pid, 9)
            p.wait()


def test_a_triggered_run_is_spread_over_its_trigger_period_and_a_stop_still_shows() -> None:
    # A 1-s trigger; batches run 0.4-0.7 s, so each 1-s bucket holds parts of two
    # batches of unequal length.
    durations = [0.5, 0.7, 0.4, 0.6, 0.5, 0.7] * 30
    batches = [(1000.0 + i + d, 100, 900.0, 1000.0 + i) for i, d in enumerate(durations)]
    t_request = 1100.5
    spread = [(b[0], b[1], b[3]) for b in batches]
    from_start = replan.throughput_per_second(spread, t_request, 1170.0)
    assert min(from_start) < 0.75 * 100  # read from the batches' starts only: "disrupted"
    paced = replan.throughput_per_second(spread, t_request, 1170.0, trigger_s=1.0)
    assert min(paced) >= 0.75 * 100
    m = replan.gloss_metrics(batches, t_request, 1170.0, lambda t: int(100 * t),
                             trigger_s=1.0)
    assert m.disrupted_s == 0 and m.downtime_s == 0 and m.baseline_disrupted_share == 0
    # Busy 0.4-0.7 s of every second before the request: 0.57 of it.
    assert m.baseline_busy_share == pytest.approx(sum(durations[:6]) / 6, abs=0.02)
    # A 10-s stop, then one batch of everything since: the seconds without a query are
    # disrupted however the trigger paced the batches before.
    stopped = [b for b in batches if b[0] < 1110.0]
    stopped += [(1121.0, 1100, 900.0, 1120.0)] + [
        (1122.0 + i + 0.4, 100, 900.0, 1122.0 + i) for i in range(20)]
    m = replan.gloss_metrics(stopped, 1109.5, 1140.0, lambda t: int(100 * t), trigger_s=1.0)
    assert m.disrupted_s >= 9


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _stopped(pid: int, stopped: bool = True, timeout_s: float = 10.0) -> bool:
    """Whether ``pid`` is (or is no longer) stopped within ``timeout_s``: kill(2) returns
    once a signal is queued, and a process running on the other CPU (its vCPU maybe
    descheduled by the hypervisor) stops or continues a moment later (CI once read it
    still running right after the SIGSTOP)."""
    deadline = time.monotonic() + timeout_s
    while (_state(pid) == "T") != stopped:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_transfer_gate_stops_the_transfer_during_a_batch_and_never_for_long() -> None:
    import os
    import signal
    import subprocess
    import sys

    from pipelines.runtime.host import procs
    from pipelines.runtime.replan import transfer as reseed

    # A busy transfer stand-in in a session of its own, with a child (its "JVM").
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                             "'-c', 'while True: pass']); time.sleep(60)"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(procs.tree_pids([proc.pid])) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        child = [p for p in procs.tree_pids([proc.pid]) if p != proc.pid][0]
        gate = reseed.TransferGate(proc.pid, hold_max_s=1.0)
        began = time.monotonic()
        gate.hold()
        assert _stopped(child)  # the whole group is stopped
        gate.release()
        assert _stopped(child, False)
        gate.hold()
        # A batch longer than hold_max_s: the transfer goes on after it (whether it was
        # seen stopped meanwhile depends on when this thread runs: the first hold showed
        # that a hold stops it).
        time.sleep(1.0)
        assert _stopped(child, False)
        gate.release()  # a release after the expiry changes nothing
        span = time.monotonic() - began
        # Held twice: briefly, then for hold_max_s; never longer than the test took.
        assert gate.holds == 2 and 1.0 < gate.held_s < span
        gate.close()
        gate.hold()  # closed: a batch that begins later no longer stops it
        time.sleep(0.1)
        assert _state(child) != "T"
        # A runner killed outright while it holds the transfer: the watchdog continues it.
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import time\nfrom pipelines.runtime.replan import transfer as reseed\n"
             f"g = reseed.TransferGate({proc.pid}, hold_max_s=60)\ng.hold()\n"
             "print(flush=True)\ntime.sleep(120)\n"],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
        assert holder.stdout is not None
        holder.stdout.readline()
        assert _stopped(child)
        holder.kill()
        holder.wait(timeout=10)
        assert _stopped(child, False), "the watchdog did not continue the transfer"
        # A runner leaving at once ends a held transfer, its children included.
        gate = reseed.TransferGate(proc.pid)
        gate.hold()
        gate.end()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and _state(child) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_short_replay_runs_in_the_application_and_a_long_one_in_a_process() -> None:
    from pipelines.nexmark import queries

    q5 = definition.validate(queries.definition("Q5", 1000, key_groups=8))
    q3 = definition.validate(queries.definition("Q3", 1000, key_groups=8))
    start = 500_000
    # Q5: 20-s horizon; Q3: 660 s (its person and auction buffers).
    assert not replan.replays_in_process(q5, start, replan.replay_start(q5, start, 0.0))
    assert replan.replays_in_process(q3, start, replan.replay_start(q3, start, 0.0))
    assert replan.replays_in_process(q5, start, 400_000, "process")
    assert not replan.replays_in_process(q3, start, 0, "application")
    with pytest.raises(replan.ReplanError, match="replay_in must be one of"):
        replan.replays_in_process(q5, start, 400_000, "elsewhere")


def test_a_transfer_is_gated_only_where_the_forwarded_batches_leave_idle_time(
        tmp_path: Path) -> None:
    gen = replan.Generation(0, 6, tmp_path / "checkpoint")
    assert gen.leaves_idle_time(1.0)  # nothing measured yet: gate
    for seconds in (0.5, 0.6, 0.55):
        gen.record_batch(seconds)
    assert gen.leaves_idle_time(1.0) and gen.batch_s == 0.55
    for seconds in (1.0, 1.2, 0.95, 1.1):  # back to back: the median leaves no idle time
        gen.record_batch(seconds)
    assert gen.recent_batch_s == [0.55, 1.0, 1.2, 0.95, 1.1]
    assert not gen.leaves_idle_time(1.0)
    assert gen.leaves_idle_time(2.0)
