"""Python operators: named pandas functions a dataflow pipeline chains (node type
``python``), and the processing elements (PEs) that run them in Spark.

A definition cannot carry code, so a ``python`` node names an installed operator, this
catalogue's or an operator package's (``packages.py``): ``{"id": "fit", "type":
"python", "input": "bucket", "function": "quote_fit", "params": {"ticks": 192}}``. Every
operator is row-wise and deterministic: its new columns depend only on the row, so a
pipeline's output does not depend on how its operators are grouped or partitioned — the
property that lets a plan change live (``replan.py``) under the exactly-once verifier.
Each operator keeps its input columns and appends (or replaces) the columns it declares,
in the frame it is given (no copy of the batch per operator; a caller that needs its
input keeps a copy).

A **processing element** (COLA, Khandekar et al. §2.1) is a chain of these operators run
in one JVM↔Python crossing: one ``mapInPandas`` whose function calls them in turn
(:func:`run_pe`). Streams inside a PE are function calls; every PE boundary costs an
Arrow serialisation in one Python worker, a JVM hop and a deserialisation in the next.
:func:`run_pe` times each operator (the worker process's CPU during the call, so that
BLAS threads count) and the PE's whole run (the process's CPU between batches, which also
holds the crossing's Arrow conversions) per Arrow batch, and appends the sums to a
profile file per worker process (``planopt.read_profile`` reads them).

The operator sets:

* ``quote_*``: the thesis' HFT kernel (De Matteis, thesis §7.1) split into six steps of
  uneven cost over the generator's quotes — parse, enrich, bucket, fit, score, format.
  ``quote_fit`` is the heavy one: per quote, a least-squares polynomial over ``ticks``
  prices reconstructed from the quote (the kernel fits its window's 1-ms averages; a
  row-wise fit keeps the output independent of batch boundaries).
* ``bid_*``: NEXMark bids (Beam's ``Bid``: auction, bidder, price, dateTime, extra):
  Query 1's currency conversion (``price * 89 / 100``, Beam ``Query1``), then parsing
  the ``extra`` field, a price band, a fraud score and a formatted record.
* ``external_wait``: a stand-in for an operator that waits on an external service (a
  lookup, a model server): inside a Spark task it waits ``us_per_record`` a record,
  whatever the machine's speed, and uses no CPU doing so. Benchmarks and tests that need
  a known cost per record use it (``manage.py bench shares``); the verifier, outside
  Spark, computes its column without waiting.
"""
from __future__ import annotations

import bisect
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.runtime.operators.base import Columns, PyOperator

__all__ = ["BUILTIN_OPERATORS", "Columns", "PyOperator"]


# ---------------------------------------------------------------- HFT kernel steps
_TABLE = np.random.default_rng(20161).uniform(50.0, 150.0, 4096)  # reference prices


