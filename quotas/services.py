"""Writes to allocations and the quota ledger: grants, a reservation when a job is accepted, its release and
its real charge when the job ends, and the move of open reservations into the next period.

Every movement is one `LedgerEntry` plus the matching change of the allocation's balances, made under a lock
on the allocation row (`SELECT ... FOR UPDATE`): on PostgreSQL, twenty simultaneous submissions against room
for five queue on that lock and exactly five find room. A job's charge and its reservations are unique in
the ledger, so a repeated import, a retried task or a second worker changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import Coalesce

from portal import metrics
from portal.db import prepared_cursor
from portal.errors import Conflict
from portal.queue import task_enqueue_on_commit
from quotas.models import Allocation, LedgerDaily, LedgerEntry, LedgerKind
from quotas.units import format_gpu_hours, gpu_hours_to_seconds
from tenants.models import Project
from tenants.services import Actor, audit_record

if TYPE_CHECKING:
    from clusters.models import Cluster
    from jobs.models import Job

logger = logging.getLogger(__name__)


def allocation_requests_path(allocation: Allocation) -> str:
    """Where a member asks for more hours on this allocation."""
    return f"/api/v1/allocations/{allocation.pk}/requests/"


class QuotaExceeded(Conflict):
    def __init__(self, message: str) -> None:
        super().__init__(message, code="quota_exceeded")


class NoAllocation(Conflict):
    def __init__(self, message: str) -> None:
        super().__init__(message, code="no_allocation")


# Allocations and grants ---------------------------------------------------------------------------------


def _allocation_state(allocation: Allocation) -> dict[str, object]:
    return {
        "project": str(allocation.project),
        "cluster": allocation.cluster.name,
        "gpu_type": allocation.gpu_type,
        "starts_on": allocation.starts_on.isoformat(),
        "ends_on": allocation.ends_on.isoformat(),
        "granted_gpu_seconds": allocation.granted_gpu_seconds,
    }


def allocation_create(
    *,
    actor: Actor,
    project: Project,
    cluster: Cluster,
    gpu_hours: Decimal,
    starts_on: date,
    ends_on: date,
    gpu_type: str = "",
    note: str = "",
) -> Allocation:
    """Give a project GPU-hours on a cluster (optionally one GPU type) for a period; one grant row records it.

    Periods of the same project, cluster and GPU type may not overlap: a job must have exactly one
    allocation to draw on. Raises Conflict when they would.
    """
    gpu_seconds = gpu_hours_to_seconds(gpu_hours)
    if gpu_seconds < 0:
        raise Conflict("An allocation cannot start with negative GPU-hours; give 0 or more.")
    if ends_on < starts_on:
        raise Conflict(f"The period ends ({ends_on}) before it starts ({starts_on}); swap the dates.")
    with transaction.atomic():
        # Serialises allocation changes of one project, so two overlapping periods cannot both get in.
        Project.objects.select_for_update(of=("self",), no_key=True).filter(pk=project.pk).first()
        overlapping = Allocation.objects.filter(
            project=project, cluster=cluster, gpu_type=gpu_type, starts_on__lte=ends_on, ends_on__gte=starts_on
        ).first()
        if overlapping is not None:
            kind = f" for {gpu_type}" if gpu_type else ""
            raise Conflict(
                f"{project} already has an allocation on {cluster.name}{kind} from {overlapping.starts_on} to "
                f"{overlapping.ends_on}, which overlaps {starts_on}..{ends_on}; grant more hours on that one, "
                "or choose a period after it."
            )
        allocation = Allocation.objects.create(
            project=project,
            cluster=cluster,
            gpu_type=gpu_type,
            starts_on=starts_on,
            ends_on=ends_on,
            granted_gpu_seconds=gpu_seconds,
            created_by=actor if actor is not None and actor.is_authenticated else None,
        )
        ledger_add(
            allocation=allocation,
            project=project,
            cluster=cluster,
            kind=LedgerKind.GRANT,
            gpu_seconds=gpu_seconds,
            actor=allocation.created_by,
            note=note or "initial grant",
        )
        audit_record(
            actor=actor,
            action="allocation.create",
            target=allocation,
            tenant=project.tenant,
            before=None,
            after=_allocation_state(allocation),
        )
        schedule_limit_sync(project_id=project.pk, cluster_id=cluster.pk)
    return allocation


def allocation_grant(*, actor: Actor, allocation: Allocation, gpu_seconds: int, note: str) -> Allocation:
    """Add GPU-seconds to an allocation (negative: take back what is not used or reserved)."""
    with transaction.atomic():
        locked = (
            Allocation.objects.select_for_update(of=("self",), no_key=True)
            .select_related("project__tenant", "cluster")
            .get(pk=allocation.pk)
        )
        if gpu_seconds < 0 and -gpu_seconds > max(locked.remaining_gpu_seconds, 0):
            raise Conflict(
                f"Only {format_gpu_hours(max(locked.remaining_gpu_seconds, 0))} GPU-hours of this allocation are "
                f"neither used nor reserved; take back at most that much."
            )
        before = _allocation_state(locked)
        ledger_add(
            allocation=locked,
            project_id=locked.project_id,
            cluster_id=locked.cluster_id,
            kind=LedgerKind.GRANT,
            gpu_seconds=gpu_seconds,
            actor=actor if actor is not None and actor.is_authenticated else None,
            note=note,
        )
        locked.granted_gpu_seconds = F("granted_gpu_seconds") + gpu_seconds
        locked.save(update_fields=["granted_gpu_seconds"])
        locked.refresh_from_db(fields=["granted_gpu_seconds", "charged_gpu_seconds", "reserved_gpu_seconds"])
        audit_record(
            actor=actor,
            action="allocation.grant",
            target=locked,
            tenant=locked.project.tenant,
            before=before,
            after={**_allocation_state(locked), "change_gpu_seconds": gpu_seconds, "note": note},
        )
        schedule_limit_sync(project_id=locked.project_id, cluster_id=locked.cluster_id)
        if gpu_seconds < 0:
            _schedule_alerts(locked.pk)  # taking hours back raises the share used
    return locked


def schedule_limit_sync(*, project_id: int, cluster_id: int) -> None:
    """After the transaction commits, have a worker write the project's GPU-minute limit into Slurm."""

    task_enqueue_on_commit(
        "quotas.tasks.quota_limit_sync",
        project_id,
        cluster_id,
        fallback="the periodic limit sync writes the limit on its next run",
    )


