"""When each cluster's jobs are synced: every JOB_SYNC_ACTIVE_SECONDS while it has jobs that can still change
(queued, pending, running), every JOB_SYNC_INTERVAL_SECONDS when it has none or its last sync failed.

Beat ticks every JOB_SYNC_ACTIVE_SECONDS; a tick syncs the clusters that are due. A sync that finds nothing
changed costs one small slurmrestd request (a 304, or its v0.0.40+ equivalent), so the fast pace is cheap, and
a state change in Slurm reaches the browsers within about a second and a half instead of five.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Exists, OuterRef

from clusters.models import Cluster
from jobs.models import ACTIVE_JOB_STATES, Job

logger = logging.getLogger(__name__)

# A tick's tasks may start a little early or late: a cluster synced within this fraction of its interval
# counts as synced, so the fast pace does not skip every other tick.
_EARLY = 0.8


def clusters_due_for_job_sync(*, now: datetime) -> list[int]:
    """The ids of the active clusters whose jobs should be synced now."""
    clusters = Cluster.objects.filter(is_active=True).annotate(
        has_active_jobs=Exists(Job.objects.filter(cluster=OuterRef("pk"), state__in=ACTIVE_JOB_STATES))
    )
    due = []
    for cluster_id, synced_at, failing, has_active_jobs in clusters.values_list(
        "pk", "jobs_synced_at", "jobs_sync_error", "has_active_jobs"
    ):
        fast = has_active_jobs and not failing
        interval = settings.JOB_SYNC_ACTIVE_SECONDS if fast else settings.JOB_SYNC_INTERVAL_SECONDS
        if synced_at is None or now - synced_at >= timedelta(seconds=interval * _EARLY):
            due.append(cluster_id)
    return due


@contextmanager
def job_sync_slot(cluster_id: int) -> Iterator[bool]:
    """Whether this worker may sync the cluster now: False while another sync of it runs, so syncs queued by
    fast ticks never pile up behind a slow listing. Without the cache (Redis down) every sync may run: they
    are safe together, only wasteful."""
    key = f"jobs:sync-running:{cluster_id}"
    try:
        acquired = cache.add(key, 1, timeout=settings.JOB_SYNC_SLOT_SECONDS)
    except Exception:
        logger.warning("cache unavailable: cluster %s's job sync runs without its slot", cluster_id, exc_info=True)
        yield True
        return
    try:
        yield bool(acquired)
    finally:
        if acquired:
            try:
                cache.delete(key)
            except Exception:
                logger.warning("cache unavailable: cluster %s's sync slot expires on its own", cluster_id)


def delivery_wake_needed(cluster_id: int) -> bool:
    """Whether a job just accepted for the cluster should send a delivery message: False while an earlier
    message for the cluster waits for a worker, or while a worker's run drains the cluster, because that run
    delivers every due job of the cluster, this one too (`delivery_wake_hold`). Under a stream of submissions
    the messages, and so the worker's runs, carry many jobs each instead of one. Without the cache (Redis down)
    every job sends one."""
    try:
        return bool(cache.add(_delivery_wake_key(cluster_id), 1, timeout=settings.JOB_DELIVERY_WAKE_SECONDS))
    except Exception:
        return True


def delivery_wake_hold(cluster_id: int, *, taking_message: bool) -> bool:
    """A worker's run drains the cluster: jobs accepted meanwhile send no message. `taking_message`: the run
    took a message (the wake it stood for becomes the run's, renewed for JOB_DELIVERY_WAKE_SECONDS); else the
    run holds the wake only if no newer message holds it. Whether the run holds it. A run that dies holding it
    lets it lapse; the jobs it held back are then the sweep's, or the next message's."""
    key, timeout = _delivery_wake_key(cluster_id), settings.JOB_DELIVERY_WAKE_SECONDS
    try:
        if taking_message:
            cache.set(key, 1, timeout=timeout)
            return True
        return bool(cache.add(key, 1, timeout=timeout))
    except Exception:
        logger.warning("cache unavailable: cluster %s's jobs each send a delivery message", cluster_id)
        return False


def delivery_wake_taken(cluster_id: int) -> None:
    """The run gives the cluster's wake back: the next job accepted sends a message again. A wake that is never
    given back (its message lost, its run dead) lapses after JOB_DELIVERY_WAKE_SECONDS."""
    try:
        cache.delete(_delivery_wake_key(cluster_id))
    except Exception:
        logger.warning("cache unavailable: cluster %s's delivery wake lapses on its own", cluster_id)


def _delivery_wake_key(cluster_id: int) -> str:
    return f"jobs:delivery-wake:{cluster_id}"


def quota_usage_collection_due(cluster_id: int) -> bool:
    """Whether the sync should also collect usage from accounting: at most once per JOB_SYNC_INTERVAL_SECONDS,
    however fast the state sync runs (accounting queries are the expensive part)."""
    try:
        return bool(cache.add(f"jobs:usage-collected:{cluster_id}", 1, timeout=settings.JOB_SYNC_INTERVAL_SECONDS))
    except Exception:
        return True
