"""The control loop, assembled in one place (pure Python, no Django).

One :meth:`ControlLoop.tick` is one control step of a run, in the shape of the Flink
autoscaler's loop (metrics collector -> evaluator -> scaling executor -> realizer) and of
the thesis' MAPE loop (ch. 6, Fig. 6.2: monitor -> forecast -> decide -> act):

1. **collect**: the runner's metrics records since the last tick (:class:`MetricsSource`);
2. **evaluate and decide**: the run's :class:`~control.live.LiveController`, restored from
   its JSON state (:class:`ControllerStore`), steps on them from the configuration the run
   has now (:class:`ConfigurationReader`);
3. **gate**: a decision to reconfigure passes the :class:`Gate` — the fleet's guards
   (excluded periods, caps, cooldowns), the policy's decision plug-ins and the arbiter
   that shares the cluster between runs (``control.fleet``, ``control.plugins``) — which
   may hold it (excluded, vetoed, refused) or change it;
4. **record**: the decision and its outcome (hold, excluded, vetoed, refused, dry run,
   busy behind a reconfiguration still under way, or pending) go to the
   :class:`DecisionStore`;
5. **realise**: a pending decision goes to the :class:`Actuator`, which sends the runner
   commands (``control.live.reconfiguration_commands``) and later reports how it ended.

The product (``control.ticks``: Redis stream, database, Celery) and the closed-loop
benchmark (``pipelines.runtime.bench.closedloop.run_loop``: the runner harness) each supply these
five adapters and call the same :meth:`ControlLoop.tick`.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Protocol

from control.live import LiveController, LiveDecision, LoopError, LoopPolicy
from control.strategies.mpc import Config


class Outcome(enum.StrEnum):
    """What became of a decision at its tick (the product stores the same words)."""

    HOLD = "hold"  # the strategy keeps the configuration
    DRY_RUN = "dry-run"  # decided and shown, not sent
    BUSY = "busy"  # a previous reconfiguration is still under way
    PENDING = "pending"  # handed to the actuator
    EXCLUDED = "excluded"  # a guard held it (excluded period, cap, cooldown)
    VETOED = "vetoed"  # a decision plug-in vetoed it
    REFUSED = "refused"  # the arbiter gave the cores to other runs


class MetricsSource(Protocol):
    def collect(self) -> list[dict[str, Any]]:
        """The metrics records committed since the last consumed one (may be empty)."""
        ...

    def consumed(self) -> None:
        """The records the last :meth:`collect` returned were used: skip them next time."""
        ...


class ConfigurationReader(Protocol):
    def current(self, records: list[dict[str, Any]], f_max: float) -> Config:
        """The configuration the run has now (``records`` are this tick's)."""
        ...


class ControllerStore(Protocol):
    def load(self) -> dict[str, Any] | None:
        """The state :meth:`LiveController.to_state` saved last, or None."""
        ...

    def save(self, state: dict[str, Any]) -> None: ...


class DecisionStore(Protocol):
    def pending(self) -> str | None:
        """A reconfiguration still being applied (what it is), or None."""
        ...

    def store(self, decision: LiveDecision, outcome: Outcome, message: str) -> Any:
        """Record the decision (and raise its alerts); returns what the actuator needs
        to report back on it (the product: the stored Decision)."""
        ...


@dataclass(frozen=True)
class GateVerdict:
    """A gate's answer: hold the decision (``outcome`` excluded, vetoed or refused), or
    let a changed one (``decision``) go on; ``message`` says why either way."""

    message: str
    outcome: Outcome | None = None
    decision: LiveDecision | None = None


class Gate(Protocol):
    def review(self, decision: LiveDecision, acting: bool) -> GateVerdict | None:
        """None lets the decision through as it is. ``acting``: the loop will send it
        (not a dry run, nothing pending), so the gate may act on other runs too (the
        arbiter's preemptions); otherwise it only says what it would do."""
        ...


class Actuator(Protocol):
    def realise(self, decision: LiveDecision, stored: Any) -> None:
        """Start carrying out a pending decision; it ends asynchronously."""
        ...


@dataclass(frozen=True)
class Tick:
    decision: LiveDecision
    outcome: Outcome
    message: str
    stored: Any


@dataclass
class ControlLoop:
    policy: LoopPolicy
    metrics: MetricsSource
    configuration: ConfigurationReader
    controllers: ControllerStore
    decisions: DecisionStore
    actuator: Actuator
    dry_run: bool = False
    gate: Gate | None = None

    def controller(self) -> LiveController:
        """The run's controller: restored from its saved state, or a fresh one (no state
        yet, or a state an older version wrote). Raises LoopError for a policy the loop
        cannot run."""
        state = self.controllers.load()
        if state is not None:
            try:
                return LiveController.from_state(self.policy, state)
            except (LoopError, KeyError, TypeError, ValueError):
                pass  # another version's state: start afresh
        return LiveController(self.policy)

    def tick(self) -> Tick | None:
        """One control step; None when no batch was committed since the last one.
        LoopError (a policy the loop cannot run) leaves the records unconsumed."""
        records = self.metrics.collect()
        if not records:
            return None
        controller = self.controller()
        decision = controller.step(records, self.configuration.current(records,
                                                                       self.policy.f_max))
        self.metrics.consumed()
        self.controllers.save(controller.to_state())
        decision, outcome, message = self._outcome(decision)
        stored = self.decisions.store(decision, outcome, message)
        if outcome is Outcome.PENDING:
            self.actuator.realise(decision, stored)
        return Tick(decision, outcome, message, stored)

    def _outcome(self, decision: LiveDecision) -> tuple[LiveDecision, Outcome, str]:
        if decision.action == "hold":
            return decision, Outcome.HOLD, ""
        pending = None if self.dry_run else self.decisions.pending()
        if pending:  # nothing is weighed while the last reconfiguration is under way
            return decision, Outcome.BUSY, f"{pending} is still being applied"
        note = ""
        if self.gate is not None:
            verdict = self.gate.review(decision, acting=not self.dry_run)
            if verdict is not None and verdict.decision is None:
                held = verdict.outcome or Outcome.VETOED
                return decision, held, (f"dry run: {verdict.message}" if self.dry_run
                                        else verdict.message)
            if verdict is not None:
                # Kept with the decision: its outcome message is replaced when it ends.
                decision = dataclasses.replace(
                    verdict.decision, inputs={**verdict.decision.inputs,
                                              "gate": verdict.message})
                note = f" ({verdict.message})"
                if decision.action == "hold":
                    return decision, Outcome.HOLD, verdict.message
        if self.dry_run:
            return decision, Outcome.DRY_RUN, "dry run: decided, not sent" + note
        return decision, Outcome.PENDING, "sent to the runner" + note