def crosses_alert_threshold(*, granted: int, used_before: int, used_after: int) -> bool:
    """Whether a movement takes an allocation's use (charged + reserved) across one of the alert thresholds."""
    if granted <= 0 or used_after <= used_before:
        return False
    return any(
        used_before * 100 < threshold * granted <= used_after * 100 for threshold in settings.QUOTA_ALERT_THRESHOLDS
    )


def _schedule_alerts(allocation_id: int) -> None:
    task_enqueue_on_commit(
        "quotas.tasks.allocation_alerts_check",
        allocation_id,
        fallback="the next movement on the allocation checks its thresholds again",
    )


# Which allocation a job draws on --------------------------------------------------------------------------


def allocations_current(*, project_id: int, cluster_id: int, now: datetime) -> list[Allocation]:
    today = now.date()
    return list(
        Allocation.objects.filter(
            project_id=project_id, cluster_id=cluster_id, starts_on__lte=today, ends_on__gte=today
        ).order_by("gpu_type")
    )


def allocation_for(*, candidates: list[Allocation], gpu_type: str | None) -> Allocation | None:
    """The allocation for this GPU type: the one restricted to it, else the one for any type."""
    if gpu_type:
        for allocation in candidates:
            if allocation.gpu_type == gpu_type:
                return allocation
    for allocation in candidates:
        if not allocation.gpu_type:
            return allocation
    return None


def job_gpu_seconds_needed(job: Job) -> int:
    """What a job may use at most, and so what it reserves: its GPUs for its whole time limit (an array: times its
    number of tasks)."""
    return task_gpu_seconds_needed(job) * max(job.array_task_count, 1)


def task_gpu_seconds_needed(job: Job) -> int:
    """What one run of the job (a plain job, or one task of an array) may use: all its GPUs (GPUs per node x
    nodes) for its time limit."""
    return job.total_gpus * job.time_limit_minutes * 60


def _array_tasks(job: Job) -> list[int | None]:
    """The ledger's `array_task` of each reservation a job holds: its tasks' indexes, or [None] for a plain job."""
    if not job.array_task_count:
        return [None]
    indexes: list[int] | None = getattr(job, "array_indexes", None)
    if indexes is None:
        indexes = list(job.array_tasks.order_by("index").values_list("index", flat=True))
    return list(indexes)


@dataclass(frozen=True)
class Reservation:
    allocation: Allocation
    gpu_seconds: int


def quota_reserve(*, job: Job, gpu_type: str | None, now: datetime) -> Reservation | None:
    """Reserve the job's GPU-hours, or refuse with what it needs and what is left. Call inside the transaction
    that stores the job; a refusal raises, so the job is not stored. `gpu_type` is the type the job will get
    (its own, or the only one its partition has). Jobs without GPUs reserve nothing."""
    needed = job_gpu_seconds_needed(job)
    if needed == 0:
        return None
    allocation = _reserve_if_it_fits(job=job, gpu_type=gpu_type, needed=needed, now=now)
    if allocation is not None:
        metrics.quota_reserved(cluster=job.cluster.name, gpu_seconds=needed)
        return Reservation(allocation=allocation, gpu_seconds=needed)
    # Refused, or an allocation changed meanwhile: decide again under the row lock, and say exactly why.
    project = job.project
    cluster = job.cluster
    candidates = allocations_current(project_id=project.pk, cluster_id=cluster.pk, now=now)
    chosen = allocation_for(candidates=candidates, gpu_type=gpu_type)
    if chosen is None:
        metrics.quota_refused(cluster=cluster.name, reason="no_allocation")
        raise NoAllocation(
            _no_allocation_message(project=project, cluster=cluster, gpu_type=gpu_type, found=candidates)
        )
    allocation = Allocation.objects.select_for_update(of=("self",), no_key=True).get(pk=chosen.pk)
    remaining = allocation.remaining_gpu_seconds
    if needed > remaining:
        metrics.quota_refused(cluster=cluster.name, reason="quota_exceeded")
        raise QuotaExceeded(_exceeded_message(job=job, allocation=allocation, needed=needed))
    _reserve(allocation=allocation, job=job, gpu_seconds=needed, note="accepted")
    metrics.quota_reserved(cluster=cluster.name, gpu_seconds=needed)
    return Reservation(allocation=allocation, gpu_seconds=needed)


