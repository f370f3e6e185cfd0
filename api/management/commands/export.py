"""``manage.py export [NAMES] [--format yaml|json]``: the pipelines, policies and
connections (all, or those named) as the document ``apply`` takes."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from api import documents


class Command(BaseCommand):
    help = "Write pipelines, policies and connections as a document apply takes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help="only these (any kind); all if none")
        parser.add_argument("--format", choices=("yaml", "json"), default="yaml")

    def handle(self, *args: Any, **opts: Any) -> None:
        doc = documents.export(opts["names"] or None)
        self.stdout.write(documents.dump(doc, opts["format"]), ending="")
