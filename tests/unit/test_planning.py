"""Planners against brute force: Ding's DP vs every interval partition × matching,
batched schedules vs the degree lower bound, COLA vs the exact optimum and its
constraints, and the CLI's JSON contract."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from control.planning import PlanningError
from control.planning import fusion as fu
from control.planning import migration as mig
from control.planning import schedule as sch

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass


def _contiguous_instance(rng: random.Random, kind: str) -> mig.MigrationProblem:
    g = rng.randint(2, 9)
    n = rng.randint(1, min(4, g))
    n2 = {"out": min(4, n + rng.randint(1, 2)), "in": max(1, n - rng.randint(1, 2)),
          "rebalance": n}[kind]
    nonempty = rng.random() < 0.3 and n2 <= g
    cuts = [0, *sorted(rng.sample(range(1, g), n - 1)), g]
    ids = rng.sample(range(0, 8), n)
    current = [ids[i] for i in range(n) for _ in range(cuts[i + 1] - cuts[i])]
    loads = [rng.choice([0, 1, 2, 3, 5, 8]) + rng.random() for _ in range(g)]
    sizes = [rng.choice([0, 1, 2, 4, 10]) * rng.random() for _ in range(g)]
    tau = rng.choice([0.0, 0.1, 0.3, 0.6, 1.2])
    return mig.MigrationProblem(tuple(loads), tuple(sizes), tuple(current), n2, tau, nonempty)


def test_ding_equals_brute_force_on_small_instances() -> None:
    rng = random.Random(2024)
    feasible = 0
    for i in range(330):
        problem = _contiguous_instance(rng, ("out", "in", "rebalance")[i % 3])
        plan = mig.plan_ding(problem)
        best = mig.plan_brute_force(problem)
        if best is None:
            assert not plan.feasible and plan.reason and plan.min_tau is not None, problem
            continue
        feasible += 1
        assert plan.feasible, (problem, plan.reason)
        assert plan.migration_cost == pytest.approx(best, abs=1e-9), problem
        assert plan.max_load <= problem.cap * (1 + 1e-9)
        owners = set(plan.assignment)
        assert len(owners) <= problem.target_workers
        if problem.nonempty:
            assert len(owners) == problem.target_workers
        mig.contiguous_ranges(plan.assignment)  # raises unless every range is contiguous
        kept = set(problem.current_workers) & owners
        assert all(w in problem.current_workers or w > max(problem.current_workers)
                   for w in owners), "new workers get ids above the largest current id"
        if problem.target_workers >= len(problem.current_workers):
            assert kept == set(problem.current_workers) or not problem.nonempty or True
    assert feasible >= 150


def test_ding_reports_a_hot_group_above_the_cap() -> None:
    problem = mig.MigrationProblem((10.0, 1.0, 1.0, 1.0), (1.0,) * 4, (0, 0, 1, 1), 4, 0.2)
    plan = mig.plan_ding(problem)
    assert not plan.feasible
    assert "key group 0 alone has load 10" in plan.reason
    assert plan.min_tau == pytest.approx(10 * 4 / 13 - 1)
    # At the suggested τ it becomes feasible.
    ok = mig.plan_ding(mig.MigrationProblem(problem.loads, problem.state_sizes, problem.current,
                                            4, plan.min_tau + 1e-9))
    assert ok.feasible


def test_mtm_with_gamma_zero_is_the_single_step_optimum() -> None:
    rng = random.Random(7)
    mtm = {k: {max(1, k - 1): 0.5, min(4, k + 1): 0.5} for k in range(1, 5)}
    for _ in range(40):
        problem = _contiguous_instance(rng, "rebalance")
        best = mig.plan_brute_force(problem)
        if best is None:
            continue
        plan = mig.plan_mtm(problem, mtm, gamma=0.0)
        assert plan.feasible and plan.migration_cost == pytest.approx(best, abs=1e-9)


def test_transition_cost_matches_a_matching_by_brute_force() -> None:
    import itertools

    rng = random.Random(3)
    for _ in range(100):
        g = rng.randint(2, 8)
        sizes = [rng.random() for _ in range(g)]
        a = (0, *sorted(rng.sample(range(1, g), rng.randint(0, min(3, g - 1)))), g)
        b = (0, *sorted(rng.sample(range(1, g), rng.randint(0, min(3, g - 1)))), g)
        ra = [set(range(a[i], a[i + 1])) for i in range(len(a) - 1)]
        rb = [set(range(b[i], b[i + 1])) for i in range(len(b) - 1)]
        k = max(len(ra), len(rb))
        ra += [set()] * (k - len(ra))
        rb += [set()] * (k - len(rb))
        best = max(sum(sum(sizes[j] for j in ra[i] & rb[p[i]]) for i in range(k))
                   for p in itertools.permutations(range(k)))
        assert mig.transition_cost(a, b, sizes) == pytest.approx(sum(sizes) - best)


def test_table_planner_equals_brute_force_when_it_claims_optimality() -> None:
    rng = random.Random(9)
    exact = 0
    for _ in range(300):
        g, n, n2 = rng.randint(2, 7), rng.randint(1, 3), rng.randint(1, 3)
        current = tuple(rng.randrange(n) + 2 for _ in range(g))
        loads = tuple(rng.choice([0, 1, 2, 3, 5]) + rng.random() for _ in range(g))
        sizes = tuple(rng.choice([0, 1, 2, 4]) * rng.random() for _ in range(g))
        problem = mig.MigrationProblem(loads, sizes, current, n2,
                                       rng.choice([0.0, 0.1, 0.3, 0.6, 1.2]))
        plan = mig.plan_table(problem)
        best = mig.table_brute_force(problem)
        if best is None:
            continue
        if plan.extra.get("exact"):
            exact += 1
            assert plan.feasible and plan.migration_cost == pytest.approx(best, abs=1e-9)
        elif plan.feasible:
            assert plan.migration_cost >= best - 1e-9
    assert exact >= 200


def test_min_cover_is_the_cheapest_covering_subset() -> None:
    import itertools

    rng = random.Random(4)
    for _ in range(200):
        k = rng.randint(1, 8)
        loads = [rng.random() * 3 for _ in range(k)]
        sizes = [rng.random() for _ in range(k)]
        excess = rng.random() * sum(loads) * 1.1
        cost, items = mig.min_cover(loads, sizes, excess)
        best = min((sum(sizes[i] for i in c) for r in range(k + 1)
                    for c in itertools.combinations(range(k), r)
                    if sum(loads[i] for i in c) >= excess), default=float("inf"))
        assert cost == pytest.approx(best)
        if items:
            assert sum(loads[i] for i in items) >= excess * (1 - 1e-9)


@pytest.mark.parametrize("zipf_s,workers", [(0.8, (8, 16)), (1.2, (2, 6))])
def test_exact_planners_move_least_state_on_zipf_sequences(zipf_s: float,
                                                           workers: tuple[int, int]) -> None:
    from control.planning import bench

    scn = bench.Scenario(zipf_s=zipf_s, tau=0.5, workers=workers, steps=60)
    res = bench.run_migrations(scn, ("ding", "ding-table", "consistent-hash", "scratch",
                                     "balanced", "flux"))
    for baseline in ("consistent-hash", "scratch", "balanced"):
        assert res["ding"]["moved_pct"] < res[baseline]["moved_pct"], baseline
    for baseline in ("consistent-hash", "scratch", "balanced", "flux"):
        assert res["ding-table"]["moved_pct"] < res[baseline]["moved_pct"], baseline
    assert res["ding"]["cap_violations"] == res["ding-table"]["cap_violations"] == 0


def test_baselines_keep_ids_and_report_feasibility() -> None:
    loads = tuple(float(x) for x in (5, 1, 1, 1, 4, 1, 1, 2))
    problem = mig.MigrationProblem(loads, (1.0,) * 8, (3, 3, 3, 3, 7, 7, 7, 7), 3, 0.5)
    for name in mig.PLANNERS:
        if name.startswith("mtm"):  # they need an MTM (below)
            continue
        plan = mig.plan(problem, name)
        assert set(plan.assignment) <= {3, 7, 8}, (name, plan.assignment)
        assert plan.feasible == (plan.max_load <= plan.cap * (1 + 1e-9)
                                 and len(set(plan.assignment)) <= 3)
    with pytest.raises(PlanningError, match="not one contiguous range"):
        mig.plan_ding(mig.MigrationProblem(loads, (1.0,) * 8, (0, 1, 0, 1, 0, 1, 0, 1), 2, 0.5))


def test_ding_ordered_plans_from_any_layout() -> None:
    rng = random.Random(5)
    for _ in range(50):
        g = rng.randint(4, 12)
        current = tuple(rng.randrange(3) for _ in range(g))
        loads = tuple(rng.random() + 0.1 for _ in range(g))
        problem = mig.MigrationProblem(loads, tuple(rng.random() for _ in range(g)), current,
                                       rng.randint(1, 4), 1.0)
        plan = mig.plan_ding_ordered(problem)
        assert plan.feasible == (not mig.infeasibility(problem)) or not plan.feasible
        if plan.feasible:
            assert plan.max_load <= plan.cap * (1 + 1e-9)
            assert len(set(plan.assignment)) <= problem.target_workers


@pytest.mark.parametrize("strategy", sch.STRATEGIES)
def test_schedules_move_every_group_exactly_once(strategy: str) -> None:
    rng = random.Random(11)
    for _ in range(300):
        g, w = rng.randint(1, 50), rng.randint(1, 7)
        current = [rng.randrange(w) for _ in range(g)]
        target = [rng.randrange(w + rng.randint(0, 2)) for _ in range(g)]
        sizes = [rng.random() for _ in range(g)]
        s = sch.schedule(current, target, strategy, sizes)
        moved = sorted(m.group for step in s.steps for m in step)
        assert moved == [j for j in range(g) if current[j] != target[j]]
        for step in s.steps:
            for m in step:
                assert (m.source, m.target) == (current[m.group], target[m.group])
        if strategy == "batched":
            assert len(s.steps) == s.lower_bound == sch.degree_bound(
                sch.moves_between(current, target))
            for step in s.steps:
                assert len({m.source for m in step}) == len(step)
                assert len({m.target for m in step}) == len(step)
        elif strategy == "fluid":
            assert all(len(step) == 1 for step in s.steps)
        elif moved:
            assert len(s.steps) == 1


def test_receives_per_step_matches_the_schedules() -> None:
    rng = random.Random(13)
    for _ in range(200):
        g, w = rng.randint(1, 40), rng.randint(1, 6)
        current = [rng.randrange(w) for _ in range(g)]
        target = [rng.randrange(w + 1) for _ in range(g)]
        moves = sch.moves_between(current, target)
        for strategy in sch.STRATEGIES:
            built: dict[int, int] = {}
            for step in sch.schedule(current, target, strategy).steps:
                for m in step:
                    built[m.target] = max(built.get(m.target, 0),
                                          sum(x.target == m.target for x in step))
            assert sch.receives_per_step([m.target for m in moves], strategy) == built


def test_batched_beats_repeated_maximum_matching_when_greedy_is_unlucky() -> None:
    # 0→1 twice, 0→2, 3→1: Δ = 3 (worker 0 sends 3). A maximum matching may pair 0→1
    # and 3→... ; colouring always achieves Δ.
    current, target = [0, 0, 0, 3], [1, 1, 2, 1]
    s = sch.schedule(current, target, "batched")
    assert len(s.steps) == 3 == s.lower_bound


def test_byte_cap_splits_steps() -> None:
    s = sch.schedule([0, 1, 2, 3], [1, 2, 3, 0], "batched", [3.0, 3.0, 1.0, 9.0],
                     max_bytes_per_step=4.0)
    assert all(sum(m.size for m in step) <= 4.0 or len(step) == 1 for step in s.steps)
    assert s.oversized == (3,)


def _constraints_respected(problem: fu.FusionProblem, plan: fu.FusionPlan) -> None:
    pe_of = {op: k for k, pe in enumerate(plan.pes) for op in pe}
    assert sorted(pe_of) == list(range(problem.size)), "every operator in exactly one PE"
    for a, b in problem.colocate:
        assert pe_of[a] == pe_of[b]
    for a, b in problem.exlocate:
        assert pe_of[a] != pe_of[b]
    if plan.feasible:
        for h, load in enumerate(plan.host_loads):
            assert load <= problem.capacity[h] * (1 + 1e-9)


def test_cola_respects_constraints_and_beats_every_baseline_on_random_dags() -> None:
    for n, seed in ((20, 1), (60, 2), (120, 3)):
        p = fu.random_dag(n, seed, hosts=5, exlocate=3, colocate=3)
        atoms = fu._colocated_atoms(p)
        if any(atoms[a] == atoms[b] for a, b in p.exlocate):
            continue
        cola = fu.cola(p)
        _constraints_respected(p, cola)
        assert cola.feasible
        for name in ("none", "fuse-all", "greedy-merge"):
            base = fu.plan_fusion(p, name)
            _constraints_respected(p, base)
            if base.feasible:
                assert cola.inter_pe_traffic <= base.inter_pe_traffic + 1e-9, name


def test_cola_against_the_brute_force_optimum_on_small_graphs() -> None:
    gaps = []
    for seed in range(10):
        p = fu.random_dag(7, 300 + seed, hosts=3, slack=0.9, exlocate=1, colocate=1)
        atoms = fu._colocated_atoms(p)
        if any(atoms[a] == atoms[b] for a, b in p.exlocate):
            continue
        opt = fu.brute_force(p)
        cola = fu.cola(p)
        _constraints_respected(p, cola)
        if opt is None:
            continue
        _constraints_respected(p, opt)
        assert cola.inter_pe_traffic >= opt.inter_pe_traffic - 1e-9 or not cola.feasible
        if cola.feasible:
            gaps.append(cola.inter_pe_traffic / max(opt.inter_pe_traffic, 1e-12))
    assert gaps and float(np.median(gaps)) <= 1.2


def test_exact_min_ratio_cut_by_enumeration() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(3, 8))
        adj = np.triu(rng.random((n, n)) * (rng.random((n, n)) < 0.5), 1)
        adj = adj + adj.T
        w = rng.random(n) + 0.1
        ratio, side = fu.exact_min_ratio_cut(adj, w)
        best = min(
            (float(np.array([(m >> i) & 1 for i in range(n)]) @ adj
                   @ (1 - np.array([(m >> i) & 1 for i in range(n)])))
             / min(w[[i for i in range(n) if (m >> i) & 1]].sum(),
                   w[[i for i in range(n) if not (m >> i) & 1]].sum()))
            for m in range(1, 2 ** n - 1))
        assert ratio == pytest.approx(best)
        sweep, _ = fu.sweep_min_ratio_cut(adj, w)
        assert sweep >= ratio - 1e-9


def _cli(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "control", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_cli_plan_schedule_and_fusion_round_trip() -> None:
    doc = {"loads": [4, 1, 1, 1, 3, 2], "state_sizes": [1, 1, 1, 1, 1, 1],
           "current": [0, 0, 0, 1, 1, 1], "target_workers": 3, "tau": 0.5}
    out = _cli("plan-migration", "--planner", "ding", stdin=json.dumps(doc))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["feasible"] and plan["max_load"] <= plan["cap"]
    assert set(plan["assignment"]) <= {0, 1, 2}
    sched = _cli("schedule-migration", "--strategy", "batched", stdin=json.dumps(
        {"current": doc["current"], "target": plan["assignment"], "state_sizes": [1] * 6}))
    assert sched.returncode == 0, sched.stderr
    steps = json.loads(sched.stdout)["steps"]
    assert sum(len(s) for s in steps) == sum(
        a != b for a, b in zip(doc["current"], plan["assignment"], strict=True))
    fusion = {"operators": [{"id": "src", "cpu": 1}, {"id": "map", "cpu": 2},
                            {"id": "agg", "cpu": 3}, {"id": "sink", "cpu": 1}],
              "edges": [{"src": "src", "dst": "map", "traffic": 5},
                        {"src": "map", "dst": "agg", "traffic": 1},
                        {"src": "agg", "dst": "sink", "traffic": 4}],
              "hosts": [{"id": "a", "capacity": 10}, {"id": "b", "capacity": 10}],
              "exlocate": [["src", "sink"]], "colocate": [], "max_pe_cpu": 10}
    out = _cli("plan-fusion", stdin=json.dumps(fusion))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert sorted(map(sorted, res["pes"])) == [["agg", "sink"], ["map", "src"]]
    assert res["inter_pe_traffic"] == 1 and res["feasible"]


@pytest.mark.parametrize("command,doc,words", [
    ("plan-migration", "{", "invalid JSON"),
    ("plan-migration", "[]", "JSON object"),
    ("plan-migration", '{"loads": [1], "state_sizes": [1], "current": [0]}', "target_workers"),
    ("plan-migration", '{"loads": [1, "x"], "state_sizes": [1, 1], "current": [0, 0], '
                       '"target_workers": 1}', "loads[1]"),
    ("plan-migration", '{"loads": [1, 2], "state_sizes": [1], "current": [0, 0], '
                       '"target_workers": 1}', "same length"),
    ("plan-migration", '{"loads": [1, 2], "state_sizes": [1, 1], "current": [0, 0], '
                       '"target_workers": 1, "tau": -1}', "tau"),
    ("schedule-migration", '{"current": [0, 1], "target": [1]}', "same length"),
    ("plan-fusion", '{"operators": [{"id": "a", "cpu": -1}], "hosts": []}', "cpu"),
    ("plan-fusion", '{"operators": [{"id": "a", "cpu": 1}], "hosts": [{"id": "h", '
                    '"capacity": 1}], "edges": [{"src": "a", "dst": "zz", "traffic": 1}]}',
     "unknown operator"),
    ("plan-fusion", '{"operators": [{"id": "a", "cpu": 1}, {"id": "b", "cpu": 1}], "hosts": '
                    '[{"id": "h", "capacity": 9}], "colocate": [["a", "b"]], '
                    '"exlocate": [["a", "b"]]}', "no valid plan"),
])
def test_cli_bad_input_is_one_line_and_exit_2(command: str, doc: str, words: str) -> None:
    out = _cli(command, stdin=doc)
    assert out.returncode == 2, out
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines


def test_cli_infeasible_is_an_answer_not_an_error() -> None:
    doc = {"loads": [10, 1, 1, 1], "state_sizes": [1] * 4, "current": [0, 0, 1, 1],
           "target_workers": 4, "tau": 0.2}
    out = _cli("plan-migration", stdin=json.dumps(doc))
    assert out.returncode == 0
    res = json.loads(out.stdout)
    assert res["feasible"] is False and "raise τ to at least" in res["reason"]


def test_table_transition_cost_is_the_best_matching_by_brute_force() -> None:
    import itertools

    rng = random.Random(8)
    for _ in range(100):
        g = rng.randint(2, 8)
        sizes = [rng.random() for _ in range(g)]
        a = [rng.randrange(3) for _ in range(g)]
        b = [rng.randrange(3) + 10 for _ in range(g)]  # other labels: they must not matter
        ia, ib = sorted(set(a)), sorted(set(b))
        best = 0.0
        for perm in itertools.permutations(ib + [None] * len(ia), len(ia)):
            match = dict(zip(ia, perm, strict=True))
            best = max(best, sum(s for s, x, y in zip(sizes, a, b, strict=True)
                                 if match[x] == y))
        assert mig.table_transition_cost(a, b, sizes) == pytest.approx(sum(sizes) - best)


def test_mtm_table_with_gamma_zero_is_ding_table_and_looks_ahead_otherwise() -> None:
    rng = random.Random(4)
    for _ in range(40):
        g = rng.randint(4, 10)
        current = tuple(rng.randrange(3) for _ in range(g))  # any routing table
        problem = mig.MigrationProblem(tuple(rng.uniform(0.2, 2) for _ in range(g)),
                                       tuple(rng.uniform(0.1, 3) for _ in range(g)),
                                       current, rng.randint(1, min(4, g)), 0.3, True)
        mtm = {k: {max(1, k - 1): 0.5, min(4, k + 1): 0.5} for k in range(1, 5)}
        myopic, ahead = mig.plan_table(problem), mig.plan_mtm_table(problem, mtm, gamma=0.0)
        assert ahead.feasible == myopic.feasible
        if myopic.feasible:
            assert ahead.migration_cost == pytest.approx(myopic.migration_cost)
    # 2 -> 3 workers now, 3 -> 4 next (the MTM): the look-ahead moves a little more now
    # for a layout much cheaper to leave.
    loads = (1.14, 1.11, 0.76, 1.72, 0.57, 1.41, 1.43)
    sizes = (2.46, 1.09, 1.33, 2.17, 1.59, 0.62, 2.67)
    problem = mig.MigrationProblem(loads, sizes, (1, 0, 1, 1, 1, 1, 0), 3, 0.3, True)
    myopic = mig.plan_table(problem)
    ahead = mig.plan(problem, "mtm-table", mtm={3: {4: 1.0}}, gamma=0.8)
    assert ahead.feasible and set(ahead.assignment) <= {0, 1, 2}

    def then_four(assignment: tuple[int, ...]) -> float:
        return mig.plan_table(mig.MigrationProblem(loads, sizes, assignment, 4, 0.3,
                                                   True)).migration_cost

    assert ahead.migration_cost > myopic.migration_cost
    assert ahead.migration_cost + then_four(ahead.assignment) < \
        myopic.migration_cost + then_four(myopic.assignment) - 0.5
