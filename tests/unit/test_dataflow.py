"""Dataflow definitions: the DAG, its checks (errors name the node and the field), the
expression language, and the drawing."""
from __future__ import annotations

import json

import pytest

from pipelines.nexmark import queries
from pipelines.runtime.spec import dataflow
from pipelines.runtime.spec import definition as pdef

pytestmark = pytest.mark.dbless  # no database: run once, in the PostgreSQL pass


def _doc(*nodes: dict) -> dict:
    return {"nodes": [{"id": "events", "type": "nexmark",
                       "rate": {"kind": "constant", "records_per_s": 100}}, *nodes],
            "key_groups": 4}


def _error(doc: dict) -> str:
    with pytest.raises(pdef.DefinitionError) as caught:
        pdef.validate(doc)
    return str(caught.value)


def test_every_nexmark_query_is_a_valid_dag_in_append_mode() -> None:
    for query in queries.QUERIES:
        spec = pdef.validate(queries.definition(query, 500))
        assert spec.graph is not None and spec.output_mode == "append"
        assert spec.reference == f"nexmark:{query}" and spec.source_type == "nexmark"
        assert pdef.validate(json.loads(json.dumps(spec.raw))).raw == spec.raw
    q3 = pdef.validate(queries.definition("Q3", 500)).graph
    assert [n.id for n in q3.stateful] == ["joined"]
    assert q3.sink.columns.keys() >= {"name", "city", "state", "id"}


def test_errors_name_the_node_and_the_field() -> None:
    sink = {"id": "out", "type": "sink", "input": "bids"}
    assert "nodes[1] (bids).input: unknown node 'evnts'" in _error(_doc(
        {"id": "bids", "type": "filter", "input": "evnts", "where": "True"}, sink))
    assert "nodes[1] (bids).where: unknown column 'prcie'" in _error(_doc(
        {"id": "bids", "type": "filter", "input": "events", "where": "prcie > 3"}, sink))
    assert "function call" in _error(_doc(
        {"id": "bids", "type": "filter", "input": "events",
         "where": "__import__('os').system('id') == 0"}, sink))
    assert "not a valid expression" in _error(_doc(
        {"id": "bids", "type": "filter", "input": "events", "where": "price >"}, sink))
    assert "part of a cycle" in _error(_doc(
        {"id": "a", "type": "filter", "input": "b", "where": "True"},
        {"id": "b", "type": "filter", "input": "a", "where": "True"},
        {"id": "out", "type": "sink", "input": "b"}))
    assert "does not lead to the sink" in _error(_doc(
        {"id": "bids", "type": "filter", "input": "events", "where": "True"},
        {"id": "lonely", "type": "filter", "input": "events", "where": "True"}, sink))
    assert "exactly one source" in _error({"nodes": [sink]})
    assert "nodes[2] (w).window.slide_s" in _error(_doc(
        {"id": "bids", "type": "filter", "input": "events", "where": "True"},
        {"id": "w", "type": "window_aggregate", "input": "bids",
         "window": {"kind": "sliding", "size_s": 10, "slide_s": 3},
         "aggregates": {"n": ["count"]}}, {"id": "out", "type": "sink", "input": "w"}))
    assert "nodes[1] (j).on[0]: unknown column 'sellr'" in _error(_doc(
        {"id": "j", "type": "join", "left": "events", "right": "events",
         "on": [["id", "sellr"]], "within": {"lower_s": 0, "upper_s": 5}},
        {"id": "out", "type": "sink", "input": "j"}))
    assert "exactly one of 'within'" in _error(_doc(
        {"id": "j", "type": "join", "left": "events", "right": "events",
         "on": [["id", "seller"]]}, {"id": "out", "type": "sink", "input": "j"}))


