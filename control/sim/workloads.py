"""Simulator workloads: rate traces and key distributions (thesis §7.1–7.2).

Rates are *triggering* tuples per second (thesis §6.2: only every δ-th tuple of a key
fires the window computation; the rest cost nothing), i.e. the trace's tuples/s times
``rate_scale`` (1/δ = 1/25 in shared memory).
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from control.workload import (
    WorkloadError,
    read_key_distribution,
    read_rate_trace,
    resolve_data_path,
)

RATE_KINDS = ("random_walk", "constant", "step", "sine", "spike", "trace")
KEY_KINDS = ("file", "zipf", "uniform")


class ScenarioError(ValueError):
    """A bad scenario, with a one-line message naming the field."""


def number(doc: dict, key: str, default: float | None = None, low: float | None = None,
           where: str = "", whole: bool = False, high: float | None = None) -> float:
    """``doc[key]`` (or ``default``) as a checked number; ScenarioError names the field."""
    value = doc.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float) \
            or not _finite(value):
        raise ScenarioError(f"{where}{key}: must be a number")
    if whole and int(value) != value:
        raise ScenarioError(f"{where}{key}: must be a whole number")
    if low is not None and value < low:
        raise ScenarioError(f"{where}{key}: must be >= {low}")
    if high is not None and value > high:
        raise ScenarioError(f"{where}{key}: must be <= {high}")
    return int(value) if whole else float(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # a whole number past a double's range
        return False


# The highest arrival rate a scenario may reach (tuples/s): the thesis' peak is 458K.
MAX_RATE = 1e12


def read_rate_file(path: Path) -> list[float]:
    """The shipped ``SECOND RATE`` trace, read by the runtime's own reader."""
    try:
        return read_rate_trace(path)
    except WorkloadError as exc:
        raise ScenarioError(str(exc)) from exc


def parse_csv_trace(text: str) -> list[float]:
    """An uploaded CSV: one rate per row (last column), header allowed."""
    rates = []
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:  # e.g. a field past csv's 131,072-character limit
            raise ScenarioError(f"trace row {reader.line_num}: not CSV ({exc})") from None
        i = reader.line_num - 1
        if not row or not row[-1].strip():
            continue
        try:
            value = float(row[-1])
        except ValueError:
            if i == 0:
                continue  # header
            raise ScenarioError(f"trace row {i + 1}: {row[-1]!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ScenarioError(f"trace row {i + 1}: rates must be finite and >= 0")
        rates.append(value)
    if not rates:
        raise ScenarioError("trace: no rates found")
    return rates


def rate_series(doc: dict, steps: int, step_s: float, rng: np.random.Generator) -> np.ndarray:
    """Tuples per second for each control step."""
    kind = doc.get("kind", "random_walk")
    w = "workload.rate."
    if kind not in RATE_KINDS:
        raise ScenarioError(f"{w}kind: one of {', '.join(RATE_KINDS)}")
    t = np.arange(steps) * step_s
    if kind == "random_walk":
        if "rates" in doc:
            base = _rates_list(doc["rates"], w + "rates")
        else:
            base = read_rate_file(resolve_data_path("elastic-hft/random_walk_rates"))
        idx = np.minimum((t // 1).astype(int), len(base) - 1)
        out = np.asarray(base, dtype=float)[idx]
    elif kind == "trace":
        base = _rates_list(doc.get("rates"), w + "rates")
        per = number(doc, "seconds_per_value", 1.0, 1e-9, w)
        idx = np.minimum((t / per).astype(int), len(base) - 1)
        out = np.asarray(base, dtype=float)[idx]
    elif kind == "constant":
        out = np.full(steps, number(doc, "rate", None, 0, w))
    elif kind == "step":
        before, after = number(doc, "before", None, 0, w), number(doc, "after", None, 0, w)
        at = number(doc, "at_s", None, 0, w)
        out = np.where(t < at, before, after)
    elif kind == "sine":
        base, amp = number(doc, "base", None, 0, w), number(doc, "amplitude", 0.0, 0, w)
        period = number(doc, "period_s", 60.0, 1e-9, w)
        out = np.maximum(base + amp * np.sin(2 * np.pi * t / period), 0.0)
    else:  # spike
        base, peak = number(doc, "base", None, 0, w), number(doc, "peak", None, 0, w)
        at, length = number(doc, "at_s", None, 0, w), number(doc, "length_s", 10.0, 0, w)
        out = np.where((t >= at) & (t < at + length), peak, base)
    scale = number(doc, "scale", 1.0, 0, w)
    noise = number(doc, "noise_cv", 0.0, 0, w)
    with np.errstate(over="ignore", invalid="ignore"):
        out = out * scale
    if not np.isfinite(out).all() or (len(out) and out.max() > MAX_RATE):
        raise ScenarioError(f"{w}scale: the rates reach {float(np.nanmax(out)):.3g} "
                            f"tuples/s; at most {MAX_RATE:.0e}")
    if noise > 0:
        out = np.maximum(out * (1 + noise * rng.standard_normal(steps)), 0.0)
    return out


def _rates_list(value: object, where: str) -> list[float]:
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{where}: need a non-empty list of rates")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ScenarioError(f"{where}[{i}]: rates must be finite numbers >= 0")
    return [float(v) for v in value]


def key_distribution(doc: dict) -> np.ndarray:
    """p_k for every key, summing to 1."""
    kind = doc.get("kind", "file")
    w = "workload.keys."
    if kind not in KEY_KINDS:
        raise ScenarioError(f"{w}kind: one of {', '.join(KEY_KINDS)}")
    if kind == "file":
        path = resolve_data_path("elastic-hft/probability_distribution")
        try:
            cdf = np.asarray(read_key_distribution(path).cdf)
        except WorkloadError as exc:
            raise ScenarioError(str(exc)) from exc
        weights = np.diff(np.concatenate(([0.0], cdf)))
    else:
        n = int(number(doc, "n", 2836, 1, w))
        if kind == "uniform":
            weights = np.ones(n)
        else:
            weights = 1.0 / np.arange(1, n + 1) ** number(doc, "s", 1.0, 0, w)
    if weights.sum() <= 0:
        raise ScenarioError(f"{w}: weights must not all be zero")
    return weights / weights.sum()


def service_times(doc: dict, keys: int, rng: np.random.Generator) -> np.ndarray:
    """Per-key computation time per triggering tuple at f_max (seconds)."""
    w = "workload.service."
    mean = number(doc, "mean_ms", 0.5, 1e-9, w) / 1e3
    cv = number(doc, "per_key_cv", 0.0, 0, w)
    if cv == 0:
        return np.full(keys, mean)
    sigma = math.sqrt(math.log(1 + cv * cv))
    t = rng.lognormal(-sigma * sigma / 2, sigma, keys) * mean
    return t


def drift_keys(p: np.ndarray, rng: np.random.Generator, fraction: float) -> np.ndarray:
    """Swap the popularity of ``fraction`` of the keys with random others (D2)."""
    if fraction <= 0:
        return p
    k = max(1, int(len(p) * fraction))
    a = rng.integers(0, len(p), k)
    b = rng.integers(0, len(p), k)
    q = p.copy()
    q[a], q[b] = p[b], p[a]
    return q
