"""Retention: what Streamwise keeps, and for how long.

A run writes one metric sample per micro-batch (86,400 a day at one-second batches),
its runner relays events, the controller records a decision per step, and with kept
output the sink writes a Parquet file per batch beside the run's checkpoint. Without
pruning, all of it grows for ever. Every hour (celery beat) and on demand
(``python manage.py prune [--dry-run]``):

* **metric samples** older than ``RETAIN_RAW_SAMPLES_DAYS`` are thinned to one per
  ``RETAIN_SAMPLE_BUCKET_S`` per run: the sample with the highest p95 latency in its
  bucket is kept (a spike stays visible on the chart), the others deleted — never
  averaged, so every sample shown is still one that was measured;
* of runs that ended more than ``RETAIN_DETAIL_DAYS`` ago: the runner's progress events
  (migration steps, placement drift, ...; the lifecycle events and every operator's,
  controller's and reconciler's stay) and the controller's decisions that held or were
  not applied;
* of runs that ended more than ``RETAIN_FILES_DAYS`` ago: the kept output and the
  checkpoint (the verifier's verdict, stored on the run, stays).

Never pruned: runs, pipelines, policies, their versions, and the audit log (append-only).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q

from control.models import Decision, DecisionOutcome
from pipelines.models import TERMINAL_STATUSES, MetricSample, Run, RunEvent
from pipelines.runtime.bus import RunnerEvent

log = logging.getLogger(__name__)
DELETE_CHUNK = 2000
# Runner events that say what happened to the run as a whole: kept with the run.
LIFECYCLE_EVENTS = tuple(f"runner:{k}" for k in (
    RunnerEvent.RUNNER_STARTED, RunnerEvent.SESSION_STARTED, RunnerEvent.EXECUTORS_READY,
    RunnerEvent.QUERY_STARTED, RunnerEvent.STOPPED, RunnerEvent.FAILED,
    RunnerEvent.MIGRATION_DONE, RunnerEvent.REPLAN_DONE))


@dataclass(frozen=True)
class RetentionPolicy:
    raw_samples_days: float
    sample_bucket_s: int
    detail_days: float
    files_days: float

    @classmethod
    def from_settings(cls) -> RetentionPolicy:
        return cls(raw_samples_days=settings.RETAIN_RAW_SAMPLES_DAYS,
                   sample_bucket_s=settings.RETAIN_SAMPLE_BUCKET_S,
                   detail_days=settings.RETAIN_DETAIL_DAYS,
                   files_days=settings.RETAIN_FILES_DAYS)

    def describe(self) -> list[tuple[str, str]]:
        """(what, how long) lines for the retention page."""
        return [
            ("Metric samples, one per micro-batch",
             f"{self.raw_samples_days:g} days; then one per {self.sample_bucket_s} s per run "
             "(the highest p95 of each bucket)"),
            ("Runner progress events, controller decisions that held or failed",
             f"{self.detail_days:g} days after the run ended"),
            ("Kept output and checkpoints", f"{self.files_days:g} days after the run ended"),
            ("Runs, lifecycle events, operators' actions, applied decisions, pipelines, "
             "policies, the audit log", "for ever"),
        ]


@dataclass
class PruneReport:
    samples_deleted: int = 0
    events_deleted: int = 0
    decisions_deleted: int = 0
    directories_removed: int = 0
    bytes_freed: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (f"{verb} {self.samples_deleted} metric samples, {self.events_deleted} "
                f"runner events, {self.decisions_deleted} decisions, "
                f"{self.directories_removed} run directories ({self.bytes_freed / 1e6:.1f} MB)")


def _delete_ids(model: Any, ids: list[int], dry_run: bool) -> int:
    if not dry_run:
        for start in range(0, len(ids), DELETE_CHUNK):
            model.objects.filter(pk__in=ids[start:start + DELETE_CHUNK]).delete()
    return len(ids)


def thin_samples(before: datetime, bucket_s: int, dry_run: bool = False) -> int:
    """Keep one sample per (run, ``bucket_s`` of time) among those taken before
    ``before``: the one with the highest p95 latency (the first, when none has one)."""
    doomed: list[int] = []
    best: dict[tuple[int, int], tuple[float, int]] = {}
    rows = (MetricSample.objects.filter(t__lt=before).order_by("run_id", "t", "id")
            .values_list("id", "run_id", "t", "latency_p95_ms").iterator(chunk_size=5000))
    for sample_id, run_id, t, p95 in rows:
        bucket = (run_id, int(t.timestamp()) // bucket_s)
        score = p95 if p95 is not None else float("-inf")
        kept = best.get(bucket)
        if kept is None:
            best[bucket] = (score, sample_id)
        elif score > kept[0]:
            doomed.append(kept[1])
            best[bucket] = (score, sample_id)
        else:
            doomed.append(sample_id)
    return _delete_ids(MetricSample, doomed, dry_run)


def _ended_before(cutoff: datetime) -> Any:
    return Run.objects.filter(status__in=TERMINAL_STATUSES, ended_at__lt=cutoff)


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune(now: datetime, policy: RetentionPolicy | None = None,
          dry_run: bool = False) -> PruneReport:
    """Apply ``policy`` (the settings' by default) as of ``now``."""
    policy = policy or RetentionPolicy.from_settings()
    report = PruneReport(dry_run=dry_run)
    report.samples_deleted = thin_samples(now - timedelta(days=policy.raw_samples_days),
                                          policy.sample_bucket_s, dry_run)
    detail_runs = _ended_before(now - timedelta(days=policy.detail_days))
    events = RunEvent.objects.filter(run__in=detail_runs, kind__startswith="runner:") \
        .exclude(kind__in=LIFECYCLE_EVENTS)
    report.events_deleted = _delete_ids(RunEvent, list(events.values_list("pk", flat=True)),
                                        dry_run)
    decisions = Decision.objects.filter(run__in=detail_runs).filter(
        ~Q(outcome=DecisionOutcome.APPLIED))
    report.decisions_deleted = _delete_ids(
        Decision, list(decisions.values_list("pk", flat=True)), dry_run)
    root = Path(settings.CHECKPOINT_ROOT).resolve()
    for run in _ended_before(now - timedelta(days=policy.files_days)).exclude(
            checkpoint_dir=""):
        directory = Path(run.checkpoint_dir).resolve()
        # Only what the product made: a directory under CHECKPOINT_ROOT.
        if not directory.is_dir() or root not in directory.parents:
            continue
        report.bytes_freed += _tree_bytes(directory)
        report.directories_removed += 1
        if not dry_run:
            shutil.rmtree(directory, ignore_errors=True)
    if not dry_run and any((report.samples_deleted, report.events_deleted,
                            report.decisions_deleted, report.directories_removed)):
        log.info("retention: %s", report.summary())
    return report


def pending(now: datetime, policy: RetentionPolicy | None = None) -> PruneReport:
    """What the next pass would delete (the retention page)."""
    return prune(now, policy, dry_run=True)
