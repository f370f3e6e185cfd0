"""One operator session in headless Chromium (Debian chromium + chromium-driver)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.conftest import SMALL_DEFINITION, stop_and_wait, wait_for
from pipelines.management.browser import headless_chromium, log_in

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.single_pass]


@pytest.fixture
def browser():
    driver = headless_chromium()
    yield driver
    driver.quit()


def _set_textarea(driver, element_id: str, text: str) -> None:
    driver.execute_script("document.getElementById(arguments[0]).value = arguments[1];",
                          element_id, text)


@pytest.mark.django_db(transaction=True)
def test_operator_creates_starts_watches_scales_rebalances_and_stops(
        live_stack, operator, browser) -> None:
    """A newcomer's first run, from the pages, on the real stack (Celery, runner, Spark,
    relay, WebSockets): a pipeline form that refuses a bad definition, Start, live
    points and the placement panel, the run's metrics in the database, a scale-up to 2
    workers whose key groups migrate (verified from the executors, the runner's own
    event relayed), a rebalance from the page, Stop.

    The run starts on the live stack's warm standby (``STANDBY_RUNS`` in its
    environment, as an operator would set it): the reconciler started it, the run
    adopts its application and scales from it, and after the clean stop the same
    process and application, reset to one executor, serve the next run."""
    from django.conf import settings

    from control.models import Policy
    from pipelines import actions, launch
    from pipelines.launch import process_state
    from pipelines.models import MetricSample, Run
    from pipelines.runtime import bus as busmod
    from pipelines.runtime.runner import standby as sb

    assert live_stack.env["STANDBY_RUNS"] != "1" and live_stack.env["STANDBY_RUNNERS"] == "1"
    redis = busmod.connect(settings.REDIS_URL)

    def offered() -> sb.Offer | None:
        raw = redis.lindex(sb.READY_KEY, 0)
        return sb.Offer.from_json(raw) if raw else None

    Policy.objects.create(name="browser-policy", latency_bound_ms=5000, power_budget_w=40,
                          min_workers=1, initial_workers=1, max_workers=2)
    base = live_stack.base_url
    browser.get(base + "/runs/")
    assert "/login/" in browser.current_url
    log_in(browser, base, "operator", "op-pass-123")

    browser.get(base + "/pipelines/new/")
    browser.find_element(By.ID, "id_name").send_keys("browser-pipeline")
    bad = dict(SMALL_DEFINITION, key_groups=0)
    _set_textarea(browser, "id_definition", json.dumps(bad))
    browser.find_element(By.ID, "save-pipeline").click()
    # click() does not wait for the re-rendered form: wait for the error to appear.
    error = WebDriverWait(browser, 20).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".error[data-field=definition]"))[0].text
    assert "Invalid definition at key_groups: must be >= 1" in error

    _set_textarea(browser, "id_definition", json.dumps(SMALL_DEFINITION, indent=2))
    browser.find_element(By.ID, "save-pipeline").click()
    WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/pipelines/"))

    # Warming beside earlier tests, or serving none while an earlier test's run ended.
    offer = wait_for(offered, 300, "the live stack's standby to offer itself")
    assert process_state(offer.pid) == "alive"
    form = browser.find_element(
        By.XPATH, "//button[@data-pipeline='browser-pipeline']/ancestor::form")
    Select(form.find_element(By.NAME, "policy")).select_by_visible_text("browser-policy")
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 10).until(lambda d: "/runs/" in d.current_url)
    run = Run.objects.latest("pk")
    runs = [run]
    stale = (StaleElementReferenceException, NoSuchElementException)
    outcomes = ["reconfigured", "reconfigure_failed", "reconfigure_timeout"]
    try:
        WebDriverWait(browser, 240, poll_frequency=1).until(
            lambda d: d.execute_script("return window.__streamwise.points") >= 3)
        assert browser.find_element(By.ID, "run-status").text == "running"
        # The points come from samples stored per batch: the first batch's too (a
        # resumed stale checkpoint would show there).
        run.refresh_from_db()
        assert run.spark_app_id.startswith("app-") and run.workers == 1
        launched = run.events.get(kind="runner_launched")
        assert launched.payload["standby"] == offer.standby_id, launched.message
        assert run.runner_pid == offer.pid and run.spark_app_id == offer.app_id
        assert offered() is None  # claimed: offered to nobody else
        # Serving a run it will outlive: counted, so the reconciler starts no other.
        assert redis.exists(sb.serving_key(offer.standby_id))
        assert launch.standby_ids(redis, "serving") == {offer.standby_id}
        log = (Path(run.checkpoint_dir) / "runner.log").read_text()
        assert f"adopted standby {offer.standby_id}" in log
        samples = list(MetricSample.objects.filter(run=run).order_by("batch_id"))
        assert len(samples) >= 3
        for s in samples:
            assert s.records > 0 and s.input_rows >= s.records
            assert 0 < s.latency_p50_ms <= s.latency_p95_ms <= s.latency_p99_ms \
                <= s.latency_max_ms
            assert s.power_w > 0 and s.workers == 1
        # The placement panel: one worker holds every key group, verified per batch.
        # Read in one script: the panel is drawn again at each sample, and a row read
        # in two calls may be gone by the second (a StaleElementReferenceException).
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#placement tbody tr[data-worker]')]"
            ".map((r) => ({text: r.innerText, host: r.dataset.host}));")
        assert len(rows) == 1 and "0, 1, 2, 3" in rows[0]["text"]
        # Each executor is named with its host (here the embedded worker's loopback).
        assert rows[0]["host"] == "127.0.0.1"
        assert "on 127.0.0.1" in rows[0]["text"]
        assert browser.find_element(By.ID, "frequency-label").text != "—"
        assert browser.find_element(By.ID, "power-label").text == "modelled"

        # Scale to 2 workers from the page: groups migrate onto the new executor (the
        # adopted application scales like a cold one: its target was one executor).
        workers = browser.find_element(By.ID, "id_workers")
        workers.clear()
        workers.send_keys("2")
        browser.find_element(By.ID, "set-workers").click()
        WebDriverWait(browser, 240, poll_frequency=1, ignored_exceptions=stale).until(
            lambda d: (d.execute_script("return window.__streamwise.placement") or {})
            .get("workers") == 2)
        WebDriverWait(browser, 60, poll_frequency=1,
                      ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: any("verified" in r.text and "migration" in r.text
                          for r in d.find_elements(By.CSS_SELECTOR, "#events tbody tr")))
        assert len(browser.find_elements(By.CSS_SELECTOR,
                                         "#placement tbody tr[data-worker]")) == 2
        ack = run.events.get(kind__in=outcomes)
        assert ack.kind == "reconfigured", ack.message
        assert ack.payload["workers"] == 2 and Run.objects.get(pk=run.pk).workers == 2
        # Key groups moved onto the new executor before the command was acknowledged,
        # each step verified from the executor that ran it.
        migration = ack.payload["migration"]
        assert migration["verified"] and migration["groups_moved"] >= 1
        # The runner's own event comes through the relay, independently of the ack.
        wait_for(lambda: run.events.filter(kind="runner:migration_done").exists(), 30,
                 "the relayed runner:migration_done event")
        wait_for(lambda: MetricSample.objects.filter(run=run, workers=2).exists(), 90,
                 "a micro-batch measured with 2 workers")
        two = MetricSample.objects.filter(run=run, workers=2).latest("batch_id")
        assert len(set(two.groups["placement"])) == 2 and two.drift == 0
        shot = Path(live_stack.logs) / "browser-run.png"
        browser.save_screenshot(str(shot))

        # A rebalance from the page goes through the same path and is audited.
        rebalance = browser.find_element(By.XPATH,
                                         "//button[@id='rebalance']/ancestor::form")
        Select(rebalance.find_element(By.NAME, "planner")).select_by_value("ding-table")
        Select(rebalance.find_element(By.NAME, "schedule")).select_by_value("fluid")
        tau = rebalance.find_element(By.NAME, "tau")
        tau.clear()
        tau.send_keys("0.5")
        rebalance.find_element(By.ID, "rebalance").click()
        wait_for(lambda: run.events.filter(kind__in=outcomes).count() >= 2, 170,
                 "the runner's acknowledgement of rebalance")
        requested = run.events.filter(kind="reconfigure_requested").order_by("-id").first()
        assert requested.actor == "user:operator", requested.actor
        assert {k: requested.payload.get(k) for k in ("command", "planner", "schedule",
                                                       "tau")} == {
            "command": "rebalance", "planner": "ding-table", "schedule": "fluid",
            "tau": 0.5}, requested.payload
        rebalanced = run.events.filter(kind__in=outcomes).order_by("-id").first()
        assert rebalanced.kind == "reconfigured", rebalanced.message

        browser.get(f"{base}/runs/{run.pk}/")
        browser.find_element(By.ID, "stop-run").click()
        # The stop form POSTs and redirects back to this page: the document is
        # replaced under the wait. The status is read in one script call (no element
        # handle to outlive its document); a call that meets the navigation itself
        # (Chrome: "Node with given id does not belong to the document") is polled
        # again.
        WebDriverWait(browser, 120, poll_frequency=1,
                      ignored_exceptions=(WebDriverException,)).until(
            lambda d: d.execute_script(
                "const e = document.getElementById('run-status');"
                " return e ? e.textContent.trim() : null;") == "stopped")
        run.refresh_from_db()
        assert run.status == "stopped", run.status_reason
        assert run.samples.count() >= 3
        assert all(s.latency_p50_ms > 0 for s in run.samples.all()), "latency must be positive"

        # The same process and application offer themselves again, back to one
        # executor, and the next run starts on them with one worker.
        again = wait_for(offered, 120, "the standby's offer after the run")
        assert (again.standby_id, again.pid, again.app_id) == (
            offer.standby_id, offer.pid, offer.app_id)
        assert process_state(offer.pid) == "alive"
        second = actions.create_run(run.pipeline_version.pipeline, run.policy, operator)
        runs.append(second)
        wait_for(lambda: MetricSample.objects.filter(run=second).count() >= 2, 120,
                 "2 metric samples of the second run")
        second.refresh_from_db()
        assert second.events.get(kind="runner_launched").payload["standby"] == offer.standby_id
        assert (second.runner_pid, second.spark_app_id) == (offer.pid, offer.app_id)
        assert all(s.workers == 1 for s in MetricSample.objects.filter(run=second))
    finally:
        for each in runs:
            stop_and_wait(each.pk, operator)


def _saved_and_drawn(driver, base: str, name: str, doc: dict):
    """Save ``doc`` as pipeline ``name`` from the open pipeline form; its edit page's
    DAG. Returns (the pipeline, its drawn nodes)."""
    from pipelines.models import Pipeline

    driver.find_element(By.ID, "id_name").send_keys(name)
    _set_textarea(driver, "id_definition", json.dumps(doc, indent=2))
    driver.find_element(By.ID, "save-pipeline").click()
    WebDriverWait(driver, 20).until(lambda d: d.current_url.endswith("/pipelines/"))
    pipeline = Pipeline.objects.get(name=name)
    driver.get(f"{base}/pipelines/{pipeline.pk}/edit/")
    return pipeline, WebDriverWait(driver, 20).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#pipeline-dag .dag-node"))


@pytest.mark.django_db(transaction=True)
def test_a_dataflow_pipeline_page_draws_its_dag_and_refuses_an_unknown_input(
        live_stack, operator, browser) -> None:
    from pipelines.nexmark import queries

    base = live_stack.base_url
    log_in(browser, base, "operator", "op-pass-123")
    q3 = queries.definition("Q3", 200)
    browser.get(base + "/pipelines/new/")
    pipeline, nodes = _saved_and_drawn(browser, base, "nexmark-q3", q3)
    assert {n.get_attribute("data-node") for n in nodes} == \
        {"events", "sellers", "auctions10", "joined", "suggest", "out"}
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to"))
             for e in browser.find_elements(By.CSS_SELECTOR, "#pipeline-dag .dag-edge")}
    assert edges == {("events", "sellers"), ("events", "auctions10"), ("sellers", "joined"),
                     ("auctions10", "joined"), ("joined", "suggest"), ("suggest", "out")}
    stateful = browser.find_elements(By.CSS_SELECTOR, "#pipeline-dag .dag-node.stateful")
    assert [n.get_attribute("data-node") for n in stateful] == ["joined"]
    browser.save_screenshot(str(Path(live_stack.logs) / "pipeline-dag.png"))

    broken = json.loads(json.dumps(q3))
    join = next(n for n in broken["nodes"] if n["id"] == "joined")
    join["left"] = "ghost"
    _set_textarea(browser, "id_definition", json.dumps(broken, indent=2))
    browser.find_element(By.ID, "save-pipeline").click()
    error = WebDriverWait(browser, 20).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".error[data-field=definition]"))[0].text
    assert "nodes[3] (joined).left" in error and "unknown node 'ghost'" in error
    pipeline.refresh_from_db()
    assert pipeline.definition["nodes"][3]["left"] == "sellers"  # nothing stored is lost


@pytest.mark.django_db(transaction=True)
def test_a_viewer_sees_no_control_and_an_operator_sees_them_all(live_stack, browser) -> None:
    """Issue 17: the page shows no control the role cannot use (Chromium, real daphne)."""
    from django.contrib.auth.models import Group, Permission, User

    from accounts.roles import sync_roles
    from pipelines.models import Run
    from tests.conftest import make_pipeline_and_policy

    sync_roles(Group, Permission)
    for role in ("viewer", "operator"):
        user = User.objects.create_user(role, password=f"{role}-pass-123")
        user.groups.add(Group.objects.get(name=role))
    owner = User.objects.get(username="operator")
    pipeline, policy = make_pipeline_and_policy(owner, name="roles")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="stopped", created_by=owner)
    base = live_stack.base_url
    controls = {f"/runs/{run.pk}/": ["#stop-run", "#set-workers", "#reconfigure-card",
                                     "#set-dry-run"],
                "/runs/": ["form[action='/runs/start/']"],
                "/pipelines/": ["#new-pipeline", "form.start-run", "a[href$='/edit/']"],
                "/policies/": ["#new-policy", "a[href$='/edit/']"],
                "/lab/": ["#new-lab"]}
    for role in ("viewer", "operator"):
        browser.delete_all_cookies()
        log_in(browser, base, role, f"{role}-pass-123")
        for path, selectors in controls.items():
            browser.get(base + path)
            WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "whoami"))
            assert role in browser.find_element(By.ID, "whoami").text
            for css in selectors:
                shown = bool(browser.find_elements(By.CSS_SELECTOR, css))
                assert shown == (role == "operator"), (role, path, css)
        audit_links = browser.find_elements(By.CSS_SELECTOR, "nav a[href='/audit/']")
        assert bool(audit_links) == (role == "operator")
        browser.get(base + "/pipelines/new/")
        assert (browser.find_elements(By.ID, "save-pipeline") != []) == (role == "operator")


def _replan_from_page(browser, groups: int, scheme: str, overlaps: int) -> None:
    field = browser.find_element(By.ID, "id_key_groups")
    field.clear()
    field.send_keys(str(groups))
    Select(browser.find_element(By.ID, "id_scheme")).select_by_value(scheme)
    browser.find_element(By.ID, "replan").click()
    # The form POSTs and redirects back here; the run's key groups change when the new
    # query forwards, and the span is shaded once the re-plan has been measured.
    WebDriverWait(browser, 600, poll_frequency=1,
                  ignored_exceptions=(StaleElementReferenceException,
                                      NoSuchElementException)).until(
        lambda d: d.find_element(By.ID, "run-key-groups").text == str(groups)
        and len(d.execute_script("return window.__streamwise.overlaps") or []) >= overlaps)


def _verdict(run_id: int) -> dict | None:
    """The run's stored exactly-once verification once the check has ended."""
    from pipelines.models import Run

    doc = Run.objects.get(pk=run_id).verification or {}
    return doc if doc.get("state") in ("done", "error") else None


