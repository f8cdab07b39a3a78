"""Being told when a job ends: a user asks (or stops asking); `billing.job_end_notices` tells them, with the
outcome and the cost, once the cost is known."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction

from jobs.models import Job, JobEndWatch
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
