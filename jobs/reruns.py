"""Run a job again: its script, environment and shape submitted anew (with any changes), linked to it.

"Run again", "edit and run again" and "run it there instead" (a pending job moved to a partition or GPU type
with free GPUs now) all come here, so a rerun is checked, reserved and delivered exactly as a submission is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace as dataclass_replace
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from jobs.job_services import Accepted, JobRequest, job_cancel, job_submit_accepted
from jobs.models import Job, JobDependency, JobState
from jobs.pipelines import DependencyRequest
from portal.errors import Conflict

# What a rerun may change; everything else (project, template) stays the original's.
RERUN_FIELDS = (
    "cluster",
    "partition",
    "gpu_type",
    "gpus",
    "node_count",
    "max_switches",
    "switch_wait_minutes",
    "time_limit_minutes",
    "name",
    "script",
    "environment",
    "cpus",
    "memory_gb",
    "array",
)


def rerun_request(*, job: Job, overrides: Mapping[str, Any] | None = None, idempotency_key: str = "") -> JobRequest:
    """The submission that runs `job` again: its own fields, then `overrides` (the names of RERUN_FIELDS)."""
    unknown = sorted(set(overrides or {}) - set(RERUN_FIELDS))
    if unknown:
        raise ValueError(f"a rerun cannot change {', '.join(unknown)}")
    values: dict[str, Any] = {
        "cluster": job.cluster.name,
        "partition": job.partition,
        "gpu_type": job.gpu_type or None,
        "gpus": job.gpus,
        "node_count": job.node_count,
        "max_switches": job.max_switches,
        "switch_wait_minutes": job.switch_wait_minutes,
        "time_limit_minutes": job.time_limit_minutes,
        "name": job.name,
        "script": job.script,
        "environment": dict(job.environment),
        "cpus": job.cpus,
        "memory_gb": job.memory_gb,
        "array": job.array or None,
    }
    values.update(overrides or {})
    return JobRequest(**values, idempotency_key=idempotency_key, rerun_of=job.pk)


def job_rerun(
    *,
    user: User,
    job: Job,
    overrides: Mapping[str, Any] | None = None,
    idempotency_key: str = "",
    replace: bool = False,
    keep_dependencies: bool = False,
) -> Accepted:
    """Submit `job` again as `user` (under their cluster account), with `overrides`, linked to it.

    The caller has checked that `user` may run it again (`job_get_for_user(action=JobAction.RERUN)`). Raises
    ValidationError per field, as a submission does, and Conflict for a job the portal did not submit or when
    the project's GPU-hours do not cover it. With `replace` the original, still waiting, is cancelled in the
    same transaction (the caller has checked that `user` may cancel it): the new one runs instead of it. With
    `keep_dependencies` the new job waits for the original's parents, with the same conditions, checked as a
    submission's `depends_on` (a parent that ended so that its condition can never hold refuses it).
    """
    if job.is_external or not job.script:
        raise Conflict(
            "This job was submitted outside the portal, so the portal does not have its script; submit it again "
            "from the submit form or the API with its script."
        )
    request = rerun_request(job=job, overrides=overrides, idempotency_key=idempotency_key)
    if keep_dependencies:
        parents = JobDependency.objects.filter(child=job).order_by("id").values_list("parent_id", "condition")
        request = dataclass_replace(
            request,
            depends_on=tuple(DependencyRequest(job=parent, condition=condition) for parent, condition in parents),
        )
    with transaction.atomic():
        accepted = job_submit_accepted(user=user, project=job.project, request=request)
        if replace and accepted.created:
            waiting = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
            if waiting.state not in (JobState.QUEUED, JobState.PENDING) or waiting.cancel_requested_at is not None:
                raise Conflict(
                    f"The job is {waiting.get_state_display().lower()} now, no longer waiting to start; "
                    "run it again instead."
                )
            job_cancel(user=user, job=waiting)
    return accepted
