"""GPU efficiency in money: what a job's idle GPU-hours cost at its rate, and the monthly efficiency report of a
project, a tenant or every tenant (idle GPU-hours, their cost, the worst jobs, what ending idle jobs saved).

Who may read a report is who may read that scope's spend (billing.spend.spend_scope_for_user): a tenant's its
admins and portal admins, a project's its managers as well, every tenant's portal admins only.
A job belongs to the month it started in. Costs are kept to the micro-unit per job and rounded once per figure
in billing.money.
"""

from __future__ import annotations

import csv
import heapq
import io
import itertools
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    DateTimeField,
    DecimalField,
    F,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, TruncMonth
from django.utils import timezone

from billing.models import EfficiencySum, Rate
from billing.money import SECONDS_PER_HOUR, amount_due, usage_cost
from billing.rates import RateBook
from billing.spend import SpendScope
from jobs.models import FINAL_JOB_STATES, Job, JobEfficiency
from tenants.models import Project

WORST_JOBS = 10


@dataclass(frozen=True)
class JobWaste:
    """One job's GPU efficiency and what its idle GPU-hours cost at its rate (None: no rate prices it)."""

    job: Job
    efficiency: JobEfficiency
    rate: Rate | None
    idle_cost: Decimal | None  # micro-unit
    saved_gpu_seconds: int  # by the project's idle policy ending it before its time limit
    saved_cost: Decimal | None

    @property
    def currency(self) -> str:
        return self.rate.currency if self.rate is not None else ""

    @property
    def idle_amount(self) -> Decimal | None:
        return None if self.idle_cost is None else amount_due(amount=self.idle_cost, currency=self.currency)

    @property
    def idle_gpu_hours(self) -> Decimal:
        return gpu_hours(self.efficiency.idle_gpu_seconds)


def gpu_hours(gpu_seconds: int) -> Decimal:
    return (Decimal(gpu_seconds) / SECONDS_PER_HOUR).quantize(Decimal("0.01"))


def job_waste(*, job: Job, efficiency: JobEfficiency, rates: RateBook) -> JobWaste:
    """The job's idle GPU-seconds priced at the rate in force when it started (the rate its usage is charged at
    for that moment): idle GPU-seconds x price per GPU-hour, to the micro-unit."""
    rate = rates.in_force(cluster_id=job.cluster_id, gpu_type=job.gpu_type, at=job.started_at or job.created_at)
    saved = _saved_gpu_seconds(job, efficiency)
    if rate is None:
        return JobWaste(
            job=job, efficiency=efficiency, rate=None, idle_cost=None, saved_gpu_seconds=saved, saved_cost=None
        )
    price = rate.price_per_gpu_hour
    return JobWaste(
        job=job,
        efficiency=efficiency,
        rate=rate,
        idle_cost=usage_cost(gpu_seconds=efficiency.idle_gpu_seconds, price_per_gpu_hour=price),
        saved_gpu_seconds=saved,
        saved_cost=usage_cost(gpu_seconds=saved, price_per_gpu_hour=price),
    )


def _saved_gpu_seconds(job: Job, efficiency: JobEfficiency) -> int:
    """What a job ended for idling did not burn: the rest of its time limit, on all its GPUs."""
    if efficiency.ended_at is None or job.started_at is None:
        return 0
    ended = job.ended_at or efficiency.ended_at
    limit_end = job.started_at + timedelta(minutes=job.time_limit_minutes)
    return max(int((limit_end - ended).total_seconds()), 0) * job.total_gpus


def job_waste_for(job: Job) -> JobWaste | None:
    """One job's figures, for its page and its API; None when nothing measured it."""
    efficiency = JobEfficiency.objects.filter(job=job).first()
    if efficiency is None:
        return None
    return job_waste(job=job, efficiency=efficiency, rates=RateBook.for_clusters([job.cluster_id]))


# Monthly report -------------------------------------------------------------------------------------------


