"""Celery tasks for jobs: thin wrappers that load by id and call one service."""

from __future__ import annotations

import logging
import time
import uuid

from celery import shared_task
from django.conf import settings
from django.db import OperationalError
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.services import cluster_unreachable_record
from clusters.slurm import SlurmError, SlurmRetryableError
from jobs import array_sync, database_restores, gpu_utilisation, history_archive, job_recovery, job_sync, quota_usage
from jobs.sync_schedule import clusters_due_for_job_sync, job_sync_slot, quota_usage_collection_due
from portal import metrics

logger = logging.getLogger(__name__)


# Jobs ----------------------------------------------------------------------------------------------------


# A database error (a deadlock, a failover) is retried soon: delivery is idempotent, and the sweep would
# otherwise pick the job up only after JOB_SUBMIT_SWEEP_GRACE_SECONDS. A run stops claiming batches after
# JOB_DELIVERY_RUN_SECONDS, well inside the time limits.
@shared_task(
    ignore_result=True,
    soft_time_limit=60,
    time_limit=90,
    autoretry_for=(OperationalError,),
    retry_backoff=1,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=5,
)
def job_submit(job_id: str) -> None:
    """Deliver a queued job to Slurm exactly once, and in the same run the other due queued jobs of its cluster,
    in batches; each job that must wait for a retry gets its message here. A message whose job another run
    already delivered still delivers the cluster's other due jobs: it may stand for jobs that sent none."""
    run = job_sync.jobs_deliver_queued(job_id=uuid.UUID(job_id))
    for retried_id, delivery in run.deliveries.items():
        if delivery.retry_in is not None:
            job_submit.apply_async((str(retried_id),), countdown=delivery.retry_in)
    if run.more_due:  # the jobs accepted meanwhile may have sent no message of their own
        job_submit.delay(job_id)


# A cancel that Slurm could not take now (an outage, a timeout) is tried again for about an hour and a half.
slurm_cancel_task = shared_task(
    ignore_result=True,
    soft_time_limit=60,
    time_limit=90,
    autoretry_for=(SlurmRetryableError,),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=20,
)


@slurm_cancel_task
def job_cancel(job_id: str) -> None:
    """Cancel a job in Slurm; a repeat after the job ended does nothing."""
    with bound_contextvars(job_id=job_id):
        job_sync.job_cancel_in_slurm(job_id=uuid.UUID(job_id))


@slurm_cancel_task
def job_array_task_cancel(job_id: str, index: int) -> None:
    """Cancel one task of an array in Slurm; a repeat after the task ended does nothing."""
    with bound_contextvars(job_id=job_id, array_task=index):
        array_sync.array_task_cancel_in_slurm(job_id=uuid.UUID(job_id), index=int(index))


@shared_task(ignore_result=True, soft_time_limit=120, time_limit=180)
def cluster_jobs_sync(cluster_id: int) -> None:
    """Follow the cluster's jobs from one Slurm listing, and requeue deliveries whose message was lost."""
    cluster = Cluster.objects.filter(pk=cluster_id, is_active=True).first()
    if cluster is None:
        return
    with job_sync_slot(cluster.pk) as mine, bound_contextvars(cluster=cluster.name):
        if mine:
            _cluster_jobs_sync(cluster)


def _cluster_jobs_sync(cluster: Cluster) -> None:
    client = slurm_client_for(cluster)
    started = time.perf_counter()
    try:
        result = job_sync.cluster_jobs_sync(cluster=cluster, client=client)
    except SlurmError as exc:
        metrics.job_sync_observe(cluster=cluster.name, outcome="failed", seconds=time.perf_counter() - started)
        # Queued jobs wait and job states stay as last seen; the next beat tick tries again.
        Cluster.objects.filter(pk=cluster.pk).update(jobs_sync_error=str(exc)[:2000])
        cluster_unreachable_record(cluster_id=cluster.pk, error=str(exc))
        logger.warning("cluster %s: job sync failed: %s", cluster.name, exc)
        requeued = job_sync.jobs_requeue_overdue(cluster=cluster)
    else:
        metrics.job_sync_observe(cluster=cluster.name, outcome="ok", seconds=time.perf_counter() - started)
        requeued = result.requeued_ids
        if result.lost:  # tagged jobs in the projects' accounts that the database lost (a restore)
            job_recovery.jobs_rebuild(cluster=cluster, found=result.lost)
    for job_id in requeued:
        job_submit.delay(str(job_id))
    # Also after a failed or unchanged (304) listing: a job's accounting record lands after the listing that
    # ended it, and releases need no Slurm at all. Its failure must not look like the sync's.
    if not quota_usage_collection_due(cluster.pk):
        return
    try:
        quota_usage.quota_usage_collect(cluster=cluster, client=client)
    except Exception:
        logger.exception("cluster %s: quota usage collection failed", cluster.name)


