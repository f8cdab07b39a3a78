"""Ended jobs on the live cluster: a reservation is replaced by the real charge from Slurm's accounting, to the
GPU-second; jobs submitted around the portal are reserved and charged too; a job that never ran is released."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.slurm import SlurmClient, SlurmError, SlurmNotFound
from clusters.slurm.types import AccountingRecord, JobSubmission
from jobs import quota_usage
from jobs.models import Job, JobState
from jobs.quota_usage import QuotaUsageResult, quota_usage_collect
from jobs.tasks import cluster_jobs_sync as cluster_jobs_sync_task
from quotas.models import Allocation, LedgerEntry, QuotaLimitState
from tests.conftest import wait_until
from tests.jobs.conftest import LiveProject

pytestmark = pytest.mark.django_db(transaction=True)

QUOTA_REASON = "AssocGrpGRESMinutes"


def _collect(live_project: LiveProject) -> QuotaUsageResult:
    cluster = Cluster.objects.get(pk=live_project.cluster.pk)
    return quota_usage_collect(cluster=cluster, client=slurm_client_for(cluster))


def _collect_until_charged(live_project: LiveProject) -> QuotaUsageResult:
    """Collect as the periodic sync does, every second, until a job is charged: slurmdbd may take a moment."""
    deadline = time.monotonic() + 60
    while True:
        result = _collect(live_project)
        if result.charged or time.monotonic() > deadline:
            return result
        time.sleep(1)


def _ledger(job: Job) -> list[tuple[str, int, str]]:
    return [(entry.kind, entry.gpu_seconds, entry.note) for entry in LedgerEntry.objects.filter(job=job).order_by("id")]


def _balances(allocation: Allocation) -> tuple[int, int, int]:
    allocation.refresh_from_db()
    return allocation.reserved_gpu_seconds, allocation.charged_gpu_seconds, allocation.remaining_gpu_seconds


def _accounting_record(
    client: SlurmClient, slurm_job_id: int, is_own: Callable[[AccountingRecord], bool]
) -> AccountingRecord:
    """The job's finished record, once slurmdbd has it (it lags slurmctld a little)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            record = client.accounting_job(job_id=slurm_job_id)
        except SlurmNotFound:
            record = None
        if record is not None and record.state.is_finished and is_own(record):
            return record
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm job {slurm_job_id} has no finished accounting record of its own after 30 s: {record}")
        time.sleep(0.25)


def _set_limit(client: SlurmClient, *, account: str, minutes: int) -> None:
    """Write the account's limit behind the portal's back. 22.05 needs a move of the account to change it (see
    the client), and an account sync running meanwhile (a task queued by the fixture) can undo the move: retry."""
    for attempt in range(5):
        try:
            client.set_account_gpu_minutes_limit(account=account, cluster="local", minutes=minutes)
            return
        except SlurmError:
            if attempt == 4:
                raise
            time.sleep(1)


def _allocation(live_project: LiveProject) -> Allocation:
    return Allocation.objects.get(project=live_project.project, cluster=live_project.cluster)


def test_a_finished_job_is_charged_what_slurm_accounted_to_the_gpu_second(
    live_project: LiveProject, slurm_client: SlurmClient, celery_worker: str
) -> None:
    allocation = _allocation(live_project)
    granted = allocation.granted_gpu_seconds

    reply = live_project.submit(name="charged", gpus=2, time_limit_minutes=2, script="#!/bin/bash\nsleep 3\n")

    assert _balances(allocation) == (2 * 2 * 60, 0, granted - 240)
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)
    assert job.state == JobState.COMPLETED
    assert job.slurm_job_id is not None
    record = _accounting_record(slurm_client, job.slurm_job_id, lambda record: record.comment == job.slurm_comment)
    assert record.gpus_allocated == 2
    used = record.elapsed_seconds * 2

    result = _collect_until_charged(live_project)
    assert (result.charged, result.awaiting_accounting, result.accounting_error) == (1, 0, "")

    charge_note = f"Slurm job {job.slurm_job_id}: {record.elapsed_seconds} s x 2 GPUs"
    assert _ledger(job) == [
        ("reserve", 240, "accepted"),
        ("release", 240, "replaced by the charge"),
        ("charge", used, charge_note),
    ]
    assert _balances(allocation) == (0, used, granted - used)

    # A second run finds nothing to do and asks Slurm for nothing.
    assert _collect(live_project) == QuotaUsageResult()
    assert len(_ledger(job)) == 3
    assert _balances(allocation) == (0, used, granted - used)


