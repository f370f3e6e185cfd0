"""StreamingQueryListener that forwards each micro-batch's progress to the runner.

It runs on a py4j callback thread ~0.1 s after each batch; it must stay cheap (a slow
listener builds an unbounded backlog of listener events), so it only joins two small
dicts and does one Redis XADD.
"""
from __future__ import annotations

import sys
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener


class MetricsListener(StreamingQueryListener):
    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            self.runner.on_progress(event.progress)
        except Exception as exc:  # never let a metrics hiccup kill the callback thread
            print(f"metrics publish failed: {exc!r}", file=sys.stderr, flush=True)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