def test_a_shape_spark_refuses_is_refused_with_its_reason() -> None:
    message = _error(_doc(
        {"id": "w", "type": "window_aggregate", "input": "events", "key": ["auction"],
         "window": {"kind": "tumbling", "size_s": 10}, "aggregates": {"n": ["count"]}},
        {"id": "k", "type": "keyed_aggregate", "input": "w", "key": ["auction"],
         "aggregates": {"total": ["sum", "n"]}},
        {"id": "out", "type": "sink", "input": "k"}))
    assert "nodes[2] (k).type" in message and "only in append mode" in message
    alone = pdef.validate(_doc(
        {"id": "k", "type": "keyed_aggregate", "input": "events", "key": ["auction"],
         "aggregates": {"n": ["count"]}}, {"id": "out", "type": "sink", "input": "k"}))
    assert alone.output_mode == "update"


def test_expressions_compile_only_what_was_checked() -> None:
    cols = dataflow.NEXMARK_COLUMNS
    tree = dataflow.parse_expression("price * 89 // 100", cols, "x")
    assert dataflow.expression_type(tree, cols) == "long"
    assert dataflow.expression_type(dataflow.parse_expression("price / 2", cols, "x"),
                                    cols) == "double"
    with pytest.raises(dataflow.GraphError, match="list of literals"):
        dataflow.parse_expression("state in (city, 'OR')", cols, "x")
    with pytest.raises(dataflow.GraphError, match="chained comparison"):
        dataflow.parse_expression("1 < price < 5", cols, "x")


def test_the_picture_puts_every_node_after_its_inputs() -> None:
    spec = pdef.validate(queries.definition("Q8", 100))
    pic = pdef.picture(spec)
    x = {n.id: n.x for n in pic.nodes}
    assert all(x[e.source] < x[e.target] for e in pic.edges)
    assert len(pic.edges) == len(spec.graph.edges())
    chain = pdef.picture(pdef.validate(pdef.DEMO_DEFINITION))
    assert [n.type for n in chain.nodes] == ["generator", "filter", "map",
                                             "keyed_aggregate", "sink"]


def test_a_moving_mean_and_max_by_are_checked_and_nothing_windows_its_results() -> None:
    bids = {"id": "bids", "type": "filter", "input": "events", "where": "type == 'bid'"}
    mean = {"id": "m", "type": "moving_mean", "input": "bids", "key": ["bidder"],
            "value": "price", "order": ["dateTime"], "last": 3}
    spec = pdef.validate(_doc(bids, mean, {"id": "out", "type": "sink", "input": "m"}))
    assert spec.graph.sink.columns.keys() == {"bidder", "mean", "count", "emit_ts"}
    assert "nodes[2] (m).value: must name a numeric column" in _error(_doc(
        bids, {**mean, "value": "extra"}, {"id": "out", "type": "sink", "input": "m"}))
    assert "needs the rocksdb state store" in _error({**_doc(
        bids, mean, {"id": "out", "type": "sink", "input": "m"}), "state_store": "hdfs"})
    assert "nodes[3] (w).input: a window needs rows with an event time" in _error(_doc(
        bids, mean, {"id": "w", "type": "window_top", "input": "m", "by": "mean",
                     "window": {"kind": "tumbling", "size_s": 10}},
        {"id": "out", "type": "sink", "input": "w"}))
    assert "[max_by, value column, order column]" in _error(_doc(
        bids, {"id": "w", "type": "window_aggregate", "input": "bids",
               "window": {"kind": "tumbling", "size_s": 10},
               "aggregates": {"first": ["max_by", "price"]}},
        {"id": "out", "type": "sink", "input": "w"}))


