"""``python -m pipelines.runtime.bench``: :func:`cli.main`."""
import sys

from pipelines.runtime.bench.cli import main

sys.exit(main())
