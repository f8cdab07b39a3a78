"""Reads of rates, invoices and usage amounts, and the access helper every invoice route goes through.

Invoices are the tenant's admins' (and portal admins'): anyone else gets the same 404 as for an invoice that
does not exist, whether or not they belong to the tenant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db.models import Max, QuerySet, Sum
from django.db.models.functions import TruncMonth
from django.http import Http404

from billing.models import Invoice, InvoiceLine, Rate, UsageDaily, UsageRecord, UsageShare
from billing.money import INVOICE_LINE_FIELDS, amount_billed
from jobs.models import Job
from tenants.selectors import AnyUser, administered_by


def rate_list(*, cluster: str | None = None, gpu_type: str | None = None) -> QuerySet[Rate]:
    rates = Rate.objects.select_related("cluster").order_by("cluster__name", "gpu_type", "-valid_from")
    if cluster:
        rates = rates.filter(cluster__name=cluster)
    if gpu_type is not None:
        rates = rates.filter(gpu_type=gpu_type)
    return rates


def rate_get(*, rate_id: int) -> Rate:
    rate = Rate.objects.select_related("cluster").filter(pk=rate_id).first()
    if rate is None:
        raise Http404(f"No rate {rate_id} exists; list them with GET /api/v1/rates/.")
    return rate


@dataclass(frozen=True)
class RateChainPricedUntil:
    """How far a chain of rates (a cluster's GPU type, or "" for its any-type rates) has priced usage."""

    cluster_name: str
    gpu_type: str
    until: datetime


def rate_chain_priced_until_list() -> list[RateChainPricedUntil]:
    """Per chain, the end of the usage it already priced: a new rate of that chain may start no earlier.

    The same rule as billing.rates: a typed chain counts every priced usage of its GPU type (also what an
    any-type rate priced), the any-type chain only what any-type rates priced.
    """
    shares = UsageShare.objects.order_by()
    typed = shares.values("cluster__name", "gpu_type").annotate(until=Max("ends_at"))
    any_type = shares.filter(rate__gpu_type="").values("cluster__name").annotate(until=Max("ends_at"))
    chains = [
        RateChainPricedUntil(row["cluster__name"], row["gpu_type"], row["until"]) for row in typed if row["gpu_type"]
    ]
    chains += [RateChainPricedUntil(row["cluster__name"], "", row["until"]) for row in any_type]
    return sorted(chains, key=lambda chain: (chain.cluster_name, chain.gpu_type))


def rate_currency_by_cluster() -> dict[str, str]:
    """The currency each cluster prices in (a cluster prices in one), for clusters that have rates."""
    return dict(Rate.objects.order_by().values_list("cluster__name", "currency").distinct())


def invoice_list_for_user(
    *, user: AnyUser, tenant: str | None = None, month: date | None = None, state: str | None = None
) -> QuerySet[Invoice]:
    """Invoices of the tenants the user administers (all for portal admins), newest month first."""
    invoices = Invoice.objects.select_related("tenant").order_by("-month", "tenant__slug", "currency")
    invoices = administered_by(invoices, user=user)
    if tenant:
        invoices = invoices.filter(tenant__slug=tenant)
    if month is not None:
        invoices = invoices.filter(month=month.replace(day=1))
    if state:
        invoices = invoices.filter(state=state)
    return invoices


def invoice_get_for_user(*, user: AnyUser, invoice_id: int) -> Invoice:
    invoice = invoice_list_for_user(user=user).filter(pk=invoice_id).first()
    if invoice is None:
        raise Http404(
            f"No invoice {invoice_id} exists among the ones you can see; tenant admins list theirs with "
            "GET /api/v1/invoices/."
        )
    return invoice


def invoice_lines(*, invoice: Invoice) -> QuerySet[InvoiceLine]:
    return invoice.lines.select_related("project", "cluster").order_by(
        "project__slug", "cluster__name", "gpu_type", "usage_month", "price_per_gpu_hour", "pk"
    )


@dataclass(frozen=True)
class JobUsage:
    """A finished job's priced usage: a plain job's one record, or the sum of an array's priced tasks."""

    gpu_seconds: int
    amount: Decimal  # as an invoice holding only this usage would say it
    currency: str
    priced: int  # usage records summed: 1 for a plain job, the tasks priced so far for an array
    complete: bool  # every run is priced: always for a plain job; for an array, each task that started


def job_usage(*, job: Job) -> JobUsage | None:
    """The priced usage of a finished job, an array's being the sum of its tasks' (None until a charge is priced);
    the caller has checked access. Two queries, three for an array."""
    records = list(UsageRecord.objects.filter(job_id=job.pk).values_list("gpu_seconds", "currency"))
    if not records:
        return None
    currency = records[0][1]
    complete = not job.is_array or len(records) >= job.array_tasks.filter(started_at__isnull=False).count()
    return JobUsage(
        gpu_seconds=sum(seconds for seconds, _ in records),
        amount=usage_amount(usage_per_line(UsageShare.objects.filter(usage_record__job_id=job.pk)), currency),
        currency=currency,
        priced=len(records),
        complete=complete,
    )


UsageRows = TypeVar("UsageRows", UsageShare, UsageDaily)

# Usage amounts: grouped by invoice line, the way invoices are built, then rounded by billing.money's one rule.


def usage_per_line(shares: QuerySet[UsageRows], *fields: Any) -> QuerySet[UsageRows, dict[str, Any]]:
    """`shares` (usage shares or their daily sums) grouped by `fields` and by the invoice line each goes on
    (billing.money.INVOICE_LINE_FIELDS), with their summed `cost` and GPU-`seconds`: one query, one row per group."""
    grouped: QuerySet[UsageRows, dict[str, Any]] = (
        shares.annotate(usage_month=TruncMonth("day"))
        .values(*fields, *INVOICE_LINE_FIELDS)
        .annotate(cost=Sum("cost"), seconds=Sum("gpu_seconds"))
        .order_by()
    )
    return grouped


def usage_amount(rows: Iterable[Mapping[str, Any]], currency: str | None) -> Decimal:
    """What rows of one currency from `usage_per_line` come to: their costs summed per line, each rounded once.

    Without usage there is no currency; the zero is shown with cents, as most currencies have them.
    """
    line_costs: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
    for row in rows:
        line_costs[tuple(row[field] for field in INVOICE_LINE_FIELDS)] += row["cost"]
    return amount_billed(line_costs=line_costs.values(), currency=currency or "")


def usage_record_amount(*, record: UsageRecord) -> Decimal:
    """A record's cost (a plain job's, or one array task's) as an invoice holding only its usage would say it
    (its shares may go on several lines)."""
    return usage_amount(usage_per_line(record.shares.all()), record.currency)
