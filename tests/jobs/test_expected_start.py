"""When will it start: on every live cluster (Slurm 22.05, 24.11, 26.05) a job waiting for GPUs gets Slurm's own
expected start (its backfill scheduler's plan, slurmrestd's start_time of a pending job) and its reason in plain
words, in the API."""

from __future__ import annotations

from datetime import timedelta

import pytest

from clusters.clients import slurm_client_for
from clusters.models import Partition
from jobs.models import Job, JobState
from jobs.reasons import pending_reason_text
from tests.conftest import wait_until
from tests.jobs.conftest import LiveProject
from tests.live_clusters import LiveCluster

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKER_MINUTES = 3


def test_a_job_waiting_for_gpus_shows_slurms_expected_start(
    live: LiveCluster, contract_project: LiveProject, celery_worker: str
) -> None:
    cluster = contract_project.cluster
    # On the 22.05 cluster the a100 partition, which other tests leave alone; elsewhere the one GPU partition.
    name = "a100" if Partition.objects.filter(cluster=cluster, name="a100").exists() else live.gpu_partition
    partition = Partition.objects.get(cluster=cluster, name=name)
    gpu_type = partition.gpu_types[0]
    per_node = partition.gpus_per_node_by_type[gpu_type]
    shape = {"partition": name, "gpu_type": gpu_type, "gpus": per_node}
    # Every node of the partition busy for a few minutes, then one more job that needs a whole node.
    blockers = [
        contract_project.submit(
            name=f"blocker {node}", time_limit_minutes=BLOCKER_MINUTES, script="#!/bin/bash\nsleep 170\n", **shape
        )
        for node in partition.node_names
    ]
    for blocker in blockers:
        contract_project.wait_for(blocker["id"], lambda job: job.state != JobState.QUEUED)
    # In Slurm before it (the workers deliver in any order), so that it queues behind them.
    waiting = contract_project.submit(name="waits", time_limit_minutes=1, **shape)
    started = [
        job.started_at for job in Job.objects.filter(pk__in=[b["id"] for b in blockers]) if job.started_at is not None
    ]

    job = contract_project.wait_for(
        waiting["id"],
        # Slurm gives a reason once its scheduler has looked at the job, and the estimate once backfill planned it.
        lambda job: job.state == JobState.PENDING and job.expected_start_at is not None and job.state_reason != "",
    )

    expected, submitted = job.expected_start_at, job.submitted_at
    assert expected is not None
    assert submitted is not None
    assert job.slurm_job_id is not None
    assert job.state_reason in {"Resources", "Priority"}
    assert expected > submitted
    if len(started) == len(blockers):  # all blockers run: the waiting job starts when the first of them ends
        first_end = min(started).replace(microsecond=0) + timedelta(minutes=BLOCKER_MINUTES)
        assert expected >= first_end - timedelta(seconds=1)
    # The portal shows Slurm's own estimate, as slurmrestd gives it for the job now (backfill may move it).
    client = slurm_client_for(cluster)
    slurm_job_id = job.slurm_job_id

    def same_as_slurm() -> bool:
        direct = client.get_job(job_id=slurm_job_id).expected_start_time
        contract_project.sync()
        job.refresh_from_db()
        return direct is not None and direct == job.expected_start_at

    wait_until(same_as_slurm, timeout_seconds=30, what="the portal's estimate to be Slurm's")
    expected = job.expected_start_at
    assert expected is not None
    detail = contract_project.api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["expected_start_at"] == expected.isoformat().replace("+00:00", "Z")
    assert detail["pending_reason"] == pending_reason_text(job.state_reason)
    assert detail["pending_reason"] in {
        "waiting for GPUs or other resources to become free",
        "waiting behind jobs with a higher priority",
    }

    contract_project.api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    cancelled = contract_project.wait_for(job.pk, lambda job: job.is_final)
    assert (cancelled.state, cancelled.expected_start_at) == (JobState.CANCELLED, None)
