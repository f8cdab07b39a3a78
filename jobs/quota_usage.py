"""What jobs really cost: releases for jobs that never ran, charges from Slurm's accounting, reservations for jobs
found running outside the portal.

Runs after each periodic job sync of a cluster. A job ends in the portal as soon as slurmctld reports it;
its accounting record (elapsed time, allocated GPUs) reaches slurmdbd a moment later, so a job whose record
is not there yet simply stays uncharged until a later run finds it. Every step is idempotent (the ledger
allows one charge per job and one release per reservation), so overlapping runs are harmless.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from clusters.models import Cluster
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import AccountingRecord
from jobs.gpu_utilisation import job_efficiency_from_accounting
from jobs.job_sync import RESTART_TOLERANCE
from jobs.models import FINAL_JOB_STATES, Job, JobArrayTask
from quotas.models import Allocation, LedgerEntry, LedgerKind, QuotaLimitState
from quotas.services import (
    TaskCharge,
    quota_charge,
    quota_charge_tasks,
    quota_release,
    quota_release_tasks,
    quota_reserve_found,
)

logger = logging.getLogger(__name__)

# Jobs charged per run, oldest first: a backlog (after slurmdbd was down) is worked off over a few runs.
CHARGE_BATCH_SIZE = 500
# The accounting window opens this long before the oldest job's start: Slurm's clock and the portal's differ
# a little, and a job's recorded start can precede the moment the sync saw it running.
ACCOUNTING_WINDOW_MARGIN = timedelta(minutes=10)
# A job whose record has not appeared after this long is no longer looked for: its reservation stays held
# (Slurm counted the job, if it ran, so holding the most it could have used stays on the safe side) and
# every run would otherwise fetch ever longer windows of accounting. The warning below names such jobs first.
CHARGE_GIVE_UP_AFTER = timedelta(days=1)
# A job the window query did not return although it ended this long ago is looked up by its id (at most
# ACCOUNTING_BY_ID_PER_RUN per run): on 22.05 the window query has, rarely, left out a record that the
# by-id lookup returned at the same moment.
ACCOUNTING_BY_ID_AFTER = timedelta(seconds=20)
ACCOUNTING_BY_ID_PER_RUN = 20
# slurmdbd normally has a record within seconds; one missing for longer than this deserves a warning.
ACCOUNTING_LAG_WARNING = timedelta(minutes=10)


@dataclass(frozen=True)
class QuotaUsageResult:
    released: int = 0  # reservations of jobs that never ran, given back
    charged: int = 0  # jobs charged what Slurm's accounting says they used
    awaiting_accounting: int = 0  # ended jobs whose record slurmdbd does not have yet
    reserved_external: int = 0  # jobs found running outside the portal, now reserved
    accounting_requests: int = 0
    accounting_error: str = ""  # why the accounting request failed; its jobs are tried on the next run
    tasks_charged: int = 0  # array tasks charged what they used (each task once, as it ends)
    tasks_awaiting_accounting: int = 0


def quota_usage_collect(*, cluster: Cluster, client: SlurmClient, now: datetime | None = None) -> QuotaUsageResult:
    """Release, charge and reserve for the cluster's jobs, in a constant number of queries and at most one
    accounting request."""
    now = now or timezone.now()
    released = _release_never_ran(cluster=cluster) + _release_tasks_never_ran(cluster=cluster)
    charges = _charge_ended(cluster=cluster, client=client, now=now)
    task_charges = _charge_ended_tasks(cluster=cluster, client=client, now=now)
    reserved = _reserve_externals(cluster=cluster, now=now)
    return QuotaUsageResult(
        released=released,
        charged=charges.charged,
        awaiting_accounting=charges.awaiting,
        reserved_external=reserved,
        accounting_requests=charges.requests + task_charges.requests,
        accounting_error=charges.error or task_charges.error,
        tasks_charged=task_charges.charged,
        tasks_awaiting_accounting=task_charges.awaiting,
    )


def _open_reservation() -> Exists:
    """A reserve row of the outer job with no release of it on the same allocation."""
    released = LedgerEntry.objects.filter(
        job_id=OuterRef("job_id"), allocation_id=OuterRef("allocation_id"), kind=LedgerKind.RELEASE
    )
    return Exists(LedgerEntry.objects.filter(job_id=OuterRef("pk"), kind=LedgerKind.RESERVE).exclude(Exists(released)))


def _charged() -> Exists:
    return Exists(LedgerEntry.objects.filter(job_id=OuterRef("pk"), kind=LedgerKind.CHARGE))


def _tracked_after_end() -> Exists:
    """The portal started tracking the job's project on this cluster after the job ended: its usage is part
    of the opening usage the limit already counts, and charging it too would count it twice."""
    return Exists(
        QuotaLimitState.objects.filter(
            project_id=OuterRef("project_id"),
            cluster_id=OuterRef("cluster_id"),
            tracking_started_at__gt=OuterRef("ended_at"),
        )
    )


def _release_never_ran(*, cluster: Cluster) -> int:
    """Give back the reservations of ended jobs that never started (rejected, cancelled while queued or
    pending), and of jobs that ended before the portal tracked their account's usage."""
    jobs = (
        Job.objects.filter(cluster=cluster, state__in=FINAL_JOB_STATES, array_task_count=0)
        .filter(Q(started_at__isnull=True) | _tracked_after_end())
        .filter(_open_reservation())
        .order_by("ended_at", "pk")[:CHARGE_BATCH_SIZE]
    )
    released = 0
    for job in jobs:
        if job.started_at is None:
            note = f"never ran ({job.get_state_display().lower()})"
        else:
            note = "ended before the portal tracked the account's usage (in its opening usage)"
        if quota_release(job=job, note=note):
            released += 1
    return released


