"""Celery tasks for clusters and their Slurm accounts: thin wrappers that load by id and call one service."""

from __future__ import annotations

import logging

from celery import shared_task
from structlog.contextvars import bound_contextvars

from clusters import accounts
from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.services import cluster_check, cluster_sync_inventory
from clusters.slurm import SlurmError, SlurmRetryableError

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def cluster_sync(cluster_id: int) -> None:
    """Check a cluster's health, then refresh its inventory. Idempotent: a repeat only refreshes again."""
    cluster = Cluster.objects.filter(pk=cluster_id, is_active=True).first()
    if cluster is None:
        return
    with bound_contextvars(cluster=cluster.name):  # on every line the sync logs
        _cluster_sync(cluster)


def _cluster_sync(cluster: Cluster) -> None:
    client = slurm_client_for(cluster)
    if not cluster_check(cluster=cluster, client=client):
        return
    try:
        cluster_sync_inventory(cluster=cluster, client=client)
    except SlurmError as exc:
        # The next beat tick retries; a failed sync leaves the previous inventory in place.
        logger.warning("cluster %s: inventory sync failed: %s", cluster.name, exc)


@shared_task(ignore_result=True, soft_time_limit=30, time_limit=60)
def cluster_sync_all() -> None:
    for cluster_id in Cluster.objects.filter(is_active=True).values_list("pk", flat=True):
        cluster_sync.delay(cluster_id)


# Retryable Slurm errors (cluster down, slow, overloaded) are retried up to 8 times, backing off exponentially
# from 15 s to at most 10 minutes (jittered); after that the periodic reconcile brings the project in line.
@shared_task(
    ignore_result=True,
    soft_time_limit=120,
    time_limit=180,
    autoretry_for=(SlurmRetryableError,),
    retry_backoff=15,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=8,
)
def project_slurm_sync(project_id: int) -> None:
    """Bring the project's Slurm accounts and user associations in line with the portal, on every cluster."""
    accounts.project_slurm_sync(project_id=project_id)


@shared_task(ignore_result=True, soft_time_limit=540, time_limit=600)
def cluster_slurm_reconcile(cluster_id: int) -> None:
    """Check and repair all portal accounts on one cluster; the report records a failed run, and beat retries."""
    if not Cluster.objects.filter(pk=cluster_id, is_active=True).exists():
        return
    accounts.cluster_slurm_reconcile(cluster_id=cluster_id)


@shared_task(ignore_result=True, soft_time_limit=30, time_limit=60)
def slurm_reconcile_all() -> None:
    for cluster_id in Cluster.objects.filter(is_active=True).values_list("pk", flat=True):
        cluster_slurm_reconcile.delay(cluster_id)
