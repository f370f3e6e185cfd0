"""Operator packages: where the Python operators a dataflow's ``python`` nodes name, and
the pipeline modules an ``app`` names, come from.

A package is any installed distribution that declares an entry point in the group
``streamwise.operators`` (``pyproject.toml``: ``[project.entry-points."streamwise.operators"]
mine = "my_package.ops:OPERATORS"``); its target is a list (or dict) of
:class:`base.PyOperator`: a row-wise pandas function with the input columns it
reads, the columns it adds with their types, its parameters (:class:`base.Param`: type,
default, bounds) and a docstring. A package declares pipeline modules
(:class:`base.PipelineModule`, a function ``build(spark, source, ctx)`` made one by
``@pipeline_module``) in the group ``streamwise.pipelines``, naming a module (all of
its pipeline modules) or one of them. An admin installs the package into Streamwise's environment
(``pip install -e``, a wheel); a definition can then name its operators but never
carries code.

The product's own catalogue (``catalogue.BUILTIN_OPERATORS``) is the first package,
loaded by the same code as an entry point would be (:data:`BUILTIN`). A package that
fails to import, or declares an operator that is not well formed or whose name another
package took first, is listed with its error (:func:`packages`) and contributes nothing;
it never stops the others from loading.

The registry is read once per process (a Spark Python worker imports what its tasks
name; an installed or upgraded package is seen by processes started after it).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import ModuleType
from functools import lru_cache
from importlib import import_module, metadata
from typing import Any

from pipelines.runtime.operators.base import PipelineModule, PyOperator, check_declared

ENTRY_POINT_GROUP = "streamwise.operators"
MODULE_GROUP = "streamwise.pipelines"
# The product's own operators, as an entry point of the product would name them.
BUILTIN = ("streamwise", "pipelines.runtime.operators.catalogue:BUILTIN_OPERATORS")
COLUMN_TYPES = ("long", "double", "string")
OPERATOR_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Package:
    """An installed operator package as the registry found it."""

    name: str  # the entry point's (the product's own: "streamwise")
    distribution: str  # the installed distribution that declares it
    version: str
    target: str  # module:attribute
    operators: tuple[str, ...]
    error: str | None = None
    modules: tuple[str, ...] = ()  # pipeline modules' paths (the group MODULE_GROUP)
    group: str = ENTRY_POINT_GROUP


class OperatorError(ValueError):
    """An operator a package declares that the registry cannot take."""


def check_operator(op: Any) -> PyOperator:
    """``op`` if it is a well-formed operator; OperatorError says what is wrong."""
    if not isinstance(op, PyOperator):
        raise OperatorError(f"{op!r} is not a PyOperator")
    where = f"operator {op.name!r}"
    if not isinstance(op.name, str) or not OPERATOR_NAME.match(op.name):
        raise OperatorError(f"{where}: a name is lower-case letters, digits and _ "
                            "(at most 63), starting with a letter")
    if not callable(op.fn):
        raise OperatorError(f"{where}: fn is not callable")
    _check_columns(where, op.needs, op.adds, "adds", "at least one column and its type")
    return replace(op, params=_declared(op.params, where))


def _check_columns(where: str, needs: Any, columns: Any, field: str, empty: str) -> None:
    """An operator's or a module's ``needs`` (column names) and its new columns."""
    if not isinstance(needs, tuple) or not all(isinstance(c, str) for c in needs):
        raise OperatorError(f"{where}: needs must be a tuple of column names")
    if not isinstance(columns, Mapping) or not columns:
        raise OperatorError(f"{where}: {field} must name {empty}")
    for column, kind in columns.items():
        if not isinstance(column, str) or not column.isidentifier() or kind not in COLUMN_TYPES:
            raise OperatorError(f"{where}: {field} {column!r}: {kind!r} (a column is an "
                                f"identifier of type {', '.join(COLUMN_TYPES)})")


def _declared(params: Any, where: str) -> dict[str, Any]:
    try:
        return check_declared(params, where)
    except ValueError as exc:
        raise OperatorError(str(exc)) from None


def check_module(module: Any) -> PipelineModule:
    """``module`` with its parameters as :class:`base.Param` if it is a well-formed
    pipeline module; OperatorError says what is wrong."""
    if not isinstance(module, PipelineModule):
        raise OperatorError(f"{module!r} is not a pipeline module (@pipeline_module)")
    if not callable(module.fn):
        raise OperatorError(f"{module!r}: build is not callable")
    where = f"pipeline module {module.path!r}"
    _check_columns(where, module.needs, module.columns, "columns",
                   "its output columns and types")
    missing = [k for k in module.key if k not in module.columns]
    if missing:
        raise OperatorError(f"{where}: key column {missing[0]!r} is not an output column")
    if module.key and not module.stateful:
        raise OperatorError(f"{where}: a keyed (update-mode) output is stateful")
    horizon = module.state_horizon_s
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(
            horizon, (int, float)) or not 0 <= horizon < 10**9):
        raise OperatorError(f"{where}: state_horizon_s must be seconds (>= 0) or None")
    return replace(module, params=_declared(module.params, where))


def _load(target: str | Callable[[], Any]) -> list[PyOperator]:
    if callable(target):
        found = target()
    else:
        module, _, attribute = target.partition(":")
        found = getattr(import_module(module), attribute) if attribute else import_module(module)
    if callable(found) and not isinstance(found, (list, tuple, dict)):
        found = found()  # a function that returns them
    items: Iterable[Any] = found.values() if isinstance(found, Mapping) else found
    return [check_operator(op) for op in items]


def _load_modules(target: str) -> list[PipelineModule]:
    module, _, attribute = target.partition(":")
    found: Any = import_module(module)
    if attribute:
        found = getattr(found, attribute)
    if isinstance(found, ModuleType):  # every pipeline module it defines
        items: Iterable[Any] = [v for v in vars(found).values()
                                if isinstance(v, PipelineModule)
                                and v.fn.__module__ == found.__name__]
    elif isinstance(found, PipelineModule):
        items = [found]
    else:
        items = found.values() if isinstance(found, Mapping) else found
    return [check_module(m) for m in items]


def _entry_points(group: str = ENTRY_POINT_GROUP) -> list[tuple[str, str, str, str]]:
    """(name, distribution, version, target) of every installed entry point of
    ``group``, the product's own operators first."""
    out = [(BUILTIN[0], "streamwise", "(this checkout)", BUILTIN[1])] \
        if group == ENTRY_POINT_GROUP else []
    for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        out.append((ep.name, dist.metadata["Name"] if dist else "?",
                    dist.version if dist else "?", ep.value))
    return out