def _chargeable(*, cluster: Cluster, now: datetime) -> QuerySet[Job]:
    return (
        Job.objects.filter(
            cluster=cluster,
            state__in=FINAL_JOB_STATES,
            started_at__isnull=False,
            ended_at__isnull=False,
            ended_at__gte=now - CHARGE_GIVE_UP_AFTER,
            slurm_job_id__isnull=False,
            gpus__gt=0,
            array_task_count=0,  # an array is charged task by task: `_charge_ended_tasks`
        )
        .exclude(_charged())
        .exclude(_tracked_after_end())
        .select_related("project")
        .order_by("ended_at", "pk")
    )


@dataclass(frozen=True)
class _Charges:
    charged: int = 0
    awaiting: int = 0
    requests: int = 0
    error: str = ""


def _charge_ended(*, cluster: Cluster, client: SlurmClient, now: datetime) -> _Charges:
    """Charge ended jobs what their accounting records say, from one accounting request for all of them."""
    jobs = list(_chargeable(cluster=cluster, now=now)[:CHARGE_BATCH_SIZE])
    if not jobs:
        return _Charges()
    accounts = sorted({job.project.slurm_account for job in jobs})
    oldest_start = min(job.started_at for job in jobs if job.started_at is not None)
    # slurmrestd 22.05 (dbv0.0.38) takes a comma-separated list of accounts, as sacct -A does (tried on
    # the local cluster); the window holds every job still running at, or started after, its start.
    try:
        records = client.accounting_jobs(account=",".join(accounts), start_time=oldest_start - ACCOUNTING_WINDOW_MARGIN)
    except SlurmError as exc:
        # Releases and reservations need no Slurm request and go ahead; these jobs wait for the next run.
        logger.warning("cluster %s: accounting request for %d ended jobs failed: %s", cluster.name, len(jobs), exc)
        return _Charges(awaiting=len(jobs), requests=1, error=str(exc)[:2000])
    by_id: dict[int, list[AccountingRecord]] = {}
    for found in records:
        if found.state.is_finished and found.end_time is not None and found.cluster in {"", cluster.name}:
            by_id.setdefault(found.job_id, []).append(found)

    charged = 0
    requests = 1
    awaiting: list[Job] = []
    by_id_left = ACCOUNTING_BY_ID_PER_RUN
    for job in jobs:
        attempts = accounting_attempts_of(job, by_id.get(job.slurm_job_id or 0, []))
        if not attempts and by_id_left and job.ended_at is not None and now - job.ended_at > ACCOUNTING_BY_ID_AFTER:
            by_id_left -= 1
            requests += 1
            attempts = _attempts_by_id(client=client, job=job, cluster=cluster)
        if not attempts:
            awaiting.append(job)
            continue
        last = attempts[-1]
        if not job.gpu_type and last.gpu_type:
            # A job that asked for any type ran on some type: that type's allocation and price apply. Set before
            # the charge, which billing prices as soon as it is committed.
            Job.objects.filter(pk=job.pk, gpu_type="").update(gpu_type=last.gpu_type)
            job.gpu_type = last.gpu_type
        gpu_seconds = sum(attempt.gpu_seconds for attempt in attempts)
        if quota_charge(job=job, gpu_seconds=gpu_seconds, now=now, note=charge_note(attempts)):
            charged += 1
            job_efficiency_from_accounting(job=job, cluster=cluster, record=last, gpu_seconds=gpu_seconds)
    overdue = [job for job in awaiting if job.ended_at is not None and now - job.ended_at > ACCOUNTING_LAG_WARNING]
    if overdue:
        oldest = overdue[0]
        logger.warning(
            "cluster %s: %d ended jobs have had no accounting record for over %s (oldest: job %s, Slurm job %s, "
            "ended %s); they stay reserved, uncharged",
            cluster.name,
            len(overdue),
            ACCOUNTING_LAG_WARNING,
            oldest.pk,
            oldest.slurm_job_id,
            oldest.ended_at,
        )
    return _Charges(charged=charged, awaiting=len(awaiting), requests=requests)


