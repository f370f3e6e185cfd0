"""StreamingQueryListener that forwards each micro-batch's progress to the runner's
metrics (``batch_metrics.BatchMetrics.on_progress``).

It runs on a py4j callback thread ~0.1 s after each batch; it must stay cheap (a slow
listener builds an unbounded backlog of listener events), so it only joins two small
dicts and does one Redis XADD.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener


class MetricsListener(StreamingQueryListener):
    def __init__(self, on_progress: Callable[[Any], object]) -> None:
        self.on_progress = on_progress

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            self.on_progress(event.progress)
        except Exception as exc:  # never let a metrics hiccup kill the callback thread
            print(f"metrics publish failed: {exc!r}", file=sys.stderr, flush=True)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
