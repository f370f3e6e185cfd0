"""The example package's own tests: each operator and the pipeline module against the
values worked out by hand."""
from __future__ import annotations

import hashlib

import pandas as pd
import pytest

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


@pytest.mark.spark  # (a local Spark of its own: the module is PySpark)
def test_customer_totals_over_a_static_frame() -> None:
    """The pipeline module on a batch DataFrame, as Streamwise's verifier runs it:
    orders under min_amount left out, gross rounded half up per order."""
    from pyspark.sql import SparkSession

    from pipelines.runtime.cluster.standalone import jvm_options
    from pipelines.runtime.operators.base import BuildContext
    from streamwise_example_ops.jobs import customer_totals

    # Streamwise's JVM options (C1 only, the serial collector, its class archive): a
    # test's JVM that lives seconds starts on about half the CPU.
    spark = (SparkSession.builder.master("local[1]").appName("example-ops-test")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", jvm_options())
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    try:
        orders = spark.createDataFrame(
            [(7, 10.005), (7, 999.5), (12, 4.0), (12, 50.0)], "key long, value double")
        ctx = BuildContext(key_groups=2, params={"tax_pct": 21.0, "min_amount": 5.0})
        rows = {r["customer"]: r.asDict()
                for r in customer_totals(spark, orders, ctx).collect()}
    finally:
        spark.stop()
    assert rows[7] == {"customer": 7, "orders": 2, "gross_cents": 1211 + 120940,
                       "largest": 999.5}
    assert rows[12] == {"customer": 12, "orders": 1, "gross_cents": 6050, "largest": 50.0}


def test_the_plugin_vetoes_a_scale_down_in_the_last_ten_minutes_only() -> None:
    import datetime as dt

    from control.plugins import Proposal
    from streamwise_example_ops.plugins import QUIET_HOUR_END

    def at(minute: int, current: int, chosen: int) -> Proposal:
        now = dt.datetime(2026, 12, 7, 13, minute, tzinfo=dt.UTC).timestamp()
        return Proposal("1", "p", now, current, chosen, 2.0, 2.0, "scale", "")

    veto = QUIET_HOUR_END.review(at(55, 2, 1))
    assert veto is not None and veto.veto and "(it is :55)" in veto.reason
    assert QUIET_HOUR_END.review(at(49, 2, 1)) is None
    assert QUIET_HOUR_END.review(at(55, 1, 2)) is None  # a scale-up goes through
