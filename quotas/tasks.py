"""Celery tasks for quotas: thin wrappers that load by id and call one service."""

from __future__ import annotations

from celery import shared_task

from quotas.alerts import allocation_alerts_check as check_alerts


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def allocation_alerts_check(allocation_id: int) -> None:
    """Announce the usage thresholds the allocation has crossed and not yet announced. Idempotent."""
    check_alerts(allocation_id=allocation_id)
