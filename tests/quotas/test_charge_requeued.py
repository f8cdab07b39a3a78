"""A job that a node failure cut short is charged what ran: every attempt's GPU-seconds, never its time limit;
reconciliation compares that one charge with all of the job's records.

On 22.05 the accounting window query returns a requeued job twice under one id, the cut-short run (NODE_FAIL,
7 s on the local cluster) and the attempt that finished it, both carrying the portal's tag; the first alone
would undercharge. A stand-in client answers the window query with such records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from billing.models import ReconciliationReport
from billing.reconciliation import reconciliation_report_run
from clusters.slurm.types import AccountingRecord
from clusters.slurm.types import JobState as SlurmState
from jobs.models import Job, JobState
from jobs.quota_usage import quota_usage_collect
from quotas.models import LedgerEntry
from quotas.services import quota_reserve
from tests.factories import make_job

pytestmark = pytest.mark.django_db


@dataclass
class Window:
    records: list[AccountingRecord]

    def accounting_jobs(self, **query: Any) -> list[AccountingRecord]:
        return self.records


def _ended_job(*, state: JobState, started: datetime, ended: datetime, gpus: int) -> Job:
    job = make_job(
        allocation_gpu_hours=10,
        name="cut short",
        gpus=gpus,
        gpu_type="h100",
        state=state,
        slurm_job_id=1,
        nodes="gpu01",
        started_at=started,
        ended_at=ended,
    )
    quota_reserve(job=job, gpu_type="h100", now=started - timedelta(seconds=10))
    return job


def _run(job: Job, *, state: SlurmState, start: datetime, elapsed: int) -> AccountingRecord:
    return AccountingRecord(
        job_id=1,
        name=job.name,
        account=job.project.slurm_account,
        user_name="alice",
        partition="gpu",
        cluster="matrixcluster",
        state=state,
        comment=job.slurm_comment,
        submit_time=None,
        start_time=start,
        end_time=start + timedelta(seconds=elapsed),
        elapsed_seconds=elapsed,
        gpus_allocated=job.gpus,
        gpu_type="h100",
        exit_code=0,
    )


def _ledger(job: Job) -> list[tuple[str, int, str]]:
    return list(LedgerEntry.objects.filter(job=job).order_by("id").values_list("kind", "gpu_seconds", "note"))


def test_a_requeued_job_is_charged_both_of_its_runs() -> None:
    restarted = timezone.now().replace(microsecond=0) - timedelta(minutes=2)
    first_start = restarted - timedelta(seconds=130)
    job = _ended_job(state=JobState.COMPLETED, started=restarted, ended=restarted + timedelta(seconds=60), gpus=1)
    window = Window(
        [
            _run(job, state=SlurmState.NODE_FAIL, start=first_start, elapsed=7),
            _run(job, state=SlurmState.COMPLETED, start=restarted, elapsed=60),
        ]
    )

    result = quota_usage_collect(cluster=job.cluster, client=window)  # type: ignore[arg-type]

    assert (result.charged, result.awaiting_accounting) == (1, 0)
    assert _ledger(job) == [
        ("reserve", 300, "accepted"),
        ("release", 300, "replaced by the charge"),
        ("charge", 67, "Slurm job 1: 7 s x 1 GPUs (NODE_FAIL, requeued) + 60 s x 1 GPUs"),
    ]


def test_the_cut_short_run_alone_is_not_charged_while_the_last_attempts_record_is_missing() -> None:
    restarted = timezone.now().replace(microsecond=0) - timedelta(seconds=30)
    job = _ended_job(state=JobState.COMPLETED, started=restarted, ended=restarted + timedelta(seconds=20), gpus=1)
    window = Window([_run(job, state=SlurmState.NODE_FAIL, start=restarted - timedelta(seconds=130), elapsed=7)])

    result = quota_usage_collect(cluster=job.cluster, client=window)  # type: ignore[arg-type]

    assert (result.charged, result.awaiting_accounting) == (0, 1)
    assert [kind for kind, _, _ in _ledger(job)] == ["reserve"]


def test_a_job_that_ended_in_node_failure_is_charged_the_seconds_it_ran_not_its_time_limit() -> None:
    started = timezone.now().replace(microsecond=0) - timedelta(minutes=2)
    job = _ended_job(state=JobState.NODE_FAIL, started=started, ended=started + timedelta(seconds=7), gpus=2)
    window = Window([_run(job, state=SlurmState.NODE_FAIL, start=started, elapsed=7)])

    quota_usage_collect(cluster=job.cluster, client=window)  # type: ignore[arg-type]

    assert _ledger(job) == [
        ("reserve", 600, "accepted"),
        ("release", 600, "replaced by the charge"),
        ("charge", 14, "Slurm job 1: 7 s x 2 GPUs"),
    ]


def test_reconciliation_counts_both_runs_of_a_requeued_job_as_its_one_charge() -> None:
    restarted = timezone.now().replace(microsecond=0) - timedelta(minutes=2)
    job = _ended_job(state=JobState.COMPLETED, started=restarted, ended=restarted + timedelta(seconds=60), gpus=1)
    window = Window(
        [
            _run(job, state=SlurmState.NODE_FAIL, start=restarted - timedelta(seconds=130), elapsed=7),
            replace(_run(job, state=SlurmState.COMPLETED, start=restarted, elapsed=60), submit_time=restarted),
        ]
    )
    quota_usage_collect(cluster=job.cluster, client=window)  # type: ignore[arg-type]
    report = ReconciliationReport.objects.create(
        cluster=job.cluster, period_start=restarted - timedelta(hours=1), period_end=timezone.now()
    )

    report = reconciliation_report_run(report_id=report.pk, client=window)  # type: ignore[arg-type]

    assert report.findings == [
        {
            "kind": "unpriced",
            "slurm_job_id": 1,
            "account": job.project.slurm_account,
            "job": str(job.pk),
            "portal_gpu_seconds": 67,
            "slurm_gpu_seconds": 67,
            "detail": "Slurm's accounting has 67 GPU-seconds (67 s x 1 GPU); the job is charged but not priced yet: "
            "no rate was in force when it ran, or the usage import has not run since.",
        }
    ]
    assert (report.summary["slurm_jobs"], report.summary["difference_gpu_seconds"]) == (1, 0)