def test_a_job_submitted_around_the_portal_is_reserved_while_it_runs_and_charged_once_it_ends(
    live_project: LiveProject, slurm_client: SlurmClient, job_directory: Path, celery_worker: str
) -> None:
    allocation = _allocation(live_project)
    granted = allocation.granted_gpu_seconds
    submission = JobSubmission(
        name="outside",
        account=live_project.project.slurm_account,
        partition="h100",
        script="#!/bin/bash\nsleep 4\n",
        time_limit_minutes=1,
        working_directory=str(job_directory),
        standard_output=str(job_directory / "stdout.txt"),
        standard_error=str(job_directory / "stderr.txt"),
        gpus=2,
        gpu_type="h100",
        environment={"PATH": "/usr/bin:/bin"},
    )
    slurm_job_id = slurm_client.submit_job(user="alice", submission=submission).job_id

    def found() -> bool:
        live_project.sync()
        return Job.objects.filter(cluster=live_project.cluster, is_external=True, slurm_job_id=slurm_job_id).exists()

    wait_until(found, what="the sync finding the external job")
    job = Job.objects.get(cluster=live_project.cluster, is_external=True, slurm_job_id=slurm_job_id)
    assert (job.gpus, job.time_limit_minutes) == (2, 1)
    seen_running = not job.is_final  # a sync that came late may only have seen it end
    if seen_running:
        assert _collect(live_project) == QuotaUsageResult(reserved_external=1)
        assert _ledger(job) == [("reserve", 120, "found in Slurm")]
        assert _balances(allocation) == (120, 0, granted - 120)

    job = live_project.wait_for(job.pk, lambda job: job.is_final)
    assert job.state == JobState.COMPLETED
    record = _accounting_record(slurm_client, slurm_job_id, lambda record: record.submit_time == job.slurm_submit_time)
    assert record.gpus_allocated == 2
    used = record.elapsed_seconds * 2

    result = _collect_until_charged(live_project)
    assert (result.charged, result.awaiting_accounting, result.accounting_error) == (1, 0, "")

    reservation = [("reserve", 120, "found in Slurm"), ("release", 120, "replaced by the charge")]
    charge = ("charge", used, f"Slurm job {slurm_job_id}: {record.elapsed_seconds} s x 2 GPUs")
    assert _ledger(job) == [*(reservation if seen_running else []), charge]
    assert _balances(allocation) == (0, used, granted - used)
    assert _collect(live_project) == QuotaUsageResult()


def test_a_job_cancelled_while_pending_in_slurm_is_released_without_a_charge(
    live_project: LiveProject, slurm_client: SlurmClient, celery_worker: str
) -> None:
    allocation = _allocation(live_project)
    granted = allocation.granted_gpu_seconds
    project = live_project.project
    # The worker writes the allocation's limit first; then a limit of 1 GPU-minute keeps the job pending.
    wait_until(
        lambda: QuotaLimitState.objects.filter(project=project, applied_minutes__isnull=False).exists(),
        what="the limit sync after the grant",
    )
    _set_limit(slurm_client, account=project.slurm_account, minutes=1)

    reply = live_project.submit(name="never-runs", gpus=2, time_limit_minutes=2, script="#!/bin/bash\nsleep 3\n")
    pending = live_project.wait_for(
        reply["id"], lambda job: job.state == JobState.PENDING and job.state_reason == QUOTA_REASON
    )
    assert _balances(allocation) == (240, 0, granted - 240)
    response = live_project.api.post(f"/api/v1/jobs/{pending.pk}/cancel/")
    assert response.status_code == 202, response.json()
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)
    assert (job.state, job.started_at) == (JobState.CANCELLED, None)

    cluster_jobs_sync_task(live_project.cluster.pk)  # the periodic sync, which collects after it

    assert _ledger(job) == [("reserve", 240, "accepted"), ("release", 240, "never ran (cancelled)")]
    assert _balances(allocation) == (0, 0, granted)
    assert _collect(live_project) == QuotaUsageResult()
    assert len(_ledger(job)) == 2


def test_a_job_that_ended_before_the_portal_tracked_the_account_is_released_not_charged(
    live_project: LiveProject, slurm_client: SlurmClient, celery_worker: str
) -> None:
    allocation = _allocation(live_project)
    granted = allocation.granted_gpu_seconds
    reply = live_project.submit(name="before", gpus=2, time_limit_minutes=1, script="#!/bin/bash\nsleep 1\n")
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)
    assert job.slurm_job_id is not None
    _accounting_record(slurm_client, job.slurm_job_id, lambda record: record.comment == job.slurm_comment)
    # As when the portal first measures an account that already had usage: this job's GPU-seconds are in the
    # opening usage, which the limit counts already.
    wait_until(
        lambda: QuotaLimitState.objects.filter(project=live_project.project, cluster=live_project.cluster).exists(),
        what="the limit sync after the grant",
    )
    QuotaLimitState.objects.filter(project=live_project.project, cluster=live_project.cluster).update(
        tracking_started_at=timezone.now()
    )

    assert _collect(live_project) == QuotaUsageResult(released=1)

    released = ("release", 120, "ended before the portal tracked the account's usage (in its opening usage)")
    assert _ledger(job) == [("reserve", 120, "accepted"), released]
    assert _balances(allocation) == (0, 0, granted)
    assert _collect(live_project) == QuotaUsageResult()


def test_a_failing_collection_leaves_the_sync_done_and_is_logged(
    live_project: LiveProject, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**_: object) -> QuotaUsageResult:
        raise RuntimeError("ledger unavailable")

    monkeypatch.setattr(quota_usage, "quota_usage_collect", broken)
    Cluster.objects.filter(pk=live_project.cluster.pk).update(jobs_synced_at=None, jobs_sync_error="stale")

    cluster_jobs_sync_task(live_project.cluster.pk)

    cluster = Cluster.objects.get(pk=live_project.cluster.pk)
    assert cluster.jobs_synced_at is not None
    assert cluster.jobs_sync_error == ""
    assert [record.getMessage() for record in caplog.records if record.name == "jobs.tasks"] == [
        "cluster local: quota usage collection failed"
    ]
