"""Usage records: every job charged in the quota ledger becomes one priced record, split by day and rate.

The charge (one per job, and one per task of a job array: a database constraint) holds the GPU-seconds Slurm's
accounting reported: elapsed x allocated GPUs, for jobs submitted through the portal and for jobs found in a
project's account. Pricing it here, rather than asking slurmdbd again, keeps one source for both the quota
balance and the bill.

A job running from 23:00 to 01:00 used half its GPU-seconds on each day; each day's share is priced at the
rate in force during it, and goes on the invoice of its month. An array's task is priced as a job of its own
(its own start, end and charge) and its record names the task (`array_task`), so the array costs the sum of its
tasks. One import runs at a time (an advisory lock),
so a record is made once however many workers run the task; a second run finds nothing to do.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from billing.models import Invoice, InvoiceState, Rate, UsageRecord, UsageShare, first_of_month
from billing.money import usage_cost
from billing.rates import RateBook
from jobs.models import Job, JobArrayTask
from quotas.models import LedgerEntry, LedgerKind, period_start
from quotas.usage import DailyRebuild
from tenants.models import Tenant

logger = logging.getLogger(__name__)

IMPORT_BATCH_SIZE = 2000
BILLING_LOCK_ID = 0x62696C6C  # "bill": held by whatever writes usage or invoices


def billing_lock() -> None:
    """Serialise writers of usage and invoices until the current transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [BILLING_LOCK_ID])


@dataclass(frozen=True)
class UsageImportResult:
    imported: int = 0  # charges (jobs, array tasks) priced in this run
    unpriced: int = 0  # charges with no rate in force for part of their run; tried again next run
    invoices_rebuilt: int = 0  # draft invoices brought up to date


@dataclass(frozen=True)
class Slice:
    starts_at: datetime
    ends_at: datetime
    gpu_seconds: int


def split_gpu_seconds(*, gpu_seconds: int, start: datetime, end: datetime, cuts: list[datetime]) -> list[Slice]:
    """Share `gpu_seconds` between the pieces of [start, end) that `cuts` make, in proportion to their length.

    Whole GPU-seconds: the remainders go to the pieces with the largest fractions, so the shares always sum to
    the total. A job with no duration is one piece.
    """
    bounds = [start, *(cut for cut in sorted(set(cuts)) if start < cut < end), end]
    total = (end - start).total_seconds()
    if total <= 0:
        return [Slice(start, end, gpu_seconds)]
    pieces = list(itertools.pairwise(bounds))
    exact = [gpu_seconds * (piece_end - piece_start).total_seconds() / total for piece_start, piece_end in pieces]
    shares = [int(value) for value in exact]
    by_fraction = sorted(range(len(pieces)), key=lambda index: (exact[index] - shares[index], -index), reverse=True)
    for index in by_fraction[: gpu_seconds - sum(shares)]:
        shares[index] += 1
    return [Slice(start, end, share) for (start, end), share in zip(pieces, shares, strict=True)]


def midnights_between(start: datetime, end: datetime) -> list[datetime]:
    moments = []
    day = start.date() + timedelta(days=1)
    while (midnight := period_start(day)) < end:
        moments.append(midnight)
        day += timedelta(days=1)
    return moments


def _priceable() -> Exists:
    """The charge's cluster has some rate in force when the job started: without one nothing can be priced,
    and such charges must not crowd the batch."""
    return Exists(Rate.objects.filter(cluster_id=OuterRef("cluster_id"), valid_from__lte=OuterRef("job__started_at")))


def _unpriced_charges() -> QuerySet[LedgerEntry]:
    """Charges of jobs and array tasks without their usage record (one per charge, keyed by job and task)."""
    job_priced = UsageRecord.objects.filter(job_id=OuterRef("job_id"), array_task__isnull=True)
    task_priced = UsageRecord.objects.filter(job_id=OuterRef("job_id"), array_task=OuterRef("array_task"))
    return (
        LedgerEntry.objects.filter(kind=LedgerKind.CHARGE, job__isnull=False)
        .exclude(Exists(job_priced), array_task__isnull=True)
        .exclude(Exists(task_priced), array_task__isnull=False)
    )


@dataclass(frozen=True)
class _Run:
    """What a charge is priced over: a plain job's run, or one task's of an array."""

    job: Job
    array_task: int | None
    started_at: datetime | None
    ended_at: datetime | None
    slurm_job_id: int | None


