"""What a Python operator is (the product's catalogue and every operator package declare
theirs with it: ``packages.py``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

Columns = dict[str, str]  # name -> dataflow type (long, double, string)


@dataclass(frozen=True)
class PyOperator:
    """A row-wise, deterministic pandas function: it reads ``needs``, appends (or
    replaces) ``adds`` in the frame it is given and returns it; its new columns depend
    only on the row and ``params`` (name -> (default, lowest, highest), integers), so a
    pipeline's output does not depend on how its operators are grouped or partitioned.
    ``doc``: one line the pipeline form shows."""

    name: str
    needs: tuple[str, ...]  # input columns it reads
    adds: Columns  # columns it appends (name -> dataflow type)
    fn: Callable[[pd.DataFrame, dict[str, Any]], pd.DataFrame]
    params: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # default, lo, hi
    doc: str = ""