def _attempts_by_id(*, client: SlurmClient, job: Job, cluster: Cluster) -> list[AccountingRecord]:
    try:
        found = client.accounting_job_records(job_id=job.slurm_job_id or 0)
    except SlurmError as exc:
        logger.info("cluster %s: accounting of Slurm job %s not available: %s", cluster.name, job.slurm_job_id, exc)
        return []
    return accounting_attempts_of(job, [record for record in found if record.state.is_finished and record.end_time])


def accounting_attempts_of(job: Job, candidates: list[AccountingRecord]) -> list[AccountingRecord]:
    """The job's finished accounting records, one per attempt, oldest first; empty until its last attempt's is there.

    A job that Slurm requeued (its node failed, it was preempted) has a record for every run, each with the
    GPU-seconds of that run: together they are what the job really used. The record of the attempt that
    ended it reaches slurmdbd a moment after the job ends, and until it does the earlier ones alone would
    undercharge: the last attempt is known by its start, the one the portal recorded as the job's.
    """
    attempts = sorted(
        (record for record in candidates if is_accounting_record_of(job, record)),
        key=lambda record: record.start_time or record.submit_time or datetime.min.replace(tzinfo=UTC),
    )
    if not attempts:
        return []
    # The portal's start of the job is its last attempt's (both are slurmctld's start time).
    last_start = attempts[-1].start_time
    if job.started_at is not None and last_start is not None and last_start < job.started_at - RESTART_TOLERANCE:
        return []
    return attempts


def charge_note(attempts: list[AccountingRecord]) -> str:
    """`Slurm job 12: 7 s x 1 GPUs (NODE_FAIL, requeued) + 60 s x 1 GPUs`: the charge's sum, attempt by attempt."""
    runs = [f"{record.elapsed_seconds} s x {record.gpus_allocated} GPUs" for record in attempts]
    for index, record in enumerate(attempts[:-1]):
        runs[index] += f" ({record.state.value}, requeued)"
    return f"Slurm job {attempts[-1].job_id}: " + " + ".join(runs)


def is_accounting_record_of(job: Job, record: AccountingRecord) -> bool:
    """Whether an accounting record is the job's own: Slurm reuses ids after its state is reset, so the id
    alone could name another job. A portal job carries its tag in the comment (which 22.05's accounting holds
    once the job has ended); an external job is known by its submit time."""
    if record.job_id != job.slurm_job_id or record.account != job.project.slurm_account:
        return False
    if job.is_external:
        return job.slurm_submit_time is not None and record.submit_time == job.slurm_submit_time
    return record.comment == job.slurm_comment


# Array tasks ----------------------------------------------------------------------------------------------


def _task_reservation_open() -> Exists:
    """The outer task has a reservation that no release gives back."""
    released = LedgerEntry.objects.filter(
        job_id=OuterRef("job_id"),
        array_task=OuterRef("array_task"),
        allocation_id=OuterRef("allocation_id"),
        kind=LedgerKind.RELEASE,
    )
    return Exists(
        LedgerEntry.objects.filter(
            job_id=OuterRef("job_id"), array_task=OuterRef("index"), kind=LedgerKind.RESERVE
        ).exclude(Exists(released))
    )


