"""Compile a dataflow graph (``dataflow.py``) into one Structured Streaming query.

Each node becomes DataFrame operations on its inputs' DataFrames:

* the source reads its micro-batch once per use; the latency observation (see
  ``query.py``) sits right behind it; the event-time watermark (``watermark_s``) sits
  in front of each stateful operator's raw inputs (below every filter and re-stamp of
  the branch: Spark refuses a watermark below another; the query's is the minimum);
* ``filter``/``project`` are Spark column expressions compiled from the checked
  expression trees — no Python crossing;
* ``window_aggregate`` groups by ``window(event_time, size, slide)`` (or
  ``session_window``) and the keys; the result carries ``windowStart`` (epoch ms) and
  the window, whose end is the event time downstream operators see (a window over
  another window's results groups them by that instant, ``window_time``);
* ``project`` with ``event_time`` re-stamps the rows' event time (before any stateful
  operator of its branch);
* ``window_top`` keeps, per window, every row at the highest ``by``: a second
  aggregation that collects the window's rows and keeps those at the maximum. Behind a
  ``window_aggregate`` it regroups that operator's windows one to one by the
  ``slide``-long bucket holding each window's last instant (Spark's chained time-window
  aggregation, ``window_time``);
* ``moving_mean`` is a ``transformWithStateInPandas`` operator (``moving_mean.py``;
  the query then needs the RocksDB state store);
* ``join`` is Spark's stream–stream inner join on the key pairs, with the right side's
  event time bounded relative to the left's (``within``) or both in the same tumbling
  window (``window``), so Spark can drop state behind the watermark.

Several stateful operators in one query run in append mode (Spark ≥ 3.4); every
stateful operator's state partitions are the ``key_groups``.
"""
from __future__ import annotations

import ast
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.runtime.spec import dataflow
from pipelines.runtime.spec import definition
from pipelines.runtime.query.source import data_source_for, observe_latency, read_stream

# A zero divisor gives null (try_divide, try_mod): under ANSI mode a / 0 would fail
# the whole query on one record.
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: F.try_divide,
           ast.FloorDiv: lambda a, b: F.floor(F.try_divide(a, b)).cast("long"),
           ast.Mod: F.try_mod}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


def column(node: ast.expr) -> Column:
    """A checked expression tree (``dataflow.parse_expression``) as a Spark column."""
    if isinstance(node, ast.Name):
        return F.col(node.id)
    if isinstance(node, ast.Constant):
        return F.lit(node.value)
    if isinstance(node, ast.IfExp):
        return F.when(column(node.test), column(node.body)).otherwise(column(node.orelse))
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](column(node.left), column(node.right))
    if isinstance(node, ast.UnaryOp):
        return ~column(node.operand) if isinstance(node.op, ast.Not) else -column(node.operand)
    if isinstance(node, ast.BoolOp):
        out = column(node.values[0])
        for value in node.values[1:]:
            out = (out & column(value)) if isinstance(node.op, ast.And) else \
                (out | column(value))
        return out
    assert isinstance(node, ast.Compare)
    op, left, right = node.ops[0], column(node.left), node.comparators[0]
    if isinstance(op, (ast.Is, ast.IsNot)):  # with None: checked
        return left.isNull() if isinstance(op, ast.Is) else left.isNotNull()
    if isinstance(op, (ast.In, ast.NotIn)):
        values = [e.value for e in right.elts]  # type: ignore[attr-defined]
        return left.isin(values) if isinstance(op, ast.In) else ~left.isin(values)
    return _COMPARE[type(op)](left, column(right))


def _expr(text: str, columns: dataflow.Columns) -> Column:
    return column(dataflow.parse_expression(text, columns, ""))


def _window_column(window: dict[str, Any], time_col: Column) -> Column:
    if window["kind"] == "session":
        return F.session_window(time_col, f"{window['gap_s']} seconds")
    size = f"{window['size_s']} seconds"
    slide = f"{window.get('slide_s', window['size_s'])} seconds"
    return F.window(time_col, size, slide)


def _aggregate(name: str, fn: str, col: str, *order: str) -> Column:
    if fn == "count":
        return F.count(F.lit(1)).alias(name)
    c = F.col(col)
    if fn == "max_by":  # rows whose order is null do not count
        return F.max_by(c, F.col(order[0])).cast("double").alias(name)
    return {"sum": F.sum(c), "min": F.min(c), "max": F.max(c), "mean": F.avg(c)}[fn] \
        .cast("double").alias(name)


