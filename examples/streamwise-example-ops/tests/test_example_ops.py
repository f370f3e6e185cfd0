"""The example package's own tests: each operator against the value worked out by hand."""
from __future__ import annotations

import hashlib

import pandas as pd

from streamwise_example_ops import customer_region, order_gross, order_receipt


def _orders() -> pd.DataFrame:
    return pd.DataFrame({"key": [7, 12], "value": [10.005, 999.5]})


def test_gross_is_rounded_half_up_to_cents() -> None:
    out = order_gross(_orders(), {"tax_pct": 21})
    assert out["gross_cents"].tolist() == [1211, 120940]  # 10.005 * 121 = 1210.605


def test_regions_follow_the_customer() -> None:
    assert customer_region(_orders(), {"regions": 5})["region"].tolist() == [2, 2]


def test_a_receipt_is_the_repeated_hash() -> None:
    df = order_gross(_orders(), {"tax_pct": 0})
    out = order_receipt(df, {"rounds": 2})
    want = hashlib.sha256(hashlib.sha256(b"7:1001").digest()).digest().hex()[:16]
    assert out["receipt"].tolist()[0] == want
