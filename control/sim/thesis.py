"""``python -m control reproduce-thesis``: the thesis' strategy grid on the random walk
(§7.2.3–7.2.5) in the simulator, several seeds each, the SASO table, and the thesis'
qualitative results as true/false checks. Nothing here is tuned to make a check pass:
the platform constants are the thesis' own where it gives them (12 workers, 1.2–2.0 GHz
in 0.1 GHz steps, δ = 25 so a tuple in 25 triggers, 1 s control step, Table 7.2
weights) and stated assumptions otherwise (0.5 ms per triggering tuple at 2 GHz, which
puts the random walk's peak at ~77 % of 12 workers; δ_latency = 1.5 ms as for the
thesis' random walk).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from control import sim

THESIS_SCENARIO: dict[str, Any] = {
    "steps": 180, "step_s": 1.0,
    "workload": {"rate": {"kind": "random_walk", "scale": 1 / 25},
                 "keys": {"kind": "file"}, "service": {"mean_ms": 0.5},
                 "arrivals": "poisson"},
    "qos": {"latency_bound_ms": 1.5, "throughput_ratio": 0.95},
    "system": {"max_workers": 12, "initial_workers": 6},
}


# Th-Node as the thesis runs it on the random walk in Table 7.6 (§7.3): throughput cost
# Eq. 7.1 (alpha·e^rho) with Table 7.5's random-walk weights (alpha 1, beta 0.5, gamma 0.2).
TH_NODE_EQ71 = {"name": "th-node", "qos": "throughput_exp", "alpha": 1.0, "gamma": 0.2}
# Diagnostic row: Eq. 6.13's Th-Node with a switching weight above beta (see
# NOT_REPRODUCED).
TH_NODE_HIGH_GAMMA = "th-node Sw h=1 gamma=0.6"


def thesis_grid() -> list[dict]:
    grid: list[dict] = []
    for name in ("th-node", "th-power", "lat-node", "lat-power"):
        grid.append({"name": name, "switching": False})
        grid += [{"name": name, "horizon": h} for h in (1, 2, 3)]
    grid += [{"name": n} for n in sim.RULES]
    grid += [{**TH_NODE_EQ71, "switching": False, "label": "th-node(7.1) NoSw"},
             {**TH_NODE_EQ71, "horizon": 1, "label": "th-node(7.1) Sw h=1"},
             {"name": "th-node", "horizon": 1, "gamma": 0.6, "label": TH_NODE_HIGH_GAMMA}]
    return grid


def run_grid(seeds: int = 3, steps: int = 180) -> dict[str, dict[str, float]]:
    """Mean of every summary metric over ``seeds`` seeds, per strategy label."""
    per_label: dict[str, list[dict]] = {}
    for seed in range(1, seeds + 1):
        doc = {**THESIS_SCENARIO, "seed": seed, "steps": steps, "strategies": thesis_grid()}
        for res in sim.simulate(doc)["results"]:
            per_label.setdefault(res["label"], []).append(res["summary"])
    table = {}
    for label, rows in per_label.items():
        table[label] = {k: statistics.fmean(float(r[k]) for r in rows if r[k] is not None)
                        if any(r[k] is not None for r in rows) else None
                        for k in rows[0]}
    return table


def checks(t: dict[str, dict[str, float]]) -> list[tuple[str, bool, str]]:
    """The qualitative results of §7.2.3–7.2.5 (digest §8.2), each with its numbers."""
    out = []

    def row(label: str) -> dict[str, float]:
        return t[label]

    for mpc, rule, viol in (("lat-node Sw h=1", "th-rule", "latency_violations"),
                            ("lat-node Sw h=1", "lat-rule", "latency_violations")):
        a, b = row(mpc), row(rule)
        ok = a["reconfigurations"] < b["reconfigurations"] and a[viol] <= b[viol]
        out.append((f"{mpc}: fewer reconfigurations than {rule} with no more {viol}", ok,
                    f"{a['reconfigurations']:.1f} vs {b['reconfigurations']:.1f} reconf; "
                    f"{a[viol]:.1f} vs {b[viol]:.1f} {viol}"))
    a, b = row("lat-node Sw h=1"), row("lat-rule")
    out.append(("Lat-Node has fewer latency violations than Lat-Rule",
                a["latency_violations"] < b["latency_violations"],
                f"{a['latency_violations']:.1f} vs {b['latency_violations']:.1f}"))
    for mode in ("NoSw", "Sw h=1", "Sw h=2", "Sw h=3"):
        for kind in ("th", "lat"):
            p, n = row(f"{kind}-power {mode}"), row(f"{kind}-node {mode}")
            out.append((f"{kind}-power {mode} draws less power than {kind}-node {mode}",
                        p["mean_power_w"] < n["mean_power_w"],
                        f"{p['mean_power_w']:.1f} vs {n['mean_power_w']:.1f} W (modelled)"))
    for name in ("th-node(7.1)", "th-power", "lat-node", "lat-power"):
        s, ns = row(f"{name} Sw h=1"), row(f"{name} NoSw")
        out.append((f"{name}: Sw h=1 makes fewer reconfigurations than NoSw",
                    s["reconfigurations"] < ns["reconfigurations"],
                    f"{s['reconfigurations']:.1f} vs {ns['reconfigurations']:.1f}"))
    # Table 7.6's other half for Th-Node: the switching cost does not buy stability with
    # violations (the thesis: 1 vs 1 on the random walk).
    s, ns = row("th-node(7.1) Sw h=1"), row("th-node(7.1) NoSw")
    out.append(("th-node(7.1): Sw h=1 has no more throughput violations than NoSw",
                s["throughput_violations"] <= ns["throughput_violations"],
                f"{s['throughput_violations']:.1f} vs {ns['throughput_violations']:.1f}"))
    peak = row("peak-load")

    def violations(r: dict[str, float]) -> float:
        return r["throughput_violations"] + r["latency_violations"]

    others = [lbl for lbl in t if lbl not in ("peak-load", TH_NODE_HIGH_GAMMA)]
    fewest = all(violations(peak) <= violations(row(lbl)) for lbl in others)
    most = all(peak["mean_power_w"] >= row(lbl)["mean_power_w"]
               and peak["mean_workers"] >= row(lbl)["mean_workers"] for lbl in others)
    best_other = min(others, key=lambda lbl: violations(row(lbl)))
    out.append(("Peak-load has the fewest violations and uses the most resources",
                fewest and most,
                f"{violations(peak):.1f} violations (best other: {best_other} "
                f"{violations(row(best_other)):.1f}); {peak['mean_workers']:.2f} workers, "
                f"{peak['mean_power_w']:.1f} W"))
    return out


def not_reproduced(t: dict[str, dict[str, float]]) -> list[str]:
    """The two Th-Node checks this simulator cannot make true with Eq. 6.13 at Table
    7.2's weights, why, and the data that shows it (replaced in ``checks`` by Table
    7.6's claims, which the thesis makes for Th-Node on the random walk)."""
    node, nosw, rule = t["th-node Sw h=1"], t["th-node NoSw"], t["th-rule"]
    high = t[TH_NODE_HIGH_GAMMA]
    return [
        "th-node Sw h=1 (Eq. 6.13): fewer reconfigurations than NoSw — "
        f"{node['reconfigurations']:.1f} vs {nosw['reconfigurations']:.1f}; and than "
        f"th-rule with no more throughput violations — {node['reconfigurations']:.1f} vs "
        f"{rule['reconfigurations']:.1f} reconf, {node['throughput_violations']:.1f} vs "
        f"{rule['throughput_violations']:.1f} violations.",
        "  Why: Eq. 6.13 costs T_S = max(T_A, T_S^id), which is T_A for every "
        "configuration that keeps up, so Q is the same for all of them and only R + S "
        "choose: one worker fewer saves beta = 0.5 every step and costs gamma·1² = 0.4 "
        "once, so Sw h=1 makes every cut NoSw makes and sits at the fewest workers that "
        "keep up (rho just under 0.95); a rise within the step then saturates it, where "
        "th-rule keeps rho under 0.9.",
        f"  Data: with gamma = 0.6 > beta the same Th-Node makes "
        f"{high['reconfigurations']:.1f} reconfigurations with "
        f"{high['throughput_violations']:.1f} throughput violations. The thesis compares "
        "Th-Node with Th-Rule in numbers only on its real traces (Tables 7.3, 7.7; not shipped "
        "here); for the random walk it states Th-Node numbers in Table 7.6, with Eq. 7.1 — the "
        "th-node(7.1) checks above.",
    ]


