"""Being told when a job, or the whole pipeline it is a step of, ends: a user asks (or stops asking);
`billing.job_end_notices` tells them, with the outcome and the cost, once the cost is known."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import User
from django.db import transaction

from jobs.models import Job, JobEndWatch, PipelineEndWatch
from jobs.pipelines import pipeline_has_ended, pipeline_never_running, pipeline_whole
from portal.errors import Conflict
from tenants.services import audit_record


def job_end_watch_set(*, user: User, job: Job, watching: bool) -> bool:
    """Ask to be told when `job` ends (`watching`), or stop asking; whether the user is now watching it.

    Anyone who may see the job may ask (the caller has checked it). Asking twice changes nothing. A job that has
    already ended cannot be watched any more: its page says how it ended.
    """
    with transaction.atomic():
        waiting = JobEndWatch.objects.filter(job=job, user=user, notified_at__isnull=True)
        was = waiting.exists()
        if not watching:
            waiting.delete()
        elif job.is_final:
            raise Conflict(f"The job has already ended ({job.get_state_display().lower()}); its page says how.")
        else:
            JobEndWatch.objects.get_or_create(job=job, user=user)
        audit_record(
            actor=user,
            action="job.watch" if watching else "job.unwatch",
            target=job,
            tenant=job.project.tenant,
            before={"watching": was},
            after={"watching": watching},
        )
    return watching


def job_end_watching(*, user: User, job: Job) -> bool:
    """Whether `user` waits to be told when `job` ends."""
    return JobEndWatch.objects.filter(job=job, user=user, notified_at__isnull=True).exists()


def pipeline_end_watch_set(*, user: User, job: Job, watching: bool) -> bool:
    """Ask to be told when the pipeline `job` is a step of ends (`watching`): every job connected to it by
    dependencies, whichever way, has ended or will never run. Or stop asking (from any step of it). Returns
    whether the user is now watching it.

    Anyone who may see the job may ask: the steps are in its project. A job with no dependencies yet may be
    watched too (its later children join its pipeline). Asking from several steps of one pipeline still tells
    once; a pipeline that has already ended cannot be watched.
    """
    with transaction.atomic():
        pipeline = pipeline_whole(job)
        step_ids = [step.pk for step in pipeline.steps]
        waiting = PipelineEndWatch.objects.filter(job_id__in=step_ids, user=user, notified_at__isnull=True)
        was = waiting.exists()
        if not watching:
            waiting.delete()
        elif pipeline_has_ended(pipeline, pipeline_never_running(pipeline)):
            raise Conflict("Every job of this pipeline has already ended or will never run; their pages say how.")
        elif not was:
            # A watch told before (the pipeline ended, then grew) is asked again from this step.
            PipelineEndWatch.objects.update_or_create(job=job, user=user, defaults={"notified_at": None})
        audit_record(
            actor=user,
            action="job.watch_pipeline" if watching else "job.unwatch_pipeline",
            target=job,
            tenant=job.project.tenant,
            before={"watching": was},
            after={"watching": watching},
        )
    return watching


def pipeline_end_watching(*, user: User, job: Job, step_ids: list[uuid.UUID]) -> bool:
    """Whether `user` waits to be told when the pipeline of `job` ends (`step_ids`: its steps)."""
    return PipelineEndWatch.objects.filter(job_id__in=[job.pk, *step_ids], user=user, notified_at__isnull=True).exists()