@dataclass
class ScopeTotals:
    """The figures of a set of jobs: per currency for money."""

    jobs: int = 0
    observed_gpu_seconds: int = 0
    utilisation_percent_seconds: float = 0.0
    idle_gpu_seconds: int = 0
    saved_gpu_seconds: int = 0
    ended_for_idling: int = 0
    idle_costs: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    saved_costs: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))

    def add(self, waste: JobWaste) -> None:
        efficiency = waste.efficiency
        self.jobs += 1
        self.observed_gpu_seconds += efficiency.observed_gpu_seconds
        self.utilisation_percent_seconds += efficiency.utilisation_percent_seconds
        self.idle_gpu_seconds += efficiency.idle_gpu_seconds
        self.saved_gpu_seconds += waste.saved_gpu_seconds
        self.ended_for_idling += efficiency.ended_at is not None
        if waste.idle_cost is not None:
            self.idle_costs[waste.currency] += waste.idle_cost
        if waste.saved_cost is not None:
            self.saved_costs[waste.currency] += waste.saved_cost

    @property
    def mean_utilisation_percent(self) -> float | None:
        if not self.observed_gpu_seconds:
            return None
        return round(self.utilisation_percent_seconds / self.observed_gpu_seconds, 1)

    @property
    def idle_gpu_hours(self) -> Decimal:
        return gpu_hours(self.idle_gpu_seconds)

    @property
    def saved_gpu_hours(self) -> Decimal:
        return gpu_hours(self.saved_gpu_seconds)

    @property
    def idle_amounts(self) -> dict[str, Decimal]:
        return {
            currency: amount_due(amount=cost, currency=currency) for currency, cost in sorted(self.idle_costs.items())
        }

    @property
    def saved_amounts(self) -> dict[str, Decimal]:
        return {
            currency: amount_due(amount=cost, currency=currency) for currency, cost in sorted(self.saved_costs.items())
        }


@dataclass
class EfficiencyReport:
    scope: SpendScope
    month: date
    totals: ScopeTotals
    by_group: dict[str, ScopeTotals]  # per project (a project's or tenant's report) or per tenant (every tenant's)
    worst: list[JobWaste]
    jobs: list[JobWaste]


def month_bounds(month: date) -> tuple[datetime, datetime]:
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    following = datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=UTC)
    return start, following


def _measured_in(scope: SpendScope, month: date) -> QuerySet[JobEfficiency]:
    start, end = month_bounds(month)
    found = JobEfficiency.objects.filter(job__started_at__gte=start, job__started_at__lt=end).select_related(
        "job__project__tenant", "job__cluster", "job__user"
    )
    if scope.project is not None:
        return found.filter(job__project=scope.project)
    if scope.tenant is not None:
        return found.filter(job__project__tenant=scope.tenant)
    return found


def efficiency_report(
    *, scope: SpendScope, month: date, worst: int = WORST_JOBS, with_jobs: bool = False
) -> EfficiencyReport:
    """The month's efficiency of the scope's jobs: totals, per project (or per tenant for every tenant's), and the
    jobs that idled the most GPU-hours; every job too (`jobs`, for the CSV) only `with_jobs`.

    A busy month holds tens of thousands of measured jobs, too many to load or even sum for a dashboard (12 s,
    then 1 s, at 1M jobs a year: bench/history.py). The jobs that are done are read from their month's sums
    (billing.EfficiencySum, `efficiency_sums_add`); the others (running, just ended: few) are summed live by
    the database, each priced there as `job_waste` prices it. tests/billing/test_efficiency.py checks both
    against `job_waste` job by job."""
    measured = _measured_in(scope, month)
    grouped_by_tenant = scope.tenant is None and scope.project is None
    live = _priced(measured.filter(summed=False)).values("currency", "job__project_id").annotate(**_SUMS)
    sums = [(row["job__project_id"], _summed(row)) for row in live]
    sums += [
        (found.project_id, _sums_of(found) | {"currency": found.currency or None}) for found in _sums_in(scope, month)
    ]
    projects = Project.objects.select_related("tenant").in_bulk({project_id for project_id, _ in sums})
    totals = ScopeTotals()
    by_group: dict[str, ScopeTotals] = defaultdict(ScopeTotals)
    for project_id, row in sums:
        project = projects[project_id]
        _add_sums(totals, row)
        _add_sums(by_group[project.tenant.slug if grouped_by_tenant else str(project)], row)
    ranked = measured.order_by("-idle_gpu_seconds", "job_id")
    if with_jobs:
        chosen = list(ranked)
    elif worst > IDLEST_KEPT:
        chosen = list(ranked.filter(idle_gpu_seconds__gt=0)[:worst])
    else:
        chosen = _idlest(scope, month, ranked, worst) if worst else []
    rates = RateBook.for_clusters({efficiency.job.cluster_id for efficiency in chosen})
    wastes = [job_waste(job=efficiency.job, efficiency=efficiency, rates=rates) for efficiency in chosen]
    return EfficiencyReport(
        scope=scope,
        month=month,
        totals=totals,
        by_group=dict(sorted(by_group.items())),
        worst=[waste for waste in wastes[:worst] if waste.efficiency.idle_gpu_seconds > 0],
        jobs=wastes if with_jobs else [],
    )