@dataclass(frozen=True)
class _Registry:
    operators: dict[str, PyOperator]
    owner: dict[str, str]  # operator -> package
    modules: dict[str, PipelineModule]  # path -> module
    packages: tuple[Package, ...]


@lru_cache(maxsize=1)
def _registry() -> _Registry:
    operators: dict[str, PyOperator] = {}
    owner: dict[str, str] = {}
    found: list[Package] = []
    for name, dist, version, target in _entry_points():
        try:
            ops = _load(target)
            taken = [op.name for op in ops if op.name in operators]
            if taken:
                raise OperatorError(f"operator {taken[0]!r} is {owner[taken[0]]}'s already")
            if len({op.name for op in ops}) != len(ops):
                raise OperatorError("declares an operator name twice")
        except Exception as exc:  # noqa: BLE001 - any failure of a package's own code
            found.append(Package(name, dist, version, target, (),
                                 f"{type(exc).__name__}: {exc}"[:500]))
            continue
        for op in ops:
            operators[op.name] = op
            owner[op.name] = name
        found.append(Package(name, dist, version, target, tuple(op.name for op in ops)))
    modules: dict[str, PipelineModule] = {}
    for name, dist, version, target in _entry_points(MODULE_GROUP):
        try:
            mods = _load_modules(target)
            if not mods:
                raise OperatorError("declares no pipeline module")
            taken = [m.path for m in mods if m.path in modules]
            if taken:
                raise OperatorError(f"pipeline module {taken[0]!r} is declared already")
        except Exception as exc:  # noqa: BLE001 - any failure of a package's own code
            found.append(Package(name, dist, version, target, (),
                                 f"{type(exc).__name__}: {exc}"[:500], group=MODULE_GROUP))
            continue
        modules.update((m.path, m) for m in mods)
        found.append(Package(name, dist, version, target, (),
                             modules=tuple(m.path for m in mods), group=MODULE_GROUP))
    return _Registry(operators, owner, modules, tuple(found))


def operators() -> dict[str, PyOperator]:
    """Every installed operator by name."""
    return _registry().operators


def operator(name: str) -> PyOperator:
    """The installed operator ``name`` (KeyError if none is)."""
    return _registry().operators[name]


def package_of(name: str) -> str:
    """The package an installed operator comes from."""
    return _registry().owner[name]


def packages() -> tuple[Package, ...]:
    """Every package entry point found (operators and pipeline modules), with what it
    declares or the error that kept it out."""
    return _registry().packages


def modules() -> dict[str, PipelineModule]:
    """Every installed pipeline module by path (``package.module:function``)."""
    return _registry().modules


def module(path: str) -> PipelineModule:
    """The installed pipeline module at ``path`` (KeyError if none is)."""
    return _registry().modules[path]


def reload() -> None:
    """Read the installed packages again (after an install, in a long-lived process)."""
    _registry.cache_clear()