def _run_on_its_page(live_stack, operator, browser, name: str, doc: dict):
    """A run of ``doc`` on 1 worker (of 2 its policy allows), started through the
    product, its page open as the operator. Returns (run, base URL). One executor: a
    re-plan's new generation places its key groups on the run's executors whatever
    their number, and the re-plans across two are NEXMark Q5's
    (tests/spark/test_replan_spark.py); a second would cost a JVM and spread every
    batch over two processes for nothing this test checks."""
    from control.models import Policy
    from pipelines import actions
    from pipelines.models import Pipeline

    pipeline = actions.save_pipeline(Pipeline(name=f"{name}-pipeline", definition=doc),
                                     operator)
    policy = Policy.objects.create(name=f"{name}-policy", latency_bound_ms=10000,
                                   power_budget_w=40, min_workers=1, initial_workers=1,
                                   max_workers=2)
    run = actions.create_run(pipeline, policy, operator)
    base = live_stack.base_url
    log_in(browser, base, "operator", "op-pass-123")
    browser.get(f"{base}/runs/{run.pk}/")
    return run, base


# A filtered keyed mean (a sum and a count per key) over 2,500 Zipf keys, on a
# processing-time trigger: the seamless transfer runs between its batches
# (reseed.TransferGate); the HFT and NEXMark re-plan tests run without one.
MEAN = {"source": {"type": "generator", "seed": 8, "partitions": 2,
                   "rate": {"kind": "constant", "records_per_s": 800},
                   "keys": {"kind": "zipf", "n": 2500, "s": 0.8}},
        "operators": [{"type": "filter", "field": "value", "op": "<", "value": 900},
                      {"type": "keyed_aggregate", "key": "key", "agg": "mean",
                       "field": "value"}],
        "sink": {"type": "latency", "keep_output": True},
        "key_groups": 8, "trigger_ms": 1000}


