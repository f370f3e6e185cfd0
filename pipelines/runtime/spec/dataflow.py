"""Dataflow pipelines: a DAG of named operators with explicit inputs (validation, no Spark).

A dataflow definition lists ``nodes``; each names its ``input`` (or ``left`` and
``right``) by id::

    {"nodes": [
       {"id": "events", "type": "nexmark", "partitions": 2,
        "rate": {"kind": "constant", "records_per_s": 2000}},
       {"id": "bids", "type": "filter", "input": "events", "where": "type == 'bid'"},
       {"id": "euro", "type": "project", "input": "bids",
        "columns": {"auction": "auction", "price": "price * 89 // 100"}},
       {"id": "out", "type": "sink", "input": "euro", "keep_output": true}],
     "key_groups": 8}

Node types: sources ``generator`` (the keyed record generator), ``nexmark`` (Beam's
NEXMark events, ``pipelines.nexmark``) and the brokers' streams ``redis_stream`` and
``jetstream`` (``connectors/``: records of declared ``fields``, or ``"events":
"nexmark"``, NEXMark events as the feeder publishes them); stateless ``filter`` (``where``), ``project``
(``columns``: name -> expression) and ``python`` (a named pandas operator of
``pyops.py``; the definition's ``plan`` groups them into processing elements); stateful ``keyed_aggregate`` (no window; the query
then runs in update mode), ``window_aggregate`` (tumbling, sliding or session windows
on event time), ``window_top`` (per window, the rows at the highest value of a column,
ties kept), ``join`` (stream–stream inner join on keys, bounded in event time by an
interval or by a common tumbling window) and ``moving_mean`` (per key, the mean of the
latest N values by an order: ``moving_mean.py``, a ``transformWithState`` operator);
one ``sink`` (with ``to``: a PostgreSQL table, a Parquet folder or a Redis stream as well
as the run's kept output). Aggregates: ``count``, ``sum``, ``min``, ``max``, ``mean`` and
``max_by`` (``["max_by", value, order]``: the value on the row with the greatest order).

Expressions are Python-syntax formulas over the input's columns — arithmetic
(``+ - * / // %``), comparisons, ``and``/``or``/``not``, ``in (…)`` over literals,
``a if cond else b`` (``None``: null), ``x is None`` / ``x is not None`` —
parsed here with :mod:`ast` and compiled to Spark columns (``dataflow_spark.py``); no
function call or attribute is accepted, so a definition cannot reach Spark's SQL
functions that call into the JVM.

Every node knows its output columns, so an error names the node, the field and what is
wrong (``nodes[3] (q2).where: unknown column 'auctoin'``). Shapes Spark refuses are
refused here with Spark's reason: several stateful operators run in one query only in
append mode (Spark ≥ 3.4), so a ``keyed_aggregate`` (update mode) must be the only
stateful node.
"""
from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

SOURCE_TYPES = ("generator", "nexmark", "redis_stream", "jetstream")
BROKER_SOURCE_TYPES = ("redis_stream", "jetstream")
STATELESS_TYPES = ("filter", "project", "python")
STATEFUL_TYPES = ("keyed_aggregate", "window_aggregate", "window_top", "join", "moving_mean")
# A pipeline module (the user's own code, ``operators/base.py``): stateful or not as it
# declares.
APP_TYPE = "app"
NODE_TYPES = SOURCE_TYPES + STATELESS_TYPES + STATEFUL_TYPES + (APP_TYPE, "sink")
AGGREGATES = ("count", "sum", "min", "max", "mean", "max_by")
WINDOW_KINDS = ("tumbling", "sliding", "session")
MAX_NODES = 64
# Spark expands each row into size_s / slide_s sliding windows before it aggregates:
# the batch's rows, shuffle and state all grow by that factor (Q5's 10 s by 2 s is 5).
MAX_WINDOWS_PER_ROW = 100

# Columns every row carries from its source: the scheduled emission time (latency) and
# the event time (windows and watermarks).
TIME_COLUMNS = {"emit_ts": "double", "event_time": "timestamp"}
GENERATOR_COLUMNS = {"seq": "long", "key": "long", "value": "double", **TIME_COLUMNS}
NEXMARK_COLUMNS = {
    "seq": "long", "type": "string",
    # person and auction
    "id": "long", "name": "string", "emailAddress": "string", "creditCard": "string",
    "city": "string", "state": "string", "itemName": "string", "description": "string",
    "initialBid": "long", "reserve": "long", "expires": "long", "seller": "long",
    "category": "long",
    # bid
    "auction": "long", "bidder": "long", "price": "long",
    "dateTime": "long", "extra": "string", **TIME_COLUMNS,
}


