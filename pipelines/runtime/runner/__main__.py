"""``python -m pipelines.runtime.runner``: :func:`runner.main`."""
import sys

from pipelines.runtime.runner.runner import main

sys.exit(main())
