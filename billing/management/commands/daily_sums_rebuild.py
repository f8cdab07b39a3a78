"""`manage.py daily_sums_rebuild [--check]`: recompute the daily sums that spend, billing and burn-down read
(billing.UsageDaily, quotas.LedgerDaily) from the usage shares and the ledger, in short batches, and say how long
the longest batch made a writer wait; `--check` only compares them and says what differs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.usage import usage_daily_mismatches, usage_daily_rebuild
from quotas.usage import DailyRebuild, ledger_daily_mismatches, ledger_daily_rebuild


class Command(BaseCommand):
    help = (
        "Recompute the daily sums (usage per day, ledger per allocation and day) from the rows they sum, a day or a "
        "week per transaction so that imports and quota writes wait milliseconds at most; safe to stop and to run "
        "again. Run it after an upgrade that adds them, and after a repair (README, 'A year of history')."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="Only compare the sums with the rows; change nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"]:
            usage, ledger = usage_daily_mismatches(), ledger_daily_mismatches()
            self.stdout.write(
                f"Usage per day: {len(usage)} rows differ from the shares; ledger per day: {len(ledger)} rows differ "
                "from the entries."
            )
            if usage or ledger:
                raise CommandError("The daily sums differ from the rows they sum: run daily_sums_rebuild.")
            return
        for name, run in (("Usage per day", usage_daily_rebuild()), ("Ledger per day", ledger_daily_rebuild())):
            self.stdout.write(_said(name, run))


def _said(name: str, run: DailyRebuild) -> str:
    return (
        f"{name}: {run.rows} rows written in {run.batches} batches, {run.seconds:.1f} s; the longest batch held its "
        f"lock {run.longest_batch_seconds * 1000:.0f} ms."
    )
