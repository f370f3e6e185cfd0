"""Benchmark: time from a metrics record written by a runner to the viewers receiving it.

Starts daphne and the relay on the configured database (the Makefile points it at
var/bench) for ``--runs`` runs (rows in the database and live buses; no Spark: the
records are written with the runner's own publish function). First, as the baseline,
one run watched by headless Chromium and by one WebSocket viewer (``N`` records at
``--rate`` per second); beside it, the bare Redis floor (XADD -> a blocked XREAD in
another thread). Then the load: ``--viewers`` WebSocket viewers (the page's own socket
URL and session cookie, as that many browser tabs) spread evenly over the runs, each run
writing ``N`` records at ``--rate`` per second. Prints median, p95 and max of each,
their ratios, and whether every viewer got every record of its run. The product target
(issue 50): p95 < 100 ms at 1,000 viewers over 10 runs on an otherwise idle machine.
"""
from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from control.models import Policy
from pipelines import actions
from pipelines.management.benchkit import (PASSWORD, Viewers, bench_operator, free_port,
                                           percentile, session_headers, start_logged,
                                           wait_port)
from pipelines.management.processes import daphne_command, end_on_sigterm
from pipelines.models import Pipeline, Run
from pipelines.runtime import bus as busmod
from pipelines.runtime.spec.definition import DEMO_DEFINITION
from pipelines.management.browser import headless_chromium, log_in



def redis_floor_ms(n: int) -> list[float]:
    """XADD -> XREAD(block) latency between two connections, in ms."""
    writer = busmod.connect(settings.REDIS_URL)
    reader = busmod.connect(settings.REDIS_URL)
    key = "bench:floor"
    writer.delete(key)
    out: list[float] = []
    done = threading.Event()

    def read() -> None:
        last = "0-0"
        while len(out) < n:
            for _k, entries in reader.xread({key: last}, block=1000) or []:
                for entry_id, fields in entries:
                    last = entry_id
                    out.append((time.time() - float(fields["t"])) * 1000)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    time.sleep(0.2)
    for _ in range(n):
        writer.xadd(key, {"t": repr(time.time())})
        time.sleep(0.01)
    done.wait(30)
    writer.delete(key)
    return out


def publish_all(buses: list[busmod.RunnerBus], n: int, rate: float, first: int) -> None:
    """``n`` metrics records per run at ``rate`` per second each, the runs' writes spread
    evenly over each period (as runs started at different moments would be); batch ids
    from ``first`` (the relay pushes a run's batches in order, once each)."""
    period = 1.0 / rate
    step = period / len(buses)
    started = time.monotonic()
    for i in range(n):
        for j, run_bus in enumerate(buses):
            wait = started + i * period + j * step - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            run_bus.publish_metrics({"batch_id": first + i, "t": time.time(), "records": 1000,
                                     "input_rows": 1000, "latency_p95_ms": 100.0,
                                     "workers": 1, "power_w": 5.0,
                                     "power_source": "modelled"})
    time.sleep(2)


def summary(name: str, values: list[float]) -> str:
    return (f"{name}: {len(values)} pushes, median {statistics.median(values):.1f} ms, "
            f"p95 {percentile(values, 0.95):.1f} ms, max {max(values):.1f} ms")


