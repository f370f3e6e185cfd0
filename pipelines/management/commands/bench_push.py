"""Benchmark: time from a metrics record written by the runner to the browser receiving it.

Starts daphne and the relay on the configured database (the Makefile points it at
var/bench), opens a run page in headless Chromium, writes N metrics records with the
runner's own publish function, and reads the browser's arrival times. The baseline,
measured in the same run, is the bare Redis floor: XADD -> a blocked XREAD in another
thread. Prints medians and their ratio; the product target is a median under 300 ms.
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
from pipelines.management.benchkit import (PASSWORD, bench_operator, free_port, start_logged,
                                           wait_port)
from pipelines.management.processes import end_on_sigterm
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


class Command(BaseCommand):
    help = "Measure push latency runner -> relay -> Channels -> browser (median, p95)."

    def add_arguments(self, parser):
        parser.add_argument("--records", type=int, default=200)
        parser.add_argument("--rate", type=float, default=10.0, help="records per second")

    def handle(self, *args, **options):
        n, rate = options["records"], options["rate"]
        if n < 10 or not 0 < rate <= 1000:
            raise CommandError("--records must be >= 10 and --rate in (0, 1000]")
        user = bench_operator()
        pipeline = Pipeline.objects.filter(name="bench").first() or actions.save_pipeline(
            Pipeline(name="bench", definition=DEMO_DEFINITION), user)
        policy, _ = Policy.objects.get_or_create(name="bench", defaults={
            "latency_bound_ms": 1000, "power_budget_w": 10})
        run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                                 status="running", created_by=user)
        control_bus = busmod.ControlBus(busmod.connect(settings.REDIS_URL), run.bus_key)
        control_bus.reset()
        control_bus.mark_live()
        run_bus = busmod.RunnerBus(control_bus.r, run.bus_key)  # the runner's side

        port = free_port()
        logs = Path(settings.VAR_DIR) / "bench-logs"
        end_on_sigterm()
        procs = start_logged({
            "web": [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                    "webapp.asgi:application"],
            "relay": [sys.executable, "manage.py", "relay"]}, logs)
        driver = None
        try:
            wait_port(port, logs / "web.log")
            driver = headless_chromium()
            base = f"http://127.0.0.1:{port}"
            from selenium.webdriver.support.ui import WebDriverWait

            log_in(driver, base, "bench", PASSWORD)
            driver.get(f"{base}/runs/{run.pk}/")
            WebDriverWait(driver, 30).until(
                lambda d: d.execute_script("return window.__streamwise.socketOpen"))
            floor = redis_floor_ms(n)
            self.stdout.write(f"writing {n} metrics records at {rate:g}/s …")
            for i in range(n):
                run_bus.publish_metrics({"batch_id": i, "t": time.time(), "records": 1000,
                                         "input_rows": 1000, "latency_p95_ms": 100.0,
                                         "workers": 1, "power_w": 5.0,
                                         "power_source": "modelled"})
                time.sleep(1.0 / rate)
            time.sleep(2)
            arrivals = driver.execute_script("return window.__streamwise.arrivals")
        finally:
            if driver is not None:
                driver.quit()
            for proc in procs:
                os.killpg(proc.pid, signal.SIGTERM)
            control_bus.mark_done()
            Run.objects.filter(pk=run.pk).update(status="stopped")
        push = [(a["received_at"] - a["written_at"]) * 1000 for a in arrivals]
        if len(push) < n * 0.9:
            raise CommandError(f"only {len(push)} of {n} records reached the browser")
        med, floor_med = statistics.median(push), statistics.median(floor)
        p95 = statistics.quantiles(push, n=20)[18]
        self.stdout.write(
            f"push latency runner -> browser over {len(push)} records: median {med:.1f} ms, "
            f"p95 {p95:.1f} ms, max {max(push):.1f} ms\n"
            f"baseline Redis XADD -> XREAD: median {floor_med:.2f} ms\n"
            f"ratio push/baseline (medians): {med / floor_med:.1f}x; "
            f"target median < 300 ms: {'met' if med < 300 else 'NOT met'}")
