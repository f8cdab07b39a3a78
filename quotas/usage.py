"""The burn-down of an allocation: GPU-hours used and reserved per day, the recent burn rate, when it runs out.

Two queries over the allocation's daily sums (LedgerDaily, kept as entries are added), whatever the size of the
ledger: the days shown and the sums from before the first of them; the rest is arithmetic over at most one row
per day. `ledger_daily_mismatches` checks those sums against the entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import connection, transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce

from quotas.models import Allocation
from quotas.units import HOURS_PLACES, SECONDS_PER_HOUR

BURN_RATE_DAYS = 7


@dataclass(frozen=True)
class UsageDay:
    day: date
    used_gpu_seconds: int  # charges that landed that day
    cumulative_used_gpu_seconds: int  # charges from the start of the period to the end of that day
    reserved_gpu_seconds: int  # reservations still open at the end of that day


@dataclass(frozen=True)
class UsageSeries:
    allocation: Allocation
    as_of: date  # the last day shown: today, or the period's last day once it is over
    days: list[UsageDay]
    burn_rate_days: int  # the days the burn rate averages over (7, or fewer early in the period)
    burn_rate_gpu_seconds: int  # charges over those days
    projected_exhaustion_on: date | None
    exhausted_before_period_end: bool

    @property
    def burn_rate_gpu_hours_per_day(self) -> Decimal:
        if self.burn_rate_days == 0:
            return Decimal("0.00")
        per_day = Decimal(self.burn_rate_gpu_seconds) / (SECONDS_PER_HOUR * self.burn_rate_days)
        return per_day.quantize(HOURS_PLACES, rounding=ROUND_HALF_UP)


def allocation_usage_series(*, allocation: Allocation, now: datetime, days: int | None = None) -> UsageSeries:
    """Each day of the allocation's period up to today (the last `days` of them when given)."""
    today = now.date()
    as_of = min(today, allocation.ends_on)
    first = allocation.starts_on if days is None else max(allocation.starts_on, as_of - timedelta(days=days - 1))
    elapsed = (as_of - allocation.starts_on).days + 1
    burn_days = max(min(BURN_RATE_DAYS, elapsed), 0)
    burn_from = as_of - timedelta(days=burn_days - 1)

    days_kept = allocation.ledger_days.filter(day__lte=as_of)
    before = days_kept.aggregate(
        charged=Coalesce(Sum("charged_gpu_seconds", filter=Q(day__lt=first)), 0),
        reserved=Coalesce(Sum("reserved_gpu_seconds", filter=Q(day__lt=first)), 0),
        released=Coalesce(Sum("released_gpu_seconds", filter=Q(day__lt=first)), 0),
        burned=Coalesce(Sum("charged_gpu_seconds", filter=Q(day__gte=burn_from)), 0),
    )
    daily = {
        row.day: {
            "charged": row.charged_gpu_seconds,
            "reserved": row.reserved_gpu_seconds,
            "released": row.released_gpu_seconds,
        }
        for row in days_kept.filter(day__gte=first).order_by("day")
    }

    series: list[UsageDay] = []
    cumulative = int(before["charged"])
    open_reserved = int(before["reserved"]) - int(before["released"])
    day = first
    while day <= as_of:
        row = daily.get(day)
        used = int(row["charged"]) if row else 0
        cumulative += used
        if row:
            open_reserved += int(row["reserved"]) - int(row["released"])
        series.append(
            UsageDay(
                day=day,
                used_gpu_seconds=used,
                cumulative_used_gpu_seconds=cumulative,
                reserved_gpu_seconds=open_reserved,
            )
        )
        day += timedelta(days=1)

    burned = int(before["burned"]) if burn_days else 0
    projected = _projected_exhaustion(
        allocation=allocation, as_of=as_of, today=today, burned=burned, burn_days=burn_days
    )
    return UsageSeries(
        allocation=allocation,
        as_of=as_of,
        days=series,
        burn_rate_days=burn_days,
        burn_rate_gpu_seconds=burned,
        projected_exhaustion_on=projected,
        exhausted_before_period_end=projected is not None,
    )