def _release_tasks_never_ran(*, cluster: Cluster) -> int:
    """Give back the reservations of array tasks that ended without running (cancelled while waiting), and of
    every task that never ran of an array that ended (rejected, cancelled before Slurm had it)."""
    ended_unrun = Q(state__in=FINAL_JOB_STATES) | Q(job__state__in=FINAL_JOB_STATES)
    tasks = (
        JobArrayTask.objects.filter(job__cluster=cluster, started_at__isnull=True)
        .filter(ended_unrun)
        .filter(_task_reservation_open())
        .values_list("job_id", "index")[: CHARGE_BATCH_SIZE * 4]
    )
    by_job: dict[uuid.UUID, set[int]] = {}
    for job_id, index in tasks:
        by_job.setdefault(job_id, set()).add(index)
    released = 0
    for job in Job.objects.filter(pk__in=list(by_job)):
        if quota_release_tasks(job=job, tasks=by_job[job.pk], note="task never ran"):
            released += len(by_job[job.pk])
    return released


def _charge_ended_tasks(*, cluster: Cluster, client: SlurmClient, now: datetime) -> _Charges:
    """Charge each ended array task what its accounting record says, once: one accounting request for all the
    tasks due, then one charge per array (a few statements, whatever its number of tasks)."""
    charged_task = LedgerEntry.objects.filter(
        job_id=OuterRef("job_id"), array_task=OuterRef("index"), kind=LedgerKind.CHARGE
    )
    tasks = list(
        JobArrayTask.objects.filter(
            job__cluster=cluster,
            state__in=FINAL_JOB_STATES,
            started_at__isnull=False,
            ended_at__gte=now - CHARGE_GIVE_UP_AFTER,
            job__slurm_job_id__isnull=False,
            job__gpus__gt=0,
        )
        .exclude(Exists(charged_task))
        .select_related("job__project")
        .order_by("ended_at", "pk")[: CHARGE_BATCH_SIZE * 4]
    )
    if not tasks:
        return _Charges()
    accounts = sorted({task.job.project.slurm_account for task in tasks})
    oldest_start = min(task.started_at for task in tasks if task.started_at is not None)
    try:
        records = client.accounting_jobs(account=",".join(accounts), start_time=oldest_start - ACCOUNTING_WINDOW_MARGIN)
    except SlurmError as exc:
        logger.warning("cluster %s: accounting request for %d ended tasks failed: %s", cluster.name, len(tasks), exc)
        return _Charges(awaiting=len(tasks), requests=1, error=str(exc)[:2000])
    # A task's records (one per run, when Slurm requeued it) by (array, index, tag).
    runs: dict[tuple[int, int, str], list[AccountingRecord]] = {}
    for record in records:
        if record.array_job_id is None or record.array_task_id is None or not record.state.is_finished:
            continue
        if record.cluster in {"", cluster.name} and record.end_time is not None:
            runs.setdefault((record.array_job_id, record.array_task_id, record.comment), []).append(record)
    due: dict[uuid.UUID, dict[int, TaskCharge]] = {}
    jobs: dict[uuid.UUID, Job] = {}
    awaiting = 0
    for task in tasks:
        job = task.job
        found = runs.get((job.slurm_job_id or 0, task.index, job.slurm_comment), [])
        found = [record for record in found if record.account == job.project.slurm_account]
        if not found:
            awaiting += 1
            continue
        found.sort(key=lambda record: record.start_time or record.submit_time or datetime.min.replace(tzinfo=UTC))
        jobs[job.pk] = job
        due.setdefault(job.pk, {})[task.index] = TaskCharge(
            gpu_seconds=sum(record.gpu_seconds for record in found), note=f"task {task.index}: " + charge_note(found)
        )
    charged = sum(quota_charge_tasks(job=jobs[job_id], charges=charges, now=now) for job_id, charges in due.items())
    return _Charges(charged=charged, awaiting=awaiting, requests=1)


def _reserve_externals(*, cluster: Cluster, now: datetime) -> int:
    """Reserve for jobs running or pending in a project's account outside the portal: Slurm counts them
    against the account's limit, so the portal's balance must count them too."""
    today = now.date()
    has_allocation = Exists(
        Allocation.objects.filter(
            project_id=OuterRef("project_id"), cluster=cluster, starts_on__lte=today, ends_on__gte=today
        )
    )
    reserved_ever = Exists(LedgerEntry.objects.filter(job_id=OuterRef("pk"), kind=LedgerKind.RESERVE))
    jobs = (
        Job.objects.filter(cluster=cluster, is_external=True, gpus__gt=0, time_limit_minutes__gt=0)
        .exclude(state__in=FINAL_JOB_STATES)
        .filter(has_allocation)
        .exclude(reserved_ever)
        .order_by(Coalesce("submitted_at", "created_at"), "pk")[:CHARGE_BATCH_SIZE]
    )
    return sum(1 for job in jobs if quota_reserve_found(job=job, now=now))