def _runs_of(charges: list[LedgerEntry]) -> list[_Run]:
    """Each charge's run, in the same order: the job's times, or its task's (one query for every task)."""
    task_keys = {(charge.job_id, charge.array_task) for charge in charges if charge.array_task is not None}
    tasks = {
        (task.job_id, task.index): task
        for task in JobArrayTask.objects.filter(
            job_id__in={job_id for job_id, _ in task_keys}, index__in={index for _, index in task_keys}
        )
        if (task.job_id, task.index) in task_keys
    }
    runs = []
    for charge in charges:
        job = charge.job
        assert job is not None
        task = tasks.get((job.pk, charge.array_task)) if charge.array_task is not None else None
        if task is None:
            runs.append(_Run(job, charge.array_task, job.started_at, job.ended_at, job.slurm_job_id))
        else:
            runs.append(_Run(job, task.index, task.started_at, task.ended_at, task.slurm_job_id or job.slurm_job_id))
    return runs


def usage_import(*, now: datetime | None = None, batch_size: int = IMPORT_BATCH_SIZE) -> UsageImportResult:
    """Price the charges that have no usage record yet (at most `batch_size`, oldest first) and rebuild the
    draft invoices they land on, in one transaction."""
    now = now or timezone.now()
    with transaction.atomic():
        billing_lock()
        charges = list(
            _unpriced_charges().filter(_priceable()).select_related("job__project").order_by("id")[:batch_size]
        )
        if not charges:
            return UsageImportResult()
        book = RateBook.for_clusters({charge.cluster_id for charge in charges})
        final = set(
            Invoice.objects.filter(
                tenant_id__in={charge.project.tenant_id for charge in charges}, state=InvoiceState.FINAL
            ).values_list("tenant_id", "month", "currency")
        )
        current_month = first_of_month(now.date())
        records: list[UsageRecord] = []
        shares_of: list[list[UsageShare]] = []
        unpriced = 0
        for charge, run in zip(charges, _runs_of(charges), strict=True):
            priced = _price(run=run, gpu_seconds=charge.gpu_seconds, fallback_end=charge.created_at, book=book)
            if priced is None:
                unpriced += 1
                continue
            record, shares = priced
            for share in shares:
                month = first_of_month(share.day)
                share.billed_month = current_month if (record.tenant_id, month, share.currency) in final else month
            records.append(record)
            shares_of.append(shares)
        UsageRecord.objects.bulk_create(records)
        for record, shares in zip(records, shares_of, strict=True):
            for share in shares:
                share.usage_record = record
        UsageShare.objects.bulk_create([share for shares in shares_of for share in shares], batch_size=5000)
        usage_daily_add(shares_of=shares_of)

        touched: dict[date, set[int]] = defaultdict(set)
        for shares in shares_of:
            for share in shares:
                touched[share.billed_month].add(share.tenant_id)
        # Imported here rather than at the top: invoices build on usage records and import this module's lock.
        from billing.invoices import invoices_build

        rebuilt = sum(invoices_build(month=month, tenant_ids=tenants, now=now) for month, tenants in touched.items())
    if unpriced:
        logger.warning("usage import: %d charges (jobs, tasks) have no rate in force for part of their run", unpriced)
    return UsageImportResult(imported=len(records), unpriced=unpriced, invoices_rebuilt=rebuilt)


