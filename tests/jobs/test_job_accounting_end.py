"""A job that slurmctld forgot before the sync saw it run is finished from accounting, as one that ran."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.slurm.types import AccountingRecord
from clusters.slurm.types import JobState as SlurmState
from jobs.job_sync import jobs_apply_slurm_state
from jobs.models import Job, JobState
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def _pending_job() -> Job:
    return make_job(name="forgotten", gpus=2, time_limit_minutes=10, slurm_job_id=4242)


def _record(*, elapsed: int, start: object, end: object) -> AccountingRecord:
    return AccountingRecord(
        job_id=4242,
        name="forgotten",
        account="acct",
        user_name="alice",
        partition="gpu",
        cluster="matrixcluster",
        state=SlurmState.COMPLETED,
        comment="",
        submit_time=None,
        start_time=start,  # type: ignore[arg-type]
        end_time=end,  # type: ignore[arg-type]
        elapsed_seconds=elapsed,
        gpus_allocated=2 if elapsed else 0,
        gpu_type=None,
        exit_code=0,
    )


def test_a_record_with_elapsed_time_marks_the_job_as_having_run() -> None:
    job = _pending_job()
    end = timezone.now().replace(microsecond=0) - timedelta(minutes=1)
    start = end - timedelta(seconds=95)

    jobs_apply_slurm_state(cluster=job.cluster, updates={job.pk: _record(elapsed=95, start=start, end=end)})

    job.refresh_from_db()
    assert (job.state, job.started_at, job.ended_at) == (JobState.COMPLETED, start, end)
    assert list(job.transitions.values_list("to_state", flat=True)) == ["running", "completed"]


def test_a_record_without_elapsed_time_never_ran() -> None:
    job = _pending_job()
    end = timezone.now().replace(microsecond=0) - timedelta(minutes=1)

    jobs_apply_slurm_state(cluster=job.cluster, updates={job.pk: _record(elapsed=0, start=end, end=end)})

    job.refresh_from_db()
    assert (job.state, job.started_at) == (JobState.COMPLETED, None)
