"""Receding-horizon MPC controller (thesis §5.4.3): state kept across control steps.

Each step it observes the measured rate, computation time, c_a/c_s and latency, updates
the forecaster and the latency feedback factor (Eq. 6.10: measured over predicted
waiting time at the previous step), builds the MPC problem for the next h steps, solves
it, applies only the first configuration, and remembers its prediction for the next
feedback. Pure Python; the control app stores each returned Decision as-is.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from control import forecasting as fc
from control import sysmodel as sm
from control.strategies import mpc


@dataclass
class MpcController:
    strategy: str
    worker_options: tuple[int, ...]
    freq_options: tuple[float, ...]
    horizon: int = 1
    solver: str = "dp"
    params: dict[str, Any] = field(default_factory=dict)
    forecaster: fc.Forecaster = field(default_factory=fc.Holt)
    _measured_wq: deque = field(default_factory=lambda: deque(maxlen=3), repr=False)
    _predicted_wq: deque = field(default_factory=lambda: deque(maxlen=3), repr=False)
    _last_prediction: float | None = field(default=None, repr=False)
    _next_rate: float | None = field(default=None, repr=False)
    rate_actual: list[float] = field(default_factory=list, repr=False)
    rate_predicted: list[float] = field(default_factory=list, repr=False)
    feedback: float = 1.0  # the Eq. 6.10 factor used by the last step
    # Optional (low, high) clamp of the factor; None keeps Eq. 6.10 as the thesis has it.
    feedback_limits: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.strategy not in mpc.THESIS_STRATEGIES:
            raise ValueError(f"strategy must be one of {sorted(mpc.THESIS_STRATEGIES)}")

    def step(self, current: mpc.Config, rate: float, comp_time_s: float, ca2: float,
             cs2: float, measured_latency_s: float | None = None) -> mpc.Decision:
        """One control step with what was measured over the last one."""
        if self._next_rate is not None:  # score last step's one-step-ahead forecast
            self.rate_actual.append(rate)
            self.rate_predicted.append(self._next_rate)
        self.forecaster.observe(rate)
        microbatch = self.params.get("latency_model") == "microbatch"
        if measured_latency_s is not None and self._last_prediction is not None:
            # Eq. 6.10 works on waiting times: latency minus computation time (in a
            # micro-batch engine every record waits for its batch: the whole latency).
            self._measured_wq.append(measured_latency_s if microbatch
                                     else max(measured_latency_s - comp_time_s, 0.0))
            self._predicted_wq.append(self._last_prediction)
        feedback = sm.feedback_factor(list(self._measured_wq), list(self._predicted_wq))
        if self.feedback_limits is not None:
            feedback = min(max(feedback, self.feedback_limits[0]), self.feedback_limits[1])
        settings = {**mpc.THESIS_STRATEGIES[self.strategy], **self.params}
        problem = mpc.MpcProblem(
            worker_options=self.worker_options,
            freq_options=mpc.strategy_freqs(self.strategy, self.freq_options),
            current=current,
            rate_forecast=tuple(max(r, 0.0) for r in self.forecaster.forecast(self.horizon)),
            comp_time_s=comp_time_s, f_measured=current.freq_ghz, ca2=ca2, cs2=cs2,
            feedback=feedback, **settings)
        decision = mpc.decide(problem, self.solver)
        self._next_rate = problem.rate_forecast[0]
        first = decision.trajectory[0]
        # Kingman's waiting time the model predicts for the applied configuration,
        # without feedback, for the next step's Eq. 6.10 ratio.
        unscaled = replace(problem, feedback=1.0)
        t = sm.scaled_computation_time(comp_time_s, current.freq_ghz, first.freq_ghz)
        latency = mpc.predict(unscaled, decision.chosen, first.rate)[2]
        self._last_prediction = latency if microbatch else latency - t
        self.feedback = feedback
        return decision

    def state(self) -> dict[str, Any]:
        """What the controller carries from step to step, as JSON (its settings come
        from the policy): the forecaster, the Eq. 6.10 windows and the forecast scores."""
        return {"forecaster": self.forecaster.state(),
                "measured_wq": list(self._measured_wq),
                "predicted_wq": list(self._predicted_wq),
                "last_prediction": self._last_prediction, "next_rate": self._next_rate,
                "rate_actual": list(self.rate_actual),
                "rate_predicted": list(self.rate_predicted), "feedback": self.feedback}

    def restore(self, state: dict[str, Any]) -> None:
        self.forecaster.restore(state["forecaster"])
        self._measured_wq.clear()
        self._measured_wq.extend(state["measured_wq"])
        self._predicted_wq.clear()
        self._predicted_wq.extend(state["predicted_wq"])
        self._last_prediction = state["last_prediction"]
        self._next_rate = state["next_rate"]
        self.rate_actual = list(state["rate_actual"])
        self.rate_predicted = list(state["rate_predicted"])
        self.feedback = float(state["feedback"])

    @property
    def forecast_mape(self) -> float:
        """MAPE (%) of the one-step-ahead rate forecasts over this controller's run."""
        return fc.mape(self.rate_actual, self.rate_predicted)