def _price(
    *, run: _Run, gpu_seconds: int, fallback_end: datetime, book: RateBook
) -> tuple[UsageRecord, list[UsageShare]] | None:
    job = run.job
    end = run.ended_at or fallback_end
    start = min(run.started_at or end, end)
    cuts = midnights_between(start, end) + book.changes_between(
        cluster_id=job.cluster_id, gpu_type=job.gpu_type, start=start, end=end
    )
    shares = []
    for piece in split_gpu_seconds(gpu_seconds=gpu_seconds, start=start, end=end, cuts=cuts):
        rate = book.in_force(cluster_id=job.cluster_id, gpu_type=job.gpu_type, at=piece.starts_at)
        if rate is None:
            return None
        shares.append(
            UsageShare(
                tenant_id=job.project.tenant_id,
                project_id=job.project_id,
                cluster_id=job.cluster_id,
                user_id=job.user_id,
                cluster_username=job.cluster_username,
                gpu_type=job.gpu_type,
                day=piece.starts_at.astimezone(UTC).date(),
                starts_at=piece.starts_at,
                ends_at=piece.ends_at,
                rate=rate,
                price_per_gpu_hour=rate.price_per_gpu_hour,
                currency=rate.currency,
                gpu_seconds=piece.gpu_seconds,
                cost=usage_cost(gpu_seconds=piece.gpu_seconds, price_per_gpu_hour=rate.price_per_gpu_hour),
            )
        )
    record = UsageRecord(
        job=job,
        array_task=run.array_task,
        tenant_id=job.project.tenant_id,
        project_id=job.project_id,
        cluster_id=job.cluster_id,
        user_id=job.user_id,
        cluster_username=job.cluster_username,
        gpu_type=job.gpu_type,
        slurm_job_id=run.slurm_job_id,
        started_at=start,
        ended_at=end,
        gpu_seconds=gpu_seconds,
        cost=sum((share.cost for share in shares), Decimal(0)),
        currency=shares[0].currency,
    )
    return record, shares


# Daily sums ---------------------------------------------------------------------------------------------------

_DAILY_COLUMNS = (
    "day, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, billed_month, rate_id, "
    "price_per_gpu_hour, currency"
)
_DAILY_SUMS = "gpu_seconds, cost, jobs, carried_jobs"
_DAILY_UPSERT = f"""
    INSERT INTO billing_usagedaily ({_DAILY_COLUMNS}, {_DAILY_SUMS}) VALUES {{values}}
    ON CONFLICT ON CONSTRAINT usage_daily_key DO UPDATE SET
        gpu_seconds = billing_usagedaily.gpu_seconds + EXCLUDED.gpu_seconds,
        cost = billing_usagedaily.cost + EXCLUDED.cost,
        jobs = billing_usagedaily.jobs + EXCLUDED.jobs,
        carried_jobs = billing_usagedaily.carried_jobs + EXCLUDED.carried_jobs
"""  # noqa: S608
_DAILY_BATCH = 1000


def usage_daily_add(*, shares_of: list[list[UsageShare]]) -> None:
    """Add new shares (each record's, in time order) to their days' sums (UsageDaily), in the caller's transaction:
    one statement per thousand rows, in key order so that two writers never wait on each other crosswise."""
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for shares in shares_of:
        days_seen: set[date] = set()
        for index, share in enumerate(shares):
            key = (
                share.day,
                share.tenant_id,
                share.project_id,
                share.cluster_id,
                share.user_id,
                share.cluster_username,
                share.gpu_type,
                share.billed_month,
                share.rate_id,
                share.price_per_gpu_hour,
                share.currency,
            )
            found = sums.setdefault(key, [0, Decimal(0), 0, 0])
            found[0] += share.gpu_seconds
            found[1] += share.cost
            found[2] += 1 if index == 0 else 0
            found[3] += 1 if index > 0 and share.day not in days_seen else 0
            days_seen.add(share.day)
    rows = [(*key, *values) for key, values in sorted(sums.items(), key=lambda item: str(item[0]))]
    placeholders = "(" + ", ".join(["%s"] * 15) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _DAILY_BATCH):
            batch = rows[start : start + _DAILY_BATCH]
            cursor.execute(
                _DAILY_UPSERT.format(values=", ".join([placeholders] * len(batch))),
                [value for row in batch for value in row],
            )


# The first share of each record (by time) counts its job; the first of each later day carries it. Shares never
# change once written.
USAGE_DAILY_FROM_SHARES_SQL = f"""
    SELECT {_DAILY_COLUMNS}, sum(gpu_seconds), sum(cost), count(*) FILTER (WHERE first_of_record),
        count(*) FILTER (WHERE first_of_day AND NOT first_of_record)
    FROM (
        SELECT *,
            row_number() OVER (PARTITION BY usage_record_id ORDER BY starts_at, id) = 1 AS first_of_record,
            row_number() OVER (PARTITION BY usage_record_id, day ORDER BY starts_at, id) = 1 AS first_of_day
        FROM billing_usageshare
    ) shares
    GROUP BY {_DAILY_COLUMNS}
"""  # noqa: S608


