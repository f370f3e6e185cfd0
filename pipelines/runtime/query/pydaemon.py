"""The executors' Python daemon (``spark.python.daemon.module``): PySpark's own
(``pyspark.daemon``), which forks one worker per Python task slot, with the modules
every worker of a run imports already imported before it forks.

Each forked worker otherwise imports pandas, pyarrow, numpy, PySpark's worker and the
generator source itself: 0.9-1.1 s of CPU here, paid by every worker an executor forks
and by the first batch of every new executor (a scale-up). Forked
from a daemon that holds them, a worker starts with them.

PySpark imports its worker module only after the fork because pandas and pyarrow may
start threads as they are imported, and a fork copies no thread. What they start here
is pyarrow's jemalloc background thread, whose allocator takes its locks around a
fork (``pthread_atfork``) and restarts it in the child, and OpenBLAS' pool, which
``OPENBLAS_NUM_THREADS=1`` (set for the executors in ``session.build_session``: one
core each) keeps from starting. No Python thread runs here: the daemon refuses to
start if one does, rather than fork it half-copied. No Django import."""
from __future__ import annotations

import os
import sys
import threading

# Before numpy: a 1-core executor's BLAS has no pool to start.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy  # noqa: E402,F401
import pandas  # noqa: E402,F401
import pyarrow  # noqa: E402,F401
import pyspark.worker  # noqa: E402,F401
from pyspark import daemon  # noqa: E402

import pipelines.runtime.query.source  # noqa: E402,F401


def main() -> None:
    if threading.active_count() != 1:
        sys.exit(f"pydaemon: {threading.active_count()} Python threads before the fork")
    daemon.manager()


if __name__ == "__main__":
    main()