def _window_start_ms(window: Column) -> Column:
    return F.floor(F.unix_micros(window.start) / 1000).cast("long")


def _source(spark: SparkSession, spec: definition.PipelineSpec, t0: float,
            plan_dir: Path, start: int = 0, first_ends: tuple[int, ...] = (),
            gate: Path | None = None) -> DataFrame:
    df = read_stream(spark, data_source_for(spec.source_type), spec, t0, plan_dir, start,
                     first_ends=first_ends, gate=gate)
    if spec.source_type != "nexmark":  # (generated NEXMark events carry their own)
        # A NEXMark event's time is its dateTime, as the generated events'; other
        # records' is their emission time (the schedule's, or the broker's timestamp).
        df = df.withColumn("event_time", F.timestamp_millis("dateTime")
                           if definition.nexmark_events(spec)
                           else F.timestamp_seconds("emit_ts"))
    return observe_latency(df)


def _window_top(df: DataFrame, node: dataflow.Node, inputs: list[dataflow.Node]) -> DataFrame:
    p = node.params
    window = p["window"]
    size, slide = window["size_s"], window.get("slide_s", window["size_s"])
    keep = [c for c in inputs[0].columns if c not in ("window", "windowStart")]
    if p["chained"]:
        # One bucket of `slide` seconds per input window: the one holding its end.
        grouping = F.window(F.window_time("window"), f"{slide} seconds")
        shift_ms = (size - slide) * 1000
    else:
        grouping = _window_column(window, F.col("event_time"))
        shift_ms = 0
    rows = F.struct(*[F.col(c) for c in keep])
    top = df.groupBy(grouping.alias("bucket")).agg(F.max(p["by"]).alias("_top"),
                                                   F.collect_list(rows).alias("_rows"))
    kept = F.filter("_rows", lambda r: r[p["by"]] == F.col("_top"))
    return (top.select(F.col("bucket"), F.explode(kept).alias("_row"))
            .select(*[F.col("_row")[c].alias(c) for c in keep if c != "emit_ts"],
                    (_window_start_ms(F.col("bucket")) - F.lit(shift_ms)).alias("windowStart"),
                    F.col("_row")["emit_ts"].alias("emit_ts")))


def _join(left: DataFrame, right: DataFrame, node: dataflow.Node,
          inputs: list[dataflow.Node]) -> DataFrame:
    p = node.params
    lcols, rcols = inputs[0].columns, inputs[1].columns
    lhs, rhs = left.alias("l"), right.alias("r")
    cond = None
    for lc, rc in p["on"]:
        term = F.col(f"l.{lc}") == F.col(f"r.{rc}")
        cond = term if cond is None else cond & term
    lt, rt = F.col("l.event_time"), F.col("r.event_time")
    if "within" in p:
        lo, hi = p["within"]["lower_s"], p["within"]["upper_s"]
        cond = cond & (rt >= lt + F.expr(f"INTERVAL {lo} SECONDS")) & \
            (rt <= lt + F.expr(f"INTERVAL {hi} SECONDS"))
    else:
        size = p["window"]["size_s"]
        lhs = lhs.withColumn("_lwin", F.window("event_time", f"{size} seconds"))
        rhs = rhs.withColumn("_rwin", F.window("event_time", f"{size} seconds"))
        cond = cond & (F.col("_lwin") == F.col("_rwin"))
    joined = lhs.join(rhs, cond, "inner")
    out = [F.col(f"l.{c}").alias(c) for c in lcols]
    out += [F.col(f"r.{c}").alias(f"right_{c}" if c in lcols else c) for c in rcols]
    if "window" in p:
        out.append(_window_start_ms(F.col("_lwin")).alias("windowStart"))
    return joined.select(*out)


_SPARK_TYPES = {"long": "bigint", "double": "double", "string": "string",
                "timestamp": "timestamp", "boolean": "boolean"}


def pe_name(pe: tuple[str, ...]) -> str:
    return "+".join(pe)


def profile_dir(plan_dir: Path) -> Path:
    """Where a run's PEs write their per-worker profiles (``pyops.PeProfiler``)."""
    return plan_dir.parent / "pe-profile"


