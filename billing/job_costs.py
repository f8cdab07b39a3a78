"""What jobs cost, for the jobs list and a job's page: the priced cost of an ended job, and the cost so far of a
running one at the rate it runs at, with that rate so that a page can keep counting without asking again.

The cost so far is what an invoice holding only the run so far would say, at the rate in force now (one invoice
line, rounded by billing.money's one rule); the bill itself prices the run from Slurm's accounting once it ends.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Case, DecimalField, F, FloatField, Func, OuterRef, Q, QuerySet, Subquery, Sum, Value, When
from django.db.models.functions import Cast, Coalesce

from billing.models import Rate, UsageRecord, UsageShare
from billing.money import amount_billed, minor_unit_places, usage_cost
from billing.rates import RateBook
from billing.selectors import usage_amount, usage_per_line
from jobs.models import Job, JobState


@dataclass(frozen=True)
class JobCost:
    """A job's cost as a page shows it. `price_per_gpu_hour` is set for a job that runs (or will) on a priced
    GPU type: a page counts the cost up from `started_at` with it. `amount` None: nothing to show yet."""

    amount: Decimal | None
    currency: str
    price_per_gpu_hour: Decimal | None = None
    live: bool = False  # running now: the amount grows until it ends

    @property
    def places(self) -> int:
        return minor_unit_places(self.currency) if self.currency else 2


def job_costs(jobs: Sequence[Job], *, now: datetime) -> dict[uuid.UUID, JobCost]:
    """The cost of each job shown: priced usage for those that have it, the cost so far for running ones, the
    rate for ones not started yet (two queries). Arrays count their tasks' priced usage only."""
    costs: dict[uuid.UUID, JobCost] = {}
    priced = _priced_amounts([job.pk for job in jobs if job.is_final])
    book = RateBook.for_clusters(job.cluster_id for job in jobs if not job.is_final)
    for job in jobs:
        if job.pk in priced:
            amount, currency = priced[job.pk]
            costs[job.pk] = JobCost(amount=amount, currency=currency)
        elif not job.is_final and not job.is_array:
            rate = book.in_force(cluster_id=job.cluster_id, gpu_type=job.gpu_type, at=now)
            if rate is not None:
                costs[job.pk] = _so_far(job, rate, now=now)
    return costs


def job_cost(job: Job, *, now: datetime) -> JobCost | None:
    return job_costs([job], now=now).get(job.pk)


def _so_far(job: Job, rate: Rate, *, now: datetime) -> JobCost:
    running = job.state == JobState.RUNNING and job.started_at is not None
    amount = None
    if running and job.started_at is not None:
        gpu_seconds = job.total_gpus * max(int((now - job.started_at).total_seconds()), 0)
        amount = amount_billed(
            line_costs=[usage_cost(gpu_seconds=gpu_seconds, price_per_gpu_hour=rate.price_per_gpu_hour)],
            currency=rate.currency,
        )
    return JobCost(amount=amount, currency=rate.currency, price_per_gpu_hour=rate.price_per_gpu_hour, live=running)


def _priced_amounts(job_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, tuple[Decimal, str]]:
    """Each job's priced usage as its invoice lines round it (one query for all)."""
    ids = list(job_ids)
    if not ids:
        return {}
    rows: dict[tuple[uuid.UUID, str], list[dict[str, Any]]] = defaultdict(list)
    shares = UsageShare.objects.filter(usage_record__job_id__in=ids)
    for row in usage_per_line(shares, "usage_record__job_id"):
        rows[(row["usage_record__job_id"], row["currency"])].append(row)
    return {job_id: (usage_amount(lines, currency), currency) for (job_id, currency), lines in rows.items()}


# Sorting the jobs list by cost, in SQL: the priced cost, else the cost so far at the rate in force now.


def jobs_with_cost(jobs: QuerySet[Job], *, now: datetime) -> QuerySet[Job]:
    """`jobs` annotated with `cost_for_sorting` (unrounded; null: no cost known), to order a list by cost."""
    priced = Subquery(
        UsageRecord.objects.filter(job_id=OuterRef("pk"))
        .order_by()
        .values("job_id")
        .annotate(total=Sum("cost"))
        .values("total")[:1],
        output_field=DecimalField(max_digits=20, decimal_places=6),
    )
    # As RateBook.in_force: the GPU type's own rate, else the cluster's rate for any type; the latest started.
    price = Subquery(
        Rate.objects.filter(Q(gpu_type=OuterRef("gpu_type")) | Q(gpu_type=""), cluster_id=OuterRef("cluster_id"))
        .filter(valid_from__lte=now)
        .order_by(Case(When(gpu_type="", then=Value(1)), default=Value(0)), "-valid_from")
        .values("price_per_gpu_hour")[:1],
        output_field=DecimalField(max_digits=12, decimal_places=4),
    )
    seconds = Func(
        Value(now) - F("started_at"), template="EXTRACT(EPOCH FROM %(expressions)s)", output_field=FloatField()
    )
    so_far = Case(
        When(
            state=JobState.RUNNING,
            started_at__isnull=False,
            then=F("gpus") * F("node_count") * seconds * Cast(price, FloatField()) / 3600,
        ),
        default=None,
        output_field=FloatField(),
    )
    return jobs.annotate(cost_for_sorting=Coalesce(Cast(priced, FloatField()), so_far))