def _idlest(scope: SpendScope, month: date, ranked: QuerySet[JobEfficiency], worst: int) -> list[JobEfficiency]:
    """The scope's `worst` idlest jobs of the month: among the idlest of each of its sums and of the jobs not
    summed yet, not by walking every job of the month."""
    candidates = [(-idle, job_id) for summed in _sums_in(scope, month) for idle, job_id in summed.idlest]
    live = ranked.filter(summed=False, idle_gpu_seconds__gt=0).values_list("idle_gpu_seconds", "job_id")[:worst]
    candidates += [(-idle, str(job_id)) for idle, job_id in live]
    chosen = [job_id for _, job_id in sorted(candidates)[:worst]]
    found = ranked.in_bulk(chosen)
    return sorted(found.values(), key=lambda efficiency: (-efficiency.idle_gpu_seconds, str(efficiency.job_id)))


def _sums_in(scope: SpendScope, month: date) -> QuerySet[EfficiencySum]:
    found = EfficiencySum.objects.filter(month=month)
    if scope.project is not None:
        return found.filter(project=scope.project)
    if scope.tenant is not None:
        return found.filter(project__tenant=scope.tenant)
    return found


# Sums of jobs that are done ---------------------------------------------------------------------------------

# A job is added to its month's sums once it has ended, and neither it nor its efficiency has changed, for this
# long: the GPU collector's last reading and the sync's last word on its times have landed by then.
EFFICIENCY_SUMS_SETTLE = timedelta(hours=1)
EFFICIENCY_SUMS_BATCH = 5000
# How many of its idlest jobs each sum keeps: the most worst jobs a report can find without walking the month.
IDLEST_KEPT = 10


def efficiency_sums_add(
    *, now: datetime | None = None, batch: int = EFFICIENCY_SUMS_BATCH, max_batches: int | None = None
) -> int:
    """Adds every settled job not summed yet to its month's EfficiencySum rows, `batch` jobs per transaction
    (their rows locked, skipping any another worker holds), and marks them summed in the same transaction: each
    job is added once, whoever runs this and however often; at most `max_batches` batches. Returns how many
    jobs were added."""
    settled = _settled((now or timezone.now()) - EFFICIENCY_SUMS_SETTLE)
    added = 0
    for _ in itertools.count() if max_batches is None else range(max_batches):
        with transaction.atomic():
            _sums_lock()
            ids = list(
                JobEfficiency.objects.select_for_update(of=("self",), skip_locked=True)
                .filter(settled, summed=False)
                # In key order, the index of the rows not summed yet merge-joined with the jobs' (0.9 s a batch
                # while a million waited after the upgrade, against 2-3 s for a hash join of every job).
                .order_by("job_id")
                .values_list("job_id", flat=True)[:batch]
            )
            if not ids:
                break
            started = JobEfficiency.objects.filter(job_id__in=ids, job__started_at__isnull=False)
            idlest = _idlest_by_key(started)
            for key, sums in _sums_by_key(started).items():
                _sum_add(key, sums, idlest[key])
            JobEfficiency.objects.filter(job_id__in=ids).update(summed=True)
            added += len(ids)
    if added >= STATISTICS_REFRESH_ROWS:
        _statistics_refresh()
    return added


