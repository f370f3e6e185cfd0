"""The control loop, assembled in one place (pure Python, no Django).

One :meth:`ControlLoop.tick` is one control step of a run, in the shape of the Flink
autoscaler's loop (metrics collector -> evaluator -> scaling executor -> realizer) and of
the thesis' MAPE loop (ch. 6, Fig. 6.2: monitor -> forecast -> decide -> act):

1. **collect**: the runner's metrics records since the last tick (:class:`MetricsSource`);
2. **evaluate and decide**: the run's :class:`~control.live.LiveController`, restored from
   its JSON state (:class:`ControllerStore`), steps on them from the configuration the run
   has now (:class:`ConfigurationReader`);
3. **record**: the decision and its outcome (hold, dry run, busy behind a reconfiguration
   still under way, or pending) go to the :class:`DecisionStore`;
4. **realise**: a pending decision goes to the :class:`Actuator`, which sends the runner
   commands (``control.live.reconfiguration_commands``) and later reports how it ended.

The product (``control.ticks``: Redis stream, database, Celery) and the closed-loop
benchmark (``pipelines.runtime.bench.closedloop.run_loop``: the runner harness) each supply these
five adapters and call the same :meth:`ControlLoop.tick`.
"""
from __future__ import annotations

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
        outcome, message = self._outcome(decision)
        stored = self.decisions.store(decision, outcome, message)
        if outcome is Outcome.PENDING:
            self.actuator.realise(decision, stored)
        return Tick(decision, outcome, message, stored)

    def _outcome(self, decision: LiveDecision) -> tuple[Outcome, str]:
        if decision.action == "hold":
            return Outcome.HOLD, ""
        if self.dry_run:
            return Outcome.DRY_RUN, "dry run: decided, not sent"
        pending = self.decisions.pending()
        if pending:
            return Outcome.BUSY, f"{pending} is still being applied"
        return Outcome.PENDING, "sent to the runner"