@pytest.mark.django_db(transaction=True)
def test_key_groups_change_8_16_4_from_the_run_page_with_exactly_once_output(
        live_stack, operator, browser) -> None:
    """Issue 15's browser acceptance: re-plan a running run 8 -> 16 (seamless) -> 4
    (stop and restart) from its page, see both spans shaded on the charts, and the
    exactly-once check of the whole run say OK. It is also the runtime's test of a
    keyed aggregate's re-plan (what each scheme did, from the runner's summaries; the
    generations' ledger; the output batches' numbering across generations): one run
    through the product rather than a second one through the harness."""
    from pipelines import launch
    from pipelines.models import Run
    from pipelines.runtime.replan import gloss

    run, base = _run_on_its_page(live_stack, operator, browser, "replan", MEAN)
    try:
        WebDriverWait(browser, 240, poll_frequency=1).until(
            lambda d: d.execute_script("return window.__streamwise.points") >= 5)
        assert browser.find_element(By.ID, "run-key-groups").text == "8"
        _replan_from_page(browser, 16, "seamless", 1)
        _replan_from_page(browser, 4, "stop-restart", 2)
        overlaps = browser.execute_script("return window.__streamwise.overlaps")
        assert [o["scheme"] for o in overlaps] == ["seamless", "stop-restart"]
        assert all(o["to"] > o["from"] for o in overlaps)
        browser.save_screenshot(str(Path(live_stack.logs) / "browser-replan.png"))
        done = [e.payload for e in Run.objects.get(pk=run.pk).events.filter(
            kind="runner:replan_done").order_by("at")]
        assert [(d["from_groups"], d["to_groups"]) for d in done] == [(8, 16), (16, 4)]
        _assert_replan_facts(*done)
        kinds = list(Run.objects.get(pk=run.pk).events.values_list("kind", flat=True))
        assert kinds.count("runner:replan_switched") == 2
        assert "runner:replan_failed" not in kinds
        requested = Run.objects.get(pk=run.pk).events.filter(kind="reconfigure_requested")
        assert requested.count() == 2 and all(e.actor == "user:operator" for e in requested)
        browser.find_element(By.ID, "stop-run").click()
        wait_for(lambda: Run.objects.get(pk=run.pk).is_terminal, 120, "the run to stop")
        browser.get(f"{base}/runs/{run.pk}/")
        browser.find_element(By.ID, "verify-run").click()
        # The check queued on stop may still be running: the button then says so and
        # queues no second one. Read the badge on the page the click led to.
        WebDriverWait(browser, 30, poll_frequency=0.5,
                      ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: "exactly-once check" in " ".join(
                e.text for e in d.find_elements(By.CSS_SELECTOR, ".flash")))
        # The check's verdict in the database first, so that a check that never ends
        # (or ends in "not checkable") fails here with what it stored and what the Lab
        # worker, which runs it, logged; then the page's badge, which a push updates.
        try:
            verification = wait_for(lambda: _verdict(run.pk), 300, "the exactly-once check")
        except pytest.fail.Exception:
            lab_log = launch.tail(Path(live_stack.logs) / "lab-worker.log", 15)
            pytest.fail(f"the exactly-once check did not end in 300 s: it stored "
                        f"{Run.objects.get(pk=run.pk).verification}; the lab worker "
                        f"logged:\n{lab_log}")
        assert verification.get("state") == "done" and verification.get("ok"), verification
        WebDriverWait(browser, 30, poll_frequency=0.5,
                      ignored_exceptions=(StaleElementReferenceException,
                                          NoSuchElementException)).until(
            lambda d: d.find_element(By.ID, "run-verification").text.startswith(("OK",
                                                                                "FAILED")))
        badge = browser.find_element(By.ID, "run-verification").text
        assert badge.startswith("OK"), verification
    finally:
        stop_and_wait(run.pk, operator)
    # The run's output batches continue across generations, one record each, and the
    # ledger says which generation (and how many key groups) wrote which.
    run.refresh_from_db()
    epochs = list(run.samples.order_by("batch_id").values_list("batch_id", flat=True))
    assert epochs == list(range(len(epochs)))
    ledger = json.loads((Path(run.checkpoint_dir) / gloss.GENERATIONS_FILE).read_text())
    assert [(g["generation"], g["key_groups"]) for g in ledger["generations"]] == [
        (0, 8), (1, 16), (2, 4)]