def efficiency_sums_rebuild(*, now: datetime | None = None) -> int:
    """Every sum made again from every settled job in a few statements over the whole table, not in batches: for
    a bulk load (bench/history.py) or a repair after `efficiency_sums_mismatches` found a difference. One
    transaction; it holds the lock each batch of `efficiency_sums_add` takes, so neither runs beside the other.
    Returns how many jobs the sums hold."""
    settled = _settled((now or timezone.now()) - EFFICIENCY_SUMS_SETTLE)
    with transaction.atomic():
        _sums_lock()
        EfficiencySum.objects.all().delete()
        JobEfficiency.objects.filter(summed=True).exclude(settled).update(summed=False)
        JobEfficiency.objects.filter(settled, summed=False).update(summed=True)
        started = JobEfficiency.objects.filter(summed=True, job__started_at__isnull=False)
        idlest = _idlest_by_key(started)
        EfficiencySum.objects.bulk_create(
            EfficiencySum(
                month=month,
                project_id=project_id,
                currency=currency,
                idlest=_idlest_kept(idlest[(month, project_id, currency)]),
                **{field: sums[field] for field in _SUM_FIELDS},
            )
            for (month, project_id, currency), sums in _sums_by_key(started).items()
        )
        summed = JobEfficiency.objects.filter(summed=True).count()
    _statistics_refresh()
    return summed


# Marking many jobs summed at once (a rebuild, or the runs that catch up after an upgrade) leaves PostgreSQL's
# statistics saying they are not: until autovacuum analyzes the table (minutes at a site; never where it is off) the
# planner reads a month's unsummed jobs through the idlest-first index, row by row, and the efficiency report
# took 2.6 s at 1M jobs instead of 50 ms. So such a run analyzes the table itself (about 0.2 s at 1M rows).
STATISTICS_REFRESH_ROWS = 50_000


def _statistics_refresh() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {JobEfficiency._meta.db_table}")


def _settled(before: datetime) -> Q:
    """The jobs that ended before `before`, and that neither the sync nor the GPU collector has changed since."""
    return Q(
        updated_at__lt=before,
        job__state__in=list(FINAL_JOB_STATES),
        job__ended_at__lt=before,
        job__updated_at__lt=before,
    )


def _sums_lock() -> None:
    """One writer of the sums at a time (PostgreSQL's advisory lock, held to the end of the transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('billing.EfficiencySum'))")


def _idlest_by_key(efficiencies: QuerySet[JobEfficiency]) -> dict[tuple[date, int, str], list[tuple[int, str]]]:
    """The jobs that idled at all, as (idle GPU-seconds, job id) per (month, project, currency), in no order."""
    idlest: dict[tuple[date, int, str], list[tuple[int, str]]] = defaultdict(list)
    for month, project_id, currency, idle, job_id in (
        _priced(efficiencies.filter(idle_gpu_seconds__gt=0))
        .annotate(month=TruncMonth("job__started_at", tzinfo=UTC))
        .values_list("month", "job__project_id", "currency", "idle_gpu_seconds", "job_id")
        .iterator(chunk_size=10_000)
    ):
        idlest[(month.date(), project_id, currency or "")].append((idle, str(job_id)))
    return idlest


def _idlest_kept(entries: list[tuple[int, str]]) -> list[list[Any]]:
    """The IDLEST_KEPT idlest, idlest first, ties by job id: what EfficiencySum.idlest holds."""
    return [[idle, job_id] for idle, job_id in heapq.nsmallest(IDLEST_KEPT, entries, key=_idlest_first)]


def _sums_by_key(efficiencies: QuerySet[JobEfficiency]) -> dict[tuple[date, int, str], dict[str, Any]]:
    """The jobs' sums per (month they started in, project, currency: "" for none)."""
    by_key = (
        _priced(efficiencies)
        .annotate(month=TruncMonth("job__started_at", tzinfo=UTC))
        .values("month", "job__project_id", "currency")
        .annotate(**_SUMS)
    )
    return {(row["month"].date(), row["job__project_id"], row["currency"] or ""): _summed(row) for row in by_key}


