"""The operators a pipeline runs in Python, as pandas functions with no Spark import:
the catalogue of row-wise operators a dataflow ``python`` node names (``catalogue``),
the thesis' HFT kernel (``hft``) and the per-key moving mean processor
(``moving_mean``). The spec checks a node against their signatures; the query runs
them; the verifier applies them outside Spark."""
