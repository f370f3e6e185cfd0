"""``python -m pipelines.runtime.cluster``: :func:`standalone.main`."""
import sys

from pipelines.runtime.cluster.standalone import main

sys.exit(main())
