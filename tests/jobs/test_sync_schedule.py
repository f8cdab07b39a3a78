"""The pace of the job sync: fast while a cluster has jobs that can change, slow when idle or failing."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import JobState
from jobs.sync_schedule import clusters_due_for_job_sync, job_sync_slot, quota_usage_collection_due
from tests.factories import make_job, make_matrix_cluster

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("paces")]


@pytest.fixture
def paces() -> object:
    with override_settings(JOB_SYNC_ACTIVE_SECONDS=1, JOB_SYNC_INTERVAL_SECONDS=5) as overridden:
        yield overridden


def _synced(cluster: Cluster, seconds_ago: float, *, error: str = "") -> None:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    Cluster.objects.filter(pk=cluster.pk).update(jobs_synced_at=at, jobs_sync_error=error)


def test_a_cluster_with_running_jobs_is_due_every_second_and_an_idle_one_every_five() -> None:
    busy, idle = make_matrix_cluster("busy"), make_matrix_cluster("idle")
    make_job(busy, state=JobState.RUNNING)
    make_job(idle, state=JobState.COMPLETED)
    _synced(busy, 1.5)
    _synced(idle, 1.5)

    assert clusters_due_for_job_sync(now=timezone.now()) == [busy.pk]

    _synced(idle, 6)
    assert sorted(clusters_due_for_job_sync(now=timezone.now())) == sorted([busy.pk, idle.pk])


def test_queued_and_pending_jobs_count_as_active_and_a_never_synced_cluster_is_due() -> None:
    queued, pending, never = make_matrix_cluster("q"), make_matrix_cluster("p"), make_matrix_cluster("never")
    make_job(queued, state=JobState.QUEUED)
    make_job(pending, state=JobState.PENDING)
    _synced(queued, 1)
    _synced(pending, 1)

    assert sorted(clusters_due_for_job_sync(now=timezone.now())) == sorted([queued.pk, pending.pk, never.pk])


def test_a_failing_cluster_is_tried_at_the_slow_pace_even_with_active_jobs() -> None:
    failing = make_matrix_cluster("failing")
    make_job(failing, state=JobState.RUNNING)
    _synced(failing, 2, error="slurmrestd refused the connection")

    assert clusters_due_for_job_sync(now=timezone.now()) == []
    assert clusters_due_for_job_sync(now=timezone.now() + timedelta(seconds=4)) == [failing.pk]


def test_an_inactive_cluster_is_never_due() -> None:
    Cluster.objects.filter(pk=make_matrix_cluster("off").pk).update(is_active=False)

    assert clusters_due_for_job_sync(now=timezone.now()) == []


def _unused_id() -> int:
    """A cluster id no other run has used: the cache outlives a test run."""
    return uuid.uuid4().int % 10**12


def test_one_sync_of_a_cluster_at_a_time() -> None:
    one, two = _unused_id(), _unused_id()
    with job_sync_slot(one) as first, job_sync_slot(one) as second, job_sync_slot(two) as other:
        assert (first, second, other) == (True, False, True)
    with job_sync_slot(one) as again:
        assert again is True


def test_usage_is_collected_once_per_slow_interval_however_fast_the_sync() -> None:
    one, two = _unused_id(), _unused_id()
    assert [quota_usage_collection_due(one) for _ in range(3)] == [True, False, False]
    assert quota_usage_collection_due(two) is True
