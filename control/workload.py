"""Deterministic, replayable workloads: rate schedules, key distributions, records.

Record ``i`` of a run is a pure function of ``(seed, i)``, so a run can be replayed and
verified:

* its **scheduled emission time** comes from the rate schedule: the schedule is a
  sequence of per-second rates ``r[s]`` (piecewise constant, like the thesis'
  ``random_walk_rates`` trace, one value per 1 s control step), so the number of
  records scheduled by time ``t`` is ``N(t) = cum[s] + (t - s) * r[s]`` and record ``i``
  is emitted at ``N^-1(i)``;
* its **key** is drawn from a discrete distribution by inverting the CDF at a
  counter-based hash of ``(seed, i)``;
* its **value** is a second hash of ``(seed, i)`` mapped to ``[0, 1000)``.

Because nothing depends on wall-clock order or on which executor generates the record,
any partitioning of ``[start, end)`` yields the same records, and a replay after a
reconfiguration produces the same input bit for bit. This module has no Spark and no
Django import so a verifier, a simulator or a notebook can use it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

# splitmix64 constants (Steele, Lea, Flood 2014): a counter-based generator whose
# output for counter i does not depend on any earlier output.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_KEY_STREAM = 0x6B6579  # "key": separates the key hash from the value hash
_VALUE_STREAM = 0x76616C  # "val"

# Wrap-around traces and random walks repeat with this period at most: long enough
# that a demo never sees the seam, short enough to precompute cheaply.
RANDOM_WALK_SECONDS = 3600
SINE_RESOLUTION_S = 1  # sine schedules are discretised to 1 s steps like the traces


def data_root() -> Path:
    """Where relative trace and key-distribution paths are found: STREAMWISE_DATA_ROOT,
    else the shipped data beside the checkout (``../shared/data``)."""
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    return Path(os.environ.get("STREAMWISE_DATA_ROOT", str(default)))


class WorkloadError(ValueError):
    """A schedule or distribution that cannot be built (bad file, bad numbers)."""


# The shipped files are a few KiB; a trace of a day at one rate a second is ~1 MiB.
MAX_DATA_FILE_BYTES = 16 * 1024 * 1024


def resolve_data_path(name: str | Path) -> Path:
    """A trace or key-distribution file named in a definition, as a path inside the data
    root: relative, no ``..``, still inside the root once links are followed, a regular
    file (not a device or a pipe) of at most ``MAX_DATA_FILE_BYTES``. A definition comes
    from a web form and the web process reads the file to validate it: nothing outside
    the root is opened, and a name outside it is refused before the file system is
    asked, so the answer says nothing about what exists there."""
    text = str(name)
    relative = Path(text)
    if relative.is_absolute() or ".." in relative.parts or "\0" in text:
        raise WorkloadError(f"cannot read {text!r}: data files are named relative to the "
                            "data root, without '..'")
    root = data_root().resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise WorkloadError(f"cannot read {text!r}: it leads outside the data root")
    if not path.is_file():
        raise WorkloadError(f"cannot read {text!r}: no such file in the data root")
    size = path.stat().st_size
    if size > MAX_DATA_FILE_BYTES:
        raise WorkloadError(f"cannot read {text!r}: {size:,} bytes, more than the "
                            f"{MAX_DATA_FILE_BYTES:,} a data file may have")
    return path


def splitmix64(counter: np.ndarray, stream: int, seed: int) -> np.ndarray:
    """Hash ``counter`` (uint64 array) for a given ``(seed, stream)`` to uint64."""
    with np.errstate(over="ignore"):
        base = np.uint64((seed * 0x100000001B3 + stream) & 0xFFFFFFFFFFFFFFFF)
        z = counter.astype(np.uint64) * _GOLDEN + base
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def unit_interval(bits: np.ndarray) -> np.ndarray:
    """Map uint64 hashes to doubles uniform in [0, 1) using the top 53 bits."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


