"""Telling those who asked that a job ended: its outcome and its cost, in the portal and by e-mail.

The cost is the priced usage record's (an array's: the sum of its tasks', once each task that ran is priced), as
the invoice rounds it, so a job that ran is told of once the usage import has priced it; one that never ran
(rejected, cancelled while waiting) costs nothing and is told of at once; one that ran where no price is in force
is told of with its GPU-hours once it is charged.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from billing.models import Rate
from billing.selectors import job_usage
from jobs.models import FINAL_JOB_STATES, Job, JobEndWatch, JobState
from jobs.pipelines import NEVER_SATISFIED_REASON, pipeline_position
from quotas.models import LedgerEntry, LedgerKind
from quotas.units import gpu_seconds_to_hours
from tenants.notifications import notifications_send

logger = logging.getLogger(__name__)

NOTICE_BATCH_SIZE = 200


def job_end_notices_send(*, now: datetime | None = None, batch_size: int = NOTICE_BATCH_SIZE) -> int:
    """Tell the watchers of ended jobs whose cost is known; returns how many were told. Each watcher is told once:
    the watch is marked in the transaction that leaves the notification (and sends the e-mail on commit)."""
    now = now or timezone.now()
    told = 0
    with transaction.atomic():
        watches = list(
            JobEndWatch.objects.select_for_update(of=("self",), skip_locked=True)
            .filter(notified_at__isnull=True, job__state__in=list(FINAL_JOB_STATES))
            .select_related("job__project__tenant", "job__cluster", "user")
            .order_by("id")[:batch_size]
        )
        by_job: dict[Job, list[JobEndWatch]] = defaultdict(list)
        for watch in watches:
            by_job[watch.job].append(watch)
        for job, waiting in by_job.items():
            cost = _cost_sentence(job)
            if cost is None:
                continue  # ran, and its usage is not priced yet: the next import prices it
            # A step of a pipeline says where it stands in it (what it waited for, what waits for it).
            position = pipeline_position(job)
            notifications_send(
                users=[watch.user for watch in waiting],
                tenant=job.project.tenant,
                kind="job.ended",
                title=f"Job “{job.name}” {_outcome(job)}",
                body=f"Your job “{job.name}” in {job.project} on cluster {job.cluster.name} {_outcome(job)}. {cost}"
                + (f" {position}" if position else ""),
                link=f"/jobs/{job.pk}/",
            )
            JobEndWatch.objects.filter(pk__in=[watch.pk for watch in waiting]).update(notified_at=now)
            told += len(waiting)
    return told


def _outcome(job: Job) -> str:
    state = job.get_state_display().lower()
    if job.state == JobState.REJECTED and job.last_error:
        return f"was rejected: {job.last_error}"
    if job.state == JobState.CANCELLED and job.state_reason == NEVER_SATISFIED_REASON and job.last_error:
        return f"was cancelled: {job.last_error[0].lower()}{job.last_error[1:].rstrip('.')}"
    if job.exit_code is not None and job.state in (JobState.COMPLETED, JobState.FAILED):
        return f"{state} with exit code {job.exit_code}"
    return "timed out" if job.state == JobState.TIMEOUT else state


def _cost_sentence(job: Job) -> str | None:
    """What the job cost, once known; None while its usage waits to be priced."""
    if job.started_at is None:
        return "It never ran, so it costs nothing."
    usage = job_usage(job=job)
    if usage is not None:
        if not usage.complete:
            return None  # an array some of whose tasks are still being priced
        hours = gpu_seconds_to_hours(usage.gpu_seconds)
        return f"It used {hours} GPU-hours, which cost {usage.amount} {usage.currency}."
    charged = LedgerEntry.objects.filter(job=job, kind=LedgerKind.CHARGE).aggregate(
        charges=Count("pk"), gpu_seconds=Sum("gpu_seconds")
    )
    if (
        charged["charges"]
        and not Rate.objects.filter(cluster_id=job.cluster_id, valid_from__lte=job.started_at).exists()
    ):
        return (
            f"It used {gpu_seconds_to_hours(charged['gpu_seconds'])} GPU-hours; no price is set for them on this "
            "cluster."
        )
    return None
