"""``manage.py apply -f FILE [--dry-run] [--user NAME]``: make the database hold a
document's pipelines, policies and connections (``api/documents.py``)."""
from __future__ import annotations

import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from api import documents


class Command(BaseCommand):
    help = ("Create or update the pipelines, policies and connections of a YAML or JSON "
            "document, idempotently; print what changed and the versions it made.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-f", "--file", required=True,
                            help="the document (YAML or JSON; - reads stdin)")
        parser.add_argument("--dry-run", action="store_true",
                            help="say what would change, change nothing")
        parser.add_argument("--user", default="admin",
                            help="whose change it is in the audit (default: admin)")

    def handle(self, *args: Any, **opts: Any) -> None:
        user = get_user_model().objects.filter(username=opts["user"]).first()
        if user is None:
            raise CommandError(f"--user: no user {opts['user']!r}")
        try:
            text = sys.stdin.read() if opts["file"] == "-" else open(opts["file"]).read()
        except OSError as exc:
            raise CommandError(f"-f: {exc}") from None
        try:
            changes = documents.apply(documents.parse(text), user, opts["dry_run"])
        except documents.DocumentError as exc:
            raise CommandError(f"nothing changed; {len(exc.errors)} problem(s):\n"
                               + "\n".join(exc.errors)) from None
        for change in changes:
            self.stdout.write(change.line())
        changed = sum(c.action != "unchanged" for c in changes)
        tail = " (dry run: nothing changed)" if opts["dry_run"] else ""
        self.stdout.write(f"{changed} change(s), {len(changes) - changed} unchanged{tail}")
