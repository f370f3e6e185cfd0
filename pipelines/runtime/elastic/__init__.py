"""Elasticity of a running query: the commands that change it (``reconfigure``:
set workers, rebalance, move key groups, set frequency), how a migration of key groups
is planned and paced (``migration``), where state partitions run (``placement``: the
driver's state store coordinator) and the executors asked for and retired
(``executors``)."""
