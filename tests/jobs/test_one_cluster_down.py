"""One cluster down, the others working: with north's slurmrestd stopped, its jobs wait and the other clusters'
run to the end; when north comes back its waiting job goes through, once. Real clusters, a real worker.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.tasks import cluster_sync
from jobs.models import Job, JobState
from tests.jobs.conftest import LiveProject, _live_project, registered_cluster
from tests.live_clusters import LiveCluster, live_clusters

pytestmark = [pytest.mark.cluster, pytest.mark.disrupts_clusters, pytest.mark.django_db(transaction=True)]

SCRIPTS = Path(settings.BASE_DIR) / "scripts"


def _cluster(name: str) -> LiveCluster:
    found = {cluster.name: cluster for cluster in live_clusters()}
    cluster = found.get(name)
    if cluster is None or cluster.status != "up":
        pytest.skip(f"cluster {name} is not up here: {cluster.reason if cluster else 'not described'}")
    return cluster


@pytest.fixture
def two_projects() -> Iterator[tuple[LiveProject, LiveProject]]:
    """A project on the 22.05 cluster and one on north (Slurm 24.11)."""
    local, north = _cluster("local"), _cluster("north")
    local_cluster = registered_cluster(local)
    local_projects = _live_project(local_cluster, slurm_client_for(local_cluster))
    north_cluster = registered_cluster(north)
    north_projects = _live_project(
        north_cluster, slurm_client_for(north_cluster), partition=north.gpu_partition, gpu_type=north.gpu_type
    )
    yield next(local_projects), next(north_projects)
    for generator in (local_projects, north_projects):
        next(generator, None)


def _wait_row(job_id: object, condition: Callable[[Job], bool], *, timeout: float = 60) -> Job:
    """Watch the job's row only: the sync of a cluster that is down has nothing to tell."""
    deadline = time.monotonic() + timeout
    while not condition(job := Job.objects.get(pk=str(job_id))):
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} is still {job.state} ({job.last_error}) after {timeout}s")
        time.sleep(0.3)
    return job


@pytest.fixture
def north_outage() -> Iterator[None]:
    subprocess.run(["bash", str(SCRIPTS / "cluster.sh"), "stop", "slurmrestd", "north"], check=True)
    try:
        yield
    finally:
        subprocess.run(["bash", str(SCRIPTS / "slurm-chroot.sh"), "up", "north"], check=True, capture_output=True)


def test_a_cluster_that_goes_down_holds_only_its_own_jobs(
    two_projects: tuple[LiveProject, LiveProject], celery_worker: str, north_outage: None
) -> None:
    on_local, on_north = two_projects

    waiting = on_north.submit(name="waits", script="#!/bin/bash\necho north\n")
    running = on_local.submit(name="runs", script="#!/bin/bash\necho local\n")

    # The other cluster is unaffected: its job runs to the end while north is down.
    done = on_local.wait_for(running["id"], lambda job: job.is_final)
    assert (done.state, done.exit_code) == (JobState.COMPLETED, 0)
    held = _wait_row(waiting["id"], lambda job: job.submit_attempts >= 1 and bool(job.last_error))
    assert held.state == JobState.QUEUED
    assert "is unreachable" in held.last_error
    cluster_sync(on_north.cluster.pk)
    cluster_sync(on_local.cluster.pk)
    statuses = dict(Cluster.objects.values_list("name", "last_ping_ok"))
    assert (statuses["local"], statuses["north"]) == (True, False)

    # North comes back: the waiting job is delivered by the worker's retry, and runs once.
    subprocess.run(["bash", str(SCRIPTS / "slurm-chroot.sh"), "up", "north"], check=True, capture_output=True)
    delivered = on_north.wait_for(waiting["id"], lambda job: job.is_final, timeout=120)
    assert (delivered.state, delivered.exit_code) == (JobState.COMPLETED, 0)
    listing = slurm_client_for(on_north.cluster).list_jobs()
    assert listing is not None
    assert [job.job_id for job in listing.jobs if job.comment == delivered.slurm_comment] == [delivered.slurm_job_id]
    cluster_sync(on_north.cluster.pk)
    assert Cluster.objects.get(name="north").last_ping_ok is True
