"""The Slurm client against the real local cluster (slurmrestd v0.0.38 on Slurm 22.05)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobs.slurm import SlurmAuthError, SlurmClient, SlurmNotFound, SlurmRejected
from jobs.slurm.types import AccountingRecord, JobState, JobSubmission
from tests.conftest import JOB_USER, is_finished, wait_for_job, wait_until

pytestmark = pytest.mark.cluster


def wait_for_accounting(client: SlurmClient, job_id: int, *, timeout_seconds: float = 30) -> AccountingRecord:
    """slurmdbd records a job shortly after it ends; poll until the record shows the final state."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            record = client.accounting_job(job_id=job_id)
            if record.state.is_finished and record.end_time:
                return record
        except SlurmNotFound:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"no finished accounting record for job {job_id} after {timeout_seconds}s")
        time.sleep(0.5)


def test_detects_the_served_version_and_pings(slurm_client: SlurmClient) -> None:
    assert slurm_client.detect_version() == "0.0.38"
    result = slurm_client.ping()
    assert result.api_version == "0.0.38"
    assert result.responding is True
    assert result.slurm_release is not None
    assert result.slurm_release.startswith("22.05.")


def test_one_gpu_job_runs_completes_and_is_accounted(
    slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission], job_directory: Path, slurm_account: str
) -> None:
    tag = f"portal-job:{uuid.uuid4()}"
    submitted = slurm_client.submit_job(user=JOB_USER, submission=make_submission(comment=tag))

    running = wait_for_job(slurm_client, submitted.job_id, lambda job: job.state is not JobState.PENDING)
    assert running.state is JobState.RUNNING
    assert (running.user_name, running.account, running.partition) == (JOB_USER, slurm_account, "h100")
    assert (running.gpus, running.gpu_type) == (1, "h100")
    assert running.nodes in {"gpu01", "gpu02"}
    assert running.comment == tag

    finished = wait_for_job(slurm_client, submitted.job_id, is_finished)
    assert finished.state is JobState.COMPLETED
    assert finished.exit_code == 0

    record = wait_for_accounting(slurm_client, submitted.job_id)
    assert record.state is JobState.COMPLETED
    assert (record.account, record.user_name, record.comment) == (slurm_account, JOB_USER, tag)
    assert (record.gpus_allocated, record.gpu_type) == (1, "h100")
    assert record.start_time is not None
    assert record.end_time is not None
    assert record.elapsed_seconds == int((record.end_time - record.start_time).total_seconds())
    assert record.elapsed_seconds >= 2
    assert record.gpu_seconds == record.elapsed_seconds
    assert (job_directory / "stdout.txt").read_text() == "started\ndone\n"

    # Accounting queries by time window (22.05 refuses epoch seconds; the client sends times relative to now).
    def listed_since(moment: datetime) -> bool:
        records = slurm_client.accounting_jobs(account=slurm_account, start_time=moment)
        return submitted.job_id in {record.job_id for record in records}

    now = datetime.now(UTC)
    wait_until(lambda: listed_since(now - timedelta(minutes=10)), timeout_seconds=15, what="the windowed query")
    assert not listed_since(now + timedelta(hours=1))


def test_a_running_job_is_cancelled(slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission]) -> None:
    submission = make_submission(script="#!/bin/bash\necho started\nsleep 120\n", time_limit_minutes=5)
    submitted = slurm_client.submit_job(user=JOB_USER, submission=submission)
    wait_for_job(slurm_client, submitted.job_id, lambda job: job.state is JobState.RUNNING)

    slurm_client.cancel_job(user=JOB_USER, job_id=submitted.job_id)

    cancelled = wait_for_job(slurm_client, submitted.job_id, is_finished)
    assert cancelled.state is JobState.CANCELLED


def test_another_user_cannot_cancel_the_job(
    slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission]
) -> None:
    submission = make_submission(script="#!/bin/bash\nsleep 120\n", time_limit_minutes=5, hold=True)
    submitted = slurm_client.submit_job(user=JOB_USER, submission=submission)

    with pytest.raises(SlurmAuthError) as raised:
        slurm_client.cancel_job(user="bob", job_id=submitted.job_id)

    assert "Access/permission denied" in str(raised.value)
    assert slurm_client.get_job(job_id=submitted.job_id).state is JobState.PENDING


def test_nine_gpus_on_a_four_gpu_node_is_rejected_with_slurms_message(
    slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission]
) -> None:
    with pytest.raises(SlurmRejected) as raised:
        slurm_client.submit_job(user=JOB_USER, submission=make_submission(gpus=9))

    assert raised.value.retryable is False
    assert "Requested node configuration is not available" in str(raised.value)
    assert [message.error_number for message in raised.value.messages] == [2014]


