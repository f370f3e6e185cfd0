"""The exactly-once check: a run's kept output against its source recomputed
outside Spark (``verifier``, ``python -m pipelines.runtime.verify RUN_DIR``), with the
pipeline's expressions evaluated over pandas frames as Spark evaluates them
(``expressions``)."""