def _quote_parse(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # The quote as the exchange's wire text ("symbol|price|sequence", rebuilt from the
    # record: the generator emits numbers), decoded field by field, row by row — the
    # per-record Python work a feed handler does.
    price, size, side = [], [], []
    for k, v, q in zip(df["key"].tolist(), df["value"].tolist(), df["seq"].tolist()):
        fields = f"{k}|{v:.4f}|{q}".split("|")
        ticks = round(float(fields[1]) * 100.0)
        price.append(ticks / 100.0)
        n = int(fields[2])
        size.append((n * 2654435761) % 997 + 1)
        side.append(n % 2)
    df["price"] = np.asarray(price, dtype=np.float64)
    df["size"] = np.asarray(size, dtype=np.int64)
    df["side"] = np.asarray(side, dtype=np.int64)
    return df


_SYMBOLS = {k: ((k * 31) % 11, float(_TABLE[k % len(_TABLE)]), 0.05 if k % 3 == 0 else 0.01)
            for k in range(4096)}


def _quote_enrich(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # A look-up per quote in the symbol table (a dict, as reference data is held).
    rows = [_SYMBOLS[k % 4096] for k in df["key"].tolist()]
    df["sector"] = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    df["ref_price"] = np.fromiter((r[1] for r in rows), np.float64, len(rows))
    df["tick"] = np.fromiter((r[2] for r in rows), np.float64, len(rows))
    return df


def _quote_bucket(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # The quote's 1-ms resolution interval (the kernel averages prices per interval),
    # its minute of the UTC day, and its notional.
    bucket, minute = [], []
    for ts in df["emit_ts"].tolist():
        ms = math.floor(ts * 1000.0)
        bucket.append(ms)
        minute.append((ms // 60_000) % 1440)
    df["bucket_ms"] = np.asarray(bucket, dtype=np.int64)
    df["minute"] = np.asarray(minute, dtype=np.int64)
    df["notional"] = df["price"].to_numpy(np.float64) * df["size"].to_numpy()
    return df


def _fit_basis(ticks: int, degree: int) -> np.ndarray:
    x = np.linspace(-1.0, 1.0, ticks)
    return np.linalg.pinv(np.vander(x, degree + 1))  # (degree+1, ticks)


def _quote_fit(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    ticks = int(p.get("ticks", 128))
    seq = df["seq"].to_numpy(np.int64).astype(np.float64)
    price = df["price"].to_numpy(np.float64)
    t = np.arange(ticks, dtype=np.float64)
    out_slope = np.empty(len(df))
    out_curve = np.empty(len(df))
    step = 256  # (rows x ticks) doubles per slice: a few hundred KB, inside a core's cache
    basis = _fit_basis(ticks, 2)
    for a in range(0, len(df), step):
        b = min(a + step, len(df))
        path = price[a:b, None] * (1.0 + 0.001 * np.sin(seq[a:b, None] * 0.618 + t * 0.37))
        # (rows, 3), highest power first; einsum, not BLAS: one thread whatever the
        # process (Spark runs Python workers with OMP_NUM_THREADS=1), the same sums
        # whatever the batch split.
        coef = np.einsum("ij,kj->ik", path, basis)
        out_curve[a:b] = coef[:, 0]
        out_slope[a:b] = coef[:, 1]
    df["slope"] = out_slope
    df["curve"] = out_curve
    return df


def _quote_score(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # Per quote: how far it lies from the reference in ticks, squashed, and the trend.
    score, signal = [], []
    for p, ref, tick, slope, curve in zip(df["price"].tolist(), df["ref_price"].tolist(),
                                          df["tick"].tolist(), df["slope"].tolist(),
                                          df["curve"].tolist()):
        dev = (p - ref) / tick
        score.append(math.tanh(dev / 1000.0 + slope) * math.exp(-abs(curve)))
        signal.append(0 if curve == 0 else (1 if curve > 0 else -1))
    df["score"] = np.asarray(score, dtype=np.float64)
    df["signal"] = np.asarray(signal, dtype=np.int64)
    return df


def _quote_format(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    df["message"] = [f"{int(k)}|{p:.2f}|{c:+.4f}" for k, p, c in
                     zip(df["key"].tolist(), df["price"].tolist(), df["score"].tolist())]
    return df


# ----------------------------------------------------------------- NEXMark bids
def _bid_euro(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # Beam Query1: price * 89 / 100 (integer division of a long), row by row as a
    # Python UDF is written (vectorised it costs under 0.1 us a row: less than the
    # per-call overhead that then swings its measured cost 2-4x).
    df["price"] = np.asarray([0 if p is None or p != p else int(p) * 89 // 100
                              for p in df["price"].tolist()], dtype=np.int64)
    return df


def _bid_extra(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # The bid's free-text field, read row by row.
    lengths, vowels = [], []
    for text in df["extra"].tolist():
        text = text or ""
        lengths.append(len(text))
        vowels.append(sum(map(text.count, "aeiou")))
    df["extra_len"] = np.asarray(lengths, dtype=np.int64)
    df["extra_vowels"] = np.asarray(vowels, dtype=np.int64)
    return df


def _bid_band(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # The price band (bounds 100, 1,000, 10,000, 100,000), row by row as _bid_euro.
    df["band"] = np.asarray([bisect.bisect_left(_BAND_BOUNDS, p)
                             for p in df["price"].tolist()], dtype=np.int64)
    return df


_BAND_BOUNDS = (100, 1_000, 10_000, 100_000)


def _bid_fraud(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    ticks = int(p.get("ticks", 128))
    bidder = df["bidder"].fillna(0).to_numpy().astype(np.float64)
    price = df["price"].to_numpy(np.int64).astype(np.float64)
    t = np.arange(ticks, dtype=np.float64)
    score = np.empty(len(df))
    for a in range(0, len(df), 256):  # slices inside a core's cache, as in quote_fit
        b = min(a + 256, len(df))
        walk = np.cos(bidder[a:b, None] * 0.7071 + t * 0.13) * np.log1p(price[a:b, None])
        score[a:b] = walk.std(axis=1)
    df["fraud"] = score
    return df


def _bid_format(df: pd.DataFrame, _p: dict[str, Any]) -> pd.DataFrame:
    # (ids as whole numbers: a column with nulls upstream may arrive as doubles)
    df["message"] = [f"{int(a)}:{int(b)}:{int(p)}:{f:.3f}" for a, b, p, f in
                     zip(df["auction"].tolist(), df["bidder"].tolist(),
                         df["price"].tolist(), df["fraud"].tolist())]
    return df


def _external_wait(df: pd.DataFrame, p: dict[str, Any]) -> pd.DataFrame:
    from pyspark import TaskContext

    # Only in a Spark task: the verifier and the plan's profiler call the same function
    # outside Spark, where the wait would only slow them down.
    if len(df) and TaskContext.get() is not None:
        time.sleep(len(df) * p["us_per_record"] / 1e6)
    return df.assign(waited_us=np.full(len(df), p["us_per_record"], dtype=np.int64))


_FIT = {"ticks": (128, 4, 4096)}
# The product's own operators: the first operator package (``packages.BUILTIN``); a
# pipeline names any installed package's through ``packages.operator``.
BUILTIN_OPERATORS: dict[str, PyOperator] = {op.name: op for op in (
    PyOperator("quote_parse", ("seq", "value"), {"price": "double", "size": "long",
                                                 "side": "long"}, _quote_parse,
               doc="a quote's price in cents, size and side"),
    PyOperator("quote_enrich", ("key",), {"sector": "long", "ref_price": "double",
                                          "tick": "double"}, _quote_enrich,
               doc="the symbol's sector, reference price and tick size"),
    PyOperator("quote_bucket", ("emit_ts", "price", "size"),
               {"bucket_ms": "long", "minute": "long", "notional": "double"}, _quote_bucket,
               doc="the 1-ms resolution interval, minute of the day and notional"),
    PyOperator("quote_fit", ("seq", "price"), {"slope": "double", "curve": "double"},
               _quote_fit, dict(_FIT), doc="a degree-2 least-squares fit over ticks prices"),
    PyOperator("quote_score", ("price", "ref_price", "tick", "slope", "curve"),
               {"score": "double", "signal": "long"}, _quote_score,
               doc="a bargain score and signal"),
    PyOperator("quote_format", ("key", "price", "score"), {"message": "string"},
               _quote_format, doc="the quote as a text record"),
    PyOperator("bid_euro", ("price",), {"price": "long"}, _bid_euro,
               doc="NEXMark Q1: the bid price in euros"),
    PyOperator("bid_extra", ("extra",), {"extra_len": "long", "extra_vowels": "long"},
               _bid_extra, doc="parses the bid's extra field"),
    PyOperator("bid_band", ("price",), {"band": "long"}, _bid_band,
               doc="the bid's price band"),
    PyOperator("bid_fraud", ("bidder", "price"), {"fraud": "double"}, _bid_fraud,
               dict(_FIT), doc="a bidder's fraud score over ticks steps"),
    PyOperator("bid_format", ("auction", "bidder", "price", "fraud"), {"message": "string"},
               _bid_format, doc="the bid as a text record"),
    PyOperator("external_wait", (), {"waited_us": "long"}, _external_wait,
               {"us_per_record": (1000, 0, 100_000)},
               doc="waits us_per_record a record in a Spark task, as a call to an "
                   "external service would (no CPU); a known cost per record"),
)}


def _operator(name: str) -> PyOperator:
    from pipelines.runtime.operators import packages

    return packages.operator(name)


def output_columns(op: PyOperator, columns: Columns) -> Columns:
    out = dict(columns)
    out.update(op.adds)
    return out


# ------------------------------------------------------------- processing elements
@dataclass(frozen=True)
class PeStep:
    node_id: str
    function: str
    params: dict[str, Any]


def _arrow_bytes(df: pd.DataFrame) -> int:
    """What a batch weighs in Arrow: 8 bytes a number, a string's length plus its
    offset; strings measured on a sample of rows (exact enough for a per-record rate)."""
    n = len(df)
    if not n:
        return 0
    total = 0
    sample = df.iloc[:256]
    for name, dtype in df.dtypes.items():
        if pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype):
            lengths = sample[name].map(lambda v: len(v) if isinstance(v, str) else 0)
            total += int((float(lengths.mean()) + 4.0) * n)
        else:
            total += 8 * n
    return total


class PeProfiler:
    """Per-operator and per-PE sums of one Python worker, flushed to a JSON-lines file
    about once a second (``planopt.read_profile`` sums every worker's files)."""

    FLUSH_S = 1.0
    SEGMENT_S = 600  # one file per worker per ten minutes: a reader skips old ones

    def __init__(self, profile_dir: str, pe: str, steps: list[PeStep]) -> None:
        self.directory = Path(profile_dir)
        self.pe = pe
        self.ops = {s.node_id: {"cpu_s": 0.0, "rows_in": 0, "rows_out": 0, "bytes_out": 0}
                    for s in steps}
        self.totals = {"tasks": 0, "batches": 0, "cpu_s": 0.0, "rows_in": 0, "bytes_in": 0,
                       "rows_out": 0, "bytes_out": 0}
        self.last_flush = time.monotonic()

    def flush(self, force: bool = False) -> None:
        if not self.totals["batches"]:
            return
        if not force and time.monotonic() - self.last_flush < self.FLUSH_S:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        record = {"t": now, "pe": self.pe, "pid": os.getpid(), **self.totals,
                  "ops": self.ops}
        segment = int(now // self.SEGMENT_S) * self.SEGMENT_S
        path = self.directory / f"{self.pe}.{os.getpid()}.{segment}.jsonl"
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")
        self.last_flush = time.monotonic()
        for op in self.ops.values():
            for k in op:
                op[k] = 0
        for k in self.totals:
            self.totals[k] = 0


def run_pe(batches: Iterator[pd.DataFrame], steps: list[PeStep],
           profiler: PeProfiler | None = None) -> Iterator[pd.DataFrame]:
    """One PE: every Arrow batch through its operators in turn (the ``mapInPandas``
    function). The PE's CPU is the process's CPU from the first batch's arrival to the
    last one's output (Arrow conversions included, time blocked on input excluded)."""
    from pipelines.runtime.operators import packages

    ops = [(s, packages.operator(s.function)) for s in steps]
    cpu_mark = time.process_time()
    if profiler is not None:
        profiler.totals["tasks"] += 1  # one call per task: the PE's fixed cost per task
    for df in batches:
        if profiler is not None:
            profiler.totals["batches"] += 1
            profiler.totals["rows_in"] += len(df)
            profiler.totals["bytes_in"] += _arrow_bytes(df)
        out_bytes = 0
        for step, op in ops:
            before = time.process_time()
            rows_in = len(df)
            df = op.fn(df, step.params)
            if profiler is not None:
                acc = profiler.ops[step.node_id]
                acc["cpu_s"] += time.process_time() - before
                acc["rows_in"] += rows_in
                acc["rows_out"] += len(df)
                out_bytes = _arrow_bytes(df)
                acc["bytes_out"] += out_bytes
        if profiler is not None:  # the PE's output is its last operator's
            profiler.totals["rows_out"] += len(df)
            profiler.totals["bytes_out"] += out_bytes
        yield df
        if profiler is not None:
            now = time.process_time()
            # The yield returned: the worker has serialised the output and read the
            # next batch, so this span holds both conversions.
            profiler.totals["cpu_s"] += now - cpu_mark
            cpu_mark = now
            profiler.flush()
    if profiler is not None:
        profiler.flush(force=True)


# Written before each operator is timed alone: more than a core's L2 (1 MiB on this
# EPYC), so the operator's own data (the symbol table, the fit's basis) starts out of
# the caches, as in a PE worker, whose caches the JVM and the batch's Arrow conversion
# have held since its previous call. Timed warm, the cheap operators ran 5-10 % faster.
EVICT_BYTES = 4 << 20


def time_chain_alone(steps: list[PeStep], sample: pd.DataFrame, seconds: float,
                     pause_s: float = 0.25) -> dict[str, float]:
    """Each operator of a chain timed on its own, outside Spark, for about ``seconds``:
    round after round, each operator called once on a copy of its input (``sample``
    through the operators before it), a pause between rounds as a PE's worker waits
    between batches. Median CPU seconds per record, per operator. Run it while the
    profiled query runs: a shared machine's speed drifts, and both then see the same."""
    inputs = []
    df = sample
    for step in steps:
        inputs.append(df)
        df = _operator(step.function).fn(df.copy(), step.params)
    times: dict[str, list[float]] = {s.node_id: [] for s in steps}
    evict = np.zeros(EVICT_BYTES // 8)
    deadline = time.monotonic() + seconds
    while True:
        for step, frame in zip(steps, inputs, strict=True):
            # The caller's heap is not a Python worker's: a full collection over it
            # (a test process holds Django, Spark's client, ...) would be timed too.
            gc.collect()
            gc.disable()
            try:
                # The copy after the collection (which walks the whole heap through the
                # caches): fresh in the caches as a worker's batch is, out of Arrow.
                evict += 1.0
                df = frame.copy()
                before = time.process_time()
                _operator(step.function).fn(df, step.params)
                times[step.node_id].append(time.process_time() - before)
            finally:
                gc.enable()
        if time.monotonic() >= deadline:
            break
        time.sleep(pause_s)
    return {k: float(np.median(v)) / max(1, len(sample)) for k, v in times.items()}


def time_chain_alone_isolated(steps: list[PeStep], sample: pd.DataFrame, seconds: float,
                              pause_s: float = 0.25) -> dict[str, float]:
    """:func:`time_chain_alone` in a fresh Python process that imports this module and
    what a PE's Python worker imports (PySpark's worker, Arrow): a heap like a worker's. Timed in the caller's
    process (a test or the bench: Django, Spark's client, ...), the cheap operators
    (under 2 µs a row) drifted up to ±30 % from the profile, the way a big heap's
    collections and cache misses go; the same operators timed here do not carry them."""
    with tempfile.TemporaryDirectory(prefix="streamwise-alone-") as tmp:
        job, answer = Path(tmp) / "job.pkl", Path(tmp) / "answer.json"
        pd.to_pickle({"steps": steps, "sample": sample, "seconds": seconds,
                      "pause_s": pause_s}, job)
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.runtime.operators.catalogue", str(job), str(answer)],
            cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True,
            timeout=seconds + 120)
        if done.returncode != 0:
            raise RuntimeError(f"timing the operators alone failed: {done.stderr[-2000:]}")
        return json.loads(answer.read_text())


def _time_alone_main(argv: list[str]) -> int:
    """``python -m pipelines.runtime.operators.catalogue JOB ANSWER``: the child of
    :func:`time_chain_alone_isolated`."""
    # The modules a PE's Python worker holds (PySpark's worker, Arrow, cloudpickle): its
    # heap, not a bare interpreter's, is what the per-row Python work runs in, and
    # per-row operators time cheaper in a bare one (docs/benchmarks.md, "operators
    # timed alone").
    import pyarrow  # noqa: F401
    import pyspark.worker  # noqa: F401
    job = pd.read_pickle(argv[0])
    times = time_chain_alone(job["steps"], job["sample"], job["seconds"], job["pause_s"])
    Path(argv[1]).write_text(json.dumps(times))
    return 0


# ----------------------------------------------------------- example pipelines
HFT_STEPS = ("parse", "enrich", "bucket", "fit", "score", "format")


def hft_split_definition(rate: float, ticks: int = 256, partitions: int = 2,
                         plan: dict[str, Any] | None = None,
                         max_records_per_batch: int = 200_000) -> dict[str, Any]:
    """The HFT kernel as six Python operators over the artifact's 2,836 symbols."""
    nodes: list[dict[str, Any]] = [
        {"id": "quotes", "type": "generator", "seed": 16, "partitions": partitions,
         "rate": {"kind": "constant", "records_per_s": rate},
         "keys": {"kind": "file", "file": "elastic-hft/probability_distribution"}}]
    prev = "quotes"
    for step in HFT_STEPS:
        node: dict[str, Any] = {"id": step, "type": "python", "input": prev,
                                "function": f"quote_{step}"}
        if step == "fit":
            node["params"] = {"ticks": ticks}
        nodes.append(node)
        prev = step
    nodes.append({"id": "out", "type": "sink", "input": prev, "keep_output": True})
    doc: dict[str, Any] = {"nodes": nodes, "max_records_per_batch": max_records_per_batch}
    if plan is not None:
        doc["plan"] = plan
    return doc


def nexmark_python_definition(rate: float, ticks: int = 128, partitions: int = 1,
                              plan: dict[str, Any] | None = None,
                              max_records_per_batch: int = 200_000) -> dict[str, Any]:
    """NEXMark bids (Query 1's conversion to euros) through four more Python steps."""
    nodes: list[dict[str, Any]] = [
        {"id": "events", "type": "nexmark", "seed": 5, "partitions": partitions,
         "rate": {"kind": "constant", "records_per_s": rate}},
        {"id": "bids", "type": "filter", "input": "events", "where": "type == 'bid'"},
        {"id": "euro", "type": "python", "input": "bids", "function": "bid_euro"},
        {"id": "extra", "type": "python", "input": "euro", "function": "bid_extra"},
        {"id": "band", "type": "python", "input": "extra", "function": "bid_band"},
        {"id": "fraud", "type": "python", "input": "band", "function": "bid_fraud",
         "params": {"ticks": ticks}},
        {"id": "format", "type": "python", "input": "fraud", "function": "bid_format"},
        {"id": "out", "type": "sink", "input": "format", "keep_output": True}]
    doc: dict[str, Any] = {"nodes": nodes, "max_records_per_batch": max_records_per_batch}
    if plan is not None:
        doc["plan"] = plan
    return doc


if __name__ == "__main__":
    sys.exit(_time_alone_main(sys.argv[1:]))
