"""Usage as the quota ledger leaves it, without Slurm: a finished job charged the GPU-seconds accounting reported."""

from __future__ import annotations

import itertools
from datetime import date, datetime, time, timedelta

from django.contrib.auth.models import User
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job, JobArrayTask, JobState
from quotas.services import TaskCharge, quota_charge, quota_charge_tasks
from tenants.models import Project

_slurm_ids = itertools.count(900_000)


def at(day: date, hour: int = 0, minute: int = 0) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=timezone.get_current_timezone())


def charged_job(
    project: Project,
    cluster: Cluster,
    *,
    start: datetime,
    end: datetime,
    gpus: int = 1,
    gpu_type: str = "h100",
    user: User | None = None,
    gpu_seconds: int | None = None,
    external: bool = False,
) -> Job:
    """A job that ran from `start` to `end`, charged elapsed x GPUs (or `gpu_seconds`) as the accounting import does."""
    job = Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username="alice",
        is_external=external,
        name="job",
        partition="gpu",
        gpu_type=gpu_type,
        gpus=gpus,
        time_limit_minutes=max(1, int((end - start) / timedelta(minutes=1)) + 1),
        state=JobState.COMPLETED,
        slurm_job_id=next(_slurm_ids),
        slurm_submit_time=start if external else None,
        created_at=start,
        submitted_at=start,
        started_at=start,
        ended_at=end,
    )
    used = gpu_seconds if gpu_seconds is not None else int((end - start).total_seconds()) * gpus
    assert quota_charge(job=job, gpu_seconds=used, now=end, note="accounting")
    return job


def charged_array(
    project: Project,
    cluster: Cluster,
    *,
    runs: list[tuple[datetime, datetime]],
    gpus: int = 1,
    gpu_type: str = "h100",
    user: User | None = None,
) -> Job:
    """A job array whose task `i` ran over `runs[i]`, each task charged elapsed x GPUs as the task collection does."""
    first = min(start for start, _ in runs)
    last = max(end for _, end in runs)
    job = Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username="alice",
        name="sweep",
        partition="gpu",
        gpu_type=gpu_type,
        gpus=gpus,
        time_limit_minutes=max(1, int(max(end - start for start, end in runs) / timedelta(minutes=1)) + 1),
        state=JobState.COMPLETED,
        slurm_job_id=next(_slurm_ids),
        array=f"0-{len(runs) - 1}",
        array_task_count=len(runs),
        created_at=first,
        submitted_at=first,
        started_at=first,
        ended_at=last,
    )
    JobArrayTask.objects.bulk_create(
        JobArrayTask(
            job=job,
            index=index,
            state=JobState.COMPLETED,
            slurm_job_id=next(_slurm_ids),
            exit_code=0,
            started_at=start,
            ended_at=end,
        )
        for index, (start, end) in enumerate(runs)
    )
    charges = {
        index: TaskCharge(gpu_seconds=int((end - start).total_seconds()) * gpus, note=f"task {index}")
        for index, (start, end) in enumerate(runs)
    }
    assert quota_charge_tasks(job=job, charges=charges, now=last) == len(runs)
    return job


def previous_month(month: date) -> date:
    return (month.replace(day=1) - timedelta(days=1)).replace(day=1)
