"""The burn-down of an allocation: GPU-hours used and reserved per day, the recent burn rate, when it runs out.

Two aggregate queries whatever the size of the ledger: the daily sums (grouped by the day of each row) and
the sums from before the first day shown; the rest is arithmetic over at most one row per day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Q, Sum
from django.db.models.functions import Coalesce, TruncDate

from quotas.models import Allocation, LedgerKind, period_end, period_start
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
    burn_from = period_start(as_of - timedelta(days=burn_days - 1))
    shown_from, shown_until = period_start(first), period_end(as_of)

    entries = allocation.ledger_entries.filter(created_at__lt=shown_until)
    charge, reserve, release = Q(kind=LedgerKind.CHARGE), Q(kind=LedgerKind.RESERVE), Q(kind=LedgerKind.RELEASE)
    before = entries.aggregate(
        charged=Coalesce(Sum("gpu_seconds", filter=charge & Q(created_at__lt=shown_from)), 0),
        reserved=Coalesce(Sum("gpu_seconds", filter=reserve & Q(created_at__lt=shown_from)), 0),
        released=Coalesce(Sum("gpu_seconds", filter=release & Q(created_at__lt=shown_from)), 0),
        burned=Coalesce(Sum("gpu_seconds", filter=charge & Q(created_at__gte=burn_from)), 0),
    )
    daily = {
        row["day"]: row
        for row in entries.filter(created_at__gte=shown_from)
        .annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(
            charged=Coalesce(Sum("gpu_seconds", filter=charge), 0),
            reserved=Coalesce(Sum("gpu_seconds", filter=reserve), 0),
            released=Coalesce(Sum("gpu_seconds", filter=release), 0),
        )
        .order_by("day")
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
