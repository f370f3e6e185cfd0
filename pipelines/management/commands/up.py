"""Start the whole product on this machine and keep it in the foreground.

Redis (a local one if none answers at REDIS_URL), migrations, the demo data, the
embedded Spark standalone cluster, one worker's capacity for the elastic demo (measured
on the first start, then stored under var/calibration/), daphne, the Celery workers of
the control and Lab queues, celery beat and the relay.
Ctrl-C (or SIGTERM) stops everything it started, by pid.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from pipelines import launch
from pipelines.management.processes import end_on_sigterm, product_processes, set_priority
from pipelines.runtime import bus as busmod
from pipelines.runtime.runner import calibration
from pipelines.runtime.cluster import standalone as cluster
from pipelines.runtime.host import secretfile
from pipelines.runtime.spec.definition import ELASTIC_STREAM_DEFINITION
from pipelines.runtime.runner.harness import HarnessError


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def with_password(url: str, password: str) -> str:
    parts = urllib.parse.urlsplit(busmod.public_url(url))
    return urllib.parse.urlunsplit(parts._replace(
        netloc=f":{urllib.parse.quote(password, safe='')}@{parts.netloc}"))


def private_redis(var: Path, url: str) -> tuple[list[str], str]:
    """The command that starts a Redis of our own for ``url`` (on its port, loopback
    only, nothing kept on disk) with a password, and ``url`` with that password. The
    password is made once (``var/redis_password``) and handed to redis-server in a
    private config file, never on its command line, where any user could read it."""
    password = secretfile.make_once(var / "redis_password",
                                    lambda: secrets.token_urlsafe(32))
    port = urllib.parse.urlsplit(url).port or 6379
    conf = var / "redis.conf"
    secretfile.write_private(conf, "\n".join([
        "bind 127.0.0.1", f"port {port}", 'save ""', "appendonly no",
        f"requirepass {password}", ""]))
    server = shutil.which("redis-server")
    if server is None:
        raise CommandError(f"no Redis answers at {busmod.public_url(url)} and redis-server "
                           "is not installed (make run installs it)")
    return [server, str(conf)], with_password(url, password)


FEED_PASSWORD_ENV = "STREAMWISE_FEED_PASSWORD"


def _password(url: str) -> str:
    from urllib.parse import unquote, urlsplit

    password = urlsplit(url).password
    return unquote(password) if password else ""


class Command(BaseCommand):
    help = "Run Streamwise: web, worker, beat, relay and the embedded Spark cluster."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
        parser.add_argument("--password", default=os.environ.get("ADMIN_PASSWORD"))

    def handle(self, *args, **options):
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.cluster_info = None
        end_on_sigterm()
        try:
            self._start(options)
            self._watch()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            self._stop_all()

    def _start(self, options) -> None:
        var = Path(settings.VAR_DIR)
        logs = var / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if not redis_answers(settings.REDIS_URL):
            command, url = private_redis(var, settings.REDIS_URL)
            if not redis_answers(url):  # else: ours from an earlier start, still up
                self._spawn("redis", command, logs)
                for _ in range(50):
                    if redis_answers(url):
                        break
                    time.sleep(0.1)
                else:
                    raise CommandError("started redis-server but it does not answer; see "
                                       f"{logs / 'redis.log'}")
            self._use_redis(url)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", password=options["password"])
        if settings.SPARK_MASTER_URL == "embedded":
            self.stdout.write("starting the embedded Spark cluster (≈10 s)…")
            try:
                self.cluster_info = cluster.start(Path(settings.SPARK_DIR),
                                                  worker_cores=settings.CLUSTER_CORES)
            except cluster.ClusterError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"Spark master {self.cluster_info.master_url} "
                              f"(UI {self.cluster_info.master_web})")
        connections = self._keep_local_connection()
        feeders = {"feeder": self._seed_stream_demo()}
        elastic_feeder = self._seed_elastic_demo(var, connections)
        if elastic_feeder is not None:
            feeders["feeder-elastic"] = elastic_feeder
        for name, args in product_processes(options["port"], var).items():
            self._spawn(name, args, logs)
        for name, args in feeders.items():
            self._spawn(name, args, logs, env={FEED_PASSWORD_ENV: _password(
                settings.REDIS_URL)})
        self.stdout.write(self.style.SUCCESS(
            f"\nStreamwise is up: http://127.0.0.1:{options['port']}/  (logs in {logs})\n"
            "Ctrl-C stops everything."))

    def _keep_local_connection(self) -> dict[str, dict[str, str]]:
        """The connection to the product's own Redis (its password in the connection),
        which both demos' streams are read through; as a runner gets it."""
        from django.contrib.auth import get_user_model

        from pipelines.management.commands import seed_demo as demo
        from pipelines.models import Connection

        user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
        conn, _ = Connection.objects.get_or_create(name=demo.STREAM_CONNECTION, defaults={
            "kind": "redis", "created_by": user,
            "description": "The product's own Redis (the demos' streams)."})
        public, password = busmod.public_url(settings.REDIS_URL), _password(settings.REDIS_URL)
        if (conn.kind, conn.url, conn.password) != ("redis", public, password):
            conn.kind, conn.url, conn.password = "redis", public, password
            conn.save()  # (audited: the password as "(old)" -> "(new)")
        return {conn.name: conn.runtime()}

    def _feeder(self, stream: str, rate: dict[str, Any], keys: dict[str, Any],
                *extra: str) -> list[str]:
        """A feeder's command into the product's Redis (its password in the
        environment, never on the command line)."""
        command = [sys.executable, "-m", "pipelines.feed", "redis", "--url",
                   busmod.public_url(settings.REDIS_URL), "--stream", stream,
                   "--rate", json.dumps(rate), "--keys", json.dumps(keys), *extra]
        if _password(settings.REDIS_URL):
            command += ["--password-env", FEED_PASSWORD_ENV]
        return command

    def _seed_stream_demo(self) -> list[str]:
        """The pipeline that reads the stream demo's orders and the feeder's command
        (``_start`` runs it beside the product)."""
        from django.contrib.auth import get_user_model

        from pipelines.management.commands import seed_demo as demo

        user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
        pipeline = demo.seed_stream_demo(user)
        self.stdout.write(f"stream demo: pipeline '{pipeline.name}' ({pipeline.description})")
        return self._feeder(demo.STREAM_NAME,
                            {"kind": "constant", "records_per_s": demo.STREAM_RATE},
                            demo.STREAM_KEYS, "--malformed", str(demo.STREAM_MALFORMED),
                            # (3 minutes of orders: a run never falls that far behind)
                            "--maxlen", str(180 * demo.STREAM_RATE))

    def _seed_elastic_demo(self, var: Path, connections: dict[str, dict[str, str]]
                           ) -> list[str] | None:
        """Measure one worker's capacity reading the elastic demo's stream (first start
        only; ~2 min, on a scratch stream), then seed the elastic demo from it, so that
        its rate step needs a second worker on this machine, whatever its speed; the
        command of the feeder that repeats the step into the stream."""
        from django.contrib.auth import get_user_model

        from pipelines.management.commands import seed_demo as demo

        master = (self.cluster_info.master_url if self.cluster_info
                  else settings.SPARK_MASTER_URL)
        shape = ELASTIC_STREAM_DEFINITION
        path = var / "calibration" / f"{calibration.shape_of(shape)}.json"
        if calibration.load(path, shape) is None:
            self.stdout.write("first start: measuring one Spark worker's capacity for the "
                              "elastic demo (~2 min, once)…")
        try:
            cal = calibration.load_or_calibrate(path, master, var / "calibration",
                                                settings.REDIS_URL, shape,
                                                progress=self.stdout.write,
                                                connections=connections)
        except HarnessError as exc:
            self.stderr.write(f"{exc}: the elastic demo is not seeded (runner log under "
                              f"{var / 'calibration'})")
            return None
        user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
        pipeline, policy = demo.seed_elastic_demo(user, cal, stream=True)
        self.stdout.write(f"elastic demo: pipeline '{pipeline.name}' under policy "
                          f"'{policy.name}' ({pipeline.description})")
        schedule, cycle_s = demo.elastic_feed(cal)
        source = shape["source"]
        high = calibration.step_plan(cal).high_rps
        return self._feeder(source["stream"], schedule, source["keys"],
                            "--seconds", str(cycle_s), "--repeat",
                            # (90 s at the high rate: what a run may fall behind)
                            "--maxlen", str(int(90 * high)))

    @staticmethod
    def _use_redis(url: str) -> None:
        """Every process from here on talks to ``url``: this one through its settings,
        the ones it starts through their environment (readable by this user only)."""
        os.environ["REDIS_URL"] = url
        settings.REDIS_URL = settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = url
        for layer in settings.CHANNEL_LAYERS.values():
            for host in layer.get("CONFIG", {}).get("hosts", []):
                host["address"] = url

    def _spawn(self, name: str, args: list[str], logs: Path,
               env: dict[str, str] | None = None) -> None:
        out = open(logs / f"{name}.log", "ab")
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                cwd=settings.BASE_DIR, start_new_session=True,
                                env={**os.environ, **(env or {})})
        set_priority(name, proc.pid)
        self.procs.append((name, proc))

    def _watch(self) -> None:
        while True:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise CommandError(f"{name} exited with code {proc.returncode}; see "
                                       f"{settings.VAR_DIR}/logs/{name}.log")
            time.sleep(1)

    def _stop_runs(self) -> None:
        """Runners are detached from us (double fork): ask each active one to stop,
        while the relay still runs to record the outcome."""
        from pipelines.launch import process_state
        from pipelines.models import ACTIVE_STATUSES, Run

        pids = [pid for pid in Run.objects.filter(status__in=ACTIVE_STATUSES)
                .values_list("runner_pid", flat=True) if process_state(pid) == "alive"]
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if process_state(p) == "alive"]
            time.sleep(0.5)
        time.sleep(1)  # let the relay apply the runners' "stopped" events

    def _stop_all(self) -> None:
        try:
            self._stop_runs()
        except Exception as exc:
            self.stderr.write(f"could not stop runs cleanly: {exc}")
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        try:  # after beat is told to stop, so that it starts no new standby
            launch.stop_standbys()
        except Exception as exc:
            self.stderr.write(f"could not stop the standby runners: {exc}")
        deadline = time.monotonic() + 15
        for _name, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.cluster_info is not None:
            cluster.stop(self.cluster_info)
            (Path(settings.SPARK_DIR) / "cluster.json").unlink(missing_ok=True)