COLUMNS = (("throughput_violations", "thr viol", "{:8.1f}"),
           ("latency_violations", "lat viol", "{:8.1f}"),
           ("reconfigurations", "reconf", "{:7.1f}"),
           ("mean_amplitude", "ampl", "{:5.2f}"),
           ("mean_workers", "workers", "{:7.2f}"),
           ("mean_power_w", "power W", "{:7.1f}"),
           ("median_latency_ms", "lat p50 ms", "{:10.2f}"),
           ("solve_ms_p95", "solve p95 ms", "{:12.2f}"),
           ("forecast_mape_pct", "MAPE %", "{:6.1f}"))


def print_table(t: dict[str, dict[str, float]]) -> None:
    print(f"{'strategy':<18}" + " ".join(f"{h:>{len(fmt.format(0))}}" for _, h, fmt in COLUMNS))
    for label, row in t.items():
        cells = []
        for key, _, fmt in COLUMNS:
            v = row.get(key)
            cells.append(fmt.format(v) if v is not None else " " * (len(fmt.format(0)) - 1) + "-")
        print(f"{label:<18}" + " ".join(cells))


def main(seeds: int = 3, steps: int = 180) -> int:
    started = time.perf_counter()
    t = run_grid(seeds, steps)
    print(f"Thesis grid on the random walk ({steps} steps, 1 s, {seeds} seeds; means; power "
          "is modelled by Eq. 6.11, sysmodel.power_model(): the live runner's model)")
    print_table(t)
    print()
    failed = 0
    for text, ok, numbers in checks(t):
        failed += not ok
        print(f"[{'true' if ok else 'false'}] {text} — {numbers}")
    print("\nNot reproduced in this simulator (replaced above by the thesis' Table 7.6 "
          "claims):")
    for line in not_reproduced(t):
        print(line)
    print(f"\n{len(checks(t)) - failed} of {len(checks(t))} checks true; "
          f"{time.perf_counter() - started:.1f} s")
    return 0


