"""``python -m pipelines.runtime.verify``: :func:`verifier.main`."""
import sys

from pipelines.runtime.verify.verifier import main

sys.exit(main())