def _projected_exhaustion(
    *, allocation: Allocation, as_of: date, today: date, burned: int, burn_days: int
) -> date | None:
    """Today plus what remains over the burn rate, if that falls within the period; None otherwise."""
    if today > allocation.ends_on or today < allocation.starts_on:
        return None
    remaining = allocation.remaining_gpu_seconds
    if remaining <= 0:
        return today
    if burned <= 0:
        return None
    # remaining / (burned / burn_days) whole days from today: it runs out during that day.
    projected = today + timedelta(days=remaining * burn_days // burned)
    return projected if projected <= allocation.ends_on else None


# The ledger summed per allocation and UTC day, as LedgerDaily keeps it.
_LEDGER_DAILY_FROM_ENTRIES_SQL = """
    SELECT allocation_id, (created_at AT TIME ZONE 'UTC')::date AS day,
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'charge'), 0) AS charged_gpu_seconds,
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'reserve'), 0) AS reserved_gpu_seconds,
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'release'), 0) AS released_gpu_seconds
    FROM quotas_ledgerentry
    WHERE allocation_id IS NOT NULL AND kind IN ('charge', 'reserve', 'release')
    GROUP BY 1, 2
"""


def ledger_daily_mismatches() -> list[tuple[object, ...]]:
    """The daily sums that differ from the ledger entries (none, unless something wrote around quotas.services):
    each row ("kept", allocation, day, charged, reserved, released) as stored, or ("expected", ...) as the
    entries say."""
    columns = "allocation_id, day, charged_gpu_seconds, reserved_gpu_seconds, released_gpu_seconds"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH kept AS (SELECT {columns} FROM quotas_ledgerdaily),
                expected AS ({_LEDGER_DAILY_FROM_ENTRIES_SQL})
            (SELECT 'kept', * FROM (SELECT * FROM kept EXCEPT SELECT * FROM expected) only_kept)
            UNION ALL
            (SELECT 'expected', * FROM (SELECT * FROM expected EXCEPT SELECT * FROM kept) only_expected)
            """  # noqa: S608
        )
        return [tuple(row) for row in cursor.fetchall()]


@dataclass(frozen=True)
class DailyRebuild:
    """What a batched rebuild of daily sums did (`ledger_daily_rebuild`, billing's `usage_daily_rebuild`)."""

    rows: int  # daily rows written
    batches: int  # short transactions, each holding the writers' lock for its slice only
    longest_batch_seconds: float  # the longest that one batch held that lock: the longest any writer waited on it
    seconds: float


LEDGER_DAILY_BATCH_DAYS = 7
# One allocation's entries of [first, end) summed per day: the index on (allocation, created_at) finds them.
_LEDGER_DAILY_OF_SLICE_SQL = """
    INSERT INTO quotas_ledgerdaily (allocation_id, day, charged_gpu_seconds, reserved_gpu_seconds,
        released_gpu_seconds)
    SELECT allocation_id, (created_at AT TIME ZONE 'UTC')::date,
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'charge'), 0),
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'reserve'), 0),
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'release'), 0)
    FROM quotas_ledgerentry
    WHERE allocation_id = %(allocation)s AND created_at >= %(starts)s AND created_at < %(ends)s
        AND kind IN ('charge', 'reserve', 'release')
    GROUP BY 1, 2
"""
# The days of an allocation that have entries or sums: where its slices run.
_LEDGER_DAILY_DAYS_SQL = """
    SELECT least(entries.first, sums.first), greatest(entries.last, sums.last)
    FROM (
        SELECT (min(created_at) AT TIME ZONE 'UTC')::date AS first,
            (max(created_at) AT TIME ZONE 'UTC')::date AS last
        FROM quotas_ledgerentry WHERE allocation_id = %(allocation)s
    ) entries, (
        SELECT min(day) AS first, max(day) AS last FROM quotas_ledgerdaily WHERE allocation_id = %(allocation)s
    ) sums
"""


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def ledger_daily_rebuild(*, days_per_batch: int = LEDGER_DAILY_BATCH_DAYS) -> DailyRebuild:
    """Recompute every allocation's daily sums from the ledger (after a bulk load, a repair, or an upgrade that
    created the table: quotas migration 0005), `days_per_batch` days of one allocation per transaction. A batch
    holds that allocation's row lock, which every ledger writer takes (`ledger_add_many`), and replaces its days'
    rows with the entries' sums: a quota write on that allocation waits for one batch at most, others not at all,
    and a batch is right whatever was written before or is written after it. Idempotent; safe to stop."""
    started = time.monotonic()
    rows = batches = 0
    longest = 0.0
    for allocation_id in Allocation.objects.order_by("pk").values_list("pk", flat=True):
        with connection.cursor() as cursor:
            cursor.execute(_LEDGER_DAILY_DAYS_SQL, {"allocation": allocation_id})
            first, last = cursor.fetchone() or (None, None)
        if first is None or last is None:
            continue
        while first <= last:
            end = first + timedelta(days=days_per_batch)
            with transaction.atomic(), connection.cursor() as cursor:
                list(Allocation.objects.select_for_update(of=("self",)).filter(pk=allocation_id).values_list("pk"))
                locked = time.monotonic()
                cursor.execute(
                    "DELETE FROM quotas_ledgerdaily WHERE allocation_id = %s AND day >= %s AND day < %s",
                    [allocation_id, first, end],
                )
                cursor.execute(
                    _LEDGER_DAILY_OF_SLICE_SQL,
                    {"allocation": allocation_id, "starts": _midnight(first), "ends": _midnight(end)},
                )
                rows += cursor.rowcount
            longest = max(longest, time.monotonic() - locked)
            batches += 1
            first = end
    return DailyRebuild(rows=rows, batches=batches, longest_batch_seconds=longest, seconds=time.monotonic() - started)
