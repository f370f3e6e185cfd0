"""Example operators over the keyed records (``key``: a customer, ``value``: an order's
amount in [0, 1000)), as a team would write its own: each a row-wise pandas function
that reads some columns and appends its own, with integer parameters and bounds.

Installed into Streamwise's environment (``pip install -e examples/streamwise-example-ops``),
its operators can be named by a dataflow pipeline's ``python`` nodes::

    {"id": "gross", "type": "python", "input": "events", "function": "order_gross",
     "params": {"tax_pct": 21}}
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd

from pipelines.runtime.operators.base import Param, PyOperator


def order_gross(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    """The order's amount with tax, in whole cents (rounded half up)."""
    cents = np.floor(df["value"].to_numpy(np.float64) * (100 + p["tax_pct"]) + 0.5)
    return df.assign(gross_cents=cents.astype(np.int64))


def customer_region(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    """The customer's sales region: one of ``regions``, by the customer's number."""
    return df.assign(region=df["key"].to_numpy(np.int64) % p["regions"])


def order_receipt(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    """A receipt code: the SHA-256 of the customer and gross amount, hashed ``rounds``
    times (the costly step of this package, as a signature would be)."""
    codes = []
    for key, cents in zip(df["key"].tolist(), df["gross_cents"].tolist()):
        digest = f"{key}:{cents}".encode()
        for _ in range(p["rounds"]):
            digest = hashlib.sha256(digest).digest()
        codes.append(digest.hex()[:16])
    return df.assign(receipt=pd.array(codes, dtype=object))


def order_note(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    """Sets the order's free-text note to ``chars`` characters (a form's comment field):
    what makes rows wide, so that where a plan cuts the chain matters."""
    return df.assign(note=pd.array(np.full(len(df), "n" * p["chars"], dtype=object),
                                   dtype=object))


OPERATORS = [
    PyOperator("order_gross", ("value",), {"gross_cents": "long"}, order_gross,
               {"tax_pct": (21, 0, 100)}, doc=order_gross.__doc__ or ""),
    PyOperator("customer_region", ("key",), {"region": "long"}, customer_region,
               {"regions": (4, 1, 1000)}, doc=customer_region.__doc__ or ""),
    PyOperator("order_receipt", ("key", "gross_cents"), {"receipt": "string"},
               order_receipt, {"rounds": (8, 1, 10_000)}, doc=order_receipt.__doc__ or ""),
    PyOperator("order_note", (), {"note": "string"}, order_note,
               {"chars": Param(100, 0, 100_000, doc="the note's length")},
               doc=order_note.__doc__ or ""),
]
