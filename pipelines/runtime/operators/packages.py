"""Operator packages: where the Python operators a dataflow's ``python`` nodes name come
from.

A package is any installed distribution that declares an entry point in the group
``streamwise.operators`` (``pyproject.toml``: ``[project.entry-points."streamwise.operators"]
mine = "my_package.ops:OPERATORS"``); its target is a list (or dict) of
:class:`base.PyOperator`: a row-wise pandas function with the input columns it
reads, the columns it adds with their types, its integer parameters (default, lowest,
highest) and a docstring. An admin installs the package into Streamwise's environment
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
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module, metadata
from typing import Any

from pipelines.runtime.operators.base import PyOperator

ENTRY_POINT_GROUP = "streamwise.operators"
# The product's own operators, as an entry point of the product would name them.
BUILTIN = ("streamwise", "pipelines.runtime.operators.catalogue:BUILTIN_OPERATORS")
COLUMN_TYPES = ("long", "double", "string")
OPERATOR_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MAX_PARAM = 2**53  # parameters travel as JSON numbers


@dataclass(frozen=True)
class Package:
    """An installed operator package as the registry found it."""

    name: str  # the entry point's (the product's own: "streamwise")
    distribution: str  # the installed distribution that declares it
    version: str
    target: str  # module:attribute
    operators: tuple[str, ...]
    error: str | None = None


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
    if not isinstance(op.needs, tuple) or not all(isinstance(c, str) for c in op.needs):
        raise OperatorError(f"{where}: needs must be a tuple of column names")
    if not isinstance(op.adds, Mapping) or not op.adds:
        raise OperatorError(f"{where}: adds must name at least one column and its type")
    for column, kind in op.adds.items():
        if not isinstance(column, str) or not column.isidentifier() or kind not in COLUMN_TYPES:
            raise OperatorError(f"{where}: adds {column!r}: {kind!r} (a column is an "
                                f"identifier of type {', '.join(COLUMN_TYPES)})")
    for param, bounds in op.params.items():
        ok = (isinstance(param, str) and param.isidentifier() and isinstance(bounds, tuple)
              and len(bounds) == 3 and all(isinstance(b, int) and not isinstance(b, bool)
                                           and abs(b) <= MAX_PARAM for b in bounds))
        if not ok or not bounds[1] <= bounds[0] <= bounds[2]:
            raise OperatorError(f"{where}: parameter {param!r} must be (default, lowest, "
                                "highest) integers with lowest <= default <= highest")
    return op


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


def _entry_points() -> list[tuple[str, str, str, str]]:
    """(name, distribution, version, target) of every installed entry point of the
    group, the product's own first."""
    out = [(BUILTIN[0], "streamwise", "(this checkout)", BUILTIN[1])]
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        out.append((ep.name, dist.metadata["Name"] if dist else "?",
                    dist.version if dist else "?", ep.value))
    return out


@lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, PyOperator], dict[str, str], tuple[Package, ...]]:
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
    return operators, owner, tuple(found)


def operators() -> dict[str, PyOperator]:
    """Every installed operator by name."""
    return _registry()[0]


def operator(name: str) -> PyOperator:
    """The installed operator ``name`` (KeyError if none is)."""
    return _registry()[0][name]


def package_of(name: str) -> str:
    """The package an installed operator comes from."""
    return _registry()[1][name]


def packages() -> tuple[Package, ...]:
    """Every operator package found, with its operators or the error that kept it out."""
    return _registry()[2]


def reload() -> None:
    """Read the installed packages again (after an install, in a long-lived process)."""
    _registry.cache_clear()
