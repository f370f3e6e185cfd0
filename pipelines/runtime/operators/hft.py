"""The thesis' high-frequency-trading kernel (De Matteis, thesis §7.1) as a Spark
``transformWithStateInPandas`` operator, and a pure-pandas reference of it.

Quotes are keyed by symbol (the artifact's 2,836-symbol distribution). For every symbol
the operator keeps a *count window* of the last |W| quotes; every δ quotes of that
symbol (a "triggering tuple", §6.2) it

(a) averages the prices inside each 1 ms resolution interval of the window, and
(b) fits a polynomial of degree d to those averages (the thesis uses
    Levenberg–Marquardt through lmfit; for a polynomial model LM converges to the
    linear least-squares solution, which ``numpy.polyfit`` computes directly).

Window semantics (the thesis gives |W| = 1000, δ = 25, §7.1; digest §8.2): windows
are complete count windows; with c the number of quotes of the symbol so far, a window
fires at quote c when c >= |W| and (c - |W|) is a multiple of δ, and covers quotes
c-|W|+1 .. c in sequence order. Each fired window emits one row:
``key, window_end (= c), first_seq, last_seq, buckets, price_mean, coefficients``
(highest power first, left-padded with zeros when a window has fewer distinct 1 ms
buckets than d+1). A quote's time is its scheduled emission time ``emit_ts``.

The operator holds, per symbol, the count and the last |W| quotes in one ValueState
row (arrays): that is the state a migration of the symbol's key group moves.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

OUTPUT_DDL = ("key LONG, window_end LONG, first_seq LONG, last_seq LONG, buckets LONG, "
              "price_mean DOUBLE, coefficients ARRAY<DOUBLE>")
OUTPUT_COLUMNS = ["key", "window_end", "first_seq", "last_seq", "buckets", "price_mean",
                  "coefficients"]
STATE_DDL = "count LONG, seqs ARRAY<LONG>, ts ARRAY<DOUBLE>, prices ARRAY<DOUBLE>"


def window_stats(ts: np.ndarray, prices: np.ndarray, degree: int) -> tuple[int, float, list[float]]:
    """1 ms bucket averages of one window and the polynomial fitted to them."""
    buckets = np.floor(ts * 1000.0).astype(np.int64)
    uniq, inverse = np.unique(buckets, return_inverse=True)
    sums = np.bincount(inverse, weights=prices)
    counts = np.bincount(inverse)
    means = sums / counts
    x = (uniq - uniq[0]).astype(np.float64)
    deg = min(degree, len(uniq) - 1)
    coef = list(np.polyfit(x, means, deg)) if deg > 0 else [float(means.mean())]
    coef = [0.0] * (degree + 1 - len(coef)) + [float(c) for c in coef]
    return len(uniq), float(means.mean()), coef


def fire_positions(count_before: int, count_after: int, window: int, slide: int) -> list[int]:
    """Counts c in (count_before, count_after] at which a window fires."""
    first = max(count_before + 1, window)
    # smallest c >= first with (c - window) % slide == 0
    c = first + (-(first - window)) % slide
    return list(range(c, count_after + 1, slide))


def _processor_class() -> type:
    # Imported lazily: this module is also used by the verifier without Spark.
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class HftWindowProcessor(StatefulProcessor):
        """Count window |W|, slide δ, per symbol; see the module docstring."""

        def __init__(self, window: int, slide: int, degree: int) -> None:
            self.window, self.slide, self.degree = window, slide, degree

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.state = handle.getValueState("window", STATE_DDL)

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                            timerValues: Any = None) -> Iterator[pd.DataFrame]:
            new = pd.concat(list(rows), ignore_index=True).sort_values("seq", kind="stable")
            stored = self.state.get()  # None before the symbol's first quote (one round trip)
            if stored is not None:
                count, seqs, ts, prices = stored
                seqs, ts, prices = (np.asarray(seqs, dtype=np.int64),
                                    np.asarray(ts, dtype=np.float64),
                                    np.asarray(prices, dtype=np.float64))
            else:
                count = 0
                seqs = np.empty(0, np.int64)
                ts = prices = np.empty(0, np.float64)
            seqs = np.concatenate([seqs, new["seq"].to_numpy(np.int64)])
            ts = np.concatenate([ts, new["emit_ts"].to_numpy(np.float64)])
            prices = np.concatenate([prices, new["value"].to_numpy(np.float64)])
            after = count + len(new)
            first_count = after - len(seqs) + 1  # the count of the buffer's first quote
            out = []
            for c in fire_positions(count, after, self.window, self.slide):
                hi = c - first_count + 1
                lo = hi - self.window
                n_buckets, mean, coef = window_stats(ts[lo:hi], prices[lo:hi], self.degree)
                out.append((int(key[0]), c, int(seqs[lo]), int(seqs[hi - 1]), n_buckets,
                            mean, coef))
            keep = self.window - 1  # the next window needs at most |W|-1 older quotes
            self.state.update((after, seqs[-keep:].tolist(), ts[-keep:].tolist(),
                               prices[-keep:].tolist()))
            if out:
                yield pd.DataFrame(out, columns=OUTPUT_COLUMNS)

        def handleInitialState(self, key: Any, initialState: pd.DataFrame,
                               timerValues: Any = None) -> None:
            """A live re-plan's new query starts from the old one's state
            (``replan.write_snapshot``): one row per symbol, the stored window."""
            row = initialState.iloc[0]
            self.state.update((int(row["count"]), [int(x) for x in row["seqs"]],
                               [float(x) for x in row["ts"]],
                               [float(x) for x in row["prices"]]))

        def close(self) -> None:
            pass

    return HftWindowProcessor


def make_processor(window: int, slide: int, degree: int) -> Any:
    return _processor_class()(window, slide, degree)


def reference(records: pd.DataFrame, window: int, slide: int, degree: int) -> pd.DataFrame:
    """Every window the kernel fires over ``records`` (columns seq, key, value,
    emit_ts), computed from the whole stream at once (no incremental state): the oracle
    the operator is tested against. Its bucket averages are a dictionary's sums and
    counts, not the operator's ``np.unique``/``bincount`` (``window_stats``)."""
    rows = []
    df = records.sort_values("seq", kind="stable")
    for key, quotes in df.groupby("key", sort=True):
        seqs = quotes["seq"].to_numpy(np.int64)
        buckets = np.floor(quotes["emit_ts"].to_numpy(np.float64) * 1000.0).astype(np.int64)
        values = quotes["value"].to_numpy(np.float64)
        for end in range(window, len(quotes) + 1, slide):  # end = c, 1-based count
            sums: dict[int, list[float]] = {}
            for bucket, value in zip(buckets[end - window:end].tolist(),
                                     values[end - window:end].tolist(), strict=True):
                acc = sums.setdefault(bucket, [0.0, 0.0])
                acc[0] += value
                acc[1] += 1.0
            order = sorted(sums)
            means = np.array([sums[b][0] / sums[b][1] for b in order])
            x = np.array(order, dtype=np.int64) - order[0]
            deg = min(degree, len(order) - 1)
            coef = (list(np.polyfit(x.astype(float), means, deg)) if deg > 0
                    else [float(means.mean())])
            coef = [0.0] * (degree + 1 - len(coef)) + [float(c) for c in coef]
            rows.append((int(key), end, int(seqs[end - window]), int(seqs[end - 1]),
                         len(order), float(means.mean()), coef))
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)
