"""Template filters for a job's figures on the jobs pages: how long it ran and its cost, written as
frontend/static/frontend/js/jobs-live.js writes them while they count up."""

from __future__ import annotations

import uuid
from datetime import datetime

from django import template
from django.utils import timezone

from billing.job_costs import JobCost
from jobs.models import Job

register = template.Library()


def duration_text(seconds: int) -> str:
    """Hours, minutes and seconds, e.g. 0:04:05 or 26:00:00: one unambiguous form however long."""
    seconds = max(seconds, 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@register.filter
def run_duration(job: Job, now: datetime | None = None) -> str:
    """How long it ran (until now while it runs); "—" before it starts."""
    if job.started_at is None:
        return "—"
    end = job.ended_at or now or timezone.now()
    return duration_text(int((end - job.started_at).total_seconds()))


@register.filter
def cost_of(costs: dict[uuid.UUID, JobCost], job: Job) -> JobCost | None:
    return costs.get(job.pk)