# --------------------------------------------------------------------------- schedules
@dataclass(frozen=True)
class RateSchedule:
    """Per-second rates ``rates[s]`` (records/s) and what happens after the last one.

    ``tail == "hold"`` keeps the last rate forever; ``tail == "loop"`` repeats the
    sequence (traces, sine periods, random walks).
    """

    rates: tuple[float, ...]
    tail: str = "hold"

    def __post_init__(self) -> None:
        if not self.rates:
            raise WorkloadError("a rate schedule needs at least one rate")
        if any((not math.isfinite(r)) or r < 0 for r in self.rates):
            raise WorkloadError("rates must be finite and >= 0")
        if self.tail not in ("hold", "loop"):
            raise WorkloadError("tail must be 'hold' or 'loop'")
        if self.tail == "loop" and sum(self.rates) <= 0:
            raise WorkloadError("a looping schedule needs a positive total rate")
        if self.tail == "hold" and self.rates[-1] <= 0:
            raise WorkloadError("the last rate of a holding schedule must be > 0")

    @property
    def _cum(self) -> np.ndarray:
        return _cumulative(self.rates)

    def rate_at(self, t: float) -> float:
        """Scheduled rate (records/s) at ``t`` seconds after the run's start."""
        s = int(math.floor(max(t, 0.0)))
        n = len(self.rates)
        if s >= n:
            s = s % n if self.tail == "loop" else n - 1
        return float(self.rates[s])

    def records_by(self, t: float) -> int:
        """How many records are emitted by ``t``: those with ``i < N(t)``, ``ceil(N(t))``.

        Record i is emitted at ``inf{t: N(t) > i}`` (see ``emission_times``), so it
        becomes available right after its emission time, never before.
        """
        if t <= 0:
            return 0
        cum = self._cum
        n = len(self.rates)
        period_total = float(cum[-1])
        s = int(math.floor(t))
        base = 0.0
        if s >= n:
            if self.tail == "loop":
                periods, s = divmod(s, n)
                base = periods * period_total
                t = t - periods * n
            else:
                return int(math.ceil(period_total + (t - n) * self.rates[-1]))
        return int(math.ceil(base + cum[s] + (t - s) * self.rates[s]))

    def emission_times(self, seq: np.ndarray) -> np.ndarray:
        """Scheduled emission time (s after start) of each record index in ``seq``.

        The inverse of ``N(t)``: record ``i`` is emitted when ``N(t)`` reaches ``i``.
        """
        cum = self._cum
        n = len(self.rates)
        rates = np.asarray(self.rates, dtype=np.float64)
        x = seq.astype(np.float64)
        period_total = float(cum[-1])
        offset = np.zeros_like(x)
        if self.tail == "loop":
            periods = np.floor(x / period_total)
            x = x - periods * period_total
            offset = periods * n
        else:
            beyond = x >= period_total
            if beyond.any():
                out = np.empty_like(x)
                out[beyond] = n + (x[beyond] - period_total) / rates[-1]
                inside = ~beyond
                out[inside] = self._inverse_within(x[inside], cum, rates)
                return out
        return offset + self._inverse_within(x, cum, rates)

    @staticmethod
    def _inverse_within(x: np.ndarray, cum: np.ndarray, rates: np.ndarray) -> np.ndarray:
        # cum[s] <= x < cum[s+1]; seconds with rate 0 have cum[s] == cum[s+1] and are
        # skipped by side="right".
        s = np.searchsorted(cum, x, side="right") - 1
        s = np.clip(s, 0, len(rates) - 1)
        return s + (x - cum[s]) / np.where(rates[s] > 0, rates[s], 1.0)


@lru_cache(maxsize=64)
def _cumulative(rates: tuple[float, ...]) -> np.ndarray:
    cum = np.zeros(len(rates) + 1, dtype=np.float64)
    np.cumsum(np.asarray(rates, dtype=np.float64), out=cum[1:])
    return cum


def read_rate_trace(path: str | Path) -> list[float]:
    """Read a ``SECOND RATE`` trace (first line: count), e.g. ``random_walk_rates``."""
    try:
        lines = Path(path).read_text().split("\n")
    except OSError as exc:
        raise WorkloadError(f"cannot read rate trace {path}: {exc.strerror}") from exc
    rates: list[float] = []
    for lineno, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts or (lineno == 1 and len(parts) == 1):
            continue
        if len(parts) != 2:
            raise WorkloadError(f"{path}:{lineno}: expected 'SECOND RATE'")
        try:
            rates.append(float(parts[1]))
        except ValueError as exc:
            raise WorkloadError(f"{path}:{lineno}: rate is not a number") from exc
    if not rates:
        raise WorkloadError(f"{path}: no rates found")
    return rates


