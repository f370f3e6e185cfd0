"""JSON documents for the control CLIs: one reader, one error type, one-line messages."""
from __future__ import annotations

import json
import math
import sys
from typing import Any


class InputError(ValueError):
    """Bad CLI input; the message is the one line printed after ``error:``."""


# Every whole number the product takes fits a 64-bit integer (a Redis stream's packed
# entry IDs, 19 digits, among them).
MAX_DIGITS = 19
# No document the product reads nests deeper than a few levels; a deeper one would only
# make each later walk of it (validation, the audit's copy) recurse that far.
MAX_DEPTH = 64


def _whole(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise InputError(f"invalid JSON: the number {text[:12]}... has more than "
                         f"{MAX_DIGITS} digits")
    value = int(text)
    if not -(1 << 63) <= value < (1 << 63):
        raise InputError(f"invalid JSON: the number {text[:12]}... is outside a 64-bit "
                         "integer")
    return value


def _real(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"invalid JSON: the number {text[:12]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise InputError(f"invalid JSON: {name} is not a number JSON allows")


def loads(text: str) -> Any:
    """JSON as the standard says it: no NaN or Infinity, no number out of a double's
    range, no whole number past 64 bits (Python would take them, and they fail later,
    deep in a computation or as a server error); every error one line."""
    try:
        doc = json.loads(text, parse_int=_whole, parse_float=_real,
                         parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}") from exc
    except RecursionError as exc:
        raise InputError(f"invalid JSON: nested deeper than {MAX_DEPTH} levels") from exc
    _check_depth(doc)
    return doc


def _check_depth(doc: Any) -> None:
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise InputError(f"invalid JSON: nested deeper than {MAX_DEPTH} levels")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def read_json(path: str | None) -> Any:
    """The JSON document in ``path``, or on stdin for ``-`` / None."""
    try:
        text = sys.stdin.read() if path in (None, "-") else open(path).read()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    return loads(text)