# The common case of every submission in one statement: choose the allocation as `allocation_for` does (the
# job's own GPU type before any type), take the GPU-seconds only if they are left, and write the ledger row (an
# array: one row per task, each released or charged when its task ends) and add them to the allocation's day (as
# `ledger_add_many` does).
# The UPDATE's row lock serialises reservers; under it PostgreSQL re-checks the balance on the newest row.
_RESERVE_SQL = """
WITH chosen AS (
    SELECT id FROM {allocation}
    WHERE project_id = %(project)s AND cluster_id = %(cluster)s AND starts_on <= %(today)s AND ends_on >= %(today)s
        AND gpu_type IN (%(gpu_type)s, '')
    ORDER BY gpu_type = ''
    LIMIT 1
), held AS (
    UPDATE {allocation} AS allocation SET reserved_gpu_seconds = allocation.reserved_gpu_seconds + %(needed)s
    FROM chosen
    WHERE allocation.id = chosen.id
        AND allocation.granted_gpu_seconds - allocation.charged_gpu_seconds - allocation.reserved_gpu_seconds
            >= %(needed)s
    RETURNING {returning}
), entry AS (
    INSERT INTO {ledger}
        (allocation_id, project_id, cluster_id, kind, gpu_seconds, job_id, array_task, note, created_at)
    SELECT id, project_id, cluster_id, %(kind)s, %(each)s, %(job)s, task, 'accepted', %(now)s
    FROM held, unnest(%(tasks)s::integer[]) AS task
), daily AS (
    INSERT INTO {daily} (allocation_id, day, reserved_gpu_seconds, charged_gpu_seconds, released_gpu_seconds)
    SELECT id, %(day)s, %(needed)s, 0, 0 FROM held
    ON CONFLICT (allocation_id, day)
    DO UPDATE SET reserved_gpu_seconds = {daily}.reserved_gpu_seconds + EXCLUDED.reserved_gpu_seconds
)
SELECT {columns} FROM held
"""
# Columns named, not `*`: a prepared statement (portal/db.py) must not change its result's columns under a migration.
_ALLOCATION_FIELDS = Allocation._meta.concrete_fields
_RESERVE_STATEMENT = _RESERVE_SQL.format(
    allocation=Allocation._meta.db_table,
    ledger=LedgerEntry._meta.db_table,
    daily=LedgerDaily._meta.db_table,
    returning=", ".join(f"allocation.{field.column}" for field in _ALLOCATION_FIELDS),
    columns=", ".join(str(field.column) for field in _ALLOCATION_FIELDS),
)
_ALLOCATION_NAMES = [field.attname for field in _ALLOCATION_FIELDS]  # the statement's columns, as attributes


def _reserve_if_it_fits(*, job: Job, gpu_type: str | None, needed: int, now: datetime) -> Allocation | None:
    """The allocation, its balances after the reservation, when the job's allocation has room; else None."""
    parameters: dict[str, Any] = {
        "project": job.project_id,
        "cluster": job.cluster_id,
        "today": now.date(),
        "gpu_type": gpu_type or "",
        "needed": needed,
        "each": task_gpu_seconds_needed(job),
        "tasks": _array_tasks(job),
        "kind": LedgerKind.RESERVE.value,
        "job": job.pk,
        "now": now,
        "day": now.astimezone(UTC).date(),
    }
    with prepared_cursor() as cursor:
        cursor.execute(_RESERVE_STATEMENT, parameters)
        row = cursor.fetchone()
    if row is None:
        return None
    allocation = Allocation.from_db(connection.alias, _ALLOCATION_NAMES, row)  # as if read with the ORM
    used_after = allocation.charged_gpu_seconds + allocation.reserved_gpu_seconds
    if crosses_alert_threshold(
        granted=allocation.granted_gpu_seconds, used_before=used_after - needed, used_after=used_after
    ):
        _schedule_alerts(allocation.pk)
    return allocation