def random_walk_rates(seed: int, start: float, sigma: float, low: float, high: float,
                      seconds: int = RANDOM_WALK_SECONDS) -> list[float]:
    """A multiplicative random walk of per-second rates, clipped to [low, high]."""
    steps = unit_interval(splitmix64(np.arange(seconds, dtype=np.uint64), 0x7277, seed))
    rates = [start]
    for u in steps[1:]:
        # Uniform(-1, 1) increments scaled to standard deviation sigma.
        nxt = rates[-1] * (1.0 + sigma * math.sqrt(3.0) * (2.0 * float(u) - 1.0))
        rates.append(min(max(nxt, low), high))
    return rates


def sine_rates(base: float, amplitude: float, period_s: int) -> list[float]:
    """One period of ``base + amplitude * sin(2 pi t / period)``, sampled mid-second."""
    return [max(base + amplitude * math.sin(2 * math.pi * (s + 0.5) / period_s), 0.0)
            for s in range(0, period_s, SINE_RESOLUTION_S)]


# --------------------------------------------------------------------- key distributions
@dataclass(frozen=True)
class KeyDistribution:
    """A discrete distribution over keys ``0..n-1`` given by its CDF."""

    cdf: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.cdf)

    def sample(self, u: np.ndarray) -> np.ndarray:
        """Keys for uniforms ``u`` in [0, 1) (inverse-CDF sampling)."""
        cdf = _cdf_array(self.cdf)
        return np.minimum(np.searchsorted(cdf, u, side="right"), self.n - 1).astype(np.int64)

    def probabilities(self) -> np.ndarray:
        cdf = _cdf_array(self.cdf)
        return np.diff(np.concatenate(([0.0], cdf)))


@lru_cache(maxsize=16)
def _cdf_array(cdf: tuple[float, ...]) -> np.ndarray:
    return np.asarray(cdf, dtype=np.float64)


def distribution_from_weights(weights: list[float] | np.ndarray) -> KeyDistribution:
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise WorkloadError("key weights must be finite, >= 0 and not all zero")
    cdf = np.cumsum(w / w.sum())
    cdf[-1] = 1.0
    return KeyDistribution(tuple(float(c) for c in cdf))


def uniform_keys(n: int) -> KeyDistribution:
    return distribution_from_weights(np.ones(n))


def zipf_keys(n: int, s: float) -> KeyDistribution:
    """Zipf(s) over n keys: P(k) proportional to 1 / (k+1)^s."""
    return distribution_from_weights(1.0 / np.arange(1, n + 1, dtype=np.float64) ** s)


def read_key_distribution(path: str | Path) -> KeyDistribution:
    """Read the artifact format: ``N D`` then ``d p_0 ... p_{N-1}`` (first one used)."""
    try:
        lines = [ln.split() for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError as exc:
        raise WorkloadError(f"cannot read key distribution {path}: {exc.strerror}") from exc
    if len(lines) < 2 or len(lines[0]) < 1:
        raise WorkloadError(f"{path}: expected a header 'N D' and one distribution line")
    try:
        n = int(lines[0][0])
        weights = [float(x) for x in lines[1][1:]]
    except ValueError as exc:
        raise WorkloadError(f"{path}: not numbers") from exc
    if len(weights) != n:
        raise WorkloadError(f"{path}: header says {n} keys, line has {len(weights)}")
    return distribution_from_weights(weights)


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Records:
    """A column batch of generated records."""

    seq: np.ndarray  # int64 record index i
    key: np.ndarray  # int64 key id
    value: np.ndarray  # float64 in [0, 1000)
    emit_ts: np.ndarray  # float64 epoch seconds: scheduled emission time


def generate(seed: int, start: int, end: int, schedule: RateSchedule,
             keys: KeyDistribution, t0: float) -> Records:
    """Records ``start <= i < end`` of a run that started at epoch ``t0``."""
    seq = np.arange(start, end, dtype=np.int64)
    useq = seq.astype(np.uint64)
    key = keys.sample(unit_interval(splitmix64(useq, _KEY_STREAM, seed)))
    value = unit_interval(splitmix64(useq, _VALUE_STREAM, seed)) * 1000.0
    emit_ts = t0 + schedule.emission_times(seq)
    return Records(seq=seq, key=key, value=value, emit_ts=emit_ts)
