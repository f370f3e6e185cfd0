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
    assert form.scenario["workload"]["rate"]["rates"] == [5000.0, 9000.0]
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
    assert policy.max_workers == 12 and policy.latency_bound_ms == 1.5
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
    from selenium.common.exceptions import JavascriptException, WebDriverException
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
    WebDriverWait(browser, 20).until(lambda d: "/lab/" in d.current_url
                                     and d.current_url.rstrip("/").split("/")[-1].isdigit())
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