def _processing_element(df: DataFrame, node: dataflow.Node, graph: dataflow.Graph,
                        spec: definition.PipelineSpec, plan_dir: Path,
                        frames: dict[str, DataFrame]) -> DataFrame:
    """``node``'s PE as one ``mapInPandas`` when ``node`` is its first operator; a later
    operator of a PE is computed by the first's (its frame is the PE's output)."""
    from pipelines.runtime.operators import catalogue as pyops

    plan = spec.pe_plan
    assert plan is not None  # a dataflow spec always has one (definition.validate)
    pe = plan.pes[plan.pe_of(node.id)]
    if pe[0] != node.id:
        return frames[node.id]  # set when the PE's first operator was built
    last = graph.node(pe[-1])
    steps = [pyops.PeStep(n, graph.node(n).params["function"], graph.node(n).params["params"])
             for n in pe]
    schema = ", ".join(f"`{c}` {_SPARK_TYPES[t]}" for c, t in last.columns.items())
    if plan.partitions > spec.partitions and graph.node(node.inputs[0]).type != "python":
        # Data enters Python here: spread it over more tasks than the source has
        # (COLA's placement onto more hosts; a round-robin shuffle of the narrow rows).
        df = df.repartition(plan.partitions)
    where, name = str(profile_dir(plan_dir)), pe_name(pe)

    def run(batches: Any) -> Any:
        return pyops.run_pe(batches, steps, pyops.PeProfiler(where, name, steps))

    out = df.mapInPandas(run, schema)
    for n in pe[1:]:
        frames[n] = out
    return out


def build_dataflow(spark: SparkSession, spec: definition.PipelineSpec, t0: float,
                   plan_dir: Path | None = None, start: int = 0,
                   first_ends: tuple[int, ...] = (),
                   gate: Path | None = None) -> DataFrame:
    """The sink's input stream of a dataflow pipeline. ``plan_dir``: where the source's
    readers agree on each batch's end (``source.py``; a fresh directory if not given);
    ``start``/``first_ends``: a re-plan's replay (``replan.replay_start``); ``gate``:
    its turns with the forwarding query (``source.wait_for_forwarded``)."""
    assert spec.graph is not None
    graph = spec.graph
    if plan_dir is None:
        plan_dir = Path(tempfile.mkdtemp(prefix="streamwise-plan-"))
    frames: dict[str, DataFrame] = {}
    watermarked: set[str] = set()  # nodes whose output carries a watermark already
    for node in graph.nodes:
        inputs = [graph.node(i) for i in node.inputs]
        ins = _watermarked(node, [frames[i] for i in node.inputs], watermarked,
                           spec.watermark_s)
        if node.type in dataflow.SOURCE_TYPES:
            frames[node.id] = _source(spark, spec, t0, plan_dir, start, first_ends, gate)
        elif node.type == "python":
            frames[node.id] = _processing_element(ins[0], node, graph, spec, plan_dir,
                                                  frames)
        elif node.type == dataflow.APP_TYPE:
            frames[node.id] = build_app(spark, ins[0], node, spec)
        else:
            frames[node.id] = COMPILERS[node.type](ins, node, inputs)
    out = frames[graph.sink.id]
    hidden = [c for c in ("window", "event_time") if c in graph.sink.columns]
    return out.drop(*hidden)


class AppError(ValueError):
    """A pipeline module's ``build`` returned something the run cannot sink."""


def build_app(spark: SparkSession, df: DataFrame, node: dataflow.Node,
              spec: definition.PipelineSpec) -> DataFrame:
    """A pipeline module's output stream: its ``build(spark, source, ctx)`` over
    ``df``, checked against the columns it declares and narrowed to them (in their
    order, which the sink's table and the verifier read)."""
    from pipelines.runtime.operators import packages
    from pipelines.runtime.operators.base import BuildContext

    module = packages.module(node.params["app"])
    ctx = BuildContext(key_groups=spec.key_groups, params=dict(node.params["params"]),
                       watermark_s=spec.watermark_s, trigger_ms=spec.trigger_ms)
    out = module.fn(spark, df, ctx)
    check_app_output(out, node.columns, module.path, streaming=True)
    return out.select(*[F.col(c) for c in node.columns])


