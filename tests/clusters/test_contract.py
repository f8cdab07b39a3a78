"""The Slurm contract: the same scenario against every live cluster (Slurm 22.05, 24.11 and 26.05), through the client.

Each test runs once per cluster `scripts/cluster.sh up` described (see tests/live_clusters.py), over the newest
slurmrestd API version both the cluster and the portal know. What differs between generations is said where it
does, by generation, never by hard-coded version.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from clusters.slurm import SlurmAuthError, SlurmClient, SlurmNotFound, SlurmRejected
from clusters.slurm.codecs import SUPPORTED_VERSIONS_NEWEST_FIRST
from clusters.slurm.types import AccountingRecord, JobState, JobSubmission
from tests.conftest import JOB_USER, is_finished, wait_for_job, wait_until
from tests.live_clusters import LiveCluster

pytestmark = pytest.mark.cluster


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


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


def test_negotiates_the_newest_version_both_sides_know_and_pings(
    live: LiveCluster, contract_client: SlurmClient
) -> None:
    served = contract_client.served_versions()
    both = [version for version in SUPPORTED_VERSIONS_NEWEST_FIRST if version in served]
    assert both, f"{live.name} serves {served}, none of which the portal knows"

    assert contract_client.detect_version() == max(both, key=_version_key)
    result = contract_client.ping()
    assert result.responding is True
    assert result.slurm_release == live.slurm_release
    assert result.cluster_name in {live.name, None}


def test_a_gpu_job_runs_writes_its_log_completes_and_is_accounted(
    live: LiveCluster,
    contract_client: SlurmClient,
    contract_submission: Callable[..., JobSubmission],
    contract_job_directory: Path,
    contract_account: str,
) -> None:
    tag = f"portal-job:{uuid.uuid4()}"
    submitted = contract_client.submit_job(user=JOB_USER, submission=contract_submission(comment=tag, gpus=2))

    running = wait_for_job(contract_client, submitted.job_id, lambda job: job.state is not JobState.PENDING)
    assert running.state is JobState.RUNNING
    assert (running.user_name, running.account, running.partition) == (JOB_USER, contract_account, live.gpu_partition)
    assert (running.gpus, running.gpu_type) == (2, live.gpu_type)
    assert running.nodes
    # The devices it holds (gres_detail), which the DCGM readings are matched to jobs by.
    ((node, indices),) = running.gpu_indices
    assert node == running.nodes
    assert len(indices) == 2
    assert running.comment == tag
    assert running.standard_output == str(contract_job_directory / "stdout.txt")

    finished = wait_for_job(contract_client, submitted.job_id, is_finished)
    assert finished.state is JobState.COMPLETED
    assert finished.exit_code == 0
    assert finished.gpu_indices == ()  # gres_detail is gone once the job has ended
    assert (contract_job_directory / "stdout.txt").read_text() == "started\ndone\n"

    record = wait_for_accounting(contract_client, submitted.job_id)
    assert record.state is JobState.COMPLETED
    assert (record.account, record.user_name, record.comment, record.cluster) == (
        contract_account,
        JOB_USER,
        tag,
        live.name,
    )
    assert (record.gpus_allocated, record.gpu_type) == (2, live.gpu_type)
    assert record.start_time is not None
    assert record.end_time is not None
    assert record.elapsed_seconds == int((record.end_time - record.start_time).total_seconds())
    assert record.elapsed_seconds >= 2
    assert record.gpu_seconds == 2 * record.elapsed_seconds
    # These clusters' Slurm has no NVML: no gres/gpuutil or gres/gpumem in the steps' usage, and none invented.
    assert (record.gpu_utilisation_percent, record.gpu_memory_peak_bytes) == (None, None)

    # Exactly-once recovery finds a job by its tag: in the accounting of a time window, not outside it.
    def listed_since(moment: datetime) -> bool:
        records = contract_client.accounting_jobs(account=contract_account, start_time=moment)
        return tag in {record.comment for record in records}

    now = datetime.now(UTC)
    wait_until(lambda: listed_since(now - timedelta(minutes=10)), timeout_seconds=15, what="the windowed query")
    assert not listed_since(now + timedelta(hours=1))


def test_exit_codes_read_as_the_shell_reports_them(
    live: LiveCluster,
    contract_client: SlurmClient,
    contract_submission: Callable[..., JobSubmission],
    contract_job_directory: Path,
) -> None:
    scripts = {
        0: "#!/bin/bash\necho fine\n",
        3: "#!/bin/bash\necho failing\nexit 3\n",
        137: "#!/bin/bash\necho killed\nkill -KILL $$\n",  # killed by signal 9: 128 + 9, as bash's $? says
    }
    submitted = {
        expected: contract_client.submit_job(
            user=JOB_USER,
            submission=contract_submission(
                script=script,
                standard_output=str(contract_job_directory / f"{expected}.out"),
                standard_error=str(contract_job_directory / f"{expected}.err"),
            ),
        ).job_id
        for expected, script in scripts.items()
    }

    for expected, job_id in submitted.items():
        finished = wait_for_job(contract_client, job_id, is_finished)
        record = wait_for_accounting(contract_client, job_id)
        # 22.05's slurmdbd API loses a plain exit's code (every one reads {"status": "SUCCESS", "return_code": 0},
        # where sacct says 3:0): there, accounting knows only that a failed job failed.
        accounted = expected if live.generation >= (23, 2) or expected in {0, 137} else None
        assert (expected, finished.exit_code, record.exit_code) == (expected, expected, accounted)
        assert finished.state is (JobState.COMPLETED if expected == 0 else JobState.FAILED)


def test_a_running_job_is_cancelled(
    contract_client: SlurmClient, contract_submission: Callable[..., JobSubmission]
) -> None:
    submission = contract_submission(script="#!/bin/bash\necho started\nsleep 120\n", time_limit_minutes=5)
    submitted = contract_client.submit_job(user=JOB_USER, submission=submission)
    wait_for_job(contract_client, submitted.job_id, lambda job: job.state is JobState.RUNNING)

    contract_client.cancel_job(user=JOB_USER, job_id=submitted.job_id)

    cancelled = wait_for_job(contract_client, submitted.job_id, is_finished)
    assert cancelled.state is JobState.CANCELLED
    record = wait_for_accounting(contract_client, submitted.job_id)
    assert record.state is JobState.CANCELLED


def test_another_user_cannot_cancel_the_job(
    contract_client: SlurmClient, contract_submission: Callable[..., JobSubmission]
) -> None:
    submission = contract_submission(script="#!/bin/bash\nsleep 120\n", time_limit_minutes=5, hold=True)
    submitted = contract_client.submit_job(user=JOB_USER, submission=submission)

    with pytest.raises(SlurmAuthError) as raised:
        contract_client.cancel_job(user="bob", job_id=submitted.job_id)

    assert re.search(r"Access/permission denied|permission", str(raised.value), re.IGNORECASE)
    assert contract_client.get_job(job_id=submitted.job_id).state is JobState.PENDING


def test_more_gpus_than_a_node_has_is_rejected_with_slurms_message(
    live: LiveCluster, contract_client: SlurmClient, contract_submission: Callable[..., JobSubmission]
) -> None:
    with pytest.raises(SlurmRejected) as raised:
        contract_client.submit_job(user=JOB_USER, submission=contract_submission(gpus=live.gpus_per_node * 2 + 1))

    assert raised.value.retryable is False
    assert "Requested node configuration is not available" in str(raised.value)
    assert [message.error_number for message in raised.value.messages] == [2014]


def test_a_held_submission_succeeds_with_its_job_id(
    live: LiveCluster, contract_client: SlurmClient, contract_submission: Callable[..., JobSubmission]
) -> None:
    submitted = contract_client.submit_job(user=JOB_USER, submission=contract_submission(hold=True))

    job = contract_client.get_job(job_id=submitted.job_id)
    assert job.state is JobState.PENDING
    assert job.state_reason == "JobHeldUser"
    assert (job.gpus, job.gpu_type) == (1, live.gpu_type)


def test_listing_since_a_time_is_not_modified_until_a_job_changes(
    contract_client: SlurmClient, contract_submission: Callable[..., JobSubmission]
) -> None:
    # Jobs of earlier tests may still be finishing: wait for a quiet second.
    deadline = time.monotonic() + 30
    while True:
        quiet_since = datetime.now(UTC)
        time.sleep(1.1)  # update_time has a resolution of one second
        if contract_client.list_jobs(updated_since=quiet_since) is None:
            break
        assert time.monotonic() < deadline, "slurmctld reported changes for 30 s"

    submitted = contract_client.submit_job(user=JOB_USER, submission=contract_submission(hold=True))

    listing = contract_client.list_jobs(updated_since=quiet_since)
    assert listing is not None
    assert submitted.job_id in {job.job_id for job in listing.jobs}


def test_an_unknown_job_is_not_found(contract_client: SlurmClient) -> None:
    with pytest.raises(SlurmNotFound):
        contract_client.get_job(job_id=987654321)


def test_nodes_partitions_and_gpu_types_are_read(live: LiveCluster, contract_client: SlurmClient) -> None:
    nodes = contract_client.nodes()
    gpu_nodes = [node for node in nodes if node.gpu_type == live.gpu_type]
    assert len(gpu_nodes) >= 2
    assert all(node.gpus_total == live.gpus_per_node for node in gpu_nodes)
    partitions = {partition.name: partition for partition in contract_client.partitions()}
    assert {"debug", live.gpu_partition} <= set(partitions)
    assert partitions["debug"].max_time_minutes == 30
    assert set(partitions[live.gpu_partition].nodes) == {node.name for node in gpu_nodes}


def test_a_gpu_minute_limit_is_written_read_back_and_enforced_by_slurm(
    live: LiveCluster,
    contract_client: SlurmClient,
    contract_submission: Callable[..., JobSubmission],
    contract_account: str,
    contract_parent_account: str,
) -> None:
    assert contract_client.account_gpu_minutes_limit(account=contract_account, cluster=live.name) is None

    applied = contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=3)

    assert applied == 3
    assert contract_client.account_gpu_minutes_limit(account=contract_account, cluster=live.name) == 3
    (own,) = [a for a in contract_client.associations(account=contract_account, cluster=live.name) if not a.user]
    assert own.parent_account == contract_parent_account

    # 2 GPUs x 1 minute fits in 3 GPU-minutes; 2 GPUs x 2 minutes does not, so Slurm holds it back.
    fits = contract_client.submit_job(
        user=JOB_USER,
        submission=contract_submission(gpus=2, time_limit_minutes=1, script="#!/bin/bash\nsleep 1\n"),
    )
    too_big = contract_client.submit_job(user=JOB_USER, submission=contract_submission(gpus=2, time_limit_minutes=2))
    wait_for_job(contract_client, fits.job_id, lambda job: job.state is not JobState.PENDING)
    held = wait_for_job(contract_client, too_big.job_id, lambda job: job.state_reason != "None")
    assert held.state is JobState.PENDING
    assert held.state_reason == "AssocGrpGRESMinutes"

    # Raising the limit lets the held job start.
    raised = contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=100)
    assert raised == 100
    started = wait_for_job(contract_client, too_big.job_id, lambda job: job.state is not JobState.PENDING)
    assert started.state in {JobState.RUNNING, JobState.COMPLETED}


def test_a_limit_changed_behind_the_portals_back_is_read_as_drift_and_repaired(
    live: LiveCluster, contract_client: SlurmClient, contract_account: str
) -> None:
    contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=600)

    # What an administrator at the cluster would type.
    live.slurm_command("sacctmgr", "-i", "modify", "account", contract_account, "set", "GrpTRESMins=gres/gpu=42")

    assert contract_client.account_gpu_minutes_limit(account=contract_account, cluster=live.name) == 42
    assert (
        contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=600) == 600
    )
    shown = live.slurm_command(
        "sacctmgr", "-n", "-P", "show", "assoc", f"account={contract_account}", "user=", "format=GrpTRESMins"
    )
    assert "gres/gpu=600" in shown


def test_an_account_is_created_with_its_limit_under_its_parent(
    live: LiveCluster, contract_client: SlurmClient, contract_parent_account: str
) -> None:
    name = f"t{uuid.uuid4().hex[:10]}"
    contract_client.create_account(
        name=name,
        cluster=live.name,
        description="pytest",
        organization="pytest",
        parent_account=contract_parent_account,
        gpu_minutes_limit=600,
    )
    try:
        assert contract_client.account_gpu_minutes_limit(account=name, cluster=live.name) == 600
        (own,) = [a for a in contract_client.associations(account=name, cluster=live.name) if not a.user]
        assert own.parent_account == contract_parent_account
        # Creating it again (the sync does, for accounts it is unsure of) changes nothing.
        contract_client.create_account(
            name=name,
            cluster=live.name,
            description="pytest",
            organization="pytest",
            parent_account=contract_parent_account,
            gpu_minutes_limit=600,
        )
        assert contract_client.account_gpu_minutes_limit(account=name, cluster=live.name) == 600
    finally:
        contract_client.delete_account(name=name)
    assert name not in {account.name for account in contract_client.accounts()}


def test_clearing_a_limit(live: LiveCluster, contract_client: SlurmClient, contract_account: str) -> None:
    contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=30)

    if live.generation < (23, 2):
        # 22.05 only: slurmdbd clears the limit when the account is moved, but slurmctld keeps enforcing it.
        with pytest.raises(SlurmRejected) as raised:
            contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=None)
        assert "set a new limit instead" in str(raised.value)
        assert contract_client.account_gpu_minutes_limit(account=contract_account, cluster=live.name) == 30
        return

    assert (
        contract_client.set_account_gpu_minutes_limit(account=contract_account, cluster=live.name, minutes=None) is None
    )
    shown = live.slurm_command(
        "sacctmgr", "-n", "-P", "show", "assoc", f"account={contract_account}", "user=", "format=GrpTRESMins"
    )
    assert "gres/gpu" not in shown


def test_an_accounting_query_that_matches_nothing_is_an_empty_list(contract_client: SlurmClient) -> None:
    # 22.05 answers it with error 9003 "Nothing found"; for a list that means no records.
    assert contract_client.accounting_jobs(account=f"none{uuid.uuid4().hex[:8]}") == []
