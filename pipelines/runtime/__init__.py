"""The elastic Spark runtime, with no Django import (``make lint`` checks it): the
control plane talks to a runner only through Redis (``bus``). Its rooms, bottom up:

* ``operators`` — the Python operators (pandas, no Spark);
* ``spec`` — a definition validated into a typed spec;
* ``connectors`` — brokers and stores outside the product, without Spark: a Redis
  stream's offsets, reads and dead letters, the PostgreSQL sink;
* ``query`` — a spec compiled into a Structured Streaming query, its sources and sink;
* ``host``, ``cluster`` — the machine (frequency, power, private files) and the
  embedded standalone cluster;
* ``runner`` — the runner process, its session, standbys and per-batch metrics;
* ``elastic`` — scaling, migration and placement of keyed state;
* ``replan`` — the live re-plan (Gloss) and its state transfer;
* ``verify`` — the exactly-once check of a run's output;
* ``bench`` — the runtime's benchmarks (nothing else imports them).
"""
