"""The elastic Spark runtime: the runner process (one per run, a PySpark driver), its
Redis contract, the deterministic source, placement and migration of keyed state, and
the measurement harnesses. No Django import (``make lint`` checks it): the control plane
talks to a runner only through Redis."""