def quota_reserve_batch(*, jobs: list[Job], gpu_types: list[str | None], now: datetime) -> list[Reservation | None]:
    """Reserve the GPU-hours of a batch of jobs of one project on one cluster at once, all or none: each job on
    the allocation `quota_reserve` would choose for it (`gpu_types`, in the jobs' order), every allocation
    locked once, the ledger written in one insert. A refusal raises naming how many of the batch's jobs, in
    order, would fit, and nothing is reserved. Queries: a constant few, whatever the batch's size (one update
    per allocation drawn on). Call inside the transaction that stores the jobs."""
    reservations: list[Reservation | None] = [None] * len(jobs)
    needing = [(index, job_gpu_seconds_needed(job)) for index, job in enumerate(jobs)]
    needing = [(index, needed) for index, needed in needing if needed]
    if not needing:
        return reservations
    project, cluster = jobs[0].project, jobs[0].cluster
    candidates = allocations_current(project_id=project.pk, cluster_id=cluster.pk, now=now)
    chosen: dict[int, Allocation] = {}  # job index -> allocation
    for index, _ in needing:
        allocation = allocation_for(candidates=candidates, gpu_type=gpu_types[index])
        if allocation is None:
            metrics.quota_refused(cluster=cluster.name, reason="no_allocation")
            message = _no_allocation_message(
                project=project, cluster=cluster, gpu_type=gpu_types[index], found=candidates
            )
            raise NoAllocation(f"Job {index} of the batch: {message} Nothing in the batch was accepted.")
        chosen[index] = allocation
    locked = {
        allocation.pk: allocation
        for allocation in Allocation.objects.select_for_update(of=("self",), no_key=True)
        .filter(pk__in={allocation.pk for allocation in chosen.values()})
        .order_by("pk")  # one order everywhere: no deadlocks
    }
    wanted: dict[int, int] = {}
    for index, needed in needing:
        wanted[chosen[index].pk] = wanted.get(chosen[index].pk, 0) + needed
    for allocation_id, total in wanted.items():
        allocation = locked[allocation_id]
        if total > allocation.remaining_gpu_seconds:
            metrics.quota_refused(cluster=cluster.name, reason="quota_exceeded")
            raise QuotaExceeded(_batch_exceeded_message(jobs=jobs, needing=needing, chosen=chosen, locked=locked))
    entries = []
    for index, needed in needing:
        job, allocation = jobs[index], locked[chosen[index].pk]
        tasks = _array_tasks(job)
        entries += [
            LedgerEntry(
                allocation=allocation,
                project_id=allocation.project_id,
                cluster_id=allocation.cluster_id,
                kind=LedgerKind.RESERVE,
                gpu_seconds=needed // len(tasks),
                job=job,
                array_task=task,
                note="accepted",
                created_at=now,
            )
            for task in tasks
        ]
        reservations[index] = Reservation(allocation=allocation, gpu_seconds=needed)
    ledger_add_many(entries)
    for allocation_id, total in wanted.items():
        allocation = locked[allocation_id]
        Allocation.objects.filter(pk=allocation_id).update(reserved_gpu_seconds=F("reserved_gpu_seconds") + total)
        used = allocation.charged_gpu_seconds + allocation.reserved_gpu_seconds
        allocation.reserved_gpu_seconds += total
        if crosses_alert_threshold(granted=allocation.granted_gpu_seconds, used_before=used, used_after=used + total):
            _schedule_alerts(allocation_id)
        metrics.quota_reserved(cluster=cluster.name, gpu_seconds=total)
    return reservations


def _batch_exceeded_message(
    *, jobs: list[Job], needing: list[tuple[int, int]], chosen: dict[int, Allocation], locked: dict[int, Allocation]
) -> str:
    """Which allocation the batch overdraws, and how many of its jobs, taken in order, would fit."""
    left = {pk: max(allocation.remaining_gpu_seconds, 0) for pk, allocation in locked.items()}
    fitting, total = 0, sum(needed for _, needed in needing)
    for index, needed in needing:
        allocation_id = chosen[index].pk
        if needed > left[allocation_id]:
            break
        left[allocation_id] -= needed
        fitting += 1
    fitting += sum(1 for job in jobs if not job_gpu_seconds_needed(job)) if fitting == len(needing) else 0
    project, cluster = jobs[0].project, jobs[0].cluster
    remaining = sum(max(allocation.remaining_gpu_seconds, 0) for allocation in locked.values())
    return (
        f"This batch of {len(jobs)} jobs needs {format_gpu_hours(total)} GPU-hours; {project.slug} has "
        f"{format_gpu_hours(remaining)} GPU-hours left on cluster {cluster.name}, enough for the first {fitting} "
        f"of its jobs. Nothing in the batch was accepted: send at most {fitting} of them, shorten their time "
        f"limits, or request more at {allocation_requests_path(next(iter(locked.values())))}."
    )


def quota_refusal(*, job: Job, gpu_type: str | None, candidates: list[Allocation]) -> Conflict | None:
    """What `quota_reserve` would refuse `job` with, given the project's allocations open today on its cluster
    (`allocations_current`), or None when it fits: how an estimate says the same words as a submission."""
    needed = job_gpu_seconds_needed(job)
    if needed == 0:
        return None
    chosen = allocation_for(candidates=candidates, gpu_type=gpu_type)
    if chosen is None:
        return NoAllocation(
            _no_allocation_message(project=job.project, cluster=job.cluster, gpu_type=gpu_type, found=candidates)
        )
    if needed > chosen.remaining_gpu_seconds:
        return QuotaExceeded(_exceeded_message(job=job, allocation=chosen, needed=needed))
    return None


