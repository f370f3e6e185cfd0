"""JSON documents for the control CLIs: one reader, one error type, one-line messages."""
from __future__ import annotations

import json
import sys
from typing import Any


class InputError(ValueError):
    """Bad CLI input; the message is the one line printed after ``error:``."""


def read_json(path: str | None) -> Any:
    """The JSON document in ``path``, or on stdin for ``-`` / None."""
    try:
        text = sys.stdin.read() if path in (None, "-") else open(path).read()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}") from exc
