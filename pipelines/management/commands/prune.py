"""Apply the retention policy now (``pipelines.retention``), or show what it would do.

    python manage.py prune [--dry-run]
"""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from pipelines import retention


class Command(BaseCommand):
    help = "Thin old metric samples and prune old runs' detail, output and checkpoints."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true",
                            help="say what would be deleted, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        policy = retention.RetentionPolicy.from_settings()
        for what, how_long in policy.describe():
            self.stdout.write(f"  {what}: {how_long}")
        report = retention.prune(timezone.now(), policy, dry_run=options["dry_run"])
        self.stdout.write(report.summary())
