"""Operator packages (issue 46): operators come from installed packages through one
registry, the product's own catalogue the first of them; a package that fails to load
is listed with its error and keeps nothing else out; a definition names an installed
operator and its parameters are checked against the package's bounds."""
from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest

from pipelines.runtime.operators import packages
from pipelines.runtime.operators.base import Param, PyOperator, pipeline_module
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
    assert orders.operators == ("order_gross", "customer_region", "order_receipt",
                                "order_note")
    assert packages.package_of("order_receipt") == "orders"
    assert packages.operator("order_gross").params == {"tax_pct": Param(21, 0, 100)}
    jobs = found["jobs"]  # the same distribution's pipeline modules
    assert jobs.group == packages.MODULE_GROUP and jobs.error is None
    assert jobs.modules == ("streamwise_example_ops.jobs:customer_totals",)
    module = packages.module("streamwise_example_ops.jobs:customer_totals")
    assert module.key == ("customer",) and module.stateful and module.output_mode == "update"
    assert module.params["tax_pct"].kind == "number"


def _with(monkeypatch, operators: list | None = None, modules: list | None = None) -> None:
    """The installed entry points plus these (name, distribution, version, target)."""
    real = packages._entry_points

    def entry_points(group: str = packages.ENTRY_POINT_GROUP) -> list:
        extra = operators if group == packages.ENTRY_POINT_GROUP else modules
        return [*real(group), *(extra or [])]

    monkeypatch.setattr(packages, "_entry_points", entry_points)


def test_a_package_that_fails_is_listed_with_its_error_and_the_rest_load(
        fresh, monkeypatch) -> None:
    _with(monkeypatch, operators=[
        ("missing", "broken-dist", "1.0", "no_such_module_here:OPERATORS"),
        ("good", "good-dist", "2.0", lambda: GOOD),
        ("clash", "clash-dist", "1.0", lambda: TAKEN),
        ("bad", "bad-dist", "1.0", lambda: BAD),
    ], modules=[("jobs-missing", "broken-dist", "1.0", "no_such_jobs_module"),
                ("jobs-empty", "empty-dist", "1.0", "pandas")])
    found = {p.name: p for p in packages.packages()}
    assert found["missing"].error.startswith("ModuleNotFoundError")
    assert found["good"].operators == ("fine_op",) and found["good"].error is None
    assert "'bid_euro' is streamwise's already" in found["clash"].error
    assert "a name is lower-case" in found["bad"].error
    assert packages.package_of("bid_euro") == "streamwise"  # the first keeps it
    assert "fine_op" in packages.operators() and "Bad-Name" not in packages.operators()
    assert found["jobs-missing"].error.startswith("ModuleNotFoundError")
    assert "declares no pipeline module" in found["jobs-empty"].error
    assert list(packages.modules()) == ["streamwise_example_ops.jobs:customer_totals"]


