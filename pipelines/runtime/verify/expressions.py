"""A checked expression tree (``dataflow.parse_expression``) evaluated over a pandas
frame, as ``dataflow_spark.column`` compiles it for Spark: the verifier's reference of
a filter. It walks the tree that validation accepted; no expression text is evaluated
(``DataFrame.query`` would evaluate the text again, with Python's rules: ``x is not
None`` compared the Series object, ``'a' * 10**9`` built the string).

Nulls follow Spark SQL: arithmetic and comparisons with a null are null (and a
division or remainder by zero, as ``try_divide``/``try_mod`` compile it), ``and`` /
``or`` / ``not`` are three-valued (Kleene), ``a if c else b`` takes ``b`` where ``c``
is null, ``x in (...)`` is null for a null ``x``; a filter keeps the rows where its
condition is true. Values are float/int/str Series with NaN or None for null, and
boolean results pandas' nullable ``boolean``."""
from __future__ import annotations

import ast
import operator
from typing import Any

import numpy as np
import pandas as pd

# Spark's % is the JVM's remainder: its sign is the dividend's (Python's % would take
# the divisor's).
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.Div: operator.truediv, ast.Mod: np.fmod}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def _nulls(value: Any, index: pd.Index) -> pd.Series:
    if isinstance(value, pd.Series):
        return value.isna()
    return pd.Series(value is None, index=index)


def _number(value: Any, index: pd.Index) -> pd.Series:
    """As Spark casts an operand of arithmetic: a number, else null."""
    return pd.to_numeric(_series(value, index), errors="coerce").astype(float)


def _series(value: Any, index: pd.Index) -> pd.Series:
    return value if isinstance(value, pd.Series) else pd.Series([value] * len(index),
                                                                 index=index, dtype=object
                                                                 if value is None else None)


def _boolean(values: Any, null: pd.Series) -> pd.Series:
    out = pd.Series(np.asarray(values, dtype=bool), index=null.index, dtype="boolean")
    out[null.to_numpy()] = pd.NA
    return out


def evaluate(node: ast.expr, frame: pd.DataFrame) -> Any:
    """The value of ``node`` per row of ``frame`` (a Series), or a scalar for a tree
    of literals."""
    index = frame.index
    if isinstance(node, ast.Name):
        return frame[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        value = evaluate(node.operand, frame)
        if isinstance(node.op, ast.Not):
            return ~_series(value, index).astype("boolean")
        return -value
    if isinstance(node, ast.BinOp):
        left, right = evaluate(node.left, frame), evaluate(node.right, frame)
        null = _nulls(left, index) | _nulls(right, index)
        with np.errstate(all="ignore"):
            a, b = _number(left, index), _number(right, index)
            out = (np.floor(a / b) if isinstance(node.op, ast.FloorDiv)  # floor(a / b)
                   else _ARITHMETIC[type(node.op)](a, b))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            null = null | (b == 0)  # Spark's try_divide / try_mod
        return out.where(~null, np.nan)
    if isinstance(node, ast.BoolOp):
        values = [_series(evaluate(v, frame), index).astype("boolean") for v in node.values]
        out = values[0]
        for value in values[1:]:
            out = (out & value) if isinstance(node.op, ast.And) else (out | value)
        return out
    if isinstance(node, ast.IfExp):
        test = _series(evaluate(node.test, frame), index).astype("boolean")
        body = _series(None if _none(node.body) else evaluate(node.body, frame), index)
        orelse = _series(None if _none(node.orelse) else evaluate(node.orelse, frame), index)
        return body.where(test.fillna(False).to_numpy(dtype=bool), orelse)
    assert isinstance(node, ast.Compare), type(node).__name__  # dataflow._check's forms
    op, left = node.ops[0], _series(evaluate(node.left, frame), index)
    if isinstance(op, (ast.Is, ast.IsNot)):  # with None: checked
        null = left.isna()
        return (null if isinstance(op, ast.Is) else ~null).astype("boolean")
    if isinstance(op, (ast.In, ast.NotIn)):
        assert isinstance(node.comparators[0], (ast.Tuple, ast.List))
        values = [e.value for e in node.comparators[0].elts if isinstance(e, ast.Constant)]
        found = left.isin(values).to_numpy()
        return _boolean(found if isinstance(op, ast.In) else ~found, left.isna())
    right = evaluate(node.comparators[0], frame)
    null = left.isna() | _nulls(right, index)
    right_values = _series(right, index)
    both = ~null.to_numpy()
    result = np.zeros(len(index), dtype=bool)
    if both.any():
        result[both] = _COMPARE[type(op)](left[both], right_values[both]).to_numpy(dtype=bool)
    return _boolean(result, null)


def _none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def keep(frame: pd.DataFrame, condition: ast.expr) -> pd.DataFrame:
    """The rows of ``frame`` where ``condition`` is true (not false, not null)."""
    value = _series(evaluate(condition, frame), frame.index).astype("boolean")
    return frame[value.fillna(False).to_numpy(dtype=bool)]
