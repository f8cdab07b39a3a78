"""Rebuilding from Slurm the jobs a restore of the database lost (see jobs/database_restores.py for the whole way).

A lost job is a tagged Slurm job, in a portal project's account, that no portal job matches. It comes back under
its original id with what Slurm knows of it, reserved and charged once through the quota ledger. A lost array
(its tasks' records share the tag) comes back as one job with a task row for each index Slurm names (its tasks'
records and its waiting record), reserved task by task and each task that ran charged once.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from clusters.models import Cluster, ClusterAccount, ProjectSlurmAccount
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import AccountingRecord, SlurmJob
from jobs.array_sync import array_rebuilt_apply, waiting_indexes
from jobs.job_services import jobs_push
from jobs.job_sync import slurm_record_apply
from jobs.models import (
    FINAL_JOB_STATES,
    RECOVERED_DETAIL,
    ClusterRecovery,
    Job,
    JobArrayTask,
    JobState,
    JobTransition,
    job_id_from_tag,
)
from jobs.paths import job_paths
from jobs.quota_usage import accounting_attempts_of, charge_note
from quotas.services import TaskCharge, quota_charge, quota_charge_tasks, quota_reserve_found
from tenants.models import Project
from tenants.services import audit_record

logger = logging.getLogger(__name__)

# Slurm is searched from this long before the restored copy's last check: Slurm's clock and the portal's differ
# a little, and a job accepted just before the backup may have reached Slurm just after it.
SEARCH_MARGIN = timedelta(minutes=10)
# A cluster's recovery ends with its first search this long after the restore was noticed: a job submitted
# moments before reaches slurmdbd a little later, so the first search alone could miss it in accounting.
SETTLE_AFTER = timedelta(minutes=2)
# Accounts per accounting request: the list travels in the query string, which slurmrestd limits.
ACCOUNTS_PER_REQUEST = 100
# Rebuilds of one cluster's jobs take this advisory lock (with the cluster's id): the sync and the search may
# find the same lost job at once.
_REBUILD_LOCK_ID = 0x72656275  # "rebu"


# Rebuilding lost jobs ---------------------------------------------------------------------------------


@dataclass
class RebuildResult:
    rebuilt: list[uuid.UUID] = field(default_factory=list)
    charged: int = 0
    not_rebuilt: list[dict[str, Any]] = field(default_factory=list)  # tagged jobs that could not be, with why


def _newest(records: Sequence[SlurmJob | AccountingRecord]) -> SlurmJob | AccountingRecord:
    """The job's current attempt: the live listing's, else its newest accounting record."""
    listed = [record for record in records if isinstance(record, SlurmJob)]
    if listed:
        return listed[0]
    oldest = datetime.min.replace(tzinfo=UTC)
    return max(records, key=lambda record: (record.start_time or record.submit_time or oldest, record.job_id))


def jobs_rebuild(
    *, cluster: Cluster, found: Sequence[SlurmJob | AccountingRecord], now: datetime | None = None
) -> RebuildResult:
    """Rebuild the portal jobs that Slurm has (tagged in a project's account) and the database has lost.

    `found` may hold several records of one job (the listing's and accounting's, one per attempt). A job is
    rebuilt once, under its original id, and reserved like a job found in Slurm; one that has ended is charged
    from its accounting records here (the usage collection would charge it too, but not one that ended longer
    ago than it looks). Jobs that exist are left alone: a second call does nothing.
    """
    now = now or timezone.now()
    result = RebuildResult()
    by_tag: dict[uuid.UUID, list[SlurmJob | AccountingRecord]] = defaultdict(list)
    for record in found:
        job_id = job_id_from_tag(record.comment)
        if job_id is not None:
            by_tag[job_id].append(record)
    if not by_tag:
        return result
    projects = {project.slurm_account: project for project in Project.objects.select_related("tenant")}
    created: list[Job] = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_REBUILD_LOCK_ID, cluster.pk])
        existing = set(Job.objects.filter(pk__in=list(by_tag)).values_list("pk", flat=True))
        users = dict(ClusterAccount.objects.filter(cluster=cluster).values_list("username", "user_id"))
        transitions: list[JobTransition] = []
        array_tasks: list[JobArrayTask] = []
        for job_id, records in by_tag.items():
            if job_id in existing:
                continue
            current = _newest(records)
            project = projects.get(current.account)
            if project is None:
                result.not_rebuilt.append(_not_rebuilt(current, f"account {current.account!r} is no portal project's"))
                continue
            user_id = users.get(current.user_name)
            if any(record.array_job_id is not None for record in records):
                array = _rebuilt_array(
                    job_id=job_id, cluster=cluster, project=project, records=records, user_id=user_id
                )
                if isinstance(array, str):
                    result.not_rebuilt.append(_not_rebuilt(current, array))
                    continue
                job, tasks, timeline = array
                array_tasks.extend(tasks)
            else:
                job, timeline = _rebuilt(
                    job_id=job_id, cluster=cluster, project=project, record=current, user_id=user_id
                )
            created.append(job)
            transitions.extend(timeline)
        Job.objects.bulk_create(created, batch_size=500)
        JobArrayTask.objects.bulk_create(array_tasks, batch_size=1000)
        JobTransition.objects.bulk_create(transitions, batch_size=500)
        by_project: dict[Project, list[str]] = defaultdict(list)
        for job in created:
            by_project[job.project].append(str(job.pk))
        for project, job_ids in by_project.items():
            audit_record(
                actor=None,
                action="job.recover",
                target=project,
                tenant=project.tenant,
                before=None,
                after={"cluster": cluster.name, "jobs": job_ids},
            )
        rebuilt_ids = [job.pk for job in created]
        transaction.on_commit(lambda: jobs_push(rebuilt_ids))
    result.rebuilt = rebuilt_ids
    for job in created:
        # Reserved as when it was accepted (on the allocation of that moment), so that its ledger reads as any
        # job's: reserved once, then released or charged.
        quota_reserve_found(job=job, now=job.submitted_at or now, note="recovered after a restore")
        if job.is_array:
            if job.gpus > 0:
                result.charged += _charge_tasks(job=job, records=by_tag[job.pk], now=now)
        elif job.state in FINAL_JOB_STATES and job.started_at is not None and job.gpus > 0:
            result.charged += _charge(job=job, records=by_tag[job.pk], now=now)
    if created:
        logger.warning("cluster %s: rebuilt %d jobs lost by a restore from Slurm", cluster.name, len(created))
    return result


def _not_rebuilt(record: SlurmJob | AccountingRecord, reason: str) -> dict[str, Any]:
    return {
        "slurm_job_id": record.job_id,
        "account": record.account,
        "user": record.user_name,
        "comment": record.comment,
        "reason": reason,
    }


def _rebuilt(
    *, job_id: uuid.UUID, cluster: Cluster, project: Project, record: SlurmJob | AccountingRecord, user_id: int | None
) -> tuple[Job, list[JobTransition]]:
    """The lost job as Slurm knows it, and its timeline: recovered (pending in Slurm), then what Slurm says."""
    submitted = record.submit_time or record.start_time or timezone.now()
    paths = job_paths(
        log_root=cluster.log_root, tenant_slug=project.tenant.slug, project_slug=project.slug, job_id=job_id
    )
    listed = record if isinstance(record, SlurmJob) else None
    job = Job(
        id=job_id,
        project=project,
        cluster=cluster,
        user_id=user_id,
        cluster_username=record.user_name[:32],
        name=record.name[:200],
        partition=record.partition[:64],
        gpu_type=record.gpu_type or "",
        gpus=listed.gpus if listed is not None else record.gpus_allocated,  # type: ignore[union-attr]
        time_limit_minutes=record.time_limit_minutes or 0,
        working_directory=paths.working_directory,
        stdout_path=(listed.standard_output if listed is not None else "")[:1000] or paths.stdout,
        stderr_path=(listed.standard_error if listed is not None else "")[:1000] or paths.stderr,
        state=JobState.PENDING,
        slurm_job_id=record.job_id,
        slurm_submit_time=record.submit_time,
        created_at=submitted,
        submitted_at=submitted,
        updated_at=submitted,
    )
    timeline = [
        JobTransition(
            job=job,
            from_state="",
            to_state=JobState.PENDING,
            at=submitted,
            detail=f"{RECOVERED_DETAIL}: Slurm job {record.job_id}",
        )
    ]
    now = timezone.now()
    timeline.extend(slurm_record_apply(job=job, slurm_job=record, now=now) or [])
    job.updated_at = now
    return job, timeline


def _rebuilt_array(
    *,
    job_id: uuid.UUID,
    cluster: Cluster,
    project: Project,
    records: Sequence[SlurmJob | AccountingRecord],
    user_id: int | None,
) -> tuple[Job, list[JobArrayTask], list[JobTransition]] | str:
    """The lost array as Slurm knows it: one job, a task for each index Slurm names, and the array's timeline
    (recovered, then what its tasks say); or why it cannot be rebuilt."""
    # A second submission under the same tag (a duplicate the sync would cancel) is not this array.
    own_id = min(record.array_job_id or record.job_id for record in records)
    # A task's first record that ends it is the one a sync keeps: the controller's listing (with its exit code)
    # before accounting's.
    own = sorted(
        (record for record in records if (record.array_job_id or record.job_id) == own_id),
        key=lambda record: isinstance(record, AccountingRecord),
    )
    indexes: set[int] = set()
    for record in own:
        if record.array_task_id is not None:
            indexes.add(record.array_task_id)
        elif isinstance(record, SlurmJob):
            indexes.update(waiting_indexes(record.array_task_string))
    if not indexes:
        return "an array whose tasks Slurm does not name"
    listed = next((record for record in own if isinstance(record, SlurmJob)), None)
    first = listed or _newest(own)
    cap = next(
        (record.array_max_tasks for record in own if isinstance(record, SlurmJob) and record.array_max_tasks), None
    )
    submitted = (
        min((record.submit_time for record in own if record.submit_time is not None), default=None) or timezone.now()
    )
    paths = job_paths(
        log_root=cluster.log_root,
        tenant_slug=project.tenant.slug,
        project_slug=project.slug,
        job_id=job_id,
        is_array=True,
    )
    ordered = sorted(indexes)
    job = Job(
        id=job_id,
        project=project,
        cluster=cluster,
        user_id=user_id,
        cluster_username=first.user_name[:32],
        name=first.name[:200],
        partition=first.partition[:64],
        gpu_type=first.gpu_type or "",
        gpus=listed.gpus
        if listed is not None
        else max(record.gpus_allocated for record in own if isinstance(record, AccountingRecord)),
        time_limit_minutes=first.time_limit_minutes or 0,
        array=array_expression(ordered) + (f"%{cap}" if cap else ""),
        array_task_count=len(ordered),
        array_max_running=cap,
        array_progress={"pending": len(ordered)},
        working_directory=paths.working_directory,
        stdout_path=paths.stdout,
        stderr_path=paths.stderr,
        state=JobState.PENDING,
        slurm_job_id=own_id,
        slurm_submit_time=submitted,
        created_at=submitted,
        submitted_at=submitted,
        updated_at=submitted,
    )
    job.array_indexes = ordered  # type: ignore[attr-defined]  # the reservation's tasks, before they are stored
    tasks = [JobArrayTask(job=job, index=index, state=JobState.PENDING, updated_at=submitted) for index in ordered]
    timeline = [
        JobTransition(
            job=job,
            from_state="",
            to_state=JobState.PENDING,
            at=submitted,
            detail=f"{RECOVERED_DETAIL}: Slurm array {own_id}, {len(ordered)} tasks",
        )
    ]
    now = timezone.now()
    timeline.extend(array_rebuilt_apply(job=job, tasks=tasks, records=own, now=now))
    job.updated_at = now
    return job, tasks, timeline


def array_expression(indexes: Sequence[int]) -> str:
    """Sorted indexes written as `sbatch --array` takes them: runs as ranges ("0-3,7,9-10")."""
    parts: list[str] = []
    start = previous = indexes[0]
    for index in [*indexes[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    return ",".join(parts)


def _charge_tasks(*, job: Job, records: Sequence[SlurmJob | AccountingRecord], now: datetime) -> int:
    """Charge each ended task of a rebuilt array that ran what its accounting records say (each task once);
    the tasks whose records are not there yet are charged by the usage collection."""
    runs: dict[int, list[AccountingRecord]] = defaultdict(list)
    for record in records:
        if (
            isinstance(record, AccountingRecord)
            and record.array_job_id == job.slurm_job_id
            and record.array_task_id is not None
            and record.state.is_finished
            and record.end_time is not None
        ):
            runs[record.array_task_id].append(record)
    ran = JobArrayTask.objects.filter(job=job, state__in=list(FINAL_JOB_STATES), started_at__isnull=False).values_list(
        "index", flat=True
    )
    oldest = datetime.min.replace(tzinfo=UTC)
    charges: dict[int, TaskCharge] = {}
    for index in ran:
        found = sorted(runs.get(index, []), key=lambda record: record.start_time or record.submit_time or oldest)
        if found:
            charges[index] = TaskCharge(
                gpu_seconds=sum(record.gpu_seconds for record in found),
                note=f"task {index}: " + charge_note(found),
            )
    return quota_charge_tasks(job=job, charges=charges, now=now)


def _charge(*, job: Job, records: Sequence[SlurmJob | AccountingRecord], now: datetime) -> int:
    """Charge an ended rebuilt job what its accounting records say; 0 when they are not there yet (the usage
    collection charges it later) or it was charged already."""
    candidates = [
        record
        for record in records
        if isinstance(record, AccountingRecord) and record.state.is_finished and record.end_time is not None
    ]
    attempts = accounting_attempts_of(job, candidates)
    if not attempts:
        return 0
    gpu_seconds = sum(attempt.gpu_seconds for attempt in attempts)
    return int(quota_charge(job=job, gpu_seconds=gpu_seconds, now=now, note=charge_note(attempts)))


# Searching a cluster ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchResult:
    recovered: int = 0
    charged: int = 0
    finished: bool = False
    error: str = ""


def cluster_recovery_search(
    *, recovery: ClusterRecovery, client: SlurmClient, now: datetime | None = None
) -> SearchResult:
    """Search the cluster's Slurm for the jobs the restore lost and rebuild them; the recovery ends with a
    search made SETTLE_AFTER after the restore was noticed. A failed request leaves it open for the next run."""
    now = now or timezone.now()
    cluster = recovery.cluster
    since = recovery.restore.backup_after - SEARCH_MARGIN
    accounts = sorted(
        ProjectSlurmAccount.objects.filter(cluster=cluster).values_list("project__slurm_account", flat=True)
    )
    found: list[SlurmJob | AccountingRecord] = []
    try:
        for first in range(0, len(accounts), ACCOUNTS_PER_REQUEST):
            records = client.accounting_jobs(
                account=",".join(accounts[first : first + ACCOUNTS_PER_REQUEST]), start_time=since
            )
            found.extend(record for record in records if record.cluster in {"", cluster.name})
        listing = client.list_jobs()
    except SlurmError as exc:
        logger.warning("cluster %s: the search for jobs lost by the restore failed: %s", cluster.name, exc)
        ClusterRecovery.objects.filter(pk=recovery.pk).update(error=str(exc)[:2000], searched_at=now)
        return SearchResult(error=str(exc))
    in_accounts = set(accounts)
    found.extend(job for job in (listing.jobs if listing else ()) if job.account in in_accounts)
    result = jobs_rebuild(cluster=cluster, found=found, now=now)
    finished = now - recovery.restore.detected_at >= SETTLE_AFTER
    with transaction.atomic():
        locked = ClusterRecovery.objects.select_for_update(of=("self",)).get(pk=recovery.pk)
        known = {entry.get("slurm_job_id") for entry in locked.not_rebuilt}
        locked.not_rebuilt += [entry for entry in result.not_rebuilt if entry["slurm_job_id"] not in known]
        locked.searches += 1
        locked.searched_at = now
        locked.recovered_jobs += len(result.rebuilt)
        locked.error = ""
        if finished:
            locked.finished_at = now
        locked.save(update_fields=["not_rebuilt", "searches", "searched_at", "recovered_jobs", "error", "finished_at"])
    return SearchResult(recovered=len(result.rebuilt), charged=result.charged, finished=finished)


def recoveries_open(*, cluster_id: int) -> list[ClusterRecovery]:
    return list(
        ClusterRecovery.objects.filter(cluster_id=cluster_id, finished_at__isnull=True)
        .select_related("cluster", "restore")
        .order_by("restore__detected_at")
    )


def clusters_to_recover() -> list[int]:
    """The clusters with a recovery still open."""
    return sorted(
        set(
            ClusterRecovery.objects.filter(finished_at__isnull=True, cluster__is_active=True).values_list(
                "cluster_id", flat=True
            )
        )
    )
