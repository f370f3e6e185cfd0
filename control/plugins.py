"""Decision plug-ins: code installed as a package that reviews each decision of a
controller and may veto or change it, with a reason that is recorded (pure Python, no
Django). The Flink autoscaler's FLIP-575 plug-ins, in Streamwise's terms.

A package declares plug-ins through the entry point group ``streamwise.decision_plugins``
(as operator packages declare operators in ``streamwise.operators``); each entry point
names an object with

* ``name`` (str) and ``description`` (str), and
* ``review(proposal: Proposal) -> Verdict | None`` — None lets the decision through.

A policy lists the plug-ins its runs use (``Policy.decision_plugins``): installing a
package changes no run by itself. The product's control loop (``control.ticks``) and the
Strategy Lab's simulator (``control.sim``) both call :func:`review`, so a plug-in behaves
the same on a live run, in a dry run and in the Lab. A plug-in that raises vetoes
nothing: the decision goes on and the error is the recorded reason, so that a broken
plug-in cannot stop every run's controller.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import import_module, metadata
from typing import Any, Protocol

ENTRY_POINT_GROUP = "streamwise.decision_plugins"


class PluginError(ValueError):
    """A plug-in that is not installed or does not load (a clear message)."""


@dataclass(frozen=True)
class Proposal:
    """What a controller decided at one step, as a plug-in sees it."""

    run: str
    policy: str
    now: float  # epoch s: the step's time (simulated time in the Lab)
    current_workers: int
    chosen_workers: int
    current_freq_ghz: float
    chosen_freq_ghz: float
    action: str  # hold | scale | frequency | scale+frequency | rebalance
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def scales_down(self) -> bool:
        return self.chosen_workers < self.current_workers

    @property
    def scales_up(self) -> bool:
        return self.chosen_workers > self.current_workers


@dataclass(frozen=True)
class Verdict:
    """A plug-in's answer: a veto, or other workers than the controller chose."""

    reason: str
    veto: bool = True
    workers: int | None = None  # with veto=False: the workers to use instead

    @classmethod
    def change(cls, workers: int, reason: str) -> Verdict:
        return cls(reason=reason, veto=False, workers=workers)


class DecisionPlugin(Protocol):
    name: str
    description: str

    def review(self, proposal: Proposal) -> Verdict | None: ...


@dataclass(frozen=True)
class Installed:
    name: str
    distribution: str
    version: str
    target: str
    description: str = ""
    error: str = ""  # why it does not load


@dataclass(frozen=True)
class Review:
    """What the reviewing plug-ins made of a proposal, in order."""

    verdict: Verdict | None
    plugin: str | None
    notes: tuple[str, ...] = ()  # plug-ins that failed (their error), or let it through


def _target(value: str) -> Any:
    module, _, attribute = value.partition(":")
    found: Any = import_module(module)
    for part in filter(None, attribute.split(".")):
        found = getattr(found, part)
    return found


@lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, DecisionPlugin], tuple[Installed, ...]]:
    loaded: dict[str, DecisionPlugin] = {}
    listed: list[Installed] = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        where = (dist.metadata["Name"] if dist else "?", dist.version if dist else "?",
                 ep.value)
        try:
            plugin = _target(ep.value)
            if isinstance(plugin, type):
                plugin = plugin()
            if not callable(getattr(plugin, "review", None)):
                raise PluginError("has no review(proposal) method")
            if ep.name in loaded:
                raise PluginError(f"the name {ep.name!r} is declared twice")
        except Exception as exc:  # noqa: BLE001 - any failure of a package's own code
            listed.append(Installed(ep.name, *where, error=f"{type(exc).__name__}: {exc}"[:500]))
            continue
        loaded[ep.name] = plugin
        listed.append(Installed(ep.name, *where,
                                description=str(getattr(plugin, "description", ""))))
    return loaded, tuple(listed)


def installed() -> tuple[Installed, ...]:
    """Every installed plug-in, those that fail to load with their error."""
    return _registry()[1]


def load(names: Sequence[str]) -> list[DecisionPlugin]:
    """The named plug-ins, in order; PluginError naming the first that is not installed
    or does not load."""
    loaded, listed = _registry()
    errors = {i.name: i.error for i in listed if i.error}
    out = []
    for name in names:
        if name in errors:
            raise PluginError(f"plug-in {name!r} does not load: {errors[name]}")
        if name not in loaded:
            known = ", ".join(loaded) or "none is installed"
            raise PluginError(f"no decision plug-in {name!r} is installed ({known})")
        out.append(loaded[name])
    return out


def review(plugins: Sequence[DecisionPlugin], proposal: Proposal) -> Review:
    """Each plug-in in turn; the first veto or change wins. A plug-in that raises is
    noted and passed over."""
    notes = []
    for plugin in plugins:
        name = str(getattr(plugin, "name", type(plugin).__name__))
        try:
            verdict = plugin.review(proposal)
        except Exception as exc:  # noqa: BLE001 - a plug-in's own failure
            notes.append(f"plug-in {name} failed: {type(exc).__name__}: {exc}"[:300])
            continue
        if verdict is None:
            continue
        if not isinstance(verdict, Verdict) or (not verdict.veto and (
                not isinstance(verdict.workers, int) or verdict.workers < 1)):
            notes.append(f"plug-in {name} answered {verdict!r}, not a Verdict; ignored")
            continue
        return Review(verdict, name, tuple(notes))
    return Review(None, None, tuple(notes))