def test_the_moving_mean_does_not_depend_on_how_rows_are_split_into_batches() -> None:
    """The operator's state step against the brute force: the mean of the ``last``
    greatest rows by order among everything seen, whatever the batches."""
    import random

    from pipelines.runtime.operators import moving_mean

    rng = random.Random(7)
    rows = [((float(rng.randrange(50)), float(rng.randrange(5))), float(rng.randrange(100)))
            for _ in range(300)]
    for _trial in range(20):
        state, seen, i = None, [], 0
        while i < len(rows):
            n = rng.randrange(1, 30)
            batch = rows[i:i + n]
            state, seen, i = moving_mean.advance(state, batch, 10), seen + batch, i + n
            brute = sorted(seen, key=lambda r: r[0])[-10:]
            assert state.count == len(seen)
            assert sorted(state.kept) == sorted(brute)
            assert moving_mean.mean(state) == pytest.approx(sum(v for _o, v in brute) / len(brute))


# ------------------------------------------------- hostile expressions (issue 48)
@pytest.mark.parametrize("text, words", [
    ("+".join(["1"] * 999), "nests deeper than 32 levels"),  # was a RecursionError
    ("-" * 1990 + "value", "nests deeper than 32 levels"),
    ("(" * 300 + "value" + ")" * 300, "too many nested parentheses"),
    ("('a' * 1000000000) == 'b'", "arithmetic takes numbers, not a string literal"),
    ("state + 'x' == 'ORx'", "arithmetic takes numbers, not a string literal"),
    ("value < 99999999999999999999", "outside a long's range"),
    ("value < 1e999", "must be finite"),
    (" or ".join(["value < 1"] * 300), "longer than 2000 characters"),
    (" or ".join(["value<1"] * 180), "more than 256 terms"),
])
def test_an_expression_too_deep_too_big_or_building_strings_is_refused(
        text: str, words: str) -> None:
    columns = {"value": "double", "state": "string"}
    with pytest.raises(dataflow.GraphError, match=words):
        dataflow.parse_expression(text, columns, "nodes[1] (f).where")


def _spark_value(node, row):
    """One row's value of a checked tree under Spark SQL's null rules, by brute force:
    the reference of dataflow_pandas."""
    import ast
    import math
    import operator

    def v(n):
        return _spark_value(n, row)

    if isinstance(n := node, ast.Name):
        x = row[n.id]
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else x
    if isinstance(n, ast.Constant):
        return n.value
    if isinstance(n, ast.UnaryOp):
        x = v(n.operand)
        return None if x is None else (not x) if isinstance(n.op, ast.Not) else -x
    if isinstance(n, ast.BinOp):
        a, b = v(n.left), v(n.right)
        if a is None or b is None:
            return None
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.Div: operator.truediv, ast.Mod: math.fmod,
               ast.FloorDiv: lambda p, q: math.floor(p / q)}
        return ops[type(n.op)](float(a), float(b))
    if isinstance(n, ast.BoolOp):
        xs = [v(x) for x in n.values]
        if isinstance(n.op, ast.And):
            return False if False in xs else None if None in xs else True
        return True if True in xs else None if None in xs else False
    if isinstance(n, ast.IfExp):
        return v(n.body) if v(n.test) is True else v(n.orelse)
    op, a = n.ops[0], v(n.left)
    if isinstance(op, (ast.Is, ast.IsNot)):
        return (a is None) == isinstance(op, ast.Is)
    if isinstance(op, (ast.In, ast.NotIn)):
        values = [e.value for e in n.comparators[0].elts]
        return None if a is None else (a in values) == isinstance(op, ast.In)
    b = v(n.comparators[0])
    if a is None or b is None:
        return None
    ops = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
           ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
    return ops[type(op)](a, b)


