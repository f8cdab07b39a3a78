"""`manage.py job_history_archive [--months N] [--batch-size N] [--max-batches N]`: move old job transitions to the
archive now, as beat's hourly task does, and say how long it took and the longest one batch held its locks."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.history_archive import ARCHIVE_BATCH_SIZE, archive_cutoff, job_transitions_archive


class Command(BaseCommand):
    help = (
        "Move job transitions older than HISTORY_ARCHIVE_AFTER_MONTHS (or --months) to the archive table in short "
        "batches, each its own transaction; safe to stop and to run again (README, 'Old history')."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--months", type=int, default=None, help="Archive what is older than this many months")
        parser.add_argument("--batch-size", type=int, default=ARCHIVE_BATCH_SIZE, help="Transitions per batch")
        parser.add_argument("--max-batches", type=int, default=None, help="Stop after this many batches")

    def handle(self, *args: Any, **options: Any) -> None:
        months = settings.HISTORY_ARCHIVE_AFTER_MONTHS if options["months"] is None else options["months"]
        if months <= 0:
            raise CommandError("Archiving is off (HISTORY_ARCHIVE_AFTER_MONTHS is 0); give --months to run it once.")
        if options["batch_size"] <= 0:
            raise CommandError("--batch-size must be at least 1.")
        run = job_transitions_archive(
            before=archive_cutoff(months=months), batch_size=options["batch_size"], max_batches=options["max_batches"]
        )
        self.stdout.write(
            f"Moved {run.moved} transitions recorded before {run.before.isoformat()} to the archive in {run.batches} "
            f"batches, {run.seconds:.1f} s; the longest batch held its locks {run.longest_batch_seconds * 1000:.0f} ms."
        )
