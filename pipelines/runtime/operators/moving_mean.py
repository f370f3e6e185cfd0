"""A keyed moving mean over the latest ``last`` values, as a Spark
``transformWithStateInPandas`` operator, and a pure-Python reference of it.

It is what NEXMark Q6 needs after Beam's WinningBids ("Average selling price by seller",
Beam's ``Query6`` with its ``MovingMeanSellingPrice`` combiner): per seller, the mean of
the prices of their 10 latest winning bids, ordered by bid time then price. Spark has no
built-in operator for "the latest N per key" (a window is over time, not a count), and
its arbitrary state operators follow other stateful operators in append mode only as
``transformWithState`` (Spark 4).

Semantics, per key: the operator keeps the ``last`` greatest rows by ``order`` (a list
of columns, ascending) it has received so far; after each micro-batch in which the key
received rows it emits one row ``key…, mean, count, emit_ts``: the mean of ``value``
over the kept rows, how many rows the key has received in all, and the latest scheduled
emission time among the batch's rows (latency). Beam emits after every element; the row
Spark emits after a batch is Beam's row after that batch's last element, because the
kept set does not depend on the order in which rows arrive — it is the ``last`` greatest
by ``order`` among everything seen (ties on every order column keep the later arrival,
as Beam's list does).

State per key: one ValueState row (``count`` and the kept rows' order and value arrays);
that is what a migration of the key's group moves.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class MovingMeanState:
    count: int
    kept: list[tuple[tuple[float, ...], float]]  # (order values, value), ascending


def advance(state: MovingMeanState | None, rows: Iterable[tuple[tuple[float, ...], float]],
            last: int) -> MovingMeanState:
    """The state after ``rows`` (order values, value) arrive, in arrival order."""
    kept = list(state.kept) if state else []
    count = state.count if state else 0
    for row in rows:
        kept.append(row)
        count += 1
    kept.sort(key=lambda r: r[0])  # stable: equal orders keep their arrival order
    return MovingMeanState(count, kept[-last:])


def mean(state: MovingMeanState) -> float:
    return sum(v for _o, v in state.kept) / len(state.kept)


def state_ddl(order_types: list[str]) -> str:
    orders = ", ".join(f"o{i} ARRAY<{t.upper()}>" for i, t in enumerate(order_types))
    return f"count LONG, {orders}, v ARRAY<DOUBLE>"


def output_ddl(key: list[str], key_types: list[str]) -> str:
    keys = ", ".join(f"{k} {t.upper()}" for k, t in zip(key, key_types, strict=True))
    return f"{keys}, mean DOUBLE, count LONG, emit_ts DOUBLE"


def _processor_class() -> type:
    # Imported lazily: the reference and the verifier use this module without Spark.
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class MovingMeanProcessor(StatefulProcessor):
        """Mean of the latest ``last`` values per key; see the module docstring."""

        def __init__(self, key: list[str], value: str, order: list[str],
                     order_types: list[str], last: int) -> None:
            self.key, self.value, self.order = key, value, order
            self.order_types, self.last = order_types, last

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.state = handle.getValueState("moving_mean", state_ddl(self.order_types))

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                            timerValues: Any = None) -> Iterator[pd.DataFrame]:
            new = pd.concat(list(rows), ignore_index=True)
            stored = self.state.get()  # None before the key's first row
            before = None
            if stored is not None:
                count, *orders, values = stored
                before = MovingMeanState(int(count), [
                    (tuple(o[i] for o in orders), float(values[i]))
                    for i in range(len(values))])
            arrived = zip(zip(*(new[c].tolist() for c in self.order), strict=True),
                          new[self.value].astype(float).tolist(), strict=True)
            after = advance(before, arrived, self.last)
            self.state.update((after.count,
                               *[[o[i] for o, _v in after.kept] for i in range(len(self.order))],
                               [v for _o, v in after.kept]))
            out = {k: [key[i]] for i, k in enumerate(self.key)}
            out.update(mean=[mean(after)], count=[after.count],
                       emit_ts=[float(new["emit_ts"].max())])
            yield pd.DataFrame(out)

        def close(self) -> None:
            pass

    return MovingMeanProcessor


def make_processor(key: list[str], value: str, order: list[str], order_types: list[str],
                   last: int) -> Any:
    return _processor_class()(key, value, order, order_types, last)