@pytest.mark.parametrize(("op", "message"), [
    (PyOperator("x", ("a",), {}, _noop), "adds must name"),
    (PyOperator("x", ("a",), {"b": "float"}, _noop), "of type long, double, string"),
    (PyOperator("x", ["a"], {"b": "long"}, _noop), "needs must be a tuple"),  # type: ignore[arg-type]
    (PyOperator("x", ("a",), {"b": "long"}, _noop, {"n": (5, 6, 9)}),
     "'n': n: must be between 6 and 9, got 5"),
    (PyOperator("x", ("a",), {"b": "long"}, _noop, {"n": Param("a", choices=("b",))}),
     "'a' is not one of: b"),
    (PyOperator("x", ("a",), {"b": "long"}, _noop, {"n": Param(1.5, lo="0")}),  # type: ignore[arg-type]
     "bounds must be finite numbers"),
    (PyOperator("x", ("a",), {"b": "long"}, _noop, {"n": Param("s", lo=0)}),
     "only a number has bounds"),
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
        ({"function": "order_gross", "params": {"rate": 1}}, "params.rate",
         "unknown parameter (parameters: tax_pct)"),
        ({"function": "order_gross", "params": {"tax_pct": 7.5}}, "params.tax_pct",
         "must be an integer"),
        ({"function": "order_gross", "params": [7]}, "params", "must be an object"),
        ({"function": "order_receipt"}, "input", "reads gross_cents"),
    ]:
        with pytest.raises(definition.DefinitionError) as err:
            definition.validate(_orders(node))
        assert err.value.path == f"nodes[1] (gross).{where}", err.value
        assert message in str(err.value)


def test_parameters_of_every_type_are_checked_and_defaulted() -> None:
    from pipelines.runtime.operators.base import ParamError, resolve_params

    declared = {"n": Param(3, 1, 10), "share": Param(0.5, 0.0, 1.0),
                "region": Param("eu", choices=("eu", "us")), "strict": Param(False)}
    assert resolve_params(declared, {"n": 4.0, "share": 1}) == {
        "n": 4, "share": 1.0, "region": "eu", "strict": False}
    for given, field, message in [
        ({"n": True}, "n", "must be an integer"),
        ({"share": 1.5}, "share", "between 0 and 1, got 1.5"),
        ({"share": float("nan")}, "share", "finite"),
        ({"region": "asia"}, "region", "not one of: eu, us"),
        ({"strict": 1}, "strict", "true or false"),
        ({"n": "3"}, "n", "must be an integer"),
    ]:
        with pytest.raises(ParamError) as err:
            resolve_params(declared, given)
        assert err.value.field == field and message in err.value.message, err.value


def _build(spark, source, ctx):  # noqa: ANN001, ANN202 - a module's shape
    return source


@pytest.mark.parametrize(("module", "message"), [
    (pipeline_module(needs=("key",), columns={})(_build), "columns must name"),
    (pipeline_module(needs=("key",), columns={"k": "int"})(_build), "of type long"),
    (pipeline_module(needs=("key",), columns={"k": "long"}, key=("x",))(_build),
     "key column 'x' is not an output column"),
    (pipeline_module(needs=("key",), columns={"k": "long"}, key=("k",),
                     stateful=False)(_build), "a keyed (update-mode) output is stateful"),
    (pipeline_module(needs=("key",), columns={"k": "long"}, state_horizon_s=-1)(_build),
     "state_horizon_s must be seconds"),
    (pipeline_module(needs=("key",), columns={"k": "long"},
                     params={"p": (1, 2, 3)})(_build), "between 2 and 3"),
    (_build, "is not a pipeline module"),
])
def test_a_pipeline_module_that_is_not_well_formed_is_refused(module, message) -> None:
    with pytest.raises(packages.OperatorError) as err:
        packages.check_module(module)
    assert message in str(err.value)


MODULE = "streamwise_example_ops.jobs:customer_totals"
SOURCE = {"type": "generator", "partitions": 2,
          "rate": {"kind": "constant", "records_per_s": 500}}


def test_a_definition_names_an_installed_pipeline_module(fresh) -> None:
    spec = definition.validate({"app": MODULE, "params": {"tax_pct": 7.5},
                                "source": SOURCE, "key_groups": 4})
    app = spec.graph.node("app")
    assert app.params["params"] == {"tax_pct": 7.5, "min_amount": 0.0}
    assert spec.output_mode == "update" and spec.sink_key_columns == ("customer",)
    assert spec.keyed_state and [n.id for n in spec.graph.stateful] == ["app"]
    assert spec.graph.state_horizon(0)[0] is None  # declares none: no live re-plan
    assert spec.raw["app"] == MODULE and "nodes" not in spec.raw  # kept as written
    assert definition.validate(spec.raw).raw == spec.raw
    for doc, where, message in [
        ({"app": "streamwise_example_ops.jobs:nope", "source": SOURCE}, "app",
         "is not an installed pipeline module (installed: " + MODULE),
        ({"app": "os:system", "source": SOURCE}, "app", "is not an installed pipeline"),
        ({"app": MODULE, "source": SOURCE, "params": {"tax_pct": 101}}, "params.tax_pct",
         "between 0 and 100"),
        ({"app": MODULE, "source": SOURCE, "params": {"taxes": 1}}, "params.taxes",
         "unknown parameter"),
        ({"app": MODULE}, "source", "is required"),
        ({"app": MODULE, "source": {**SOURCE, "rate": 5}}, "source.rate", "an object"),
        ({"app": MODULE, "source": SOURCE, "sink": {"to": {"type": "kafka"}}},
         "sink.to.type", "is not one of"),
        ({"app": MODULE, "source": SOURCE, "nodes2": 1}, "nodes2", "unknown field"),
        ({"app": MODULE, "source": {"type": "redis_stream", "url": "redis://h:6379",
                                    "stream": "s", "fields": {"k": "long"}}},
         "app", "reads key, value, which source does not carry"),
    ]:
        with pytest.raises(definition.DefinitionError) as err:
            definition.validate(doc)
        assert err.value.path == where and message in err.value.message, err.value


def test_a_module_in_a_dataflow_reads_records_and_feeds_the_sink(fresh) -> None:
    nodes = [{"id": "events", **SOURCE},
             {"id": "gross", "type": "python", "input": "events", "function": "order_gross"},
             {"id": "totals", "type": "app", "input": "gross", "app": MODULE},
             {"id": "out", "type": "sink", "input": "totals"}]
    spec = definition.validate({"nodes": nodes})
    assert spec.graph.sink.columns == dict(packages.module(MODULE).columns)
    after = [*nodes[:3], {"id": "f", "type": "filter", "input": "totals",
                          "where": "orders > 1"}, {"id": "out", "type": "sink", "input": "f"}]
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate({"nodes": after})
    assert "a module's output goes to the sink" in str(err.value)


def test_an_exception_in_user_code_is_reported_with_its_frames_first(tmp_path) -> None:
    import importlib.util

    from pipelines.runtime.runner.runner import start_failure

    path = tmp_path / "team_jobs.py"
    path.write_text("def build(spark, source, ctx):\n"
                    "    return helper(source)\n\n\n"
                    "def helper(source):\n"
                    "    raise KeyError('no column customer_id')\n")
    spec = importlib.util.spec_from_file_location("team_jobs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.build(None, None, None)
    except KeyError as exc:
        text = start_failure(exc)
    lines = text.splitlines()
    assert lines[0] == "user code raised KeyError: 'no column customer_id'"
    assert lines[1] == "user code, innermost frame first:"
    assert "team_jobs.py" in lines[2] and "in helper" in lines[2]
    assert "in build" in lines[4]
    assert start_failure(ValueError("bad config")) == "ValueError: bad config"


def test_a_modules_output_is_compared_key_by_key_with_its_batch_query(tmp_path) -> None:
    """What the verifier does with a pipeline module's kept output once its reference
    run gave the batch query's rows (``verifier._verify_app``, Spark-free here): a key
    written twice in one batch is duplicated, a latest row off by one is wrong, a key
    missing is lost, a key too many unexpected."""
    from pipelines.runtime.verify import verifier

    want = pd.DataFrame({"customer": [1, 2, 3], "orders": [4, 2, 7],
                         "largest": [10.5, 3.25, 0.1 + 0.2]})
    report = verifier.VerifyReport()
    got = pd.DataFrame({"customer": [1, 2, 3], "orders": [4, 2, 7],
                        "largest": [10.5, 3.25, 0.30000000000000004]})
    verifier._compare_keyed(got, want, ["customer"], report)
    assert report.ok and report.compared_rows == 3
    report = verifier.VerifyReport()
    bad = pd.DataFrame({"customer": [1, 2, 9], "orders": [5, 2, 1],
                        "largest": [10.5, 3.25, 1.0]})
    verifier._compare_keyed(bad, want, ["customer"], report)
    assert (report.lost, report.unexpected, report.wrong) == (1, 1, 1), report.problems
    assert "orders differs on 1 keys (first: customer=1: 5 where the batch query gives 4)" \
        in report.problems[-1]
    report = verifier.VerifyReport()
    verifier._compare_rows(pd.concat([got, got.iloc[[0]]]), want, False, report)
    assert report.duplicated == 1 and report.lost == 0
