"""What the Spark cluster offers and who uses it: the master's workers (its JSON API),
the cores a policy may ask for, and each active run's executors with their hosts (from
the run's latest batch). Read by the Cluster page and the policy form."""
from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from pipelines.models import ACTIVE_STATUSES, Run
from pipelines.runtime.cluster import standalone as cluster

# The policy form asks on every validation: the master is asked at most this often.
CORES_CACHE_S = 10.0
_cores_cache: dict[str, tuple[float, int | None]] = {}


class ClusterUnavailable(RuntimeError):
    """The master's JSON API cannot be read (not started, not reachable, no URL)."""


def master_web_url() -> str:
    """The master's web UI: the embedded cluster's (``cluster.json``), else
    ``SPARK_MASTER_WEB_URL``, else port 8080 on the master's host (Spark's default)."""
    if settings.SPARK_MASTER_URL == "embedded":
        info = cluster.load(Path(settings.SPARK_DIR))
        if info is None:
            raise ClusterUnavailable("the embedded Spark cluster is not running (start the "
                                     "product with `make run`)")
        return info.master_web
    if settings.SPARK_MASTER_WEB_URL:
        return settings.SPARK_MASTER_WEB_URL.rstrip("/")
    parsed = urllib.parse.urlparse(settings.SPARK_MASTER_URL)
    if parsed.scheme != "spark" or not parsed.hostname:
        raise ClusterUnavailable(f"no master web UI for {settings.SPARK_MASTER_URL!r}: "
                                 "set SPARK_MASTER_WEB_URL")
    return f"http://{parsed.hostname}:8080"


def master_url() -> str:
    if settings.SPARK_MASTER_URL != "embedded":
        return settings.SPARK_MASTER_URL
    info = cluster.load(Path(settings.SPARK_DIR))
    return info.master_url if info else "embedded (not running)"


def read_workers() -> list[cluster.WorkerStatus]:
    try:
        return cluster.workers(master_web_url())
    except (OSError, ValueError) as exc:
        raise ClusterUnavailable(f"the Spark master does not answer: {exc}") from exc


def alive_cores(workers: list[cluster.WorkerStatus]) -> int:
    """Cores a policy may ask for: every worker of a run is a 1-core executor."""
    return sum(w.cores for w in workers if w.alive)


def cluster_cores() -> tuple[int, str]:
    """Cores the alive workers offer (every worker of a run is a 1-core executor) and
    where the number comes from; ``CLUSTER_CORES`` while the master cannot be read."""
    now = time.monotonic()
    which = f"{settings.SPARK_MASTER_URL} {settings.SPARK_MASTER_WEB_URL}"
    at, cores = _cores_cache.get(which, (0.0, None))
    if now - at > CORES_CACHE_S:
        try:
            cores = alive_cores(read_workers()) or None
        except ClusterUnavailable:
            cores = None
        _cores_cache[which] = (now, cores)
    if cores is None:
        return settings.CLUSTER_CORES, "configured (CLUSTER_CORES; the master did not answer)"
    return cores, "the Spark master's alive workers"


@dataclass
class RunExecutors:
    run: Run
    executors: list[tuple[str, str]]  # (executor id, host), from the latest batch


@dataclass
class ClusterOverview:
    master_url: str
    web_url: str = ""
    workers: list[cluster.WorkerStatus] = field(default_factory=list)
    error: str = ""
    runs: list[RunExecutors] = field(default_factory=list)

    @property
    def cores(self) -> int:
        return alive_cores(self.workers)

    @property
    def cores_free(self) -> int:
        return sum(w.cores_free for w in self.workers)

    def runs_on(self, host: str) -> list[str]:
        """``run N: executor E`` for each executor on ``host``."""
        return [f"run {r.run.pk}: executor {e}" for r in self.runs
                for e, h in r.executors if h == host]


def overview() -> ClusterOverview:
    result = ClusterOverview(master_url=master_url())
    try:
        result.web_url = master_web_url()
        result.workers = read_workers()
    except ClusterUnavailable as exc:
        result.error = str(exc)
    active = Run.objects.filter(status__in=ACTIVE_STATUSES)
    for run in active.select_related("pipeline_version__pipeline").order_by("pk"):
        latest = run.samples.exclude(groups=None).order_by("-batch_id").first()
        hosts = ((latest.groups or {}).get("executor_hosts") or {}) if latest else {}
        result.runs.append(RunExecutors(
            run, sorted(hosts.items(), key=lambda kv: (len(kv[0]), kv[0]))))
    return result
