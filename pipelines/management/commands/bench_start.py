"""Benchmark: time from the Start POST to the first metrics point on the run page.

Starts the product as ``up`` does (the embedded Spark cluster, daphne, the Celery workers,
beat and the relay) on the configured database (the Makefile points it at var/bench),
logs in with headless Chromium and, ``--runs`` times: submits the Start form on /runs/
for the demo pipeline under a 1-2 worker policy, and reads the moment the run page
received its first metrics point over the WebSocket (browser and benchmark share this
machine's clock); then stops the run. Each run's start-up stages (runner, session,
executors, query, first batch) are read from its audited events. Before each Start it
waits, as an operator would, until the product's warm standby runner is offered
(pipelines.runtime.runner.standby; STANDBY_RUNNERS=0 measures cold starts), and says which
kind each run got.

The baseline, measured in the same run on the same cluster, is a bare PySpark
application started in a fresh Python process: SparkSession.getOrCreate() and a
one-row job (so that an executor has registered and run a task). Prints the medians
and their ratio; the product target is a median of at most 15 s.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from control.models import Policy
from pipelines import actions
from pipelines.management.benchkit import PASSWORD, bench_operator, start_product, wait_ended
from pipelines.models import Pipeline, Run
from pipelines.runtime import bus as busmod
from pipelines.runtime.runner import standby
from pipelines.runtime.spec.definition import DEMO_DEFINITION
from pipelines.management.browser import headless_chromium, log_in

STAGES = ("runner:runner_started", "runner:session_started", "runner:executors_ready",
          "runner:query_started")

BARE_SESSION = """
import os, sys, time
t0 = time.time()
from pyspark.sql import SparkSession
# The cluster's shared secret: any application must present it (spark.authenticate).
secret = open(os.environ["SPARK_AUTH_SECRET_FILE"]).read().strip()
spark = (SparkSession.builder.master(sys.argv[1]).appName("bench-bare-session")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.cores.max", "2").config("spark.executor.cores", "1")
         .config("spark.authenticate", "true").config("spark.authenticate.secret", secret)
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
session = time.time() - t0
spark.range(1).collect()
print(session, time.time() - t0)
spark.stop()
"""


def bare_session_s(master_url: str) -> tuple[float, float]:
    """(getOrCreate seconds, seconds to a first job's result), from process start."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, "-c", BARE_SESSION, master_url], env=env,
                         capture_output=True, text=True, timeout=180, check=True)
    session, first_job = (float(x) for x in out.stdout.split()[-2:])
    return session, first_job


class Command(BaseCommand):
    help = "Measure Start -> first chart point (median of --runs) against a bare Spark start."

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=5)

    def handle(self, *args, **options):
        n = options["runs"]
        if not 1 <= n <= 50:
            raise CommandError("--runs must be in 1..50")
        user = bench_operator()
        pipeline = Pipeline.objects.filter(name="bench-start").first() or actions.save_pipeline(
            Pipeline(name="bench-start", definition=DEMO_DEFINITION), user)
        policy, _ = Policy.objects.get_or_create(name="bench-start", defaults={
            "latency_bound_ms": 5000, "power_budget_w": 40, "min_workers": 1,
            "initial_workers": 1, "max_workers": 2, "strategy": "manual"})
        product = start_product(self.stdout)
        info = product.cluster
        driver = None
        firsts: list[float] = []
        bare: list[tuple[float, float]] = []
        try:
            driver = headless_chromium()
            base = f"http://127.0.0.1:{product.port}"
            log_in(driver, base, "bench", PASSWORD)
            for i in range(n):
                waited = self._wait_standby()
                bare.append(bare_session_s(info.master_url))
                first, stages, how = self._one_start(driver, base, pipeline, policy)
                firsts.append(first)
                self.stdout.write(
                    f"  run {i + 1}/{n}: first point {first:.1f} s after Start on {how} ("
                    + ", ".join(f"{k.split(':')[1]} {v:.1f}" for k, v in stages.items())
                    + f"); bare Spark start {bare[-1][1]:.1f} s (session {bare[-1][0]:.1f})"
                    + (f"; waited {waited:.0f} s for the standby" if waited >= 1 else ""))
        finally:
            if driver is not None:
                driver.quit()
            for run in Run.objects.filter(created_by=user, status__in=(
                    "pending", "starting", "running")):
                actions.request_stop(run, user)
            wait_ended(Run.objects.filter(created_by=user), 90)
            product.stop()
        med, base_med = statistics.median(firsts), statistics.median(b[1] for b in bare)
        self.stdout.write(
            f"Start -> first chart point over {n} runs: median {med:.1f} s "
            f"(min {min(firsts):.1f}, max {max(firsts):.1f})\n"
            f"baseline bare SparkSession + first job, same cluster: median {base_med:.1f} s "
            f"(getOrCreate alone {statistics.median(b[0] for b in bare):.1f} s)\n"
            f"ratio (medians): {med / base_med:.2f}x; target median <= 15 s: "
            f"{'met' if med <= 15 else 'NOT met'}")

    def _one_start(self, driver, base: str, pipeline: Pipeline,
                   policy: Policy) -> tuple[float, dict[str, float], str]:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select, WebDriverWait

        driver.get(f"{base}/runs/")
        Select(driver.find_element(By.NAME, "pipeline")).select_by_value(str(pipeline.pk))
        Select(driver.find_element(By.NAME, "policy")).select_by_value(str(policy.pk))
        button = driver.find_element(By.CSS_SELECTOR, "form.card button[type=submit]")
        clicked = time.time()
        button.click()
        WebDriverWait(driver, 180, poll_frequency=0.2).until(
            lambda d: d.execute_script("return window.__streamwise "
                                       "&& window.__streamwise.firstPointAt"))
        first = driver.execute_script("return window.__streamwise.firstPointAt") - clicked
        run = Run.objects.order_by("-pk").first()
        created = run.created_at.timestamp()
        stages = {e.kind: e.at.timestamp() - created
                  for e in run.events.filter(kind__in=STAGES).order_by("at")}
        launched = run.events.filter(kind="runner_launched").first()
        standby = launched.payload.get("standby") if launched else None
        how = f"standby {standby}" if standby else "a cold runner"
        actions.request_stop(run, run.created_by)
        deadline = time.monotonic() + 90
        while not Run.objects.get(pk=run.pk).is_terminal and time.monotonic() < deadline:
            time.sleep(0.5)
        return first, stages, how

    @staticmethod
    def _wait_standby(timeout_s: float = 300.0) -> float:
        """Wait (as an operator would between runs) until a warm standby is offered,
        when the product keeps one; returns the seconds waited."""
        if settings.STANDBY_RUNNERS < 1:
            return 0.0
        r = busmod.connect(settings.REDIS_URL)
        started = time.monotonic()
        while not r.llen(standby.READY_KEY):
            if time.monotonic() - started > timeout_s:
                raise CommandError(f"no standby runner was ready within {timeout_s:.0f} s; "
                                   f"see {settings.STANDBY_ROOT}")
            time.sleep(0.5)
        return time.monotonic() - started
