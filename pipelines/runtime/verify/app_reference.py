"""The reference result of a pipeline module: the same ``build(spark, source, ctx)``
over a *static* DataFrame of the records a run read, in a local Spark of its own.

A streaming query's incremental result (update mode: each key's latest row; append
mode: the rows emitted) must equal what one batch query computes over the same records
(Spark's own contract for supported streaming operations: "the same result as a batch
query over the prefix of the stream"), however the run was scaled, migrated or
restarted. So the module needs no reference written twice: the verifier
(``verifier._verify_app``) runs this in a child process, since a Celery worker should
not hold a JVM.

    python -m pipelines.runtime.verify.app_reference INPUT.parquet OUTPUT.parquet JOB.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

PROJECT_ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 900.0


class ReferenceError(RuntimeError):
    """The reference run failed: ``build`` raised over a static DataFrame (e.g. an
    operation Spark only runs on streams), or Spark could not start."""


def expected(frame: pd.DataFrame, job: dict[str, Any]) -> pd.DataFrame:
    """Run the module ``job["app"]`` over ``frame`` (the app's input rows; its
    ``event_time`` is recomputed as the stream's source computes it) in a child
    process; its rows, narrowed to the declared columns."""
    with tempfile.TemporaryDirectory(prefix="streamwise-appref-") as tmp:
        src, out, spec = Path(tmp) / "in.parquet", Path(tmp) / "out.parquet", Path(tmp) / "job.json"
        frame.drop(columns=[c for c in ("event_time",) if c in frame.columns]) \
            .to_parquet(src, index=False)
        spec.write_text(json.dumps(job))
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                          os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([sys.executable, "-m", "pipelines.runtime.verify.app_reference",
                               str(src), str(out), str(spec)], cwd=PROJECT_ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
            raise ReferenceError(f"the reference run of {job['app']} over the records "
                                 f"read failed:\n{tail}")
        return pd.read_parquet(out)


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pipelines.runtime.cluster.standalone import jvm_options
    from pipelines.runtime.operators import packages
    from pipelines.runtime.operators.base import BuildContext
    from pipelines.runtime.query.dataflow_spark import check_app_output

    src, out, spec_path = argv
    job = json.loads(Path(spec_path).read_text())
    spark = (SparkSession.builder.master("local[1]").appName("streamwise-app-reference")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", jvm_options())
             .config("spark.sql.shuffle.partitions", str(job["key_groups"]))
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    try:
        df = spark.read.parquet(src)
        # As the streaming source stamps it (dataflow_spark._source).
        df = df.withColumn("event_time", F.timestamp_millis("dateTime")
                           if job["nexmark_events"] else F.timestamp_seconds("emit_ts"))
        module = packages.module(job["app"])
        ctx = BuildContext(key_groups=job["key_groups"], params=job["params"],
                           watermark_s=job["watermark_s"], trigger_ms=job["trigger_ms"])
        result = module.fn(spark, df, ctx)
        columns = {k: v for k, v in job["columns"].items()}
        check_app_output(result, columns, module.path, streaming=False)
        result.select(*columns).toPandas().to_parquet(out, index=False)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
