"""Arrival-rate forecasters with h-step forecasts (thesis §7.2.3). Pure Python.

* ``Holt``: Holt's linear (double exponential) smoothing, as the thesis states (its
  "Holt Winters filter" without a seasonal term, per the artifact's HWFilter):
      s_t = a x_t + (1 - a)(s_{t-1} + b_{t-1});  b_t = b (s_t - s_{t-1}) + (1 - b) b_{t-1}
      forecast x_{t+i} = s_t + i b_t,  i = 1..h;  initialised s = x_0, b = x_1 - x_0.
* ``MovingAverage3``: the artifact's active forecaster, an iterated moving average of
  length 3 (each step averages the last observations with the forecasts made so far).
* ``LastValue``: x_{t+i} = x_t.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


class Forecaster:
    def observe(self, x: float) -> None:
        raise NotImplementedError

    def forecast(self, h: int) -> list[float]:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """Every field (settings and what was observed), as JSON."""
        return asdict(self)  # type: ignore[call-overload]  # each forecaster is a dataclass

    def restore(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, list(value) if isinstance(value, list) else value)


@dataclass
class Holt(Forecaster):
    alpha: float = 0.67
    beta: float = 0.26
    level: float | None = None
    trend: float = 0.0
    seen: int = 0

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError("Holt needs 0 < alpha <= 1 and 0 <= beta <= 1")

    def observe(self, x: float) -> None:
        self.seen += 1
        if self.seen == 1:
            self.level = x  # s = x_0 until the second value gives the trend
            return
        assert self.level is not None
        if self.seen == 2:
            self.trend = x - self.level  # b = x_1 - x_0, then the regular update
        previous = self.level
        self.level = self.alpha * x + (1 - self.alpha) * (self.level + self.trend)
        self.trend = self.beta * (self.level - previous) + (1 - self.beta) * self.trend

    def forecast(self, h: int) -> list[float]:
        if self.level is None:
            raise ValueError("no observation yet")
        return [self.level + i * self.trend for i in range(1, h + 1)]


@dataclass
class MovingAverage3(Forecaster):
    history: list[float] = field(default_factory=list)

    def observe(self, x: float) -> None:
        self.history.append(x)
        del self.history[:-3]

    def forecast(self, h: int) -> list[float]:
        if not self.history:
            raise ValueError("no observation yet")
        window = list(self.history)
        out = []
        for _ in range(h):
            nxt = sum(window[-3:]) / len(window[-3:])
            out.append(nxt)
            window.append(nxt)
        return out


@dataclass
class LastValue(Forecaster):
    last: float | None = None

    def observe(self, x: float) -> None:
        self.last = x

    def forecast(self, h: int) -> list[float]:
        if self.last is None:
            raise ValueError("no observation yet")
        return [self.last] * h


def mape(actual: Sequence[float], predicted: Sequence[float]) -> float:
    """Mean absolute percentage error (%) over pairs with a non-zero actual value."""
    pairs = [(a, p) for a, p in zip(actual, predicted) if a != 0]
    if not pairs:
        return 0.0
    return 100.0 * sum(abs((a - p) / a) for a, p in pairs) / len(pairs)


FORECASTERS = {"holt": Holt, "ma3": MovingAverage3, "last": LastValue}
