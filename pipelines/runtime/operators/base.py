"""What a Python operator and a pipeline module are (the product's catalogue and every
package declare theirs with these: ``packages.py``)."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

Columns = dict[str, str]  # name -> dataflow type (long, double, string)
MAX_PARAM = 2**53  # parameters travel as JSON numbers
MAX_STRING_PARAM = 200


class ParamError(ValueError):
    """A definition's parameter that its operator or module does not accept, at
    ``field`` (the parameter's name)."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}")


@dataclass(frozen=True)
class Param:
    """A parameter an operator or a pipeline module takes: its type is its default's
    (an integer, a number, a string or true/false); ``lo``/``hi`` bound a number,
    ``choices`` a string; ``doc`` says what it does (the pipeline form shows it)."""

    default: int | float | str | bool
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    @property
    def kind(self) -> str:
        """integer, number, string or boolean (the JSON type a definition gives)."""
        if isinstance(self.default, bool):
            return "boolean"
        if isinstance(self.default, int):
            return "integer"
        if isinstance(self.default, float):
            return "number"
        return "string"

    def describe(self) -> str:
        """``21 (0..100)``, ``"eu" (eu, us)``: the default and what else is allowed."""
        if self.kind == "boolean":
            return "true" if self.default else "false"
        if self.kind == "string":
            shown = f'"{self.default}"'
            return f"{shown} ({', '.join(self.choices)})" if self.choices else shown
        lo = "" if self.lo is None else f"{self.lo:g}"
        hi = "" if self.hi is None else f"{self.hi:g}"
        return f"{self.default:g} ({lo}..{hi})" if lo or hi else f"{self.default:g}"

    def bounds(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"between {self.lo:g} and {self.hi:g}"
        if self.lo is not None:
            return f"at least {self.lo:g}"
        return f"at most {self.hi:g}" if self.hi is not None else "any value"

    def check(self, name: str, value: Any) -> int | float | str | bool:
        """``value`` as this parameter takes it; ParamError says why not."""
        kind = self.kind
        if kind == "boolean":
            if not isinstance(value, bool):
                raise ParamError(name, "must be true or false")
            return value
        if kind == "string":
            if not isinstance(value, str) or len(value) > MAX_STRING_PARAM:
                raise ParamError(name, f"must be a string of at most {MAX_STRING_PARAM} "
                                       "characters")
            if self.choices and value not in self.choices:
                raise ParamError(name, f"{value!r} is not one of: {', '.join(self.choices)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(name, f"must be {'an integer' if kind == 'integer' else 'a number'}")
        if kind == "integer":
            if isinstance(value, float):
                if not value.is_integer():
                    raise ParamError(name, "must be an integer")
                value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise ParamError(name, "must be a finite number")
        if abs(value) > MAX_PARAM:
            raise ParamError(name, f"must be within ±{MAX_PARAM}")
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise ParamError(name, f"must be {self.bounds()}, got {value:g}")
        return value


Params = dict[str, Param]


def as_param(spec: Any) -> Param:
    """A declared parameter: a :class:`Param`, or the older ``(default, lowest,
    highest)`` integers."""
    if isinstance(spec, Param):
        return spec
    if isinstance(spec, tuple) and len(spec) == 3:
        default, lo, hi = spec
        return Param(default, lo, hi)
    raise TypeError(f"{spec!r} is not a Param or a (default, lowest, highest) tuple")


def check_declared(params: Mapping[str, Any], where: str) -> Params:
    """Declared parameters, each well formed (its default within its own bounds);
    ValueError names the first that is not."""
    out: Params = {}
    for name, spec in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{where}: parameter {name!r} is not an identifier")
        try:
            param = as_param(spec)
            if param.kind in ("integer", "number"):
                for bound in (param.lo, param.hi):
                    if bound is not None and (isinstance(bound, bool) or not isinstance(
                            bound, (int, float)) or not math.isfinite(bound)
                            or abs(bound) > MAX_PARAM):
                        raise ValueError("its bounds must be finite numbers")
                if param.kind == "integer" and any(
                        isinstance(b, float) for b in (param.lo, param.hi)):
                    raise ValueError("an integer's bounds are integers")
            elif param.lo is not None or param.hi is not None:
                raise ValueError("only a number has bounds")
            if param.choices and (param.kind != "string" or not all(
                    isinstance(c, str) for c in param.choices)):
                raise ValueError("only a string has choices")
            param.check(name, param.default)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: parameter {name!r}: {exc}") from None
        out[name] = param
    return out


def resolve_params(declared: Params, given: Any) -> dict[str, Any]:
    """A definition's ``params`` against the declared ones: every declared parameter,
    given or defaulted. ParamError names the first that is unknown or out of bounds
    (field "" when ``given`` is not an object)."""
    if not isinstance(given, dict):
        raise ParamError("", "must be an object of parameter: value")
    unknown = [k for k in given if k not in declared]
    if unknown:
        allowed = ", ".join(declared) or "none"
        raise ParamError(str(unknown[0]), f"unknown parameter (parameters: {allowed})")
    return {name: param.check(name, given[name]) if name in given else param.default
            for name, param in declared.items()}


@dataclass(frozen=True)
class PyOperator:
    """A row-wise, deterministic pandas function: it reads ``needs``, appends (or
    replaces) ``adds`` in the frame it is given and returns it; its new columns depend
    only on the row and ``params`` (name -> :class:`Param`, or ``(default, lowest,
    highest)`` integers), so a pipeline's output does not depend on how its operators
    are grouped or partitioned. ``doc``: one line the pipeline form shows."""

    name: str
    needs: tuple[str, ...]  # input columns it reads
    adds: Columns  # columns it appends (name -> dataflow type)
    fn: Callable[[pd.DataFrame, dict[str, Any]], pd.DataFrame]
    params: dict[str, Any] = field(default_factory=dict)
    doc: str = ""


@dataclass(frozen=True)
class BuildContext:
    """What a pipeline module's ``build(spark, source, ctx)`` is given besides the
    source stream.

    ``key_groups``: the run's key groups, i.e. ``spark.sql.shuffle.partitions``: every
    stateful operator of the query (``groupBy(...).agg``, ``dropDuplicates``,
    ``transformWithState``) hashes its keys into these groups, and those groups are what
    Streamwise places on executors, migrates when it scales and rebalances. Keep the
    count as it is (the checkpoint fixes it at the first batch).
    ``params``: the definition's parameters, checked against the module's declared ones.
    ``watermark_s``: the pipeline's watermark delay on ``event_time`` (a module that
    keeps windows uses it: ``source.withWatermark("event_time", f"{ctx.watermark_s}
    seconds")``)."""

    key_groups: int
    params: dict[str, Any]
    watermark_s: int = 0
    trigger_ms: int = 0
    event_time: str = "event_time"


Build = Callable[[Any, Any, BuildContext], Any]  # (SparkSession, DataFrame, ctx) -> DataFrame


@dataclass(frozen=True)
class PipelineModule:
    """A pipeline written as a function of the user's package: ``build(spark, source,
    ctx)`` returns the streaming DataFrame to sink. Streamwise supplies the source, the
    sink, the metrics and the elastic runtime; the module declares what the product
    must know without running it:

    * ``needs``: the source columns it reads (checked against the chosen source);
    * ``columns``: its output columns and their types (the sink's table; checked
      against the DataFrame ``build`` returns when the run starts);
    * ``key``: for a keyed aggregation (Spark's *update* output mode), the output
      columns that identify a row, which the next update of the key replaces; empty for
      an append-only output;
    * ``stateful``: whether it keeps state across batches (its key groups are then
      placed and migrated); an update-mode module always does;
    * ``state_horizon_s``: how far back in event time its state reaches (a window's
      length plus the watermark), so that a live re-plan can rebuild it by replaying the
      source; None when it does not end (an aggregate over all time): such a run is
      scaled and rebalanced but not re-planned.
    """

    fn: Build
    needs: tuple[str, ...]
    columns: Columns
    key: tuple[str, ...] = ()
    stateful: bool = False
    state_horizon_s: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    doc: str = ""

    @property
    def path(self) -> str:
        """``package.module:function``: how a definition's ``app`` names it."""
        return f"{self.fn.__module__}:{self.fn.__name__}"

    @property
    def output_mode(self) -> str:
        return "update" if self.key else "append"

    def __call__(self, spark: Any, source: Any, ctx: BuildContext) -> Any:
        return self.fn(spark, source, ctx)


def pipeline_module(*, needs: tuple[str, ...], columns: Columns, key: tuple[str, ...] = (),
                    stateful: bool | None = None, state_horizon_s: float | None = None,
                    params: dict[str, Any] | None = None
                    ) -> Callable[[Build], PipelineModule]:
    """Declare ``build`` a pipeline module (its docstring is the module's doc)::

        @pipeline_module(needs=("key", "value"), key=("region",),
                         columns={"region": "long", "orders": "long"},
                         params={"regions": Param(4, 1, 1000)})
        def regional_orders(spark, source, ctx):
            ...
    """
    def wrap(fn: Build) -> PipelineModule:
        return PipelineModule(fn, tuple(needs), dict(columns), tuple(key),
                              bool(key) if stateful is None else stateful, state_horizon_s,
                              dict(params or {}), (fn.__doc__ or "").strip())
    return wrap