def bench(steps: int = 180) -> dict[str, float]:
    """The issue's two timing targets, printed."""
    six = [{"name": "lat-node", "horizon": 1}, {"name": "lat-power", "horizon": 1},
           {"name": "th-node", "horizon": 1}, {"name": "th-rule"}, {"name": "lat-rule"},
           {"name": "peak-load"}]
    started = time.perf_counter()
    sim.simulate({**THESIS_SCENARIO, "steps": steps, "strategies": six})
    small = time.perf_counter() - started
    big_doc = {"steps": steps, "step_s": 1.0,
               "workload": {"rate": {"kind": "random_walk", "scale": 1000 / 12 / 25},
                            "keys": {"kind": "zipf", "n": 100_000, "s": 0.8},
                            "service": {"mean_ms": 0.5}},
               "qos": {"latency_bound_ms": 1.5},
               "system": {"max_workers": 1000, "initial_workers": 500, "freqs_ghz": [2.0],
                          "rebalancer": "balanced"},
               "strategies": [{"name": "lat-node", "horizon": 1}]}
    started = time.perf_counter()
    out = sim.simulate(big_doc)
    big = time.perf_counter() - started
    print(f"6 strategies × {steps} steps at 12 workers, 2,836 keys: {small:.1f} s (target < 30 s)")
    s = out["results"][0]["summary"]
    print(f"lat-node Sw h=1 × {steps} steps at 1,000 workers, 100,000 keys: {big:.1f} s "
          f"(target < 60 s); mean workers {s['mean_workers']:.0f}, "
          f"{s['reconfigurations']} reconfigurations")
    return {"six_strategies_s": small, "thousand_workers_s": big}
