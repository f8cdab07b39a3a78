"""Whatever worker meets a Slurm outage first shows it in the cluster's status, and no job's state changes.

In the slurmctld drill every slurmrestd request took ~9 s to fail while slurmctld was down, deliveries kept
both workers busy, and the periodic health check waited behind them: the portal showed the cluster "ok"
through a 45 s outage. Here a stand-in client fails the way 22.05 did then.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from clusters.models import Cluster
from clusters.slurm import SlurmAuthError, SlurmServerError
from clusters.slurm.types import SlurmMessage
from jobs import job_sync, tasks
from jobs.job_sync import job_deliver
from jobs.models import Job, JobState
from tests.factories import make_job, make_matrix_cluster

pytestmark = pytest.mark.django_db

CONTROLLER_DOWN = SlurmServerError(
    "Unable to contact slurm controller (connect failure) (Slurm error 1800)",
    messages=(SlurmMessage("Unable to contact slurm controller (connect failure)", 1800),),
    status_code=500,
)
LISTING_WHILE_DOWN = SlurmAuthError(
    "slurmctld did not answer, or refused the token: slurmrestd reports both the same way. Check that slurmctld is "
    "running, then the cluster's JWT key and the clocks: Unspecified error: Failed while looking for jobs",
    status_code=500,
)


class ControllerDown:
    """Answers every request the way slurmrestd 22.05 did with slurmctld stopped."""

    admin_user = "root"

    def submit_job(self, **request: Any) -> None:
        raise CONTROLLER_DOWN

    def list_jobs(self, **query: Any) -> None:
        raise LISTING_WHILE_DOWN

    def accounting_jobs(self, **query: Any) -> list[object]:
        return []


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    cluster = make_matrix_cluster()
    Cluster.objects.filter(pk=cluster.pk).update(last_ping_ok=True, last_ping_at=timezone.now(), last_ping_error="")
    monkeypatch.setattr(job_sync, "slurm_client_for", lambda cluster: ControllerDown())
    monkeypatch.setattr(tasks, "slurm_client_for", lambda cluster: ControllerDown())
    monkeypatch.setattr(job_sync, "job_directory_prepare", lambda **where: None)
    return cluster


def _job(cluster: Cluster, *, state: JobState) -> Job:
    return make_job(
        cluster,
        name="during the outage",
        state=state,
        slurm_job_id=None if state == JobState.QUEUED else 41,
        started_at=timezone.now() if state == JobState.RUNNING else None,
    )


def test_a_delivery_that_finds_the_controller_down_waits_and_marks_the_cluster_unreachable(cluster: Cluster) -> None:
    job = _job(cluster, state=JobState.QUEUED)

    delivery = job_deliver(job_id=job.pk)

    job.refresh_from_db()
    cluster.refresh_from_db()
    assert (delivery.outcome, job.state) == ("retry", JobState.QUEUED)
    assert (cluster.last_ping_ok, cluster.last_ping_error) == (False, str(CONTROLLER_DOWN))


def test_a_job_sync_that_cannot_list_marks_the_cluster_unreachable_and_changes_no_job(cluster: Cluster) -> None:
    running = _job(cluster, state=JobState.RUNNING)

    tasks.cluster_jobs_sync(cluster.pk)

    running.refresh_from_db()
    cluster.refresh_from_db()
    assert running.state == JobState.RUNNING
    assert not running.transitions.exists()
    assert (cluster.last_ping_ok, cluster.last_ping_error) == (False, str(LISTING_WHILE_DOWN))
    assert cluster.jobs_sync_error == str(LISTING_WHILE_DOWN)