class GraphError(ValueError):
    """A problem at ``path`` (e.g. ``nodes[2] (bids).where``)."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


Columns = dict[str, str]  # name -> type (long, double, string, timestamp, window)


@dataclass(frozen=True)
class Window:
    kind: str
    size_s: int = 0
    slide_s: int = 0
    gap_s: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "session":
            out["gap_s"] = self.gap_s
        else:
            out["size_s"] = self.size_s
            if self.kind == "sliding":
                out["slide_s"] = self.slide_s
        return out


@dataclass(frozen=True)
class Node:
    id: str
    type: str
    path: str  # where it is in the document, for errors
    inputs: tuple[str, ...]
    params: dict[str, Any]
    columns: Columns = field(default_factory=dict)

    @property
    def stateful(self) -> bool:
        return self.type in STATEFUL_TYPES or (self.type == APP_TYPE
                                               and bool(self.params.get("stateful")))


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]  # in an order where every input comes first

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    @property
    def source(self) -> Node:
        return next(n for n in self.nodes if n.type in SOURCE_TYPES)

    @property
    def sink(self) -> Node:
        return next(n for n in self.nodes if n.type == "sink")

    @property
    def stateful(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.stateful)

    @property
    def output_mode(self) -> str:
        return "update" if any(n.type == "keyed_aggregate" or n.params.get("key")
                               and n.type == APP_TYPE for n in self.nodes) else "append"

    def edges(self) -> list[tuple[str, str]]:
        return [(i, n.id) for n in self.nodes for i in n.inputs]

    def ancestors(self, node_id: str) -> list[Node]:
        """Every node ``node_id`` reads from, directly or not."""
        seen: dict[str, Node] = {}
        stack = list(self.node(node_id).inputs)
        while stack:
            upstream = self.node(stack.pop())
            if upstream.id not in seen:
                seen[upstream.id] = upstream
                stack.extend(upstream.inputs)
        return list(seen.values())

    def state_horizon(self, watermark_s: float) -> tuple[float | None, str]:
        """How far back in event time the query's state reaches at any instant, in
        seconds (an upper bound: every stateful operator's extent plus a watermark
        delay each), or None and the reason when it does not end (a key's aggregate
        over all time, a session, a re-stamped event time). A re-plan rebuilds the
        state by replaying that far (``replan.replay_start``)."""
        total = float(watermark_s)
        for node in self.nodes:
            p = node.params
            if node.type == "project" and "event_time" in p:
                return None, (f"{node.id} re-stamps the event time, so records' event "
                              "times no longer follow their order")
            if not node.stateful:
                continue
            if node.type in ("keyed_aggregate", "moving_mean"):
                return None, f"{node.id} ({node.type}) keeps state for all time"
            if node.type == APP_TYPE:
                if p.get("state_horizon_s") is None:
                    return None, (f"{node.id} ({p['app']}) declares no state horizon (how "
                                  "far back in event time its state reaches)")
                total += p["state_horizon_s"]
                continue
            if "within" in p:
                total += abs(p["within"]["upper_s"]) + abs(p["within"]["lower_s"])
            elif "window" in p:
                if p["window"].get("size_s") is None:
                    return None, f"{node.id}'s session windows have no bounded extent"
                total += p["window"]["size_s"]
            total += watermark_s
        return total, ""

    def output_lag_ms(self) -> int:
        """How far the sink's results may trail the query's watermark: a stateful
        operator feeding another passes on a watermark held back by what it may still
        emit (a join by its time range, a window by its length). An upper bound, so a
        check of the results behind ``watermark - lag`` only sees final ones."""
        feeding = {a.id for node in self.stateful for a in self.ancestors(node.id)
                   if a.stateful}
        lag_s = 0
        for node_id in feeding:
            p = self.node(node_id).params
            if "within" in p:
                lag_s += p["within"]["upper_s"] - p["within"]["lower_s"]
            elif "window" in p:
                lag_s += p["window"].get("size_s") or p["window"].get("gap_s", 0)
        return lag_s * 1000


# ------------------------------------------------------------------- expressions
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
            ast.GtE: ">=", ast.In: "in", ast.NotIn: "not in"}


def parse_expression(text: Any, columns: Columns, path: str) -> ast.expr:
    """Parse and check an expression over ``columns``; the tree is what the Spark
    compiler walks."""
    if not isinstance(text, str) or not text.strip():
        raise GraphError(path, "must be an expression (a non-empty string)")
    if len(text) > 2000:
        raise GraphError(path, "is longer than 2000 characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise GraphError(path, f"is not a valid expression ({exc.msg}, column "
                               f"{exc.offset})") from None
    except (RecursionError, MemoryError, ValueError):  # nested beyond the parser
        raise GraphError(path, f"nests deeper than {MAX_EXPRESSION_DEPTH} levels") from None
    _check_size(tree, path)
    _check(tree, columns, path)
    return tree


# What one expression may hold: the walkers of its tree (this checker, the Spark
# compiler, the verifier) recurse once per level, and a filter or a projection is a
# few terms in practice, and a deeper tree would exhaust their recursion.
MAX_EXPRESSION_DEPTH = 32
MAX_EXPRESSION_NODES = 256
# Spark's long: an integer literal outside it is no number Spark holds.
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1


def _check_size(tree: ast.expr, path: str) -> None:
    """Depth and size first, without recursion; then literals Spark can hold."""
    stack, seen = [(tree, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_EXPRESSION_DEPTH:
            raise GraphError(path, f"nests deeper than {MAX_EXPRESSION_DEPTH} levels")
        if seen > MAX_EXPRESSION_NODES:
            raise GraphError(path, f"has more than {MAX_EXPRESSION_NODES} terms")
        if isinstance(node, ast.Constant) and isinstance(node.value, int) \
                and not isinstance(node.value, bool) \
                and not LONG_MIN <= node.value <= LONG_MAX:
            raise GraphError(path, f"the integer {node.value} is outside a long's range")
        if isinstance(node, ast.Constant) and isinstance(node.value, float) \
                and not math.isfinite(node.value):
            raise GraphError(path, "a number literal must be finite")
        if isinstance(node, ast.BinOp) and any(
                isinstance(side, ast.Constant) and isinstance(side.value, str)
                for side in (node.left, node.right)):
            # Spark's + - * / on a string casts it to a number; Python would repeat or
            # join it ('a' * 10**9 took 1 GB in the verifier): neither is meant.
            raise GraphError(path, "arithmetic takes numbers, not a string literal")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool))


def _none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


# Column types an expression may only test for null: Spark (ANSI mode) refuses a
# timestamp or a window struct in arithmetic and in a comparison with a number, and
# the verifier's pandas reference could not follow it there either.
_OPAQUE_TYPES = ("timestamp", "window")


# What an expression's value is, as the checker sees it: Spark casts between these
# only implicitly, and under ANSI mode a failed cast fails the query (a string that
# is no number, compared with one), so the checker refuses the mixtures instead.
_KIND_OF_TYPE = {"long": "number", "double": "number", "string": "string",
                 "boolean": "boolean"}


def _literal_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    return "string" if isinstance(value, str) else "number"


def _check(node: ast.expr, columns: Columns, path: str) -> str:
    """Check ``node`` over ``columns``; its kind: number, string, boolean, or null (a
    branch's ``None``)."""
    for kind, check in _CHECKS:
        if isinstance(node, kind):
            return check(node, columns, path)
    if _literal(node):
        assert isinstance(node, ast.Constant)
        return _literal_kind(node.value)
    what = type(node).__name__
    if isinstance(node, ast.Compare):
        what = "a chained comparison (write a < b and b < c)"
    elif isinstance(node, (ast.Call, ast.Attribute)):
        what = "a function call or attribute (not allowed)"
    raise GraphError(path, f"{what} is not supported here")


def _check_name(node: ast.Name, columns: Columns, path: str) -> str:
    if node.id not in columns:
        raise GraphError(path, f"unknown column {node.id!r} (columns: "
                               f"{', '.join(sorted(columns))})")
    if columns[node.id] not in _KIND_OF_TYPE:
        hint = " (emit_ts holds the same instant in epoch seconds)" \
            if node.id == "event_time" and "emit_ts" in columns else ""
        raise GraphError(path, f"{node.id} is a {columns[node.id]}: an expression may "
                               f"only test it with 'is None' / 'is not None'{hint}")
    return _KIND_OF_TYPE[columns[node.id]]


def _check_arithmetic(node: ast.BinOp, columns: Columns, path: str) -> str:
    if type(node.op) not in _BINARY:
        raise GraphError(path, f"{type(node.op).__name__} is not supported here")
    for side in (node.left, node.right):
        if _check(side, columns, path) != "number":
            raise GraphError(path, f"{_BINARY[type(node.op)]} takes numbers: "
                                   f"{ast.unparse(side)[:60]} is not one")
    return "number"


def _check_unary(node: ast.UnaryOp, columns: Columns, path: str) -> str:
    if not isinstance(node.op, (ast.Not, ast.USub)):
        raise GraphError(path, f"{type(node.op).__name__} is not supported here")
    want = "boolean" if isinstance(node.op, ast.Not) else "number"
    if _check(node.operand, columns, path) != want:
        raise GraphError(path, f"{'not' if want == 'boolean' else '-'} takes a "
                               f"{want}: {ast.unparse(node.operand)[:60]} is not one")
    return want


def _check_logic(node: ast.BoolOp, columns: Columns, path: str) -> str:
    for value in node.values:
        if _check(value, columns, path) != "boolean":
            raise GraphError(path, f"and/or take conditions: {ast.unparse(value)[:60]} "
                                   "is not true or false")
    return "boolean"


def _check_if(node: ast.IfExp, columns: Columns, path: str) -> str:
    """``a if cond else b`` (a branch may be None: null)."""
    if _check(node.test, columns, path) != "boolean":
        raise GraphError(path, f"the condition of 'if' must be true or false: "
                               f"{ast.unparse(node.test)[:60]} is not")
    kinds = {_check(b, columns, path) for b in (node.body, node.orelse) if not _none(b)}
    if len(kinds) > 1:
        raise GraphError(path, "both branches of 'a if c else b' must be of one kind "
                               f"(got {' and '.join(sorted(kinds))})")
    return kinds.pop() if kinds else "null"


def _check_compare(node: ast.Compare, columns: Columns, path: str) -> str:
    if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Is, ast.IsNot, *_COMPARE)):
        what = ("a chained comparison (write a < b and b < c)" if len(node.ops) > 1
                else f"{type(node.ops[0]).__name__}")
        raise GraphError(path, f"{what} is not supported here")
    op, right = node.ops[0], node.comparators[0]
    if isinstance(op, (ast.Is, ast.IsNot)):
        if not _none(right):
            raise GraphError(path, "'is' compares with None only (x is None, x is not None)")
        if not (isinstance(node.left, ast.Name) and node.left.id in columns):
            _check(node.left, columns, path)  # a column of any type may be tested for null
        return "boolean"
    left = _check(node.left, columns, path)
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(right, (ast.Tuple, ast.List)) or not right.elts \
                or not all(_literal(e) for e in right.elts):
            raise GraphError(path, "'in' takes a list of literals, e.g. state in ('OR', 'ID')")
        kinds = {_literal_kind(e.value) for e in right.elts}  # type: ignore[attr-defined]
        if kinds != {left}:
            raise GraphError(path, f"'in' compares a {left} with literals of its kind "
                                   f"(got {', '.join(sorted(kinds))})")
    elif left != _check(right, columns, path) or left == "null":
        raise GraphError(path, f"{_COMPARE[type(op)]} compares values of one kind: "
                               f"{ast.unparse(node)[:80]} mixes them")
    return "boolean"