USAGE_DAILY_BATCH_DAYS = 1
# One tenant's shares of [first, end) summed as USAGE_DAILY_FROM_SHARES_SQL sums them all: whether a share is its
# record's first is decided among all the record's shares, also those outside the slice.
_USAGE_DAILY_OF_SLICE_SQL = f"""
    INSERT INTO billing_usagedaily ({_DAILY_COLUMNS}, {_DAILY_SUMS})
    SELECT {_DAILY_COLUMNS}, sum(gpu_seconds), sum(cost), count(*) FILTER (WHERE first_of_record),
        count(*) FILTER (WHERE first_of_day AND NOT first_of_record)
    FROM (
        SELECT *,
            row_number() OVER (PARTITION BY usage_record_id ORDER BY starts_at, id) = 1 AS first_of_record,
            row_number() OVER (PARTITION BY usage_record_id, day ORDER BY starts_at, id) = 1 AS first_of_day
        FROM billing_usageshare
        WHERE usage_record_id IN (
            SELECT usage_record_id FROM billing_usageshare
            WHERE tenant_id = %(tenant)s AND day >= %(first)s AND day < %(end)s
        )
    ) shares
    WHERE tenant_id = %(tenant)s AND day >= %(first)s AND day < %(end)s
    GROUP BY {_DAILY_COLUMNS}
"""  # noqa: S608
# The days of a tenant that have shares or sums: where its slices run (the indexes on (tenant, day)).
_USAGE_DAILY_DAYS_SQL = """
    SELECT least(shares.first, sums.first), greatest(shares.last, sums.last)
    FROM (SELECT min(day) AS first, max(day) AS last FROM billing_usageshare WHERE tenant_id = %(tenant)s) shares,
        (SELECT min(day) AS first, max(day) AS last FROM billing_usagedaily WHERE tenant_id = %(tenant)s) sums
"""


def usage_daily_rebuild(*, days_per_batch: int = USAGE_DAILY_BATCH_DAYS) -> DailyRebuild:
    """Recompute every daily sum from the shares (after a bulk load, a repair, or an upgrade that created the
    table: billing migration 0005), `days_per_batch` days of one tenant per transaction. A batch holds the billing
    lock, which every writer of usage takes, and replaces its days' rows with the shares' sums: an import waits for
    one batch at most, and a batch is right whatever was imported before or after it; readers never wait.
    Idempotent; safe to stop."""
    started = time.monotonic()
    rows = batches = 0
    longest = 0.0
    for tenant_id in Tenant.objects.order_by("pk").values_list("pk", flat=True):
        with connection.cursor() as cursor:
            cursor.execute(_USAGE_DAILY_DAYS_SQL, {"tenant": tenant_id})
            first, last = cursor.fetchone() or (None, None)
        if first is None or last is None:
            continue
        while first <= last:
            slice_ = {"tenant": tenant_id, "first": first, "end": first + timedelta(days=days_per_batch)}
            with transaction.atomic(), connection.cursor() as cursor:
                billing_lock()
                locked = time.monotonic()
                cursor.execute(
                    "DELETE FROM billing_usagedaily WHERE tenant_id = %(tenant)s AND day >= %(first)s "
                    "AND day < %(end)s",
                    slice_,
                )
                cursor.execute(_USAGE_DAILY_OF_SLICE_SQL, slice_)
                rows += cursor.rowcount
            longest = max(longest, time.monotonic() - locked)
            batches += 1
            first = slice_["end"]
    return DailyRebuild(rows=rows, batches=batches, longest_batch_seconds=longest, seconds=time.monotonic() - started)


def usage_daily_mismatches() -> list[tuple[object, ...]]:
    """The daily sums that differ from the shares they sum (none, unless something wrote around the import):
    each row ("kept", key..., gpu_seconds, cost, jobs, carried_jobs) as stored, or ("expected", ...) as the
    shares say."""
    columns = f"{_DAILY_COLUMNS}, {_DAILY_SUMS}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH kept AS (SELECT {columns} FROM billing_usagedaily),
                expected ({columns}) AS ({USAGE_DAILY_FROM_SHARES_SQL})
            (SELECT 'kept', * FROM (SELECT * FROM kept EXCEPT SELECT * FROM expected) only_kept)
            UNION ALL
            (SELECT 'expected', * FROM (SELECT * FROM expected EXCEPT SELECT * FROM kept) only_expected)
            """  # noqa: S608
        )
        return [tuple(row) for row in cursor.fetchall()]
