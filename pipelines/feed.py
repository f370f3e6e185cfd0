"""``python -m pipelines.feed redis|jetstream|files ...``: the feeder's command line. The
feeder itself is ``pipelines/runtime/connectors/feed.py`` (the benchmarks use it too)."""
from pipelines.runtime.connectors.feed import main

if __name__ == "__main__":
    raise SystemExit(main())