def _random_condition(rng, depth: int) -> str:
    """A random boolean expression over a (double), b (long) and s (string)."""
    def number(d: int) -> str:
        if d == 0 or rng.random() < 0.3:
            return rng.choice(["a", "b", str(rng.randint(-3, 3)), "0.5"])
        op = rng.choice(["+", "-", "*", "/", "//", "%"])
        right = rng.choice(["2", "3", "-1.5"]) if op in ("/", "//", "%") else number(d - 1)
        if rng.random() < 0.2:
            return f"({number(d - 1)} if {condition(d - 1)} else None)"
        return f"({number(d - 1)} {op} {right})"

    def condition(d: int) -> str:
        kind = rng.random()
        if d == 0 or kind < 0.35:
            cmp = rng.choice(["<", "<=", ">", ">=", "==", "!="])
            return rng.choice([f"{number(0)} {cmp} {number(0)}", "s in ('x', 'y')",
                               "s not in ('x',)", "a is None", "b is not None",
                               f"s {rng.choice(['==', '!='])} 'y'"])
        if kind < 0.55:
            return f"not ({condition(d - 1)})"
        if kind < 0.85:
            return f"({condition(d - 1)} {rng.choice(['and', 'or'])} {condition(d - 1)})"
        return f"{number(d - 1)} {rng.choice(['<', '>=', '!='])} {number(d - 1)}"

    return condition(depth)


def test_the_verifiers_filter_equals_spark_sqls_null_rules_row_by_row() -> None:
    """dataflow_pandas (the verifier's filter, from the checked tree) against a row-by-row
    evaluation under Spark SQL's rules, on random conditions over columns with nulls."""
    import random

    import numpy as np
    import pandas as pd

    from pipelines.runtime.verify import expressions as dataflow_pandas

    rng = random.Random(48)
    frame = pd.DataFrame({
        "a": [rng.choice([np.nan, -2.5, 0.0, 1.0, 3.5]) for _ in range(60)],
        "b": [rng.choice([np.nan, -3, 0, 2, 7]) for _ in range(60)],
        "s": [rng.choice([None, "x", "y", "z"]) for _ in range(60)]})
    columns = {"a": "double", "b": "long", "s": "string"}
    rows = frame.to_dict("records")
    for _ in range(300):
        text = _random_condition(rng, 3)
        tree = dataflow.parse_expression(text, columns, "where")
        got = dataflow_pandas.keep(frame, tree).index.tolist()
        want = [i for i, row in enumerate(rows) if _spark_value(tree, row) is True]
        assert got == want, text
    kept = dataflow_pandas.keep(frame, dataflow.parse_expression(
        "s is not None", columns, "where"))
    assert kept["s"].notna().all() and len(kept) == frame["s"].notna().sum()


def test_the_verifiers_keyed_aggregate_equals_a_plain_loop() -> None:
    """verifier._keyed_expected (pandas) against the aggregates worked out record by
    record: count counts rows, sum/min/max/mean skip nulls, max_by takes the value at the
    largest order (rows without an order do not count)."""
    import math
    import random

    import pandas as pd

    from pipelines.runtime.spec import dataflow
    from pipelines.runtime.verify import verifier

    rng = random.Random(5)
    rows = [{"key": rng.randint(0, 6), "value": None if rng.random() < 0.1 else
             rng.uniform(0, 100), "seq": i} for i in range(400)]
    node = dataflow.Node(id="agg", type="keyed_aggregate", inputs=("in",), path="nodes[1]",
                         params={"key": ["key"], "aggregates": {
                             "n": ("count", ""), "total": ("sum", "value"),
                             "low": ("min", "value"), "high": ("max", "value"),
                             "avg": ("mean", "value"), "last": ("max_by", "value", "seq")}},
                         columns={})
    got = verifier._keyed_expected(pd.DataFrame(rows), node).set_index("key")
    for key in {r["key"] for r in rows}:
        mine = [r for r in rows if r["key"] == key]
        values = [r["value"] for r in mine if r["value"] is not None]
        row = got.loc[key]
        assert row["n"] == len(mine)
        assert math.isclose(row["total"], sum(values), rel_tol=1e-12)
        assert row["low"] == min(values) and row["high"] == max(values)
        assert math.isclose(row["avg"], sum(values) / len(values), rel_tol=1e-12)
        assert row["last"] == max(mine, key=lambda r: r["seq"])["value"] or (
            math.isnan(row["last"]) and max(mine, key=lambda r: r["seq"])["value"] is None)
