"""Issue 45's browser acceptance: an operator with a real Redis stream makes the two
connections (the stream's Redis, the PostgreSQL database) and a pipeline reading one
into the other through the forms, Test connection shows the fields the stream holds,
the run starts from the pipeline list, and the stream's records arrive as rows in the
table, written by the run's runner with the connections it was given privately."""
from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from pipelines.management.browser import headless_chromium, log_in
from pipelines.runtime.connectors import feed as feeder
from tests.conftest import stop_and_wait, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.single_pass]

PG_URL = os.environ.get("PG_SINK_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def browser():
    driver = headless_chromium()
    yield driver
    driver.quit()


def _fill(driver, values: dict[str, str]) -> None:
    for field_id, value in values.items():
        element = driver.find_element(By.ID, field_id)
        if element.tag_name == "select":
            Select(element).select_by_value(value)
        else:
            element.clear()
            element.send_keys(value)


@pytest.mark.django_db(transaction=True)
def test_connections_and_a_redis_to_postgres_pipeline_made_in_the_forms_deliver_rows(
        live_stack, operator, browser) -> None:
    from control.models import Policy
    from pipelines.models import Connection, Pipeline, Run

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    stream = f"sw-browser-{uuid.uuid4().hex[:8]}"
    table = f"sw_browser_{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    stop = threading.Event()
    feed = feeder.Feed(seed=3, rate={"kind": "constant", "records_per_s": 300},
                       keys={"kind": "uniform", "n": 50})
    publisher = threading.Thread(target=feeder.publish, daemon=True, args=(
        feeder.RedisPublisher(r, stream), stream, feed),
        kwargs={"say": lambda _m: None, "stop": stop.is_set})
    publisher.start()
    Policy.objects.create(name="conn-policy", latency_bound_ms=10000, power_budget_w=40,
                          min_workers=1, initial_workers=1, max_workers=1)
    base = live_stack.base_url
    run = None
    try:
        log_in(browser, base, "operator", "op-pass-123")
        pg = psycopg.conninfo.conninfo_to_dict(PG_URL)
        for name, kind, url, user in (
                ("orders-redis", "redis", redis_url, ""),
                ("warehouse", "postgres",
                 f"postgres://{pg.get('host', '127.0.0.1')}:{pg.get('port', 5432)}/"
                 f"{pg.get('dbname', 'postgres')}", pg.get("user", "postgres"))):
            browser.get(base + "/connections/new/")
            _fill(browser, {"id_name": name, "id_kind": kind, "id_url": url,
                            "id_username": user})
            browser.find_element(By.ID, "save-connection").click()
            WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/connections/"))
        assert set(Connection.objects.values_list("name", flat=True)) == {"orders-redis",
                                                                           "warehouse"}
        wait_for(lambda: r.xlen(stream) > 100, 60, "the feeder's first entries")

        browser.get(base + "/pipelines/new/")
        _fill(browser, {"id_name": "orders-to-postgres", "id_source_type": "redis_stream",
                        "id_source_connection": "orders-redis", "id_source_stream": stream,
                        "id_sink_type": "postgres", "id_sink_connection": "warehouse",
                        "id_sink_table": table})
        # The sections show the fields of the chosen types only.
        assert not browser.find_element(By.ID, "id_source_stream").find_element(
            By.XPATH, "./ancestor::div[contains(@class, 'field')]").get_attribute("hidden")
        assert browser.find_element(By.ID, "id_source_path").find_element(
            By.XPATH, "./ancestor::div[contains(@class, 'field')]").get_attribute("hidden")
        browser.find_element(By.ID, "test-source").click()
        result = WebDriverWait(browser, 30).until(
            lambda d: d.find_element(By.ID, "test-source-result").get_attribute(
                "data-fields"))
        assert json.loads(result) == {"key": "long", "value": "double"}, result
        text = browser.find_element(By.ID, "test-source-result").text
        assert "fields: key long, value double" in text and "backlog:" in text, text
        # The schema found, fixed in the definition.
        browser.find_element(By.ID, "use-fields").click()
        written = json.loads(browser.find_element(By.ID, "id_definition").get_attribute(
            "value"))
        assert written["source"]["fields"] == {"key": "long", "value": "double"}
        browser.find_element(By.ID, "save-pipeline").click()
        WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/pipelines/"))
        saved = Pipeline.objects.get(name="orders-to-postgres").definition
        assert saved["source"]["connection"] == "orders-redis"
        assert saved["sink"]["table"] == table

        form = browser.find_element(
            By.XPATH, "//button[@data-pipeline='orders-to-postgres']/ancestor::form")
        Select(form.find_element(By.NAME, "policy")).select_by_visible_text("conn-policy")
        form.find_element(By.TAG_NAME, "button").click()
        WebDriverWait(browser, 10).until(lambda d: "/runs/" in d.current_url)
        run = Run.objects.latest("pk")

        def rows() -> int:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]
                if exists is None:
                    return 0
                return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

        try:
            wait_for(lambda: rows() >= 20, 300, "the stream's records as rows in the table")
        except Exception:
            browser.save_screenshot(str(Path(live_stack.logs) / "browser-connections.png"))
            raise
        run.refresh_from_db()
        assert run.status == "running"
        # The runner got the connections in its private config, not in its definition.
        config = Path(run.checkpoint_dir) / "runner.json"
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        assert set(json.loads(config.read_text())["connections"]) == {"orders-redis",
                                                                       "warehouse"}
    finally:
        stop.set()
        publisher.join(30)
        if run is not None:
            stop_and_wait(run.pk, operator)
        r.delete(stream, stream + ":dead-letter", stream + ":dead-letter:ids")
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute("DELETE FROM streamwise_sink_batches WHERE sink LIKE %s",
                         (f"{table}@%",))