_CHECKS: tuple[tuple[type, Callable[[Any, Columns, str], str]], ...] = (
    (ast.Name, _check_name), (ast.BinOp, _check_arithmetic), (ast.UnaryOp, _check_unary),
    (ast.BoolOp, _check_logic), (ast.IfExp, _check_if), (ast.Compare, _check_compare))


def condition_kind(tree: ast.expr, columns: Columns) -> str:
    """The kind of a checked expression (number, string, boolean or null)."""
    return _check(tree, columns, "")


def expression_type(node: ast.expr, columns: Columns) -> str:
    """Best-effort result type (for the output schema of ``project``)."""
    if isinstance(node, ast.Name):
        return columns[node.id]
    if isinstance(node, ast.Constant):
        return {bool: "boolean", int: "long", float: "double", str: "string"}[
            type(node.value)]
    if isinstance(node, (ast.Compare, ast.BoolOp)) or \
            (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return "boolean"
    if isinstance(node, ast.UnaryOp):
        return expression_type(node.operand, columns)
    if isinstance(node, ast.IfExp):
        branch = node.orelse if _none(node.body) else node.body
        return "long" if _none(branch) else expression_type(branch, columns)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Div):
            return "double"
        types = {expression_type(node.left, columns), expression_type(node.right, columns)}
        return "double" if "double" in types else "long"
    return "double"


