"""Spend of a period grouped by tenant, project, cluster or GPU type, beside the same figures of the period before
it: the portal admins' overview of every tenant, and a tenant's (or project's) own for its admins.

Read from the daily sums (billing.models.UsageDaily) grouped per invoice line, then rounded by billing.money's one
rule: every grouping is coarser than an invoice line, so the groups add up to the total to the cent, and a closed
month's total per tenant is what its invoices say (usage is counted on the day the GPUs were used: late usage,
billed on a later month's invoice, is the exception, and the page says so). Only finished jobs are priced: the GPUs
that running jobs hold are not in these figures until the jobs end and their usage is imported.
"""

from __future__ import annotations

import calendar
import enum
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from billing.money import zero
from billing.selectors import usage_amount, usage_per_line
from billing.spend import SpendScope, currency_chosen

# The names every grouping may show; functionally bound to the invoice line's ids, so they add no rows.
_NAME_FIELDS = ("tenant__slug", "project__slug", "cluster__name")


class SpendGroupBy(enum.Enum):
    TENANT = "tenant"
    PROJECT = "project"
    CLUSTER = "cluster"
    GPU_TYPE = "gpu_type"

    @property
    def label(self) -> str:
        return {"tenant": "Tenant", "project": "Project", "cluster": "Cluster", "gpu_type": "GPU type"}[self.value]

    @property
    def noun(self) -> str:
        """The label inside a sentence ("spend per GPU type")."""
        return "GPU type" if self is SpendGroupBy.GPU_TYPE else self.value


def _group_name(group_by: SpendGroupBy, row: dict[str, Any]) -> str:
    if group_by is SpendGroupBy.TENANT:
        return str(row["tenant__slug"])
    if group_by is SpendGroupBy.PROJECT:
        return f"{row['tenant__slug']}/{row['project__slug']}"
    if group_by is SpendGroupBy.CLUSTER:
        return str(row["cluster__name"])
    return str(row["gpu_type"]) or "(any type)"


def previous_period(start: date, end: date) -> tuple[date, date]:
    """The period the change is measured against.

    A calendar month (or its days so far) is compared with the same days of the month before, so that "this month
    against last" reads as people say it (a whole month with the whole previous month, however long each is);
    any other period with the period of equal length that ends the day before it starts.
    """
    last_of_month = calendar.monthrange(start.year, start.month)[1]
    if start.day == 1 and end.year == start.year and end.month == start.month:
        previous_start = (start - timedelta(days=1)).replace(day=1)
        previous_last = calendar.monthrange(previous_start.year, previous_start.month)[1]
        previous_end_day = previous_last if end.day == last_of_month else min(end.day, previous_last)
        return previous_start, previous_start.replace(day=previous_end_day)
    previous_end = start - timedelta(days=1)
    return previous_end - (end - start), previous_end


@dataclass(frozen=True)
class SpendGroup:
    name: str
    amount: Decimal
    gpu_seconds: int
    previous_amount: Decimal
    previous_gpu_seconds: int

    @property
    def change(self) -> Decimal:
        return self.amount - self.previous_amount

    @property
    def change_percent(self) -> Decimal | None:
        """The change against the previous period in %, to one decimal; None when nothing was spent then."""
        return percent_change(self.amount, self.previous_amount)


def percent_change(amount: Decimal, previous: Decimal) -> Decimal | None:
    if previous == 0:
        return None
    return ((amount - previous) * 100 / previous).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class SpendOverview:
    scope: SpendScope
    group_by: SpendGroupBy
    start: date
    end: date
    previous_start: date
    previous_end: date
    currency: str | None
    groups: list[SpendGroup]  # most spent first (this period, then the previous one), then by name
    total: SpendGroup  # named "Total"


def _amounts(
    rows: list[dict[str, Any]], group_by: SpendGroupBy, currency: str | None
) -> dict[str, tuple[Decimal, int]]:
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_group[_group_name(group_by, row)].append(row)
    return {
        name: (usage_amount(group_rows, currency), sum(row["seconds"] for row in group_rows))
        for name, group_rows in by_group.items()
    }


def spend_overview(
    *, scope: SpendScope, group_by: SpendGroupBy, start: date, end: date, currency: str | None = None
) -> SpendOverview:
    """Spend of [start, end] and of the period before it (`previous_period`) per group: two queries.

    A group that spent only in one of the two periods is listed with zero in the other.
    """
    previous_start, previous_end = previous_period(start, end)
    current_rows = list(usage_per_line(scope.shares(start=start, end=end), *_NAME_FIELDS))
    previous_rows = list(usage_per_line(scope.shares(start=previous_start, end=previous_end), *_NAME_FIELDS))
    # The currency is the period's own; the previous period is read in the same one.
    chosen = currency_chosen(found={row["currency"] for row in current_rows}, asked=currency, scope=scope)
    if chosen is None:
        chosen = currency_chosen(found={row["currency"] for row in previous_rows}, asked=None, scope=scope)
    current_rows = [row for row in current_rows if row["currency"] == chosen]
    previous_rows = [row for row in previous_rows if row["currency"] == chosen]
    current = _amounts(current_rows, group_by, chosen)
    previous = _amounts(previous_rows, group_by, chosen)
    nothing = (zero(chosen or ""), 0)
    groups = [
        SpendGroup(
            name=name,
            amount=current.get(name, nothing)[0],
            gpu_seconds=current.get(name, nothing)[1],
            previous_amount=previous.get(name, nothing)[0],
            previous_gpu_seconds=previous.get(name, nothing)[1],
        )
        for name in current.keys() | previous.keys()
    ]
    groups.sort(key=lambda group: (-group.amount, -group.previous_amount, group.name))
    total = SpendGroup(
        name="Total",
        amount=usage_amount(current_rows, chosen),
        gpu_seconds=sum(row["seconds"] for row in current_rows),
        previous_amount=usage_amount(previous_rows, chosen),
        previous_gpu_seconds=sum(row["seconds"] for row in previous_rows),
    )
    return SpendOverview(
        scope=scope,
        group_by=group_by,
        start=start,
        end=end,
        previous_start=previous_start,
        previous_end=previous_end,
        currency=chosen,
        groups=groups,
        total=total,
    )