def _no_allocation_message(*, project: Project, cluster: Cluster, gpu_type: str | None, found: list[Allocation]) -> str:
    if gpu_type is None and found:
        types = ", ".join(sorted(allocation.gpu_type for allocation in found))
        return (
            f"{project.slug}'s GPU-hours on cluster {cluster.name} are for {types} GPUs only; choose gpu_type "
            f"{'one of ' if len(found) > 1 else ''}{types}, or a partition that has only those GPUs."
        )
    kind = f" for {gpu_type} GPUs" if gpu_type else ""
    offered = (
        f" (it has some for {', '.join(sorted(a.gpu_type for a in found if a.gpu_type))})"
        if any(a.gpu_type for a in found)
        else ""
    )
    return (
        f"{project.slug} has no GPU-hour allocation open today on cluster {cluster.name}{kind}{offered}; "
        "ask your tenant admin or a portal admin for one."
    )


def _exceeded_message(*, job: Job, allocation: Allocation, needed: int) -> str:
    remaining = max(allocation.remaining_gpu_seconds, 0)
    kind = f" ({allocation.gpu_type} GPUs)" if allocation.gpu_type else ""
    left = f"{format_gpu_hours(remaining)} GPU-hours left" if remaining else "no GPU-hours left"
    shape = f"{job.total_gpus} GPU{'s' if job.total_gpus != 1 else ''} x {job.time_limit_minutes} min"
    if job.node_count > 1:
        shape = f"{job.node_count} nodes x {job.gpus} GPU{'s' if job.gpus != 1 else ''} x {job.time_limit_minutes} min"
    if job.array_task_count:
        fitting = array_tasks_that_fit(
            task_gpu_seconds=task_gpu_seconds_needed(job),
            task_count=job.array_task_count,
            remaining_gpu_seconds=remaining,
        )
        return (
            f"This array needs {format_gpu_hours(needed)} GPU-hours ({job.array_task_count} tasks x {shape}); "
            f"{job.project.slug} has {left} on cluster {job.cluster.name}{kind} until "
            f"{allocation.ends_on.isoformat()}, enough for {fitting} of its tasks; ask for at most {fitting} tasks, "
            f"fewer GPUs or a shorter time limit, or request more at {allocation_requests_path(allocation)}."
        )
    return (
        f"This job needs {format_gpu_hours(needed)} GPU-hours ({shape}); {job.project.slug} has {left} on "
        f"cluster {job.cluster.name}{kind} until {allocation.ends_on.isoformat()}; request more at "
        f"{allocation_requests_path(allocation)}, or ask for fewer GPUs or a shorter time limit."
    )


# The column of LedgerDaily each kind of entry adds to (grants are not part of a burn-down).
_DAILY_COLUMN = {
    LedgerKind.CHARGE: "charged_gpu_seconds",
    LedgerKind.RESERVE: "reserved_gpu_seconds",
    LedgerKind.RELEASE: "released_gpu_seconds",
}


def ledger_add(**fields: Any) -> LedgerEntry:
    """Add one ledger entry and its GPU-seconds to its allocation's day (`ledger_add_many`)."""
    return ledger_add_many([LedgerEntry(**fields)])[0]


def ledger_add_many(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """Add ledger entries and, in the same transaction, their GPU-seconds to their allocations' days (LedgerDaily),
    in one insert and one upsert whatever their number (an array's tasks). Every writer of the ledger goes through
    here; callers hold the allocations' row locks, so a day's row is never raced for."""
    created = LedgerEntry.objects.bulk_create(list(entries))
    days: dict[tuple[int, date], dict[str, int]] = {}  # the GPU-seconds each day of an allocation gains, by column
    for entry in created:
        column = _DAILY_COLUMN.get(LedgerKind(entry.kind))
        if entry.allocation_id is None or column is None:
            continue
        sums = days.setdefault(
            (entry.allocation_id, entry.created_at.astimezone(UTC).date()), dict.fromkeys(_DAILY_COLUMN.values(), 0)
        )
        sums[column] += entry.gpu_seconds
    if days:
        columns = list(_DAILY_COLUMN.values())
        rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(days))
        updates = ", ".join(f"{name} = quotas_ledgerdaily.{name} + EXCLUDED.{name}" for name in columns)
        parameters: list[Any] = []
        for (allocation_id, day), sums in days.items():
            parameters += [allocation_id, day, *sums.values()]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO quotas_ledgerdaily (allocation_id, day, {', '.join(columns)}) VALUES {rows} "  # noqa: S608
                f"ON CONFLICT (allocation_id, day) DO UPDATE SET {updates}",
                parameters,
            )
    return created


