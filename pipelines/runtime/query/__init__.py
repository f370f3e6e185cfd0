"""A spec as a Structured Streaming query: the sources (``source``, the keyed
generator; ``nexmark_source``, Beam's NEXMark events), the chain compiler and the
latency sink (``compiler``), the dataflow compiler (``dataflow_spark``), the operators
it runs in Python (``pyops``, ``hft``, ``moving_mean``) and the measured plan of the
Python operators' processing elements (``planopt``, COLA's input)."""