# ----------------------------------------------------------------------- helpers
def _obj(doc: Any, path: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise GraphError(path, "must be an object")
    return doc


def _allowed(doc: dict[str, Any], path: str, allowed: set[str]) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise GraphError(f"{path}.{unknown[0]}",
                         f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _int(doc: dict[str, Any], key: str, path: str, lo: int, hi: int,
         default: int | None = None) -> int:
    if key not in doc:
        if default is None:
            raise GraphError(f"{path}.{key}", "is required")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise GraphError(f"{path}.{key}", f"must be a whole number in {lo}..{hi}, got "
                                          f"{json.dumps(value)}")
    return value


def _columns_list(doc: dict[str, Any], key: str, path: str, columns: Columns,
                  default: list[str] | None = None) -> list[str]:
    raw = doc.get(key, default)
    if raw is None:
        raise GraphError(f"{path}.{key}", "is required (a list of column names)")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise GraphError(f"{path}.{key}", "must be a list of column names")
    for c in raw:
        if c not in columns:
            raise GraphError(f"{path}.{key}", f"unknown column {c!r} (columns: "
                                              f"{', '.join(sorted(columns))})")
    return list(raw)


def _window(doc: Any, path: str) -> Window:
    doc = _obj(doc, path)
    kind = doc.get("kind")
    if kind not in WINDOW_KINDS:
        raise GraphError(f"{path}.kind", f"{json.dumps(kind)} is not one of: "
                                         f"{', '.join(WINDOW_KINDS)}")
    if kind == "session":
        _allowed(doc, path, {"kind", "gap_s"})
        return Window(kind, gap_s=_int(doc, "gap_s", path, 1, 86_400))
    if kind == "tumbling":
        _allowed(doc, path, {"kind", "size_s"})
        return Window(kind, size_s=_int(doc, "size_s", path, 1, 86_400))
    _allowed(doc, path, {"kind", "size_s", "slide_s"})
    size = _int(doc, "size_s", path, 1, 86_400)
    slide = _int(doc, "slide_s", path, 1, size)
    if size % slide:
        raise GraphError(f"{path}.slide_s", f"must divide size_s ({size}) so that every "
                                            "window holds whole slides")
    if size // slide > MAX_WINDOWS_PER_ROW:
        raise GraphError(f"{path}.slide_s", f"makes {size // slide:,} windows of every row "
                         f"(size_s / slide_s); at most {MAX_WINDOWS_PER_ROW}: slide by at "
                         f"least {-(-size // MAX_WINDOWS_PER_ROW)} s")
    return Window(kind, size_s=size, slide_s=slide)


# Columns an aggregating node writes itself (or that carry the time every row has):
# an aggregate of that name would make a second column of it, which Spark refuses.
AGGREGATE_RESERVED = ("window", "windowStart", *TIME_COLUMNS)


def _aggregates(doc: dict[str, Any], path: str, columns: Columns,
                key: list[str]) -> dict[str, tuple[str, ...]]:
    """``{output: [function, column]}`` (``["count"]`` alone; ``["max_by", value,
    order]``) as ``{output: (function, column[, order])}``; no output named like a key
    column or a column the node writes itself."""
    raw = doc.get("aggregates")
    if not isinstance(raw, dict) or not raw:
        raise GraphError(f"{path}.aggregates", "must be an object {output: [function, "
                                               "column]}, e.g. {\"bids\": [\"count\"]}")
    out: dict[str, tuple[str, ...]] = {}
    for name, spec in raw.items():
        where = f"{path}.aggregates.{name}"
        if not name.isidentifier():
            raise GraphError(where, "an output name must be an identifier")
        if name in key or name in AGGREGATE_RESERVED:
            what = "a key column" if name in key else "a column this node writes itself"
            raise GraphError(where, f"{name!r} is {what}: name the aggregate otherwise")
        if isinstance(spec, str):
            spec = [spec]
        if not isinstance(spec, list) or not 1 <= len(spec) <= 3 \
                or not all(isinstance(part, str) for part in spec) or spec[0] not in AGGREGATES:
            raise GraphError(where, f"must be [function, column] with a function in "
                                    f"{', '.join(AGGREGATES)}")
        if spec[0] == "count" and len(spec) == 1:
            out[name] = ("count", "")
            continue
        arity = 3 if spec[0] == "max_by" else 2
        if len(spec) != arity or not all(c in columns for c in spec[1:]):
            shape = "[max_by, value column, order column]" if arity == 3 else \
                f"[{spec[0]}, column]"
            raise GraphError(where, f"must be {shape} over the input's columns (columns: "
                                    f"{', '.join(sorted(columns))})")
        if arity == 3 and columns[spec[2]] not in ("long", "double"):
            raise GraphError(where, f"the order column {spec[2]!r} must be numeric")
        out[name] = tuple(spec)
    return out


def _aggregate_type(fn: str) -> str:
    return "long" if fn == "count" else "double"  # the rest: doubles (Spark casts)


# --------------------------------------------------------------------- the graph
NodeBuilder = Callable[[dict[str, Any], str, list[Node]], tuple[dict[str, Any], Columns]]


def _source(doc: dict[str, Any], path: str, _inputs: list[Node],
            validate_source: Callable[[dict[str, Any], str], dict[str, Any]]
            ) -> tuple[dict[str, Any], Columns]:
    params = validate_source(doc, path)
    if doc["type"] == "generator":
        columns = GENERATOR_COLUMNS
    elif doc["type"] == "nexmark" or params.get("events") == "nexmark":
        columns = NEXMARK_COLUMNS
    else:  # a stream's declared fields; event time is the broker's timestamp
        columns = {"seq": "long", **params["fields"], **TIME_COLUMNS}
    return params, dict(columns)


def _filter(doc: dict[str, Any], path: str, inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    _allowed(doc, path, {"id", "type", "input", "where"})
    tree = parse_expression(doc.get("where"), inputs[0].columns, f"{path}.where")
    if condition_kind(tree, inputs[0].columns) != "boolean":
        raise GraphError(f"{path}.where", "must be a condition (true or false), e.g. "
                                          "price > 100")
    return {"where": doc["where"]}, dict(inputs[0].columns)


def _project(doc: dict[str, Any], path: str, inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    """Computed columns; ``event_time`` (optional, an expression in epoch ms) re-stamps
    the rows' event time, e.g. an auction's to its closing time ``expires``."""
    _allowed(doc, path, {"id", "type", "input", "columns", "event_time"})
    raw = doc.get("columns")
    if not isinstance(raw, dict) or not raw:
        raise GraphError(f"{path}.columns", "must be an object {output column: expression}")
    src = inputs[0].columns
    out: Columns = {}
    for name, expr in raw.items():
        where = f"{path}.columns.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(where, "an output column name must be an identifier")
        if name in TIME_COLUMNS:
            raise GraphError(where, f"{name} is carried from the source; it cannot be set")
        out[name] = expression_type(parse_expression(expr, src, where), src)
    for name, kind in TIME_COLUMNS.items():  # latency and event time ride along
        if name in src:
            out[name] = kind
    if "windowStart" in src and "windowStart" not in out:
        out["windowStart"] = "long"
    params: dict[str, Any] = {"columns": dict(raw)}
    if "event_time" in doc:
        where = f"{path}.event_time"
        if src.get("window") == "window":
            raise GraphError(where, "a window's results keep their window as event time")
        tree = parse_expression(doc["event_time"], src, where)
        if expression_type(tree, src) not in ("long", "double"):
            raise GraphError(where, "must be a number: the event time in epoch ms")
        params["event_time"] = doc["event_time"]
    return params, out


def _keyed_aggregate(doc: dict[str, Any], path: str,
                     inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    _allowed(doc, path, {"id", "type", "input", "key", "aggregates"})
    src = inputs[0].columns
    key = _columns_list(doc, "key", path, src)
    aggs = _aggregates(doc, path, src, key)
    cols: Columns = {k: src[k] for k in key}
    cols.update({n: _aggregate_type(spec[0]) for n, spec in aggs.items()})
    return {"key": key, "aggregates": {n: list(v) for n, v in aggs.items()}}, cols


def _window_aggregate(doc: dict[str, Any], path: str,
                      inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    _allowed(doc, path, {"id", "type", "input", "key", "window", "aggregates"})
    src = inputs[0].columns
    chained = src.get("window") == "window"
    if "event_time" not in src and not chained:
        raise GraphError(f"{path}.input", "a window needs rows with an event time")
    key = _columns_list(doc, "key", path, src, default=[])
    window = _window(doc.get("window"), f"{path}.window")
    if chained and window.kind == "session":
        raise GraphError(f"{path}.window.kind", "a window over another window's results "
                                                "takes tumbling or sliding windows")
    aggs = _aggregates(doc, path, src, key)
    cols: Columns = {k: src[k] for k in key}
    cols.update({n: _aggregate_type(spec[0]) for n, spec in aggs.items()})
    cols.update(windowStart="long", window="window", emit_ts="double")
    return {"key": key, "window": window.as_dict(), "chained": chained,
            "aggregates": {n: list(v) for n, v in aggs.items()}}, cols


def _window_top(doc: dict[str, Any], path: str,
                inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    _allowed(doc, path, {"id", "type", "input", "by", "window"})
    src = inputs[0].columns
    by = doc.get("by")
    if not isinstance(by, str) or by not in src or src[by] not in ("long", "double"):
        raise GraphError(f"{path}.by", "must name a numeric column of the input (columns: "
                                       f"{', '.join(sorted(c for c, t in src.items() if t in ('long', 'double')))})")
    window = _window(doc.get("window"), f"{path}.window")
    if window.kind == "session":
        raise GraphError(f"{path}.window.kind", "window_top takes tumbling or sliding windows")
    chained = src.get("window") == "window"
    if "event_time" not in src and not chained:
        raise GraphError(f"{path}.input", "a window needs rows with an event time")
    if chained and inputs[0].params.get("window") != window.as_dict():
        raise GraphError(f"{path}.window", "must be the window of its input "
                                           f"({json.dumps(inputs[0].params.get('window'))})")
    cols = {c: t for c, t in src.items() if c != "window"}
    cols.update(windowStart="long", emit_ts="double")
    return {"by": by, "window": window.as_dict(), "chained": chained}, cols


def _join(doc: dict[str, Any], path: str, inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    _allowed(doc, path, {"id", "type", "left", "right", "on", "within", "window"})
    left, right = inputs
    on = doc.get("on")
    if not isinstance(on, list) or not on or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(c, str) for c in p)
            for p in on):
        raise GraphError(f"{path}.on", "must be a list of [left column, right column] pairs")
    for i, (lc, rc) in enumerate(on):
        if lc not in left.columns:
            raise GraphError(f"{path}.on[{i}]", f"unknown column {lc!r} of {left.id}")
        if rc not in right.columns:
            raise GraphError(f"{path}.on[{i}]", f"unknown column {rc!r} of {right.id}")
    for side in (left, right):
        if "event_time" not in side.columns or "window" in side.columns:
            raise GraphError(path, f"{side.id} has no event time to bound the join's state "
                                   "(join raw rows, not window results)")
    if ("within" in doc) == ("window" in doc):
        raise GraphError(path, "needs exactly one of 'within' (right's event time within "
                               "[left's + lower_s, left's + upper_s]) or 'window' (the "
                               "same tumbling window): Spark keeps a stream–stream join's "
                               "state only while a time bound allows")
    params: dict[str, Any] = {"left": left.id, "right": right.id, "on": on}
    if "within" in doc:
        within = _obj(doc["within"], f"{path}.within")
        _allowed(within, f"{path}.within", {"lower_s", "upper_s"})
        lower = _int(within, "lower_s", f"{path}.within", -86_400, 86_400)
        upper = _int(within, "upper_s", f"{path}.within", lower, 86_400)
        params["within"] = {"lower_s": lower, "upper_s": upper}
    else:
        window = _window(doc["window"], f"{path}.window")
        if window.kind != "tumbling":
            raise GraphError(f"{path}.window.kind", "a windowed join takes a tumbling window")
        params["window"] = window.as_dict()
    cols: Columns = dict(left.columns)
    for c, t in right.columns.items():
        cols[f"right_{c}" if c in cols else c] = t
    if "window" in params:
        cols["windowStart"] = "long"
    return params, cols


def _moving_mean(doc: dict[str, Any], path: str,
                 inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    """Per key, the mean of ``value`` over the ``last`` rows greatest by ``order``
    (``moving_mean.py``). Its rows carry no event time, so no window or join reads
    them: Spark gives a transformWithState result a watermark only through an event-time
    column it is told of, and the mean of a key's latest values has none."""
    _allowed(doc, path, {"id", "type", "input", "key", "value", "order", "last"})
    src = inputs[0].columns
    key = _columns_list(doc, "key", path, src)
    value = doc.get("value")
    numeric = sorted(c for c, t in src.items() if t in ("long", "double"))
    if value not in numeric:
        raise GraphError(f"{path}.value", f"must name a numeric column of the input "
                                          f"(columns: {', '.join(numeric)})")
    order = _columns_list(doc, "order", path, src)
    for c in order:
        if c not in numeric:
            raise GraphError(f"{path}.order", f"{c!r} is not numeric (columns: "
                                              f"{', '.join(numeric)})")
    last = _int(doc, "last", path, 1, 10_000)
    cols: Columns = {k: src[k] for k in key}
    cols.update(mean="double", count="long", emit_ts="double")
    return {"key": key, "value": value, "order": order, "last": last,
            "order_types": [src[c] for c in order]}, cols


def _sink(doc: dict[str, Any], path: str, inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    _allowed(doc, path, {"id", "type", "input", "keep_output", "to"})
    keep = doc.get("keep_output", True)
    if not isinstance(keep, bool):
        raise GraphError(f"{path}.keep_output", "must be true or false")
    params: dict[str, Any] = {"keep_output": keep}
    if "to" in doc:  # (its own fields are definition's to check, as a chain's sink)
        params["to"] = _obj(doc["to"], f"{path}.to")
    return params, dict(inputs[0].columns)


def _python(doc: dict[str, Any], path: str, inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    """An installed Python operator (the product's catalogue or an operator package's,
    ``operators/packages.py``), by name, with its declared parameters; it keeps its
    input's columns and appends its own."""
    from pipelines.runtime.operators import catalogue as pyops
    from pipelines.runtime.operators import packages

    _allowed(doc, path, {"id", "type", "input", "function", "params"})
    name = doc.get("function")
    installed = packages.operators()
    if not isinstance(name, str) or name not in installed:
        raise GraphError(f"{path}.function", f"{json.dumps(name)} is not an installed "
                                             f"operator (installed: {', '.join(installed)})")
    op = installed[name]
    src = _reads(name, op.needs, inputs[0], path, "a Python operator takes rows")
    params = _params(op.params, doc.get("params", {}), f"{path}.params")
    return {"function": name, "params": params}, pyops.output_columns(op, src)


def _reads(name: str, needs: tuple[str, ...], upstream: Node, path: str, what: str
           ) -> Columns:
    """``upstream``'s columns, if it carries the ``needs`` of installed code ``name``
    (an operator or a pipeline module) as rows, not a window's results."""
    src = upstream.columns
    missing = [c for c in needs if c not in src]
    if missing:
        raise GraphError(f"{path}.input", f"{name} reads {', '.join(missing)}, which "
                                          f"{upstream.id} does not carry (columns: "
                                          f"{', '.join(sorted(src))})")
    if "window" in src:
        raise GraphError(f"{path}.input", f"{what}, not a window's results")
    return src


def _params(declared: dict[str, Any], given: Any, path: str) -> dict[str, Any]:
    from pipelines.runtime.operators.base import ParamError, resolve_params

    try:
        return resolve_params(declared, given)
    except ParamError as exc:
        raise GraphError(f"{path}.{exc.field}" if exc.field else path, exc.message) from None


def _app(doc: dict[str, Any], path: str, inputs: list[Node]) -> tuple[dict[str, Any], Columns]:
    """A pipeline module of an installed package (``operators/base.py``
    ``PipelineModule``), by path, with its parameters: it reads its input's stream and
    returns the rows of its declared columns."""
    from pipelines.runtime.operators import packages

    _allowed(doc, path, {"id", "type", "input", "app", "params"})
    name = doc.get("app")
    installed = packages.modules()
    if not isinstance(name, str) or name not in installed:
        listed = ", ".join(installed) or "none; a package declares them in the entry " \
                                         "point group streamwise.pipelines"
        raise GraphError(f"{path}.app", f"{json.dumps(name)} is not an installed pipeline "
                                        f"module (installed: {listed})")
    module = installed[name]
    _reads(name, module.needs, inputs[0], path, "a pipeline module reads records")
    params = _params(module.params, doc.get("params", {}), f"{path}.params")
    return ({"app": name, "params": params, "key": list(module.key),
             "stateful": module.stateful, "state_horizon_s": module.state_horizon_s},
            dict(module.columns))


BUILDERS: dict[str, NodeBuilder] = {
    "python": _python, "app": _app,
    "filter": _filter, "project": _project, "keyed_aggregate": _keyed_aggregate,
    "window_aggregate": _window_aggregate, "window_top": _window_top, "join": _join,
    "moving_mean": _moving_mean, "sink": _sink,
}


def validate_graph(nodes_doc: Any,
                   validate_source: Callable[[dict[str, Any], str], dict[str, Any]]) -> Graph:
    """Validate the ``nodes`` list into a :class:`Graph` (inputs before their users).

    ``validate_source(doc, path)`` checks a source node's own fields (rate, keys, …) and
    returns them cleaned; it is ``definition``'s, shared with chain pipelines."""
    docs = _node_docs(nodes_doc)

    def path_of(node_id: str) -> str:
        return f"nodes[{docs[node_id][0]}] ({node_id})"

    def inputs_of(node_id: str) -> list[str]:
        doc = docs[node_id][1]
        keys = ("left", "right") if doc["type"] == "join" else \
            () if doc["type"] in SOURCE_TYPES else ("input",)
        names = []
        for key in keys:
            name = doc.get(key)
            if not isinstance(name, str):
                raise GraphError(f"{path_of(node_id)}.{key}", "must name the node it reads "
                                                              "from")
            if name not in docs:
                raise GraphError(f"{path_of(node_id)}.{key}", f"unknown node {name!r} "
                                 f"(nodes: {', '.join(docs)})")
            if docs[name][1]["type"] == "sink":
                raise GraphError(f"{path_of(node_id)}.{key}", f"{name!r} is a sink; "
                                                              "nothing reads from a sink")
            names.append(name)
        return names

    sources = [n for n, (_i, d) in docs.items() if d["type"] in SOURCE_TYPES]
    sinks = [n for n, (_i, d) in docs.items() if d["type"] == "sink"]
    if len(sources) != 1:
        raise GraphError("nodes", f"needs exactly one source node ({', '.join(SOURCE_TYPES)}); "
                                  f"found {len(sources)}: every branch reads the one "
                                  "source's micro-batch")
    if len(sinks) != 1:
        raise GraphError("nodes", f"needs exactly one sink node; found {len(sinks)}")

    built: dict[str, Node] = {}
    visiting: set[str] = set()

    def build(node_id: str) -> Node:
        if node_id in built:
            return built[node_id]
        if node_id in visiting:
            raise GraphError(f"{path_of(node_id)}", "is part of a cycle: a pipeline is a "
                                                    "DAG")
        visiting.add(node_id)
        inputs = [build(name) for name in inputs_of(node_id)]
        doc, path = docs[node_id][1], path_of(node_id)
        if doc["type"] in SOURCE_TYPES:
            params, columns = _source(doc, path, inputs, validate_source)
        else:
            params, columns = BUILDERS[doc["type"]](doc, path, inputs)
        visiting.discard(node_id)
        built[node_id] = Node(node_id, doc["type"], path, tuple(i.id for i in inputs),
                              params, columns)
        order.append(built[node_id])
        return built[node_id]

    order: list[Node] = []
    build(sinks[0])
    unused = [n for n in docs if n not in built]
    if unused:
        raise GraphError(path_of(unused[0]), "does not lead to the sink")
    graph = Graph(tuple(order))
    _check_spark_shapes(graph)
    return graph


def _node_docs(nodes_doc: Any) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each node's document by id, with its index: ids unique names, types known."""
    if not isinstance(nodes_doc, list) or not nodes_doc:
        raise GraphError("nodes", "must be a non-empty list of operators")
    if len(nodes_doc) > MAX_NODES:
        raise GraphError("nodes", f"at most {MAX_NODES} nodes")
    docs: dict[str, tuple[int, dict[str, Any]]] = {}
    for i, raw in enumerate(nodes_doc):
        doc = _obj(raw, f"nodes[{i}]")
        node_id = doc.get("id")
        if not isinstance(node_id, str) or not node_id.isidentifier():
            raise GraphError(f"nodes[{i}].id", "must be a name (letters, digits, _), "
                                               f"got {json.dumps(node_id)}")
        if node_id in docs:
            raise GraphError(f"nodes[{i}].id", f"{node_id!r} is used twice")
        if doc.get("type") not in NODE_TYPES:
            raise GraphError(f"nodes[{i}] ({node_id}).type",
                             f"{json.dumps(doc.get('type'))} is not one of: "
                             f"{', '.join(NODE_TYPES)}")
        docs[node_id] = (i, doc)
    return docs


def _check_spark_shapes(graph: Graph) -> None:
    """Shapes Spark refuses, refused here with its reason."""
    for node in graph.nodes:
        if node.type == "project" and "event_time" in node.params:
            for upstream in graph.ancestors(node.id):
                if upstream.stateful:
                    raise GraphError(f"{node.path}.event_time", "re-stamps the event time "
                                     f"below the stateful {upstream.id}: Spark keeps the "
                                     "watermark an operator's results carry")
    apps = [n for n in graph.nodes if n.type == APP_TYPE]
    if len(apps) > 1:
        raise GraphError(f"{apps[1].path}.type", "a pipeline holds one pipeline module")
    for app in apps:
        readers = [n for n in graph.nodes if app.id in n.inputs]
        if any(r.type != "sink" for r in readers):
            raise GraphError(f"{readers[0].path}.input", f"reads the pipeline module "
                             f"{app.id}: a module's output goes to the sink")
        stateful_above = [a for a in graph.ancestors(app.id) if a.stateful]
        if stateful_above:
            raise GraphError(f"{app.path}.input", f"reads {stateful_above[0].id}'s "
                             "results: a pipeline module reads records (filters and "
                             "Python operators may come first)")
    keyed = [n for n in graph.stateful if n.type == "keyed_aggregate"
             or (n.type == APP_TYPE and n.params.get("key"))]
    if keyed and len(graph.stateful) > 1:
        raise GraphError(f"{keyed[0].path}.type", "a keyed_aggregate without a window runs "
                         "in update mode, and Spark runs several stateful operators in one "
                         "query only in append mode: use a window_aggregate, or make it the "
                         "only stateful node")


# ------------------------------------------------------------------------ picture
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 170, 46, 56, 22, 10


@dataclass(frozen=True)
class PictureNode:
    id: str
    type: str
    label: str  # the operator's main parameter, shortened
    x: int
    y: int
    stateful: bool


@dataclass(frozen=True)
class PictureEdge:
    source: str
    target: str
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Picture:
    """A layered drawing of a pipeline: columns by longest path from the source."""

    nodes: tuple[PictureNode, ...]
    edges: tuple[PictureEdge, ...]
    width: int
    height: int
    node_w: int = NODE_W
    node_h: int = NODE_H


def node_label(node_type: str, params: dict[str, Any]) -> str:
    if node_type == "filter":
        text = str(params.get("where", ""))
    elif node_type == "project":
        text = ", ".join(params.get("columns", {}))
    elif node_type in ("window_aggregate", "window_top"):
        w = params.get("window", {})
        size = w.get("size_s") or w.get("gap_s")
        text = f"{w.get('kind', '')} {size}s" + (f"/{w['slide_s']}s" if "slide_s" in w else "")
        text += f" by {params['by']}" if node_type == "window_top" else \
            f" {', '.join(params.get('aggregates', {}))}"
    elif node_type == "join":
        on = " and ".join(f"{a}={b}" for a, b in params.get("on", []))
        text = on + (" within" if "within" in params else " same window")
    elif node_type == "keyed_aggregate":
        text = f"by {', '.join(params.get('key', []))}"
    elif node_type == "python":
        text = str(params.get("function", ""))
    elif node_type == APP_TYPE:
        text = str(params.get("app", "")).rpartition(":")[2]
    elif node_type == "moving_mean":
        text = f"last {params.get('last')} {params.get('value')} by {', '.join(params.get('key', []))}"
    elif node_type in SOURCE_TYPES:
        rate = params.get("rate", {})
        text = f"{rate.get('kind', '')} rate"
    else:
        text = "kept" if params.get("keep_output") else ""
    return text if len(text) <= 26 else text[:25] + "…"


def picture(nodes: list[tuple[str, str, str, tuple[str, ...]]]) -> Picture:
    """Lay out ``(id, type, label, inputs)`` nodes, inputs listed before their users."""
    layer: dict[str, int] = {}
    for node_id, _type, _label, inputs in nodes:
        layer[node_id] = 1 + max((layer[i] for i in inputs), default=-1)
    rows: dict[int, int] = {}
    placed: dict[str, PictureNode] = {}
    for node_id, node_type, label, _inputs in nodes:
        column = layer[node_id]
        row = rows.get(column, 0)
        rows[column] = row + 1
        placed[node_id] = PictureNode(node_id, node_type, label,
                                      MARGIN + column * (NODE_W + GAP_X),
                                      MARGIN + row * (NODE_H + GAP_Y),
                                      node_type in STATEFUL_TYPES)
    edges = tuple(PictureEdge(i, node_id, placed[i].x + NODE_W, placed[i].y + NODE_H // 2,
                              placed[node_id].x, placed[node_id].y + NODE_H // 2)
                  for node_id, _t, _l, inputs in nodes for i in inputs)
    width = MARGIN * 2 + (max(layer.values(), default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max(rows.values(), default=1) * (NODE_H + GAP_Y) - GAP_Y
    return Picture(tuple(placed.values()), edges, width, height)


def graph_picture(graph: Graph) -> Picture:
    drawn = picture([(n.id, n.type, node_label(n.type, n.params), n.inputs)
                     for n in graph.nodes])
    stateful = {n.id for n in graph.stateful}  # (a pipeline module's, as it declares)
    return replace(drawn, nodes=tuple(replace(p, stateful=p.id in stateful)
                                      for p in drawn.nodes))


# ------------------------------------------------------------ processing elements
MAX_PARTITIONS = 256


@dataclass(frozen=True)
class PePlan:
    """How a dataflow pipeline's Python operators run (COLA's processing elements,
    ``pyops.py``): each PE is a chain of ``python`` nodes executed in one
    ``mapInPandas``; ``partitions`` (0: the source's) is the parallelism of their
    stages — a repartition in front of the first PE when it exceeds the source's.
    ``colocate``/``exlocate``: operator pairs that must share a PE or stay apart
    (COLA §3.1, PE colocation and exlocation), which the optimiser honours."""

    pes: tuple[tuple[str, ...], ...]
    partitions: int = 0
    colocate: tuple[tuple[str, str], ...] = ()
    exlocate: tuple[tuple[str, str], ...] = ()

    def pe_of(self, node_id: str) -> int:
        return next(i for i, pe in enumerate(self.pes) if node_id in pe)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pes": [list(pe) for pe in self.pes]}
        if self.partitions:
            out["partitions"] = self.partitions
        if self.colocate:
            out["colocate"] = [list(p) for p in self.colocate]
        if self.exlocate:
            out["exlocate"] = [list(p) for p in self.exlocate]
        return out


def python_chain_breaks(graph: Graph, first: str, second: str) -> str | None:
    """Why ``second`` cannot follow ``first`` inside one PE, or None."""
    node = graph.node(second)
    if node.type != "python" or node.inputs != (first,):
        return f"{second} does not read {first}"
    readers = [n.id for n in graph.nodes if first in n.inputs]
    if readers != [second]:
        return f"{first}'s rows also go to {', '.join(r for r in readers if r != second)}"
    return None


def default_pes(graph: Graph) -> tuple[tuple[str, ...], ...]:
    """One PE per Python operator: what compiling each operator on its own gives."""
    return tuple((n.id,) for n in graph.nodes if n.type == "python")


def validate_plan(doc: Any, graph: Graph, path: str = "plan") -> PePlan:
    """The definition's ``plan`` (optional) against its graph."""
    python = [n.id for n in graph.nodes if n.type == "python"]
    if doc is None:
        return PePlan(default_pes(graph))
    doc = _obj(doc, path)
    _allowed(doc, path, {"pes", "partitions", "colocate", "exlocate"})
    pairs = {kind: _plan_pairs(doc.get(kind, []), f"{path}.{kind}", python)
             for kind in ("colocate", "exlocate")}
    partitions = _int(doc, "partitions", path, 0, MAX_PARTITIONS, default=0)
    raw_pes = doc.get("pes")
    pes = default_pes(graph) if raw_pes is None else _plan_pes(raw_pes, f"{path}.pes",
                                                                python, graph)
    plan = PePlan(pes, partitions, pairs["colocate"], pairs["exlocate"])
    for a, b in plan.colocate:
        if plan.pe_of(a) != plan.pe_of(b):
            raise GraphError(f"{path}.pes", f"{a} and {b} must share a PE (colocate)")
    for a, b in plan.exlocate:
        if plan.pe_of(a) == plan.pe_of(b):
            raise GraphError(f"{path}.pes", f"{a} and {b} must not share a PE (exlocate)")
    return plan


def _not_python(x: str, python: list[str]) -> str:
    return f"{x!r} is not a python node (python nodes: {', '.join(python) or 'none'})"


def _plan_pairs(raw: Any, path: str, python: list[str]) -> tuple[tuple[str, str], ...]:
    """``colocate`` / ``exlocate``: pairs of distinct python nodes."""
    if not isinstance(raw, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in raw):
        raise GraphError(path, "must be a list of [operator, operator] pairs")
    for i, (a, b) in enumerate(raw):
        for x in (a, b):
            if x not in python:
                raise GraphError(f"{path}[{i}]", _not_python(x, python))
        if a == b:
            raise GraphError(f"{path}[{i}]", "names the same operator twice")
    return tuple((a, b) for a, b in raw)


def _plan_pes(raw: Any, path: str, python: list[str], graph: Graph
              ) -> tuple[tuple[str, ...], ...]:
    """``pes``: every python node in exactly one PE, each PE a chain in order."""
    if not isinstance(raw, list) or not all(
            isinstance(pe, list) and pe and all(isinstance(x, str) for x in pe)
            for pe in raw):
        raise GraphError(path, "must be a list of PEs, each a non-empty list of python "
                               "node ids")
    seen: set[str] = set()
    for i, pe in enumerate(raw):
        for x in pe:
            if x not in python:
                raise GraphError(f"{path}[{i}]", _not_python(x, python))
            if x in seen:
                raise GraphError(f"{path}[{i}]", f"{x!r} is in two PEs")
            seen.add(x)
        for a, b in zip(pe, pe[1:]):
            why = python_chain_breaks(graph, a, b)
            if why:
                raise GraphError(f"{path}[{i}]", "a PE is a chain run in one mapInPandas, "
                                                 f"in order: {why}")
    missing = [x for x in python if x not in seen]
    if missing:
        raise GraphError(path, f"{', '.join(missing)} is in no PE")
    return tuple(tuple(pe) for pe in raw)
