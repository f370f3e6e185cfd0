"""The runner: one process per run that holds its SparkSession and query
(``runner``, started as ``python -m pipelines.runtime.runner CONFIG``), the warm standbys
that Start adopts (``standby``), the session's configuration (``session``), each
micro-batch's metrics (``metrics``, from the query listener in ``listener``), and the
harness that tests and benchmarks run it with (``harness``, ``calibration``)."""