def _sum_add(key: tuple[date, int, str], sums: dict[str, Any], idlest: list[tuple[int, str]]) -> None:
    month, project_id, currency = key
    summed, _ = EfficiencySum.objects.select_for_update(of=("self",)).get_or_create(
        month=month, project_id=project_id, currency=currency
    )
    kept = [(idle, job_id) for idle, job_id in summed.idlest] + idlest
    EfficiencySum.objects.filter(pk=summed.pk).update(
        **{field: F(field) + sums[field] for field in _SUM_FIELDS}, idlest=_idlest_kept(kept)
    )


def _idlest_first(entry: tuple[int, str]) -> tuple[int, str]:
    return (-entry[0], entry[1])


def efficiency_sums_mismatches() -> list[str]:
    """Where the EfficiencySum rows differ from the summed jobs summed again (empty: they agree)."""
    summed = _sums_by_key(JobEfficiency.objects.filter(summed=True, job__started_at__isnull=False))
    again = {key: {field: sums[field] for field in _SUM_FIELDS} for key, sums in summed.items()}
    kept = {(found.month, found.project_id, found.currency): _sums_of(found) for found in EfficiencySum.objects.all()}
    problems = []
    for key in sorted(set(again) | set(kept), key=str):
        if again.get(key) != kept.get(key):
            problems.append(f"{key}: kept {kept.get(key)}, summed again {again.get(key)}")
    return problems


def _priced(measured: QuerySet[JobEfficiency]) -> QuerySet[Any]:  # Any: its annotations are what is read
    """`measured` with each job's price per GPU-hour and currency (RateBook.in_force in SQL: the GPU type's own
    rate in force when the job started, else the cluster's rate for any type; null: no rate), its GPU-seconds
    saved by ending it for idling (`_saved_gpu_seconds`) and both costs to the micro-unit (`usage_cost`)."""
    in_force = (
        Rate.objects.filter(
            Q(gpu_type=OuterRef("job__gpu_type")) | Q(gpu_type=""),
            cluster_id=OuterRef("job__cluster_id"),
            valid_from__lte=OuterRef("priced_at"),
        )
        .annotate(own=Case(When(gpu_type="", then=Value(1)), default=Value(0)))
        .order_by("own", "-valid_from")
    )
    # started_at + time limit - when it ended, in whole seconds (int() of Python's total_seconds()).
    limit_end = Func(
        F("job__started_at"),
        F("job__time_limit_minutes"),
        template="(%(expressions)s * INTERVAL '1 minute')",
        arg_joiner=" + ",
        output_field=DateTimeField(),
    )
    left = Func(
        limit_end,
        Coalesce("job__ended_at", "ended_at"),
        template="TRUNC(EXTRACT(EPOCH FROM %(expressions)s))::bigint",
        arg_joiner=" - ",
        output_field=BigIntegerField(),
    )
    saved = Case(
        When(
            ended_at__isnull=False,
            job__started_at__isnull=False,
            then=Greatest(left, Value(0)) * F("job__gpus") * F("job__node_count"),
        ),
        default=Value(0),
        output_field=BigIntegerField(),
    )
    priced = measured.annotate(priced_at=Coalesce("job__started_at", "job__created_at")).annotate(
        price=Subquery(in_force.values("price_per_gpu_hour")[:1]),
        currency=Subquery(in_force.values("currency")[:1]),
        job_saved_gpu_seconds=saved,
    )
    return priced.annotate(
        job_idle_cost=_micro_cost("idle_gpu_seconds"), job_saved_cost=_micro_cost("job_saved_gpu_seconds")
    )


def _micro_cost(gpu_seconds: str) -> Func:
    """GPU-seconds x price per GPU-hour rounded half up to the micro-unit, as billing.money.usage_cost (PostgreSQL's
    round of a positive numeric rounds half up)."""
    return Func(
        F(gpu_seconds) * F("price") / Value(Decimal(SECONDS_PER_HOUR)),
        Value(6),
        function="ROUND",
        output_field=DecimalField(max_digits=30, decimal_places=6),
    )