def _assert_replan_facts(seamless: dict, restart: dict) -> None:
    """What each scheme did, from the runner's re-plan summaries."""
    print(json.dumps({k: {f: a.get(f) for f in (
        "overlap_s", "catch_up_s", "transfer_s", "snapshot_rows", "downtime_s",
        "disrupted_s", "discarded_batches", "transfer_gated", "transfer_gated_s")}
        for k, a in (("seamless", seamless), ("stop-restart", restart))}))
    # The new query ran beside the old one (seamless) and the old one's output stopped
    # before the new one's began (stop-and-restart).
    assert seamless["overlap_s"] > 0 and restart["overlap_s"] == 0
    # The transfer was stopped while the old query ran its batches, where they left idle
    # time (measured by the runner: on a slow machine they ran back to back, and a gated
    # transfer would have starved), and else ran beside them.
    if seamless["transfer_gated"]:
        assert seamless["transfer_gated_s"] > 0
    else:
        assert seamless["transfer_gated_s"] is None
    assert restart["transfer_gated_s"] is None and not restart["transfer_gated"]
    assert seamless["snapshot_rows"] > 0
    assert restart["snapshot_rows"] >= seamless["snapshot_rows"]


# The receipt (SHA-256 rounds a row) is the package's costly operator: COLA fuses the
# cheap ones before or with it, where one PE a operator pays a hand-over a row.
EXAMPLE_OPS = {"nodes": [
    {"id": "orders", "type": "generator", "seed": 3, "partitions": 2,
     "rate": {"kind": "constant", "records_per_s": 1000},
     "keys": {"kind": "zipf", "n": 200, "s": 1.1}},
    {"id": "gross", "type": "python", "input": "orders", "function": "order_gross",
     "params": {"tax_pct": 9}},
    {"id": "region", "type": "python", "input": "gross", "function": "customer_region"},
    {"id": "receipt", "type": "python", "input": "region", "function": "order_receipt",
     "params": {"rounds": 32}},
    {"id": "out", "type": "sink", "input": "receipt", "keep_output": True}],
    "trigger_ms": 1000}


