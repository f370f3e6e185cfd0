"""Records as the sources hand them over: columns of the declared fields, each record's
identity (``seq``) and emission time, and the dead letters met on the way; and how a
value becomes a declared field's type, strictly (a record that does not fit is a dead
letter with the reason, never a guess)."""
from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Parsed:
    """Records parsed into columns (``seq``: the record's offset identity,
    ``emit_ts``: when the source got it) and the dead letters among them:
    (identity, raw bytes or fields, reason)."""

    seq: list[int] = field(default_factory=list)
    emit_ts: list[float] = field(default_factory=list)
    columns: dict[str, list[Any]] = field(default_factory=dict)
    dead: list[tuple[Any, Any, str]] = field(default_factory=list)


def convert_text(text: str, kind: str) -> Any:
    """A text value (a Redis field, a CSV cell) as a column of ``kind``."""
    if kind == "long":
        value: Any = int(text)
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"{text} is outside a long's range")
        return value
    if kind == "double":
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text} is not a finite number")
        return value
    return text


def convert(value: Any, kind: str) -> Any:
    """A JSON (or Parquet) value as a column of ``kind``; ValueError names what is
    wrong. Numbers are typed strictly: a long is an integer (not true/false, not 1.5), a
    double any finite number, a string a string."""
    if kind == "long":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{json.dumps(value, default=str)[:60]} is not an integer")
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"{value} is outside a long's range")
        return value
    if kind == "double":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{json.dumps(value, default=str)[:60]} is not a number")
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{json.dumps(value, default=str)[:60]} is not a string")
    return value


def fields_of(doc: Mapping[str, Any], fields: Mapping[str, str],
              optional: Collection[str] = ()) -> tuple[dict[str, Any] | None, str | None]:
    """An object's declared fields (None for an ``optional`` one it lacks), or None and
    the reason it is a dead letter."""
    row = {}
    for name, kind in fields.items():
        if name not in doc or doc[name] is None:
            if name in optional:
                row[name] = None
                continue
            return None, f"no field {name!r}"
        try:
            row[name] = convert(doc[name], kind)
        except ValueError as exc:
            return None, f"field {name!r} is not a {kind}: {exc}"
    return row, None


def parse_object(data: bytes | str, fields: Mapping[str, str], optional: Collection[str] = ()
                 ) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON object's declared fields, or None and the reason it is a dead letter."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not JSON: {str(exc)[:120]}"
    if not isinstance(doc, dict):
        return None, "not a JSON object"
    return fields_of(doc, fields, optional)