_SUM_FIELDS = (
    "jobs",
    "observed_gpu_seconds",
    "utilisation_percent_seconds",
    "idle_gpu_seconds",
    "saved_gpu_seconds",
    "ended_for_idling",
    "idle_cost",
    "saved_cost",
)
# The sums of `_priced` rows, by EfficiencySum's field names with `sum_` before them (Django refuses an
# aggregate named as a field).
_SUMS = {
    "sum_jobs": Count("job_id"),
    "sum_observed_gpu_seconds": Sum("observed_gpu_seconds"),
    "sum_utilisation_percent_seconds": Sum("utilisation_percent_seconds"),
    "sum_idle_gpu_seconds": Sum("idle_gpu_seconds"),
    "sum_saved_gpu_seconds": Sum("job_saved_gpu_seconds"),
    "sum_ended_for_idling": Count("job_id", filter=Q(ended_at__isnull=False)),
    "sum_idle_cost": Sum("job_idle_cost"),
    "sum_saved_cost": Sum("job_saved_cost"),
}


def _sums_of(found: EfficiencySum) -> dict[str, Any]:
    return {field: getattr(found, field) for field in _SUM_FIELDS}


def _summed(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of `_SUMS` by EfficiencySum's field names (None for what summed no row: 0), and its currency."""
    return {field: row[f"sum_{field}"] or 0 for field in _SUM_FIELDS} | {"currency": row["currency"]}


def _add_sums(totals: ScopeTotals, row: dict[str, Any]) -> None:
    """Adds one currency's sums (`_SUMS`, or an EfficiencySum's; currency None: unpriced) to `totals`, as
    ScopeTotals.add adds a job's."""
    totals.jobs += row["jobs"]
    totals.observed_gpu_seconds += row["observed_gpu_seconds"]
    totals.utilisation_percent_seconds += row["utilisation_percent_seconds"]
    totals.idle_gpu_seconds += row["idle_gpu_seconds"]
    totals.saved_gpu_seconds += row["saved_gpu_seconds"]
    totals.ended_for_idling += row["ended_for_idling"]
    if row["currency"] is not None:
        totals.idle_costs[row["currency"]] += row["idle_cost"]
        totals.saved_costs[row["currency"]] += row["saved_cost"]


CSV_COLUMNS = [
    "job_id",
    "name",
    "project",
    "cluster",
    "user",
    "started_at",
    "ended_at",
    "gpus",
    "utilisation_source",
    "mean_utilisation_percent",
    "peak_memory_mib",
    "idle_gpu_hours",
    "currency",
    "price_per_gpu_hour",
    "idle_cost",
    "ended_for_idling",
    "saved_gpu_hours",
    "saved_cost",
]


def efficiency_csv(report: EfficiencyReport) -> str:
    """One line per job measured in the month, the worst first."""
    output = io.StringIO()
    writer = csv.writer(output, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for waste in report.jobs:
        job, efficiency = waste.job, waste.efficiency
        mean = efficiency.mean_utilisation_percent
        writer.writerow(
            [
                job.pk,
                job.name,
                str(job.project),
                job.cluster.name,
                job.user.username if job.user else job.cluster_username,
                job.started_at.isoformat() if job.started_at else "",
                job.ended_at.isoformat() if job.ended_at else "",
                job.total_gpus,
                efficiency.source,
                "" if mean is None else f"{mean:.1f}",
                "" if efficiency.peak_memory_mib is None else efficiency.peak_memory_mib,
                waste.idle_gpu_hours,
                waste.currency,
                "" if waste.rate is None else waste.rate.price_per_gpu_hour,
                "" if waste.idle_amount is None else waste.idle_amount,
                "yes" if efficiency.ended_at else "no",
                gpu_hours(waste.saved_gpu_seconds),
                "" if waste.saved_cost is None else amount_due(amount=waste.saved_cost, currency=waste.currency),
            ]
        )
    return output.getvalue()