@pytest.mark.django_db(transaction=True)
def test_the_form_lists_a_packages_operators_and_a_pipeline_of_them_runs_and_draws_its_dag(
        live_stack, operator, browser) -> None:
    """Issue 46's browser acceptance, and issue 16's: the pipeline form lists the
    example package's operators with their docs (and its pipeline module); a pipeline
    made of them is saved from the form, drawn as a DAG and started from the list. Its
    run's "Optimise plan" shows each operator's measured cost on the DAG and the
    current plan (one PE an operator) beside COLA's; applying it re-plans the query
    live, the page then draws the new PEs, and the exactly-once check of the whole run
    (the verifier applies the same installed operators outside Spark) says OK.

    One run for both issues: the product's own Python operators take the same path
    (one registry), and COLA's plan from the profile of the product's six HFT
    operators is tested on the runtime (tests/spark/test_plan_spark.py)."""
    from control.models import Policy
    from pipelines.models import Run

    Policy.objects.create(name="pkg-policy", latency_bound_ms=10000, power_budget_w=40,
                          min_workers=1, initial_workers=2, max_workers=2)
    base = live_stack.base_url
    log_in(browser, base, "operator", "op-pass-123")
    browser.get(base + "/pipelines/new/")
    browser.find_element(By.CSS_SELECTOR, "#installed-operators summary").click()
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-operator="order_gross"]')
    assert "The order's amount with tax, in whole cents" in row.text
    assert "tax_pct = 21 (0..100)" in row.text and "streamwise-example-ops 0.1.0" in \
        browser.find_element(By.ID, "operator-packages").text
    module = browser.find_element(
        By.CSS_SELECTOR, 'tr[data-module="streamwise_example_ops.jobs:customer_totals"]')
    assert "Per customer, over all time" in module.text
    pipeline, nodes = _saved_and_drawn(browser, base, "orders-ops", EXAMPLE_OPS)
    drawn = {n.get_attribute("data-node") for n in nodes}
    assert drawn == {"orders", "gross", "region", "receipt", "out"}

    browser.get(base + "/pipelines/")
    browser.find_element(By.CSS_SELECTOR, 'button[data-pipeline="orders-ops"]').click()
    WebDriverWait(browser, 20).until(lambda d: "/runs/" in d.current_url)
    run = Run.objects.get(pipeline_version__pipeline=pipeline)
    wait = WebDriverWait(browser, 240, poll_frequency=1,
                         ignored_exceptions=(StaleElementReferenceException,
                                             NoSuchElementException))

    def plan_page_ready(d) -> bool:
        d.get(f"{base}/runs/{run.pk}/plan/")
        return bool(d.find_elements(By.ID, "plan-compare"))

    def drawn_pes(d) -> dict[str, tuple[int, float]]:
        """Each operator's PE and measured µs a row, as the plan page draws them."""
        return {n.get_attribute("data-node"): (int(n.get_attribute("data-pe")),
                                               float(n.get_attribute("data-cpu-us") or 0))
                for n in d.find_elements(By.CSS_SELECTOR, "#plan-dag .plan-node[data-pe]")}

    def profiled(d) -> dict[str, float]:
        """Each operator's measured µs a row, once the plan page has all three."""
        drawn = drawn_pes(d) if plan_page_ready(d) else {}
        costs = {node: cpu for node, (_pe, cpu) in drawn.items()}
        return costs if len(costs) == 3 and all(costs.values()) else {}

    try:
        # Past the start-up backlog: the profile is of batches at the source's rate.
        wait.until(lambda d: d.execute_script("return window.__streamwise.points") >= 8)
        browser.find_element(By.ID, "optimise-plan").click()
        costs = wait.until(profiled)
        assert max(costs, key=costs.get) == "receipt", costs
        current = json.loads(browser.find_element(By.ID, "plan-current")
                             .get_attribute("data-pes"))
        proposed = json.loads(browser.find_element(By.ID, "plan-cola")
                              .get_attribute("data-pes"))
        assert current == [["gross"], ["region"], ["receipt"]]
        assert len(proposed) < len(current), proposed
        assert "measured" in browser.find_element(By.ID, "plan-summary").text
        browser.save_screenshot(str(Path(live_stack.logs) / "browser-packages.png"))
        browser.find_element(By.ID, "apply-plan").click()
        wait_for(lambda: Run.objects.get(pk=run.pk).events.filter(
            kind="runner:replan_done").exists(), 600, "the re-plan to COLA's plan")
        requested = [e for e in Run.objects.get(pk=run.pk).events.filter(
            kind="reconfigure_requested") if e.payload.get("command") == "replan"]
        assert [e.actor for e in requested] == ["user:operator"]
        assert requested[0].payload["plan"]["pes"] == proposed
        # The page now draws the new PEs (once the new plan has a profile of its own).
        WebDriverWait(browser, 240, poll_frequency=2).until(
            lambda d: plan_page_ready(d) and json.loads(
                d.find_element(By.ID, "plan-current").get_attribute("data-pes")) == proposed)
        assert len({pe for pe, _cpu in drawn_pes(browser).values()}) == len(proposed)
        assert browser.find_element(By.ID, "apply-plan").get_attribute("disabled")
        browser.get(f"{base}/runs/{run.pk}/")
        browser.find_element(By.ID, "stop-run").click()
        wait_for(lambda: Run.objects.get(pk=run.pk).is_terminal, 120, "the run to stop")
        browser.get(f"{base}/runs/{run.pk}/")
        browser.find_element(By.ID, "verify-run").click()
        verification = wait_for(lambda: _verdict(run.pk), 300, "the exactly-once check")
        assert verification.get("state") == "done" and verification.get("ok"), verification
        report = verification["report"]
        assert report["records"] > 0 and report["output_rows"] == report["records"], report
    finally:
        stop_and_wait(run.pk, operator)