def check_app_output(out: Any, columns: dataflow.Columns, path: str,
                     streaming: bool) -> None:
    """AppError unless ``out`` is a DataFrame (a streaming one for a run) carrying the
    declared ``columns`` with their types."""
    if not isinstance(out, DataFrame):
        raise AppError(f"{path} returned {type(out).__name__}, not a DataFrame")
    if streaming and not out.isStreaming:
        raise AppError(f"{path} returned a batch DataFrame: build the result from the "
                       "source stream it is given")
    got = {f.name: f.dataType.simpleString() for f in out.schema.fields}
    for name, kind in columns.items():
        if name not in got:
            raise AppError(f"{path} declares the output column {name!r} ({kind}), which "
                           f"its DataFrame lacks (columns: {', '.join(got)})")
        if got[name] != _SPARK_TYPES[kind]:
            raise AppError(f"{path} declares {name!r} as {kind} ({_SPARK_TYPES[kind]}), "
                           f"its DataFrame has {got[name]}: cast it, or declare the type")


def _watermarked(node: dataflow.Node, ins: list[DataFrame], watermarked: set[str],
                 watermark_s: int) -> list[DataFrame]:
    """A stateful operator's raw inputs get their watermark here, behind every filter and
    re-stamp of their branch: Spark refuses a watermark defined below another one, and
    keeps the minimum of a query's watermarks. ``watermarked`` learns ``node``."""
    if node.stateful and node.type != dataflow.APP_TYPE:
        # (a pipeline module sets its own watermark: Spark refuses a second one on the
        # same stream)
        ins = [df_ if node_id in watermarked else
               df_.withWatermark("event_time", f"{watermark_s} seconds")
               for node_id, df_ in zip(node.inputs, ins, strict=True)]
        watermarked.add(node.id)
    elif node.inputs and all(i in watermarked for i in node.inputs):
        watermarked.add(node.id)
    return ins


Compiler = Callable[[list[DataFrame], dataflow.Node, list[dataflow.Node]], DataFrame]


def _filter(ins: list[DataFrame], node: dataflow.Node,
            inputs: list[dataflow.Node]) -> DataFrame:
    return ins[0].where(_expr(node.params["where"], inputs[0].columns))


def _project(ins: list[DataFrame], node: dataflow.Node,
             inputs: list[dataflow.Node]) -> DataFrame:
    p = node.params
    exprs = [_expr(e, inputs[0].columns).alias(n) for n, e in p["columns"].items()]
    carried = [c for c in node.columns if c not in p["columns"]]
    if "event_time" in p:  # re-stamped (validation: no stateful node above)
        carried.remove("event_time")
        exprs.append(F.timestamp_millis(_expr(p["event_time"], inputs[0].columns)
                                        .cast("long")).alias("event_time"))
    return ins[0].select(*exprs, *[F.col(c) for c in carried])


def _keyed_aggregate(ins: list[DataFrame], node: dataflow.Node,
                     _inputs: list[dataflow.Node]) -> DataFrame:
    p = node.params
    aggs = [_aggregate(n, *agg) for n, agg in p["aggregates"].items()]
    return ins[0].groupBy(*p["key"]).agg(*aggs)


def _window_aggregate(ins: list[DataFrame], node: dataflow.Node,
                      _inputs: list[dataflow.Node]) -> DataFrame:
    p = node.params
    aggs = [_aggregate(n, *agg) for n, agg in p["aggregates"].items()]
    # Over another window's results: each row at its window's last instant.
    time_col = F.window_time("window") if p.get("chained") else F.col("event_time")
    return (ins[0].groupBy(_window_column(p["window"], time_col).alias("window"), *p["key"])
            .agg(*aggs, F.max("emit_ts").alias("emit_ts"))
            .withColumn("windowStart", _window_start_ms(F.col("window"))))


def _moving_mean(ins: list[DataFrame], node: dataflow.Node,
                 inputs: list[dataflow.Node]) -> DataFrame:
    from pipelines.runtime.operators import moving_mean

    p = node.params
    key_types = [inputs[0].columns[k] for k in p["key"]]
    return ins[0].groupBy(*p["key"]).transformWithStateInPandas(
        moving_mean.make_processor(p["key"], p["value"], p["order"], p["order_types"],
                                   p["last"]),
        moving_mean.output_ddl(p["key"], key_types), "Append", "None")


# Each node type (but the source and the Python operators, compiled with the query's
# context above) as a function of its inputs' frames; the sink passes on what reaches it.
COMPILERS: dict[str, Compiler] = {
    "filter": _filter, "project": _project, "keyed_aggregate": _keyed_aggregate,
    "window_aggregate": _window_aggregate, "moving_mean": _moving_mean,
    "window_top": lambda ins, node, inputs: _window_top(ins[0], node, inputs),
    "join": lambda ins, node, inputs: _join(ins[0], ins[1], node, inputs),
    "sink": lambda ins, _node, _inputs: ins[0],
}
