"""Control strategies (pure Python, no Django). The registry maps the names a Policy
can choose to what they do. ``manual`` has no controller; the others are the control
library's MPC strategies (thesis Table 7.2; parameters: horizon, switching, gamma,
alpha, beta, forecaster) and reactive baselines (``control/strategies/rules.py``).
The closed loop runs them on live runs (``control.live.STRATEGY_REGISTRY`` builds
each); the Strategy Lab runs them in the simulator."""
from __future__ import annotations

STRATEGIES: dict[str, str] = {
    "manual": "Manual: no controller; operators set workers from the run page",
    "th-node": "MPC Th-Node: throughput cost (Eq. 6.13), cost per worker (Eq. 6.15)",
    "th-power": "MPC Th-Power: throughput cost (Eq. 6.13), power cost (Eq. 6.16)",
    "lat-node": "MPC Lat-Node: latency cost (Eq. 6.14), cost per worker (Eq. 6.15)",
    "lat-power": "MPC Lat-Power: latency cost (Eq. 6.14), power cost (Eq. 6.16)",
    "th-rule": "Th-Rule: utilisation thresholds",
    "lat-rule": "Lat-Rule: latency ratio thresholds",
    "spl": "SPL: congestion index with memory of failed actions",
    "peak-load": "Peak load: always the maximum workers and frequency",
    "ds2": "DS2 / Flink autoscaler: true processing rate, target utilisation",
    "static-min": "Static: always the minimum workers (a baseline)",
    "static-max": "Static: always the maximum workers (a baseline)",
}
# The reactive rules (control/strategies/rules.py) and the static baselines, by name;
# the MPC strategies are mpc.THESIS_STRATEGIES.
RULES = ("th-rule", "lat-rule", "spl", "peak-load", "ds2")
STATICS = ("static-min", "static-max")