def array_tasks_that_fit(*, task_gpu_seconds: int, task_count: int, remaining_gpu_seconds: int) -> int:
    """How many of an array's tasks the remaining GPU-seconds hold, each reserving its GPUs for its time limit."""
    return min(max(remaining_gpu_seconds, 0) // task_gpu_seconds, task_count) if task_gpu_seconds else task_count


def _reserve(*, allocation: Allocation, job: Job, gpu_seconds: int, note: str) -> None:
    """Record a reservation on a locked allocation (its balances as read under the lock); an array's, task by task."""
    tasks = _array_tasks(job)
    ledger_add_many(
        LedgerEntry(
            allocation=allocation,
            project_id=allocation.project_id,
            cluster_id=allocation.cluster_id,
            kind=LedgerKind.RESERVE,
            gpu_seconds=gpu_seconds // len(tasks),
            job=job,
            array_task=task,
            note=note,
        )
        for task in tasks
    )
    Allocation.objects.filter(pk=allocation.pk).update(reserved_gpu_seconds=F("reserved_gpu_seconds") + gpu_seconds)
    used = allocation.charged_gpu_seconds + allocation.reserved_gpu_seconds
    # Only a movement across a threshold costs the workers a task: most reservations cross none.
    if crosses_alert_threshold(granted=allocation.granted_gpu_seconds, used_before=used, used_after=used + gpu_seconds):
        _schedule_alerts(allocation.pk)


def quota_reserve_found(*, job: Job, now: datetime, note: str = "found in Slurm") -> bool:
    """Reserve for a job found running or pending in the project's Slurm account without the portal (an
    external job): Slurm is already counting it, so it is reserved without a check, and may overdraw.
    False when it had a reservation already or there is no allocation to hold one."""
    needed = job_gpu_seconds_needed(job)
    if needed == 0:
        return False
    candidates = allocations_current(project_id=job.project_id, cluster_id=job.cluster_id, now=now)
    chosen = allocation_for(candidates=candidates, gpu_type=job.gpu_type or None) or (
        candidates[0] if candidates else None
    )
    if chosen is None:
        return False
    try:
        with transaction.atomic():
            allocation = Allocation.objects.select_for_update(of=("self",), no_key=True).get(pk=chosen.pk)
            if LedgerEntry.objects.filter(job=job, kind=LedgerKind.RESERVE).exists():
                return False
            _reserve(allocation=allocation, job=job, gpu_seconds=needed, note=note)
    except IntegrityError:
        return False
    return True


# Ending: release and charge ------------------------------------------------------------------------------


def _open_reservations(job: Job, *, tasks: set[int] | None = None) -> list[LedgerEntry]:
    """The job's reservations not released yet (an array's: of every task, or of `tasks`)."""
    entries = LedgerEntry.objects.filter(job=job, kind__in=[LedgerKind.RESERVE, LedgerKind.RELEASE])
    if tasks is not None:
        entries = entries.filter(array_task__in=tasks)
    return open_reservations_of(list(entries))


def open_reservations_of(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """The reserve entries among `entries` (one job's reserves and releases) that no release gives back."""
    released = {(entry.allocation_id, entry.array_task) for entry in entries if entry.kind == LedgerKind.RELEASE}
    return [
        entry
        for entry in entries
        if entry.kind == LedgerKind.RESERVE and (entry.allocation_id, entry.array_task) not in released
    ]


def _release(*, reservation: LedgerEntry, note: str) -> None:
    """Give a reservation back; the allocation must be locked."""
    _release_all([reservation], note=note)


def _lock(allocation_ids: set[int | None]) -> None:
    ids = sorted(pk for pk in allocation_ids if pk is not None)  # one order everywhere: no deadlocks
    if ids:
        list(
            Allocation.objects.select_for_update(of=("self",), no_key=True)
            .filter(pk__in=ids)
            .order_by("pk")
            .values_list("pk", flat=True)
        )


def quota_release(*, job: Job, note: str) -> int:
    """Give back the job's open reservation without a charge (it never ran). Returns GPU-seconds released."""
    with transaction.atomic():
        open_entries = _open_reservations(job)
        _lock({entry.allocation_id for entry in open_entries})
        open_entries = _open_reservations(job)  # again, under the lock
        _release_all(open_entries, note=note)
    return sum(entry.gpu_seconds for entry in open_entries)


def quota_charge(*, job: Job, gpu_seconds: int, now: datetime, note: str) -> bool:
    """Replace the job's reservation by what it really used (GPU-seconds from Slurm's accounting).

    The charge lands on the allocation that holds the job's reservation; a job without one (found in Slurm
    after it ended) is charged to the allocation for its GPU type open when it ended, or to none. False when
    the job was charged already: charging is idempotent.
    """
    if gpu_seconds < 0:
        raise ValueError(f"negative usage {gpu_seconds} for job {job.pk}")
    try:
        with transaction.atomic():
            open_entries = _open_reservations(job)
            target_id: int | None
            if open_entries:
                target_id = open_entries[-1].allocation_id
            else:
                ended = job.ended_at or now
                candidates = allocations_current(project_id=job.project_id, cluster_id=job.cluster_id, now=ended)
                chosen = allocation_for(candidates=candidates, gpu_type=job.gpu_type or None) or (
                    candidates[0] if candidates else None
                )
                target_id = chosen.pk if chosen else None
            _lock({target_id, *(entry.allocation_id for entry in open_entries)})
            if LedgerEntry.objects.filter(job=job, kind=LedgerKind.CHARGE).exists():
                return False
            target = Allocation.objects.filter(pk=target_id).first() if target_id is not None else None
            released_on_target = 0
            for entry in _open_reservations(job):
                _release(reservation=entry, note="replaced by the charge")
                if entry.allocation_id == target_id:
                    released_on_target += entry.gpu_seconds
            ledger_add(
                allocation_id=target_id,
                project_id=job.project_id,
                cluster_id=job.cluster_id,
                kind=LedgerKind.CHARGE,
                gpu_seconds=gpu_seconds,
                job=job,
                note=note,
                created_at=now,
            )
            if target is not None:
                Allocation.objects.filter(pk=target.pk).update(
                    charged_gpu_seconds=F("charged_gpu_seconds") + gpu_seconds
                )
                used = target.charged_gpu_seconds + target.reserved_gpu_seconds
                if crosses_alert_threshold(
                    granted=target.granted_gpu_seconds,
                    used_before=used,
                    used_after=used - released_on_target + gpu_seconds,
                ):
                    _schedule_alerts(target.pk)
    except IntegrityError:
        return False  # a parallel import charged it first
    return True


def quota_release_tasks(*, job: Job, tasks: set[int], note: str) -> int:
    """Give back the reservations of these tasks of an array (they never ran). Returns GPU-seconds released."""
    with transaction.atomic():
        open_entries = _open_reservations(job, tasks=tasks)
        _lock({entry.allocation_id for entry in open_entries})
        open_entries = _open_reservations(job, tasks=tasks)  # again, under the lock
        _release_all(open_entries, note=note)
    return sum(entry.gpu_seconds for entry in open_entries)


def _release_all(entries: list[LedgerEntry], *, note: str) -> None:
    """`_release` for many reservations in one insert and one update per allocation (locked by the caller)."""
    ledger_add_many(
        LedgerEntry(
            allocation_id=entry.allocation_id,
            project_id=entry.project_id,
            cluster_id=entry.cluster_id,
            kind=LedgerKind.RELEASE,
            gpu_seconds=entry.gpu_seconds,
            job_id=entry.job_id,
            array_task=entry.array_task,
            note=note,
        )
        for entry in entries
    )
    by_allocation: dict[int, int] = {}
    for entry in entries:
        assert entry.allocation_id is not None, "a reservation always belongs to an allocation"
        by_allocation[entry.allocation_id] = by_allocation.get(entry.allocation_id, 0) + entry.gpu_seconds
    for allocation_id, gpu_seconds in by_allocation.items():
        Allocation.objects.filter(pk=allocation_id).update(reserved_gpu_seconds=F("reserved_gpu_seconds") - gpu_seconds)


@dataclass(frozen=True)
class TaskCharge:
    """What one ended task of an array really used, from Slurm's accounting."""

    gpu_seconds: int
    note: str


def quota_charge_tasks(*, job: Job, charges: dict[int, TaskCharge], now: datetime) -> int:
    """Replace the reservations of these ended tasks of an array by what each really used, in a constant number of
    statements whatever their number. A task charged before is skipped (charging is idempotent, per task, by a
    database constraint). Returns how many tasks were charged now."""
    if not charges:
        return 0
    for index, charge in charges.items():
        if charge.gpu_seconds < 0:
            raise ValueError(f"negative usage {charge.gpu_seconds} for task {index} of job {job.pk}")
    with transaction.atomic():
        open_entries = _open_reservations(job, tasks=set(charges))
        target_id: int | None = open_entries[-1].allocation_id if open_entries else None
        if target_id is None:
            candidates = allocations_current(
                project_id=job.project_id, cluster_id=job.cluster_id, now=job.ended_at or now
            )
            chosen = allocation_for(candidates=candidates, gpu_type=job.gpu_type or None) or (
                candidates[0] if candidates else None
            )
            target_id = chosen.pk if chosen else None
        _lock({target_id, *(entry.allocation_id for entry in open_entries)})
        charged_before = set(
            LedgerEntry.objects.filter(job=job, kind=LedgerKind.CHARGE, array_task__in=list(charges)).values_list(
                "array_task", flat=True
            )
        )
        due = {index: charge for index, charge in charges.items() if index not in charged_before}
        if not due:
            return 0
        target = Allocation.objects.filter(pk=target_id).first() if target_id is not None else None
        releasing = [entry for entry in _open_reservations(job, tasks=set(due))]
        _release_all(releasing, note="replaced by the charge")
        ledger_add_many(
            LedgerEntry(
                allocation_id=target_id,
                project_id=job.project_id,
                cluster_id=job.cluster_id,
                kind=LedgerKind.CHARGE,
                gpu_seconds=charge.gpu_seconds,
                job=job,
                array_task=index,
                note=charge.note,
                created_at=now,
            )
            for index, charge in due.items()
        )
        if target is not None:
            used_seconds = sum(charge.gpu_seconds for charge in due.values())
            released_on_target = sum(entry.gpu_seconds for entry in releasing if entry.allocation_id == target.pk)
            Allocation.objects.filter(pk=target.pk).update(charged_gpu_seconds=F("charged_gpu_seconds") + used_seconds)
            used = target.charged_gpu_seconds + target.reserved_gpu_seconds
            if crosses_alert_threshold(
                granted=target.granted_gpu_seconds,
                used_before=used,
                used_after=used - released_on_target + used_seconds,
            ):
                _schedule_alerts(target.pk)
    return len(due)


# Period rollover ----------------------------------------------------------------------------------------


def quota_carry_over(*, now: datetime) -> int:
    """Move the open reservations of allocations whose period has ended into the next allocation of the same
    project, cluster and GPU type, if one is open: a job that runs across the boundary is used in the new
    period, in Slurm's count as in the portal's. Returns the number of reservations moved."""
    today = now.date()
    moved = 0
    ended_with_reservations = Allocation.objects.filter(ends_on__lt=today, reserved_gpu_seconds__gt=0)
    for old in ended_with_reservations:
        successor = Allocation.objects.filter(
            project_id=old.project_id,
            cluster_id=old.cluster_id,
            gpu_type=old.gpu_type,
            starts_on__lte=today,
            ends_on__gte=today,
        ).first()
        if successor is None:
            continue
        with transaction.atomic():
            _lock({old.pk, successor.pk})
            successor.refresh_from_db()
            used_before = successor.charged_gpu_seconds + successor.reserved_gpu_seconds
            carried = 0
            entries = list(
                LedgerEntry.objects.filter(allocation=old, kind__in=[LedgerKind.RESERVE, LedgerKind.RELEASE])
            )
            released = {(entry.job_id, entry.array_task) for entry in entries if entry.kind == LedgerKind.RELEASE}
            for entry in entries:
                if entry.kind != LedgerKind.RESERVE or (entry.job_id, entry.array_task) in released:
                    continue
                if entry.job_id is None:
                    continue
                _release(reservation=entry, note=f"carried into the period from {successor.starts_on}")
                ledger_add(
                    allocation=successor,
                    project_id=successor.project_id,
                    cluster_id=successor.cluster_id,
                    kind=LedgerKind.RESERVE,
                    gpu_seconds=entry.gpu_seconds,
                    job_id=entry.job_id,
                    array_task=entry.array_task,
                    note=f"carried over from the period ending {old.ends_on}",
                )
                Allocation.objects.filter(pk=successor.pk).update(
                    reserved_gpu_seconds=F("reserved_gpu_seconds") + entry.gpu_seconds
                )
                moved += 1
                carried += entry.gpu_seconds
            if crosses_alert_threshold(
                granted=successor.granted_gpu_seconds, used_before=used_before, used_after=used_before + carried
            ):
                _schedule_alerts(successor.pk)
    return moved


# The GPU-minute limit Slurm should hold ------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedLimit:
    """The limit for a project's account on a cluster, and what it is made of (all GPU-seconds)."""

    opening_gpu_seconds: int  # usage in Slurm before the portal tracked the account
    charged_before_gpu_seconds: int  # charged outside the allocations open now: past periods, or none
    granted_now_gpu_seconds: int  # granted on the allocations open now
    carried_gpu_seconds: int  # still reserved on closed allocations: admitted jobs that may yet run

    @property
    def gpu_seconds(self) -> int:
        return (
            self.opening_gpu_seconds
            + self.charged_before_gpu_seconds
            + self.granted_now_gpu_seconds
            + self.carried_gpu_seconds
        )


def quota_expected_limit(*, project_id: int, cluster_id: int, opening_gpu_seconds: int, now: datetime) -> ExpectedLimit:
    """Slurm's usage counter for the account never resets here (PriorityDecayHalfLife=0,
    PriorityUsageResetPeriod=NONE), so the limit is the usage Slurm has counted before the open period plus
    what the open period grants (the cumulative approach of Pitt's Keystone). The usage before is read from
    the ledger, whose charges come from Slurm's own accounting, plus the opening usage."""
    pair = (project_id, cluster_id)
    return quota_expected_limits(openings={pair: opening_gpu_seconds}, now=now)[pair]


def quota_expected_limits(
    *, openings: dict[tuple[int, int], int], now: datetime
) -> dict[tuple[int, int], ExpectedLimit]:
    """`quota_expected_limit` for many (project, cluster) pairs (keys of `openings`, their opening usage) in one
    query, for the periodic run over every project."""
    today = now.date()
    closed = Q(allocation__ends_on__lt=today)
    open_now = Q(allocation__starts_on__lte=today, allocation__ends_on__gte=today)
    rows = (
        LedgerEntry.objects.filter(
            project_id__in={project_id for project_id, _ in openings},
            cluster_id__in={cluster_id for _, cluster_id in openings},
        )
        .values("project_id", "cluster_id")
        .annotate(
            charged_before=Coalesce(
                Sum("gpu_seconds", filter=Q(kind=LedgerKind.CHARGE) & (closed | Q(allocation=None))), 0
            ),
            granted_now=Coalesce(Sum("gpu_seconds", filter=Q(kind=LedgerKind.GRANT) & open_now), 0),
            reserved_closed=Coalesce(Sum("gpu_seconds", filter=Q(kind=LedgerKind.RESERVE) & closed), 0),
            released_closed=Coalesce(Sum("gpu_seconds", filter=Q(kind=LedgerKind.RELEASE) & closed), 0),
        )
        .order_by()
    )
    sums: dict[tuple[int, int], dict[str, Any]] = {(row["project_id"], row["cluster_id"]): dict(row) for row in rows}
    limits: dict[tuple[int, int], ExpectedLimit] = {}
    for pair, opening in openings.items():
        row: dict[str, Any] = sums.get(pair, {})
        limits[pair] = ExpectedLimit(
            opening_gpu_seconds=opening,
            charged_before_gpu_seconds=int(row.get("charged_before", 0)),
            granted_now_gpu_seconds=int(row.get("granted_now", 0)),
            carried_gpu_seconds=int(row.get("reserved_closed", 0)) - int(row.get("released_closed", 0)),
        )
    return limits
