"""Operator packages (issue 46): operators come from installed packages through one
registry, the product's own catalogue the first of them; a package that fails to load
is listed with its error and keeps nothing else out; a definition names an installed
operator and its parameters are checked against the package's bounds."""
from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest

from pipelines.runtime.operators import packages
from pipelines.runtime.operators.base import PyOperator
from pipelines.runtime.spec import definition

pytestmark = [pytest.mark.dbless]


@pytest.fixture()
def fresh() -> Iterator[None]:
    packages.reload()
    yield
    packages.reload()


def _noop(df: pd.DataFrame, _p: dict) -> pd.DataFrame:
    return df


GOOD = [PyOperator("fine_op", ("value",), {"y": "double"}, _noop, {"n": (1, 0, 9)})]
TAKEN = [PyOperator("bid_euro", ("price",), {"price": "long"}, _noop)]
BAD = [PyOperator("Bad-Name", ("value",), {"y": "double"}, _noop)]


def test_the_products_catalogue_and_the_example_package_are_installed(fresh) -> None:
    found = {p.name: p for p in packages.packages()}
    assert found["streamwise"].operators[:2] == ("quote_parse", "quote_enrich")
    orders = found["orders"]  # examples/streamwise-example-ops, installed by the test setup
    assert (orders.distribution, orders.version, orders.error) == (
        "streamwise-example-ops", "0.1.0", None)
    assert orders.operators == ("order_gross", "customer_region", "order_receipt")
    assert packages.package_of("order_receipt") == "orders"
    assert packages.operator("order_gross").params == {"tax_pct": (21, 0, 100)}


def test_a_package_that_fails_is_listed_with_its_error_and_the_rest_load(
        fresh, monkeypatch) -> None:
    real = packages._entry_points()
    monkeypatch.setattr(packages, "_entry_points", lambda: [
        *real,
        ("missing", "broken-dist", "1.0", "no_such_module_here:OPERATORS"),
        ("good", "good-dist", "2.0", lambda: GOOD),
        ("clash", "clash-dist", "1.0", lambda: TAKEN),
        ("bad", "bad-dist", "1.0", lambda: BAD),
    ])
    found = {p.name: p for p in packages.packages()}
    assert found["missing"].error.startswith("ModuleNotFoundError")
    assert found["good"].operators == ("fine_op",) and found["good"].error is None
    assert "'bid_euro' is streamwise's already" in found["clash"].error
    assert "a name is lower-case" in found["bad"].error
    assert packages.package_of("bid_euro") == "streamwise"  # the first keeps it
    assert "fine_op" in packages.operators() and "Bad-Name" not in packages.operators()


@pytest.mark.parametrize(("op", "message"), [
    (PyOperator("x", ("a",), {}, _noop), "adds must name"),
    (PyOperator("x", ("a",), {"b": "float"}, _noop), "of type long, double, string"),
    (PyOperator("x", ["a"], {"b": "long"}, _noop), "needs must be a tuple"),  # type: ignore[arg-type]
    (PyOperator("x", ("a",), {"b": "long"}, _noop, {"n": (5, 6, 9)}), "lowest <= default"),
    (PyOperator("x", ("a",), {"b": "long"}, "not a function"), "not callable"),  # type: ignore[arg-type]
])
def test_an_operator_that_is_not_well_formed_is_refused(op, message) -> None:
    with pytest.raises(packages.OperatorError) as err:
        packages.check_operator(op)
    assert message in str(err.value)


def _orders(node: dict) -> dict:
    return {"nodes": [
        {"id": "events", "type": "generator", "partitions": 2,
         "rate": {"kind": "constant", "records_per_s": 500}},
        {"id": "gross", "type": "python", "input": "events", **node},
        {"id": "out", "type": "sink", "input": "gross"}]}


def test_a_definition_names_an_installed_operator_within_its_bounds(fresh) -> None:
    spec = definition.validate(_orders({"function": "order_gross", "params": {"tax_pct": 7}}))
    assert spec.graph.node("gross").params == {"function": "order_gross",
                                               "params": {"tax_pct": 7}}
    assert spec.graph.node("gross").columns["gross_cents"] == "long"
    for node, where, message in [
        ({"function": "order_gros"}, "function", "is not an installed operator (installed: "),
        ({"function": "order_gross", "params": {"tax_pct": 101}}, "params.tax_pct", "100"),
        ({"function": "order_gross", "params": {"rate": 1}}, "params.rate", "unknown field"),
        ({"function": "order_receipt"}, "input", "reads gross_cents"),
    ]:
        with pytest.raises(definition.DefinitionError) as err:
            definition.validate(_orders(node))
        assert err.value.path == f"nodes[1] (gross).{where}", err.value
        assert message in str(err.value)