def test_a_held_submission_succeeds_with_its_job_id(
    slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission]
) -> None:
    submitted = slurm_client.submit_job(user=JOB_USER, submission=make_submission(hold=True))

    job = slurm_client.get_job(job_id=submitted.job_id)
    assert job.state is JobState.PENDING
    assert job.state_reason == "JobHeldUser"
    assert (job.gpus, job.gpu_type) == (1, "h100")
    assert [message.error_number for message in submitted.warnings] == [2042]


def test_listing_since_a_time_is_not_modified_until_a_job_changes(
    slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission]
) -> None:
    # Jobs of earlier tests may still be finishing: wait for a quiet second.
    deadline = time.monotonic() + 30
    while True:
        quiet_since = datetime.now(UTC)
        time.sleep(1.1)  # update_time has a resolution of one second
        if slurm_client.list_jobs(updated_since=quiet_since) is None:
            break
        assert time.monotonic() < deadline, "slurmctld reported changes for 30 s"

    submitted = slurm_client.submit_job(user=JOB_USER, submission=make_submission(hold=True))

    listing = slurm_client.list_jobs(updated_since=quiet_since)
    assert listing is not None
    assert submitted.job_id in {job.job_id for job in listing.jobs}


def test_an_unknown_job_is_not_found(slurm_client: SlurmClient) -> None:
    with pytest.raises(SlurmNotFound) as raised:
        slurm_client.get_job(job_id=987654321)
    assert "Invalid job id specified" in str(raised.value)


def test_a_gpu_minute_limit_is_written_read_back_and_enforced_by_slurm(
    slurm_client: SlurmClient, make_submission: Callable[..., JobSubmission], slurm_account: str
) -> None:
    assert slurm_client.account_gpu_minutes_limit(account=slurm_account, cluster="local") is None

    applied = slurm_client.set_account_gpu_minutes_limit(account=slurm_account, cluster="local", minutes=3)

    assert applied == 3
    assert slurm_client.account_gpu_minutes_limit(account=slurm_account, cluster="local") == 3
    # The account stays where it was in the hierarchy (22.05 needs a move away and back to change a limit).
    (own,) = [a for a in slurm_client.associations(account=slurm_account, cluster="local") if not a.user]
    assert own.parent_account == "pytest"

    # 2 GPUs x 1 minute fits in 3 GPU-minutes; 2 GPUs x 2 minutes does not, so Slurm holds it back.
    fits = slurm_client.submit_job(
        user=JOB_USER, submission=make_submission(gpus=2, time_limit_minutes=1, script="#!/bin/bash\nsleep 1\n")
    )
    too_big = slurm_client.submit_job(user=JOB_USER, submission=make_submission(gpus=2, time_limit_minutes=2))
    wait_for_job(slurm_client, fits.job_id, lambda job: job.state is not JobState.PENDING)
    held = wait_for_job(slurm_client, too_big.job_id, lambda job: job.state_reason != "None")
    assert held.state is JobState.PENDING
    assert held.state_reason == "AssocGrpGRESMinutes"

    # Raising the limit lets the held job start.
    assert slurm_client.set_account_gpu_minutes_limit(account=slurm_account, cluster="local", minutes=100) == 100
    started = wait_for_job(slurm_client, too_big.job_id, lambda job: job.state is not JobState.PENDING)
    assert started.state in {JobState.RUNNING, JobState.COMPLETED}


def test_an_account_can_be_created_with_its_limit(slurm_client: SlurmClient, slurm_parent_account: str) -> None:
    name = f"t{uuid.uuid4().hex[:10]}"
    slurm_client.create_account(
        name=name,
        cluster="local",
        description="pytest",
        organization="pytest",
        parent_account=slurm_parent_account,
        gpu_minutes_limit=600,
    )
    try:
        assert slurm_client.account_gpu_minutes_limit(account=name, cluster="local") == 600
    finally:
        slurm_client.delete_account(name=name)
    assert name not in {account.name for account in slurm_client.accounts()}


def test_clearing_a_limit_is_refused_on_22_05_because_slurmctld_would_keep_it(
    slurm_client: SlurmClient, slurm_account: str
) -> None:
    slurm_client.set_account_gpu_minutes_limit(account=slurm_account, cluster="local", minutes=30)

    with pytest.raises(SlurmRejected) as raised:
        slurm_client.set_account_gpu_minutes_limit(account=slurm_account, cluster="local", minutes=None)

    assert "set a new limit instead" in str(raised.value)
    assert slurm_client.account_gpu_minutes_limit(account=slurm_account, cluster="local") == 30


def test_an_accounting_query_that_matches_nothing_is_an_empty_list(slurm_client: SlurmClient) -> None:
    # 22.05 answers it with error 9003 "Nothing found"; for a list that means no records.
    assert slurm_client.accounting_jobs(account=f"none{uuid.uuid4().hex[:8]}") == []
