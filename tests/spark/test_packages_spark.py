"""A team's own code under Streamwise (issue 46), on the real embedded cluster: an
operator of a package (installed like any package) that raises fails the run with the
user's frames, and the fixed package resumes it; a pipeline module's keyed aggregation
scales 1 -> 2 -> 1 with its state migrated, checked by the verifier, which runs the
module's own build outside Spark. The example package's operators profiled, planned by
COLA and applied live: tests/browser/test_browser.py (from the pages, on the live
stack)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipelines.runtime.runner.harness import RunnerProcess
from pipelines.runtime.spec import definition
from pipelines.runtime.verify import verifier as verify

pytestmark = [pytest.mark.spark, pytest.mark.dbless, pytest.mark.timeout(900)]

FLAKY_PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "streamwise-test-flaky-ops"
version = "0.1.0"

[project.entry-points."streamwise.operators"]
flaky = "flaky_ops:OPERATORS"

[tool.setuptools]
packages = ["flaky_ops"]
"""

FLAKY_MODULE = '''"""An operator package with a bug (the test fixes it in place: an editable install)."""
import os

import numpy as np

from pipelines.runtime.operators.base import PyOperator


def check_order(df, _p):
    """Flags large orders."""
    # (the bug shows once the test says so: after batches have committed, however
    # fast the machine got there)
    if BROKEN and os.path.exists(TRIGGER):
        raise ValueError("order %d has no customer" % int(df["seq"].max()))
    return df.assign(large=(df["value"].to_numpy(np.float64) > 900).astype(np.int64))


BROKEN = {broken}
TRIGGER = {trigger!r}
OPERATORS = [PyOperator("check_order", ("seq", "value"), {{"large": "long"}}, check_order)]
'''


def test_an_operator_that_raises_fails_the_run_with_its_frames_and_the_fixed_package_resumes(
        tmp_path: Path, spark_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package's operator raises mid-run: the run fails with the exception and the
    package's frames first; the package is fixed in place (an editable install, as an
    admin would reinstall it); the run restarts from its checkpoint and clock (the
    restart action's runner config) and the verifier finds every record once."""
    import subprocess
    import sys

    from pipelines.runtime.operators import packages
    from pipelines.runtime.runner.harness import HarnessError

    pkg = tmp_path / "flaky-ops"
    (pkg / "flaky_ops").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(FLAKY_PYPROJECT)
    module = pkg / "flaky_ops" / "__init__.py"
    trigger = str(tmp_path / "show-the-bug")
    module.write_text(FLAKY_MODULE.format(broken=True, trigger=trigger))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(pkg)],
                   check=True, timeout=300, capture_output=True)
    sys.path.insert(0, str(pkg))  # (this process started before the install)
    packages.reload()
    # Runners started after the install, as after an admin's install and restart: the
    # session's warm standbys started before it and would not see the package.
    monkeypatch.setattr(RunnerProcess, "pool", None)
    try:
        doc = {"nodes": [
            {"id": "orders", "type": "generator", "seed": 9, "partitions": 2,
             "rate": {"kind": "constant", "records_per_s": 500},
             "keys": {"kind": "zipf", "n": 100, "s": 1.1}},
            {"id": "check", "type": "python", "input": "orders", "function": "check_order"},
            {"id": "out", "type": "sink", "input": "check", "keep_output": True}],
            "trigger_ms": 1000}
        redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
        work = tmp_path / "run"
        first = RunnerProcess(work, spark_cluster.master_url, doc, redis_url, token="tflaky",
                              max_workers=1, initial_workers=1)
        with first:
            first.wait_batches(3)
            Path(trigger).touch()
            with pytest.raises(HarnessError):
                first.wait_batches(60, timeout_s=300)
        reason = next(e["reason"] for e in first.events if e["type"] == "failed")
        t0 = first.t0
        lines = reason.splitlines()
        assert lines[0].startswith("RuntimeError: a Python operator raised ValueError: "
                                   "order "), lines[:3]
        assert lines[1] == "user code, innermost frame first:"
        assert "flaky_ops" in lines[2] and "in check_order" in lines[2], lines[:4]
        committed = len([m for m in first.metrics if m.get("input_rows")])
        assert committed >= 3  # it failed mid-run, with batches behind it
        module.write_text(FLAKY_MODULE.format(broken=False, trigger=trigger))  # fixed
        again = RunnerProcess(work, spark_cluster.master_url, doc, redis_url,
                              token="tflaky2", max_workers=1, initial_workers=1, t0=t0)
        with again:
            again.wait_batches(4)
        report = verify.verify_run_dir(work)
        assert report.ok, report.line()
        assert report.records > 0 and report.output_rows == report.records
        assert report.batches > committed  # it went on past the failure
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q",
                        "streamwise-test-flaky-ops"], timeout=120, capture_output=True)
        sys.path.remove(str(pkg))
        packages.reload()


CUSTOMER_TOTALS = "streamwise_example_ops.jobs:customer_totals"


def test_a_pipeline_modules_keyed_aggregation_scales_one_two_one_with_migration(
        tmp_path: Path, spark_cluster: Any) -> None:
    """The example package's pipeline module (a team's own PySpark job: a filter and a
    per-customer aggregation over all time) runs with Streamwise's source and sink; its
    state is in the run's key groups, which a scale-up moves to a second executor and a
    scale-down moves back; the verifier runs the module's own build over a static
    DataFrame of the same records and finds every customer's latest row equal to it.
    A re-plan is refused with the module's reason (it declares no state horizon)."""
    doc = {"app": CUSTOMER_TOTALS, "params": {"tax_pct": 7.5, "min_amount": 50.0},
           "source": {"type": "generator", "seed": 11, "partitions": 2,
                      "rate": {"kind": "constant", "records_per_s": 600},
                      "keys": {"kind": "zipf", "n": 300, "s": 1.1}},
           "key_groups": 2, "trigger_ms": 1000}
    spec = definition.validate(doc)
    assert spec.output_mode == "update" and spec.sink_key_columns == ("customer",)
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    run = RunnerProcess(tmp_path / "module", spark_cluster.master_url, doc, redis_url,
                        token="tmodule", max_workers=2, initial_workers=1,
                        locality_wait="120s")
    with run:
        first = run.wait_batches(3)[-1]
        assert set(first["placement"]) == {first["ran_on"][0]}  # one executor holds all
        up = run.command("set_workers", timeout_s=300, workers=2, schedule="batched")
        assert up["ok"], up["message"]
        assert len(up["executors"]) == 2 and up["migration"]["groups_moved"] >= 1
        assert up["migration"]["verified"]
        after = run.wait_batches(2)[-1]
        assert len(set(after["placement"])) == 2 and after["ran_on"] == after["placement"]
        refused = run.command("replan", timeout_s=120, scheme="seamless",
                              plan={"pes": []})
        assert not refused["ok"] and "declares no state horizon" in refused["message"]
        down = run.command("set_workers", timeout_s=300, workers=1, schedule="fluid")
        assert down["ok"], down["message"]
        assert len(down["released"]) == 1 and down["migration"]["groups_moved"] >= 1
        last = run.wait_batches(3)[-1]
        assert set(last["placement"]) == set(down["executors"])
        named = [op["operator"] for op in last.get("operator_bytes", [])]
        assert named and sum(sum(op["bytes"]) for op in last["operator_bytes"]) > 0
    report = verify.verify_run_dir(run.work)
    assert report.ok, report.line() + "\n" + "\n".join(report.problems)
    assert report.batches >= 8 and report.compared_rows > 100