class Command(BaseCommand):
    help = ("Measure push latency runner -> relay -> Channels -> viewers (median, p95), "
            "for one viewer and for --viewers spread over --runs.")

    def add_arguments(self, parser):
        parser.add_argument("--records", type=int, default=100, help="per run")
        parser.add_argument("--rate", type=float, default=2.0,
                            help="records per second per run (a 500-ms trigger: 2)")
        parser.add_argument("--viewers", type=int, default=1,
                            help="WebSocket viewers under load, spread over --runs")
        parser.add_argument("--runs", type=int, default=1)

    def handle(self, *args, **options):
        n, rate = options["records"], options["rate"]
        viewers_n, runs_n = options["viewers"], options["runs"]
        if n < 10 or not 0 < rate <= 100:
            raise CommandError("--records must be >= 10 and --rate in (0, 100]")
        if not 1 <= runs_n <= 100 or not 1 <= viewers_n <= 5000:
            raise CommandError("--runs must be in 1..100 and --viewers in 1..5000")
        user = bench_operator()
        pipeline = Pipeline.objects.filter(name="bench").first() or actions.save_pipeline(
            Pipeline(name="bench", definition=DEMO_DEFINITION), user)
        policy, _ = Policy.objects.get_or_create(name="bench", defaults={
            "latency_bound_ms": 1000, "power_budget_w": 10})
        runs = [Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                                   status="running", created_by=user)
                for _ in range(runs_n)]
        r = busmod.connect(settings.REDIS_URL)
        control_buses = [busmod.ControlBus(r, run.bus_key) for run in runs]
        for control_bus in control_buses:
            control_bus.reset()
            control_bus.mark_live()
        run_buses = [busmod.RunnerBus(r, run.bus_key) for run in runs]  # the runners' side

        port = free_port()
        logs = Path(settings.VAR_DIR) / "bench-logs"
        end_on_sigterm()
        procs = start_logged({
            "web": daphne_command(port),
            "relay": [sys.executable, "manage.py", "relay"]}, logs)
        driver = None
        try:
            wait_port(port, logs / "web.log")
            driver = headless_chromium()
            base = f"http://127.0.0.1:{port}"
            from selenium.webdriver.support.ui import WebDriverWait

            log_in(driver, base, "bench", PASSWORD)
            driver.get(f"{base}/runs/{runs[0].pk}/")
            WebDriverWait(driver, 30).until(
                lambda d: d.execute_script("return window.__streamwise.socketOpen"))
            floor = redis_floor_ms(n)
            headers = session_headers(user, port)
            urls = [f"ws://127.0.0.1:{port}/ws/runs/{run.pk}/" for run in runs]
            self.stdout.write(f"baseline: the browser and 1 WebSocket viewer of 1 run, "
                              f"{n} records at {rate:g}/s …")
            with Viewers(urls[0], headers) as alone:
                alone.wait_open(60)
                publish_all(run_buses[:1], n, rate, first=1)
            arrivals = driver.execute_script("return window.__streamwise.arrivals")
            driver.quit()
            driver = None
            self.stdout.write(f"load: {viewers_n} viewers over {runs_n} runs, {n} records "
                              f"per run at {rate:g}/s each …")
            # Later batch ids than the baseline's, so that each viewer's set is its own.
            with Viewers([urls[i % runs_n] for i in range(viewers_n)], headers) as load:
                opened_s = load.wait_open(max(60.0, viewers_n * 0.2))
                self.stdout.write(f"  {viewers_n} viewers connected (snapshot received) "
                                  f"in {opened_s:.1f} s")
                publish_all(run_buses, n, rate, first=n + 1)
        finally:
            if driver is not None:
                driver.quit()
            for proc in procs:
                os.killpg(proc.pid, signal.SIGTERM)
            for control_bus in control_buses:
                control_bus.mark_done()
            Run.objects.filter(pk__in=[run.pk for run in runs]).update(status="stopped")
        browser = [(a["received_at"] - a["written_at"]) * 1000 for a in arrivals]
        base_ms, loaded = alone.latencies(), load.latencies()
        if len(browser) < n * 0.9 or len(base_ms) < n * 0.9:
            raise CommandError(f"only {len(browser)} (browser) and {len(base_ms)} "
                               f"(viewer) of {n} records arrived in the baseline")
        short = [v for v in load.viewers if len(v.batches) < n]
        errors = [e for v in load.viewers for e in v.errors]
        floor_med = statistics.median(floor)
        p95, base_p95 = percentile(loaded, 0.95), percentile(base_ms, 0.95)
        self.stdout.write(
            f"baseline Redis XADD -> XREAD: median {floor_med:.2f} ms\n"
            + summary("browser (Chromium), 1 run", browser) + "\n"
            + summary("1 viewer of 1 run", base_ms) + "\n"
            + summary(f"{viewers_n} viewers over {runs_n} runs", loaded) + "\n"
            + f"ratio load/1 viewer: median "
            f"{statistics.median(loaded) / statistics.median(base_ms):.2f}x, "
            f"p95 {p95 / base_p95:.2f}x; browser/Redis (medians): "
            f"{statistics.median(browser) / floor_med:.1f}x\n"
            f"viewers missing records: {len(short)}; viewer errors: {len(errors)} "
            f"{errors[:3]}\n"
            f"target p95 < 100 ms: {'met' if p95 < 100 else 'NOT met'}")
        if short or errors:
            raise CommandError("not every viewer received every record (see above)")
