"""The embedded Spark standalone cluster that ``make run`` starts (``standalone``:
a master and a worker on loopback with ``spark.authenticate``; ``python -m
pipelines.runtime.cluster start|stop|status|worker``)."""
