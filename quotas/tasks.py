"""Celery tasks for quotas: thin wrappers that load by id and call one service."""

from __future__ import annotations

from celery import shared_task

from quotas import slurm_limits
from quotas.alerts import allocation_alerts_check as check_alerts


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def allocation_alerts_check(allocation_id: int) -> None:
    """Announce the usage thresholds the allocation has crossed and not yet announced. Idempotent."""
    check_alerts(allocation_id=allocation_id)


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def quota_limit_sync(project_id: int, cluster_id: int) -> None:
    """Write one project's GPU-minute limit after its allocations changed. Idempotent; a failure is recorded
    on its limit state and written by the periodic run (within a minute) instead of a retry here."""
    slurm_limits.quota_limit_sync(project_id=project_id, cluster_id=cluster_id)


# A run at midnight may write many limits (a few requests each); an overlapping run only finds them written.
@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def quota_limits_sync_all() -> None:
    """Every minute: roll periods over and write the limits that differ from the ones applied."""
    slurm_limits.quota_limits_sync_all()
