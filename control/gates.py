"""The control loop's gate stage (``control.controlloop.Gate``) for one run's policy:
its guards (``control.fleet.guard``) and its decision plug-ins
(``control.plugins.review``), in that order (pure Python, no Django). The product adds
the arbiter behind them (``control.ticks``); the Strategy Lab's simulator runs this same
gate on simulated time.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from control import fleet, plugins
from control.controlloop import GateVerdict, Outcome
from control.live import LiveDecision, action_of

log = logging.getLogger(__name__)


def with_workers(decision: LiveDecision, workers: int) -> LiveDecision:
    """``decision`` with other workers (a plug-in's change, the arbiter's grant)."""
    chosen = {**decision.chosen, "workers": workers}
    action = action_of(decision.current["workers"], decision.current["freq_ghz"], workers,
                       chosen["freq_ghz"])
    return dataclasses.replace(decision, chosen=chosen, action=action)


@dataclass
class PolicyGate:
    """Guards, then plug-ins; the first that holds the decision says why."""

    run: str
    policy: str
    guards: fleet.Guards
    plugins: Sequence[plugins.DecisionPlugin] = ()
    history: Callable[[], Sequence[fleet.Applied]] = list
    clock: Callable[[], float] = time.time
    min_workers: int = 1
    max_workers: int = 1_000_000

    def review(self, decision: LiveDecision, acting: bool) -> GateVerdict | None:
        now = self.clock()
        current, chosen = decision.current["workers"], decision.chosen["workers"]
        why = fleet.guard(self.guards, current, chosen, now, self.history())
        if why is not None:
            return GateVerdict(why, Outcome.EXCLUDED)
        if not self.plugins:
            return None
        verdict = plugins.review(self.plugins, plugins.Proposal(
            run=self.run, policy=self.policy, now=now, current_workers=current,
            chosen_workers=chosen, current_freq_ghz=decision.current["freq_ghz"],
            chosen_freq_ghz=decision.chosen["freq_ghz"], action=decision.action,
            reason=decision.reason, inputs=decision.inputs))
        for note in verdict.notes:  # a failing plug-in passes the decision on: said here
            log.warning("run %s: %s", self.run, note)
        if verdict.verdict is None:
            return None
        said = f"plug-in {verdict.plugin}: {verdict.verdict.reason}"
        if verdict.verdict.veto:
            return GateVerdict(said, Outcome.VETOED)
        workers = min(max(int(verdict.verdict.workers or current), self.min_workers),
                      self.max_workers)
        return GateVerdict(said, decision=with_workers(decision, workers))


@dataclass
class Gates:
    """Several gates in turn: the first that holds a decision ends the review; a change
    goes on to the next gate."""

    gates: Sequence[object]

    def review(self, decision: LiveDecision, acting: bool) -> GateVerdict | None:
        changed: GateVerdict | None = None
        for gate in self.gates:
            verdict = gate.review(decision, acting)  # type: ignore[attr-defined]
            if verdict is None:
                continue
            if verdict.decision is None:
                return verdict
            decision = verdict.decision
            message = verdict.message if changed is None else \
                f"{changed.message}; {verdict.message}"
            changed = GateVerdict(message, decision=decision)
            if decision.action == "hold":
                break
        return changed
