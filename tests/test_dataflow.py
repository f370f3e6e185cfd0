"""Dataflow definitions: the DAG, its checks (errors name the node and the field), the
expression language, and the drawing."""
from __future__ import annotations

import json

import pytest

from pipelines.nexmark import queries
from pipelines.runtime import dataflow
from pipelines.runtime import definition as pdef

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
