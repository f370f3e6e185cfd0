"""Strategy Lab: the form validates through the simulator, a comparison runs on a real
Celery worker, the bundle and the one-click policy, and one session in Chromium."""
from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

FORM = {"name": "t", "workload": "random_walk", "rate_scale": "0.04", "base_rate": "8000",
        "peak_rate": "16000", "at_s": "60", "keys": "file", "key_count": "2836",
        "zipf_s": "1", "service_ms": "0.5", "steps": "40", "step_s": "1", "seed": "1",
        "latency_bound_ms": "1.5", "max_workers": "12", "mode": "queue",
        "strategies": ["lat-node Sw h=1", "th-rule"], "parameters": "{}"}


def _form(data: dict, files: dict | None = None):
    from control.forms import LabForm

    return LabForm(data, files or {})


def test_form_builds_a_valid_scenario() -> None:
    form = _form(FORM)
    assert form.is_valid(), form.errors
    assert [s["label"] for s in form.scenario["strategies"]] == ["lat-node Sw h=1", "th-rule"]
    assert form.scenario["workload"]["rate"] == {"kind": "random_walk", "scale": 0.04}


@pytest.mark.parametrize("changes,field,words", [
    ({"parameters": "{"}, "parameters", "Invalid JSON"),
    ({"parameters": '{"magic": {}}'}, "parameters", "Unknown strategy"),
    ({"parameters": '{"lat-node": {"horizon": 9}}'}, "parameters", "horizon"),
    ({"parameters": '{"lat-node": {"forecaster": "oracle"}}'}, "parameters", "forecaster"),
    ({"workload": "trace"}, "trace_file", "Upload a CSV"),
    ({"strategies": []}, "strategies", "required"),
    ({"steps": "0"}, "steps", "greater than or equal to 1"),
])
def test_form_errors_name_the_field(changes: dict, field: str, words: str) -> None:
    form = _form({**FORM, **changes})
    assert not form.is_valid()
    assert words in " ".join(form.errors.get(field, [])), form.errors


