"""Telling those who asked that a job ended: its outcome and its cost, in the portal and by e-mail.

The cost is the priced usage record's (an array's: the sum of its tasks', once each task that ran is priced), as
the invoice rounds it, so a job that ran is told of once the usage import has priced it; one that never ran
(rejected, cancelled while waiting) costs nothing and is told of at once; one that ran where no price is in force
is told of with its GPU-hours once it is charged.

A pipeline's watchers are told once every step has ended or will never run (`jobs.pipelines`: a step that
waits for a dependency that can never be met counts as ended, as does one waiting for such a step) and each
step that ran is priced: each step's outcome and cost, and the total (the steps' costs summed).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from billing.models import Rate
from billing.selectors import job_usage
from jobs.models import FINAL_JOB_STATES, Job, JobEndWatch, JobState, PipelineEndWatch
from jobs.pipelines import (
    NEVER_SATISFIED_REASON,
    WholePipeline,
    pipeline_has_ended,
    pipeline_never_running,
    pipeline_position,
    pipeline_whole,
)
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


# A pipeline's notice names this many steps, then counts the rest.
PIPELINE_NOTICE_STEPS = 20


def pipeline_end_notices_send(*, now: datetime | None = None, batch_size: int = NOTICE_BATCH_SIZE) -> int:
    """Tell the watchers of ended pipelines whose cost is known; returns how many were told. Each user is told
    once per pipeline, however many of its steps they asked from: every waiting watch of the pipeline is locked
    and marked in the transaction that leaves the notification. Should another sender hold some of them, both
    leave the pipeline to the next run."""
    now = now or timezone.now()
    told = 0
    with transaction.atomic():
        watches = list(
            PipelineEndWatch.objects.select_for_update(of=("self",), skip_locked=True)
            .filter(notified_at__isnull=True)
            .select_related("job__project__tenant")
            .order_by("id")[:batch_size]
        )
        looked_at: set[int] = set()
        for watch in watches:
            if watch.pk in looked_at:
                continue
            pipeline = pipeline_whole(watch.job)
            step_ids = [step.pk for step in pipeline.steps]
            waiting = PipelineEndWatch.objects.filter(notified_at__isnull=True, job_id__in=step_ids)
            held = list(waiting.select_for_update(of=("self",), skip_locked=True).select_related("user").order_by("id"))
            looked_at.update(each.pk for each in held)
            if len(held) < waiting.count():
                continue  # another sender holds some of its watches
            notice = _pipeline_notice(pipeline)
            if notice is None:
                continue  # not ended yet, or a step that ran is not priced yet
            title, body = notice
            users = {each.user_id: each.user for each in held}
            notifications_send(
                users=users.values(),
                tenant=watch.job.project.tenant,
                kind="pipeline.ended",
                title=title,
                body=body,
                link=f"/jobs/{watch.job_id}/",
            )
            PipelineEndWatch.objects.filter(pk__in=[each.pk for each in held]).update(notified_at=now)
            told += len(users)
    return told


def _pipeline_notice(pipeline: WholePipeline) -> tuple[str, str] | None:
    """The title and body of a pipeline's end notice; None until it has ended and its cost is known."""
    never = pipeline_never_running(pipeline)
    if not pipeline_has_ended(pipeline, never):
        return None
    lines: list[str] = []
    counts: dict[str, int] = defaultdict(int)
    gpu_seconds = 0
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    unpriced = 0
    for step in pipeline.steps:
        if step.pk in never:
            counts["will never run"] += 1
            lines.append(f"“{step.name}” will never run: {never[step.pk]}")
            continue
        counts[step.get_state_display().lower()] += 1
        cost = _step_cost(step)
        if cost is None:
            return None
        seconds, amount, currency = cost
        gpu_seconds += seconds
        if amount is not None and currency:
            amounts[currency] += amount
            spent = f"{gpu_seconds_to_hours(seconds)} GPU-hours, {amount} {currency}"
        elif step.started_at is None:
            spent = "never ran, nothing to pay"
        else:
            unpriced += 1
            spent = f"{gpu_seconds_to_hours(seconds)} GPU-hours, no price set"
        lines.append(f"“{step.name}” {_outcome(step)} ({spent})")
    first = pipeline.steps[0]
    shown = "; ".join(lines[:PIPELINE_NOTICE_STEPS])
    more = len(lines) - PIPELINE_NOTICE_STEPS
    if more > 0:
        shown += f"; and {more} more"
    total = f"In all it used {gpu_seconds_to_hours(gpu_seconds)} GPU-hours"
    if amounts:
        total += ", which cost " + " and ".join(f"{amount} {currency}" for currency, amount in sorted(amounts.items()))
    if unpriced:
        total += f" ({unpriced} of its jobs ran where no price is set)"
    total += "."
    if never:
        total += " Cancel the jobs that will never run to give their reserved GPU-hours back to the project."
    steps = len(pipeline.steps)
    body = (
        f"Your pipeline of {steps} job{'s' if steps != 1 else ''} in {first.project} on cluster {first.cluster.name} "
        f"ended: {shown}. {total}"
    )
    title = f"Pipeline of “{first.name}” ended: " + ", ".join(f"{count} {what}" for what, count in counts.items())
    return title, body


def _step_cost(job: Job) -> tuple[int, Decimal | None, str] | None:
    """A pipeline step's GPU-seconds, cost and currency (no cost where no price is set); None while its usage
    waits to be priced."""
    if job.started_at is None:
        return 0, None, ""
    usage = job_usage(job=job)
    if usage is not None:
        if not usage.complete:
            return None
        return usage.gpu_seconds, usage.amount, usage.currency
    charged = LedgerEntry.objects.filter(job=job, kind=LedgerKind.CHARGE).aggregate(
        charges=Count("pk"), gpu_seconds=Sum("gpu_seconds")
    )
    if (
        charged["charges"]
        and not Rate.objects.filter(cluster_id=job.cluster_id, valid_from__lte=job.started_at).exists()
    ):
        return charged["gpu_seconds"], None, ""
    return None


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
    """What the job cost, once known; None while its usage waits to be priced (an array: some of its tasks)."""
    cost = _step_cost(job)
    if cost is None:
        return None
    seconds, amount, currency = cost
    if job.started_at is None:
        return "It never ran, so it costs nothing."
    if amount is None:
        return f"It used {gpu_seconds_to_hours(seconds)} GPU-hours; no price is set for them on this cluster."
    return f"It used {gpu_seconds_to_hours(seconds)} GPU-hours, which cost {amount} {currency}."