@shared_task(ignore_result=True, soft_time_limit=30, time_limit=60)
def jobs_sync_all() -> None:
    """Sync the clusters that are due (see jobs.sync_schedule): fast while they have active jobs."""
    # A sync that waited longer than its pace in the queue is stale: a later tick replaces it.
    for cluster_id in clusters_due_for_job_sync(now=timezone.now()):
        cluster_jobs_sync.apply_async((cluster_id,), expires=2 * settings.JOB_SYNC_INTERVAL_SECONDS)


# Restores ----------------------------------------------------------------------------------------------


@shared_task(ignore_result=True, soft_time_limit=30, time_limit=60)
def database_restore_watch() -> None:
    """Notice a restore of the database (and record that it is still its own), and search every cluster with a
    recovery still open for the jobs the restore lost."""
    database_restores.database_restore_check(heartbeat=True)
    for cluster_id in job_recovery.clusters_to_recover():
        cluster_recover.apply_async((cluster_id,), expires=settings.RESTORE_CHECK_INTERVAL_SECONDS)


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def cluster_recover(cluster_id: int) -> None:
    """Search the cluster's Slurm for the jobs a restore lost and rebuild them; a repeat finds nothing to do."""
    for recovery in job_recovery.recoveries_open(cluster_id=cluster_id):
        job_recovery.cluster_recovery_search(recovery=recovery, client=slurm_client_for(recovery.cluster))


# GPU utilisation -----------------------------------------------------------------------------------------


@shared_task(ignore_result=True, soft_time_limit=30, time_limit=60)
def gpu_utilisation_collect_all() -> None:
    """Beat's tick: one collection per cluster that has a Prometheus with DCGM series."""
    clusters = Cluster.objects.filter(is_active=True).exclude(dcgm_prometheus_url="").values_list("pk", flat=True)
    for cluster_id in clusters:
        gpu_utilisation_collect.apply_async((cluster_id,), expires=settings.GPU_UTILISATION_INTERVAL_SECONDS)


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def gpu_utilisation_collect(cluster_id: int) -> None:
    """Read the cluster's GPUs from Prometheus into its running jobs' aggregates; act on idle jobs."""
    cluster = Cluster.objects.filter(pk=cluster_id, is_active=True).first()
    if cluster is None:
        return
    with bound_contextvars(cluster=cluster.name):
        gpu_utilisation.cluster_gpu_utilisation_collect(cluster=cluster)


# History -------------------------------------------------------------------------------------------------


# A run moves at most JOB_HISTORY_ARCHIVE_BATCHES_PER_RUN batches (the first run on a long history leaves the rest
# to the next ticks); a run cut short by its time limit loses nothing, its batch rolls back as a whole.
@shared_task(ignore_result=True, soft_time_limit=540, time_limit=600)
def job_history_archive() -> None:
    """Beat's tick: move the transitions older than HISTORY_ARCHIVE_AFTER_MONTHS to the archive (0: never)."""
    if settings.HISTORY_ARCHIVE_AFTER_MONTHS <= 0:
        return
    run = history_archive.job_transitions_archive(
        before=history_archive.archive_cutoff(), max_batches=settings.JOB_HISTORY_ARCHIVE_BATCHES_PER_RUN
    )
    logger.info(
        "job history archived",
        extra={
            "moved": run.moved,
            "batches": run.batches,
            "longest_batch_seconds": round(run.longest_batch_seconds, 3),
        },
    )
