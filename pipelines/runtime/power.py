"""Power and frequency readings for the metrics stream.

Two backends, chosen once per runner:

* **RAPL** (``/sys/class/powercap/intel-rapl:*/energy_uj``): measured package power
  from energy counter deltas, labelled ``measured``.
* **Model** otherwise, labelled ``modelled``: the thesis' dynamic CPU power model
  P ~ C_eff * n * f * V(f)^2 (thesis Eq. 6.11, §6.2.2), plus an optional static part.
  The thesis gives no C_eff and no voltage table (only relative values matter for
  ranking configurations); the constants below are stated assumptions, not readings.

The CPU frequency comes from ``cpufreq`` when the kernel exposes it, else from
``/proc/cpuinfo`` ("cpu MHz"), else the model's nominal value; the source is reported.
"""
from __future__ import annotations

import glob
import time
from dataclasses import dataclass
from pathlib import Path

# Assumed model constants (modelled, not measured): a per-core dynamic power of
# ~10 W at the nominal 2.4 GHz / 1.1 V point, and 0 W static (the thesis ignores it).
NOMINAL_GHZ = 2.4
NOMINAL_VOLT = 1.1
WATTS_PER_CORE_AT_NOMINAL = 10.0
C_EFF = WATTS_PER_CORE_AT_NOMINAL / (NOMINAL_GHZ * NOMINAL_VOLT**2)


def voltage_for(f_ghz: float) -> float:
    """A linear V(f) assumption between 0.8 V at 1.2 GHz and 1.1 V at 2.4 GHz."""
    return max(0.7, 0.8 + (f_ghz - 1.2) * (0.3 / 1.2))


def modelled_power(workers: int, f_ghz: float, static_w: float = 0.0) -> float:
    """Thesis Eq. 6.11: P = C_eff * n * f * V(f)^2 (+ static part)."""
    return static_w + C_EFF * workers * f_ghz * voltage_for(f_ghz) ** 2


def read_frequency_ghz() -> tuple[float, str]:
    """Current mean CPU frequency and where it came from."""
    cur = glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")
    if cur:
        vals = [int(Path(p).read_text()) for p in cur]
        return sum(vals) / len(vals) / 1e6, "cpufreq"
    try:
        mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text()
               .splitlines() if line.startswith("cpu MHz")]
        if mhz:
            return sum(mhz) / len(mhz) / 1000.0, "cpuinfo"
    except OSError:
        pass
    return NOMINAL_GHZ, "nominal"


@dataclass
class PowerReading:
    watts: float
    source: str  # "measured" or "modelled"


class PowerMeter:
    def __init__(self) -> None:
        self.rapl = [Path(p) for p in glob.glob("/sys/class/powercap/intel-rapl:[0-9]*/energy_uj")]
        self._last: tuple[float, int] | None = None
        if self.rapl:
            try:
                self._last = (time.monotonic(), self._energy_uj())
            except OSError:  # counters present but unreadable (not root)
                self.rapl = []

    def _energy_uj(self) -> int:
        return sum(int(p.read_text()) for p in self.rapl)

    def read(self, workers: int, f_ghz: float) -> PowerReading:
        if self.rapl and self._last is not None:
            now, energy = time.monotonic(), self._energy_uj()
            t0, e0 = self._last
            self._last = (now, energy)
            if now > t0 and energy >= e0:
                return PowerReading((energy - e0) / 1e6 / (now - t0), "measured")
        return PowerReading(modelled_power(workers, f_ghz), "modelled")