def test_form_reads_an_uploaded_trace_and_rejects_a_bad_one() -> None:
    good = SimpleUploadedFile("t.csv", b"second,rate\n0,5000\n1,9000\n")
    form = _form({**FORM, "workload": "trace"}, {"trace_file": good})
    assert form.is_valid(), form.errors
    # One rate a control step (40 steps of 1 s), the last holding as the simulator does.
    assert form.scenario["workload"]["rate"]["rates"] == [5000.0, 9000.0] + [9000.0] * 38
    bad = SimpleUploadedFile("t.csv", b"rate\n1\nlots\n")
    form = _form({**FORM, "workload": "trace"}, {"trace_file": bad})
    assert not form.is_valid() and "row 3" in form.errors["trace_file"][0]
    from control.forms import MAX_TRACE_UPLOAD_BYTES

    huge = SimpleUploadedFile("t.csv", b"0,1\n" * (MAX_TRACE_UPLOAD_BYTES // 4 + 1))
    form = _form({**FORM, "workload": "trace"}, {"trace_file": huge})
    assert not form.is_valid() and "at most 4,194,304 are accepted" in \
        form.errors["trace_file"][0]


@pytest.mark.django_db
def test_execute_bundle_and_policy(operator) -> None:
    from control import lab
    from control.models import LabRun, LabStatus, Policy

    form = _form(FORM)
    assert form.is_valid()
    run = LabRun.objects.create(name="x", scenario=form.scenario, created_by=operator,
                                total=80)
    assert lab.execute(run.pk) == f"lab {run.pk} done"
    assert "not pending" in lab.execute(run.pk)  # a repeated delivery does nothing
    run.refresh_from_db()
    assert run.status == LabStatus.DONE and run.progress == run.total
    assert [r["label"] for r in run.result["results"]] == ["lat-node Sw h=1", "th-rule"]
    with zipfile.ZipFile(io.BytesIO(lab.bundle(run))) as z:
        assert sorted(z.namelist()) == ["result.json", "scenario.json", "series.csv",
                                        "summary.csv"]
        series = z.read("series.csv").decode().splitlines()
        assert len(series) == 1 + 2 * 40 and series[0].startswith("strategy,t,rate")
        assert json.loads(z.read("scenario.json"))["steps"] == 40
    policy, message = lab.policy_from_lab(run, "lat-node Sw h=1", operator)
    assert policy is not None, message
    assert policy.strategy == "lat-node" and policy.strategy_params == {"horizon": 1}
    # The comparison ran in the thesis' units: a policy a live run can meet, said so.
    from pipelines.cluster_status import cluster_cores

    assert "simulator's units" in message
    assert policy.latency_bound_ms == lab.DEFAULT_LIVE_BOUND_MS
    assert policy.max_workers == min(2, cluster_cores()[0]) and policy.min_workers == 1
    assert lab.policy_from_lab(run, "nope", operator)[0] is None
    assert Policy.objects.count() == 1


@pytest.fixture
def browser():
    from pipelines.management.browser import headless_chromium

    driver = headless_chromium()
    yield driver
    driver.quit()


@pytest.mark.browser
@pytest.mark.single_pass
@pytest.mark.django_db(transaction=True)
def test_lab_in_the_browser_runs_on_celery(live_stack, operator, browser) -> None:
    from selenium.common.exceptions import (
        JavascriptException,
        TimeoutException,
        WebDriverException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from control.models import LabRun, LabStatus
    from pipelines.management.browser import log_in

    base = live_stack.base_url
    log_in(browser, base, "operator", "op-pass-123")
    browser.get(base + "/lab/new/")
    steps = browser.find_element(By.ID, "id_steps")
    steps.clear()
    steps.send_keys("900")  # long enough to watch the progress bar move
    for box in browser.find_elements(By.CSS_SELECTOR, "#id_strategies input[type=checkbox]"):
        if not box.is_selected():
            box.click()
    browser.find_element(By.ID, "start-lab").click()
    try:
        WebDriverWait(browser, 60).until(lambda d: "/lab/" in d.current_url
                                         and d.current_url.rstrip("/").split("/")[-1].isdigit())
    except TimeoutException:
        errors = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".error, .errorlist")]
        pytest.fail(f"the Lab form did not start the comparison: {errors or 'no error shown'}"
                    f" at {browser.current_url}")
    seen: list[int] = []

    def finished(d) -> bool:
        try:
            state = d.execute_script("return window.__streamwiseLab || null")
        except (JavascriptException, WebDriverException):
            return False  # the page is reloading
        if state:
            if state["progress"]:  # the running page's history (the done page has none)
                seen[:] = state["progress"]
            return state["charts"] == 5
        return False

    WebDriverWait(browser, 240, poll_frequency=0.3).until(finished)
    lab = LabRun.objects.latest("pk")
    assert lab.status == LabStatus.DONE
    assert any(0 < p < 100 for p in seen), f"progress never seen between 0 and 100: {seen}"
    assert seen == sorted(seen), "progress must not go backwards"
    rows = browser.find_elements(By.CSS_SELECTOR, "#lab-summary tbody tr")
    assert len(rows) == len(lab.scenario["strategies"]) == 21
    browser.find_element(By.XPATH, "//table[@id='lab-summary']//th[3]").click()
    assert browser.execute_script("return window.__streamwiseLab.sorted.col") == 2
    values = [float(r.find_elements(By.TAG_NAME, "td")[2].text) for r in
              browser.find_elements(By.CSS_SELECTOR, "#lab-summary tbody tr")]
    assert values == sorted(values)
    browser.save_screenshot(str(live_stack.logs / "lab-result.png"))


def _batches(overhead_s: float, cost_s: float, n: int = 80, f_max: float = 2.4,
             jitter: float = 0.02) -> list[dict]:
    """Batches of a run whose batch time is D = o + c·N·f_max/(n·f) (with a deterministic
    ±jitter), rates alternating low/high every ten batches, on 1 and 2 workers."""
    out, t, d = [], 0.0, overhead_s
    for i in range(n):
        rate = 2000.0 if (i // 10) % 2 == 0 else 6000.0
        workers = 1 + (i // 20) % 2
        freq = f_max if i % 3 else 0.8 * f_max
        rows = int(rate * d)
        d = (overhead_s + cost_s * rows * f_max / (workers * freq)) \
            * (1 + jitter * (1 if i % 2 else -1))
        t += d
        out.append({"t": 1_000.0 + t, "batch_id": i, "input_rows": rows,
                    "batch_duration_ms": d * 1000, "workers": workers, "frequency_ghz": freq,
                    "scheduled_rate": rate, "input_rate": rate * 0.9, "failed_tasks": 0,
                    "migration": None})
    return out


def test_a_runs_batches_give_back_its_batch_model_and_its_rates() -> None:
    import numpy as np

    from control.live import WARMUP_BATCHES
    from control.sim import ScenarioError, from_run, parse_scenario

    batches = _batches(overhead_s=1.2, cost_s=2e-4)
    fit = from_run.fit_run(7, batches, step_s=2.0, freqs_ghz=[1.2, 2.4])
    # Reference: a least-squares line through the same steady batches.
    steady = [b for b in batches if b["batch_id"] >= WARMUP_BATCHES]
    x = [b["input_rows"] * 2.4 / (b["workers"] * b["frequency_ghz"]) for b in steady]
    slope, intercept = np.polyfit(x, [b["batch_duration_ms"] / 1000 for b in steady], 1)
    assert fit.slope_measured and fit.batches == len(steady)
    assert fit.overhead_s == pytest.approx(intercept) and fit.overhead_s == pytest.approx(1.2, 0.05)
    assert fit.cost_per_record_s == pytest.approx(slope) and slope == pytest.approx(2e-4, 0.05)
    assert fit.freqs_ghz == [1.2, 1.92, 2.4] and fit.f_max == 2.4
    # Each 2-s step carries the scheduled rate of the batches committed in it.
    assert set(fit.rates) <= {2000.0, 6000.0} and {2000.0, 6000.0} <= set(fit.rates)
    assert len(fit.rates) == int((batches[-1]["t"] - batches[0]["t"]) // 2.0) + 1

    scenario = from_run.apply_fit({"strategies": [{"name": "lat-node"}]}, fit, 8000, 1, 4, 1)
    scn = parse_scenario(scenario)
    assert scn.system.mode == "microbatch" and scn.system.batch_overhead_s == fit.overhead_s
    assert scn.latency_bound_s == 8.0 and scn.system.max_workers == 4
    assert scn.steps == len(fit.rates) and list(scn.rates) == fit.rates
    assert scenario["calibrated_from"]["run"] == 7

    with pytest.raises(ScenarioError, match="a calibration needs 12"):
        from_run.fit_run(7, batches[:WARMUP_BATCHES + 5], step_s=2.0)
    no_rates = [{**b, "scheduled_rate": None, "input_rate": None} for b in batches]
    with pytest.raises(ScenarioError, match="no arrival rate"):
        from_run.fit_run(7, no_rates, step_s=2.0)


@pytest.mark.django_db
def test_a_comparison_calibrated_from_a_run_makes_a_policy_a_live_run_can_use(operator) -> None:
    from datetime import UTC, datetime

    from control import lab
    from control.forms import LabForm, PolicyForm
    from control.models import LabRun
    from pipelines.cluster_status import cluster_cores
    from pipelines.models import MetricSample, Run
    from pipelines.runtime.host.power import modelled_power
    from tests.conftest import make_pipeline_and_policy

    pipeline, policy = make_pipeline_and_policy(operator, name="calib", max_workers=2)
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="stopped", created_by=operator, workers=1,
                             frequencies=[1.2, 2.4], started_at=datetime.now(UTC))
    MetricSample.objects.bulk_create(
        MetricSample(run=run, t=datetime.fromtimestamp(b.pop("t"), UTC), **b)
        for b in _batches(overhead_s=1.0, cost_s=1e-4))
    form = LabForm({**FORM, "calibrate_from": str(run.pk)})
    assert (run.pk, f"#{run.pk} calib (stopped, 80 batches)") in \
        list(form.fields["calibrate_from"].choices)
    assert form.is_valid(), form.errors
    scenario = form.scenario
    assert scenario["system"]["mode"] == "microbatch"
    assert scenario["qos"]["latency_bound_ms"] == 5000 and scenario["system"]["max_workers"] == 2
    assert scenario["calibrated_from"]["overhead_s"] == pytest.approx(1.0, 0.05)
    labrun = LabRun.objects.create(name="calibrated", scenario=scenario, created_by=operator,
                                   total=2 * scenario["steps"])
    assert lab.execute(labrun.pk) == f"lab {labrun.pk} done"
    labrun.refresh_from_db()
    made, message = lab.policy_from_lab(labrun, "lat-node Sw h=1", operator)
    assert made is not None, message
    assert f"calibrated from run {run.pk}" in message
    assert made.latency_bound_ms == 5000 and made.control_step_s == policy.control_step_s
    assert made.max_workers == min(2, cluster_cores()[0])
    row = next(r for r in labrun.result["results"] if r["label"] == "lat-node Sw h=1")
    peak = max(modelled_power(n, f) for n, f in zip(row["series"]["workers"],
                                                    row["series"]["freq_ghz"], strict=True))
    assert made.power_budget_w == pytest.approx(1.1 * peak, abs=0.06)
    # What the policy page would accept, unchanged.
    data = {f: getattr(made, f) for f in PolicyForm.Meta.fields}
    data["strategy_params"] = json.dumps(made.strategy_params)
    data["name"] = "copy"
    assert PolicyForm(data).is_valid()
    page = lab_detail_html(operator, labrun.pk)
    assert "Calibrated from" in page and f"run #{run.pk}" in page

    # A run with too few batches is not offered.
    short = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                               status="stopped", created_by=operator,
                               started_at=datetime.now(UTC))
    form = LabForm({**FORM, "calibrate_from": str(short.pk)})
    assert not form.is_valid() and "Select a valid choice" in str(form.errors)


def lab_detail_html(user, pk: int) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.get(f"/lab/{pk}/").content.decode()


@pytest.mark.django_db
def test_a_fleet_comparison_runs_in_the_lab_and_its_page_and_bundle_show_each_run(
        operator, client) -> None:
    from control import lab
    from control.models import LabRun, LabStatus
    from control.sim import fleet as fleetsim

    client.force_login(operator)
    page = client.get("/lab/new/fleet/")
    assert page.status_code == 200 and b"payments" in page.content
    bad = client.post("/lab/new/fleet/", {"name": "f", "scenario": '{"runs": [{"name": 1}], '
                                                                    '"cluster": {"cores": 0}}'})
    assert bad.status_code == 200 and b"cluster.cores" in bad.content
    assert not LabRun.objects.exists()
    response = client.post("/lab/new/fleet/", {"name": "arbiters",
                                               "scenario": json.dumps(fleetsim.EXAMPLE)})
    run = LabRun.objects.get()
    assert response.status_code == 302 and run.total == 2 * 120
    assert lab.execute(run.pk) == f"lab {run.pk} done"
    run.refresh_from_db()
    assert run.status == LabStatus.DONE and run.progress == run.total
    page = client.get(f"/lab/{run.pk}/").content.decode()
    assert 'id="fleet-totals"' in page and "reports" in page and "fcfs" in page
    rows = lab.fleet_rows(run)
    assert {(r["arbiter"], r["run"]) for r in rows} == {
        (a, n) for a in ("priority", "fcfs") for n in ("payments", "reports", "audit")}
    with zipfile.ZipFile(io.BytesIO(lab.bundle(run))) as z:
        series = z.read("series.csv").decode().splitlines()
        assert series[0] == "arbiter,run,step,asked,workers,latency_ms,rate,cores_used"
        assert len(series) == 1 + 2 * 3 * 120
    assert b"3 runs on one cluster" in client.get("/lab/").content
