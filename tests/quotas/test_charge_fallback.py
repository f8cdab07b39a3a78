"""When slurmdbd's window query leaves out a finished job's record, the job is looked up by its id.

The omission was seen once on the real 22.05 cluster and cannot be caused on purpose, so this test gives the
collector a stand-in client that answers the window query without the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from clusters.slurm.types import AccountingRecord
from clusters.slurm.types import JobState as SlurmState
from jobs.models import Job, JobState
from jobs.quota_usage import quota_usage_collect
from quotas.models import LedgerEntry
from quotas.services import quota_reserve
from tests.factories import make_job

pytestmark = pytest.mark.django_db


@dataclass
class WindowMissesTheRecord:
    record: AccountingRecord
    calls: list[str] = field(default_factory=list)

    def accounting_jobs(self, **query: Any) -> list[AccountingRecord]:
        self.calls.append("window")
        return []

    def accounting_job_records(self, *, job_id: int) -> list[AccountingRecord]:
        self.calls.append(f"job {job_id}")
        return [self.record]


def _ended_job(*, ended: datetime) -> Job:
    job = make_job(
        allocation_gpu_hours=10,
        name="missed",
        gpus=2,
        time_limit_minutes=10,
        state=JobState.COMPLETED,
        slurm_job_id=77,
        started_at=ended - timedelta(seconds=90),
        ended_at=ended,
    )
    quota_reserve(job=job, gpu_type="h100", now=ended - timedelta(seconds=100))
    return job


def _record(job: Job) -> AccountingRecord:
    assert job.started_at is not None
    assert job.ended_at is not None
    return AccountingRecord(
        job_id=77,
        name="missed",
        account=job.project.slurm_account,
        user_name="alice",
        partition="gpu",
        cluster="matrixcluster",
        state=SlurmState.COMPLETED,
        comment=job.slurm_comment,
        submit_time=None,
        start_time=job.started_at,
        end_time=job.ended_at,
        elapsed_seconds=90,
        gpus_allocated=2,
        gpu_type="h100",
        exit_code=0,
    )


def test_a_record_the_window_left_out_is_fetched_by_id_and_charged_once() -> None:
    job = _ended_job(ended=timezone.now() - timedelta(minutes=1))
    client = WindowMissesTheRecord(record=_record(job))

    result = quota_usage_collect(cluster=job.cluster, client=client)  # type: ignore[arg-type]
    again = quota_usage_collect(cluster=job.cluster, client=client)  # type: ignore[arg-type]

    assert (result.charged, result.awaiting_accounting, result.accounting_requests) == (1, 0, 2)
    assert client.calls == ["window", "job 77"]  # the second run finds nothing left to charge
    assert (again.charged, again.accounting_requests) == (0, 0)
    assert list(LedgerEntry.objects.filter(job=job).values_list("kind", "gpu_seconds")) == [
        ("reserve", 1200),
        ("release", 1200),
        ("charge", 180),
    ]


def test_a_job_that_just_ended_waits_for_the_window_rather_than_a_lookup_by_id() -> None:
    job = _ended_job(ended=timezone.now() - timedelta(seconds=5))
    client = WindowMissesTheRecord(record=_record(job))

    result = quota_usage_collect(cluster=job.cluster, client=client)  # type: ignore[arg-type]

    assert (result.charged, result.awaiting_accounting, result.accounting_requests) == (0, 1, 1)
    assert client.calls == ["window"]
