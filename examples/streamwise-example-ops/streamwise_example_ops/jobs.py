"""An example pipeline module: a team's own PySpark job, run by Streamwise.

Streamwise calls ``build(spark, source, ctx)`` with the run's source stream (the
generator's records, a Redis stream, a JetStream stream, a folder...: whichever the
definition chooses) and takes the DataFrame it returns to the run's sink. The grouping
below is a stateful aggregation: its state is split into ``ctx.key_groups`` groups
(``spark.sql.shuffle.partitions``), which Streamwise places on executors and moves
between them when it scales the run.

A definition runs it as::

    {"app": "streamwise_example_ops.jobs:customer_totals",
     "params": {"tax_pct": 21.0, "min_amount": 10.0},
     "source": {"type": "generator", "partitions": 2,
                "rate": {"kind": "constant", "records_per_s": 1000},
                "keys": {"kind": "zipf", "n": 500, "s": 1.1}},
     "key_groups": 4}
"""
from __future__ import annotations

from typing import Any

from pipelines.runtime.operators.base import BuildContext, Param, pipeline_module


@pipeline_module(
    needs=("key", "value"),
    columns={"customer": "long", "orders": "long", "gross_cents": "long",
             "largest": "double"},
    key=("customer",),
    params={"tax_pct": Param(21.0, 0.0, 100.0, doc="tax added to each order, in %"),
            "min_amount": Param(0.0, 0.0, 1000.0,
                                doc="orders below this amount are left out")})
def customer_totals(spark: Any, source: Any, ctx: BuildContext) -> Any:
    """Per customer, over all time: orders at or above ``min_amount``, their gross in
    whole cents (each rounded half up) and the largest order."""
    from pyspark.sql import functions as F

    p = ctx.params
    orders = source.where(F.col("value") >= F.lit(p["min_amount"]))
    cents = F.floor(F.col("value") * F.lit(100.0 + p["tax_pct"]) + F.lit(0.5)).cast("long")
    return (orders.groupBy(F.col("key").alias("customer"))
            .agg(F.count(F.lit(1)).alias("orders"), F.sum(cents).alias("gross_cents"),
                 F.max("value").alias("largest")))
