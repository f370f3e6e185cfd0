"""Power and frequency readings for the metrics stream.

Two backends, chosen once per runner:

* **RAPL** (``/sys/class/powercap/intel-rapl:*/energy_uj``): measured package power
  from energy counter deltas, labelled ``measured``.
* **Model** otherwise, labelled ``modelled``: the thesis' dynamic CPU power model
  P ~ C_eff * n * f * V(f)^2 (thesis Eq. 6.11, §6.2.2), the control library's
  ``sysmodel.power_model()`` — the same model and constants as the simulator and the
  Strategy Lab. Its C_eff and voltages are stated assumptions, not readings.

The CPU frequency comes from ``cpufreq`` when the kernel exposes it, else from
``/proc/cpuinfo`` ("cpu MHz"), else the model's nominal value; the source is reported.
"""
from __future__ import annotations

import glob
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The frequency reported when neither cpufreq nor /proc/cpuinfo says one.
NOMINAL_GHZ = 2.4


def power_model() -> Any:
    """Thesis Eq. 6.11 as the control library's ``sysmodel.PowerModel``: what the
    controller predicts is what the chart shows, and what the simulator draws."""
    from control.sysmodel import power_model as shared

    return shared()


def modelled_power(workers: int, f_ghz: float, static_w: float = 0.0) -> float:
    """Thesis Eq. 6.11: P = C_eff * n * f * V(f)^2 (+ static part)."""
    return static_w + power_model().power(workers, f_ghz)


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


POWERCAP_ROOT = Path("/sys/class/powercap")


class PowerMeter:
    """RAPL package power (``intel-rapl:N/energy_uj`` deltas) where readable, labelled
    ``measured``; else the Eq. 6.11 model, labelled ``modelled``. ``root`` points at a
    fake powercap tree in tests. Counters wrap at ``max_energy_range_uj``."""

    def __init__(self, root: Path = POWERCAP_ROOT) -> None:
        self.zones = sorted(p for p in Path(root).glob("intel-rapl:[0-9]*")
                            if (p / "energy_uj").exists())
        self._ranges = {}
        self._last: tuple[float, list[int]] | None = None
        if self.zones:
            try:
                for z in self.zones:
                    rng = z / "max_energy_range_uj"
                    self._ranges[z] = int(rng.read_text()) if rng.exists() else 2**63
                self._last = (time.monotonic(), self._energy_uj())
            except (OSError, ValueError):  # counters present but unreadable (not root)
                self.zones = []

    @property
    def source(self) -> str:
        return "measured" if self.zones else "modelled"

    def _energy_uj(self) -> list[int]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def read(self, workers: int, f_ghz: float) -> PowerReading:
        if self.zones and self._last is not None:
            now, energy = time.monotonic(), self._energy_uj()
            t0, e0 = self._last
            self._last = (now, energy)
            if now > t0:
                joules = sum((e - b) if e >= b else (e + self._ranges[z] - b)
                             for z, e, b in zip(self.zones, energy, e0, strict=True)) / 1e6
                return PowerReading(joules / (now - t0), "measured")
        return PowerReading(modelled_power(workers, f_ghz), "modelled")
