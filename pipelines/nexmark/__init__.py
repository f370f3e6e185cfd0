"""NEXMark on Streamwise: Beam's event generator, its queries as pipelines, and
reference results computed outside Spark (``python -m pipelines.nexmark``). No Django."""
