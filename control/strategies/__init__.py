"""Control strategies (pure Python, no Django). The registry maps the names a Policy
can choose to what they do; the MPC and rule-based strategies of the thesis join it
with the control library (issue 3) and the closed loop (issue 7)."""
from __future__ import annotations

STRATEGIES: dict[str, str] = {
    "manual": "Manual: no controller; operators set workers from the run page",
}
