"""``python -m pipelines.runtime.bench``: :func:`engine.main`."""
import sys

from pipelines.runtime.bench.engine import main

sys.exit(main())
