"""Benchmarks of the runtime (``python -m pipelines.runtime.bench NAME``): migration
and scale (``engine``), the closed loop (``engine``), NEXMark against Beam's
reference (``nexmark``), the plan optimiser (``plan``) and the live re-plan
(``replan``). They import the runtime; nothing in the runtime imports them."""
