"""What a runner does to its host: CPU frequency or a duty-cycle throttle
(``frequency``), the power model and RAPL readings (``power``), process CPU accounting
(``procs``) and private files for secrets (``secretfile``)."""
