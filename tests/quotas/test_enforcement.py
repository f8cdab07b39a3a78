"""The portal's own quota check at submission: reservations, refusals with what to do, and row locks."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import ClusterAccount
from jobs.models import Job, JobState
from quotas.models import Allocation, LedgerEntry, LedgerKind
from tenants.models import AuditEvent, Notification
from tests.conftest import wait_until
from tests.factories import (
    add_project_member,
    add_tenant_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

SCRIPT = "#!/bin/bash\necho hi\n"


def _world(gpu_hours: str, *, slug: str = "vision") -> tuple[Any, Any, Allocation, Any]:
    cluster = make_matrix_cluster()
    tenant = make_tenant()
    project = make_project(tenant, slug)
    member = make_user()
    add_project_member(project, member, "member")
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    allocation = grant_allocation(project, cluster, gpu_hours)
    return cluster, project, allocation, member


def _submit(user: Any, project: Any, **fields: Any) -> Any:
    api = APIClient()
    api.force_authenticate(user)
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": "matrixcluster", "script": SCRIPT}
    return api.post("/api/v1/jobs/", {**body, **fields}, format="json")


@pytest.mark.django_db
def test_a_submission_reserves_gpus_times_time_limit_and_the_allocation_shows_it() -> None:
    _, project, allocation, member = _world("10")

    response = _submit(member, project, gpus=2, time_limit_minutes=90)

    assert response.status_code == 202, response.json()
    job = Job.objects.get()
    allocation.refresh_from_db()
    assert allocation.reserved_gpu_seconds == 2 * 90 * 60
    assert allocation.remaining_gpu_seconds == 10 * 3600 - 2 * 90 * 60
    reservation = LedgerEntry.objects.get(kind=LedgerKind.RESERVE)
    assert (reservation.job_id, reservation.allocation_id, reservation.gpu_seconds) == (job.pk, allocation.pk, 10800)
    api = APIClient()
    api.force_authenticate(member)
    shown = api.get(f"/api/v1/allocations/{allocation.pk}/").json()
    assert shown["granted_gpu_hours"] == "10.00"
    assert shown["reserved_gpu_hours"] == "3.00"
    assert shown["used_gpu_hours"] == "0.00"
    assert shown["remaining_gpu_hours"] == "7.00"
    assert shown["percent_used"] == "30.0"


@pytest.mark.django_db
def test_a_submission_beyond_what_remains_is_refused_with_what_to_do() -> None:
    _, project, allocation, member = _world("3.5")

    response = _submit(member, project, gpus=4, time_limit_minutes=240)

    assert response.status_code == 409
    assert response.json() == {
        "code": "quota_exceeded",
        "message": (
            "This job needs 16.0 GPU-hours (4 GPUs x 240 min); vision has 3.5 GPU-hours left on cluster "
            f"matrixcluster until {allocation.ends_on.isoformat()}; request more at "
            f"/api/v1/allocations/{allocation.pk}/requests/, or ask for fewer GPUs or a shorter time limit."
        ),
        "fields": {},
    }
    # Nothing was stored: no job, no ledger row, no audit event of a submission.
    assert Job.objects.count() == 0
    assert LedgerEntry.objects.exclude(kind=LedgerKind.GRANT).count() == 0
    assert not AuditEvent.objects.filter(action="job.submit").exists()
    allocation.refresh_from_db()
    assert allocation.reserved_gpu_seconds == 0


@pytest.mark.django_db
def test_what_remains_is_exactly_enough_and_then_nothing_is() -> None:
    _, project, _allocation, member = _world("2")

    assert _submit(member, project, gpus=2, time_limit_minutes=60).status_code == 202
    refused = _submit(member, project, gpus=1, time_limit_minutes=1)

    assert refused.status_code == 409
    assert "vision has no GPU-hours left on cluster matrixcluster" in refused.json()["message"]


@pytest.mark.django_db
def test_no_allocation_open_today_is_refused_and_says_whom_to_ask() -> None:
    _cluster, project, allocation, member = _world("10")
    Allocation.objects.filter(pk=allocation.pk).update(
        starts_on=timezone.now().date() - timedelta(days=40), ends_on=timezone.now().date() - timedelta(days=10)
    )

    response = _submit(member, project, gpus=1, time_limit_minutes=10)

    assert response.status_code == 409
    assert response.json()["code"] == "no_allocation"
    assert response.json()["message"] == (
        "vision has no GPU-hour allocation open today on cluster matrixcluster for h100 GPUs; "
        "ask your tenant admin or a portal admin for one."
    )


@pytest.mark.django_db
def test_a_typed_allocation_serves_its_type_and_refuses_another() -> None:
    _cluster, project, allocation, member = _world("10")
    Allocation.objects.filter(pk=allocation.pk).update(gpu_type="a100")

    other = _submit(member, project, gpus=1, gpu_type="h100", time_limit_minutes=10)

    assert other.status_code == 409, other.json()
    assert other.json()["message"] == (
        "vision has no GPU-hour allocation open today on cluster matrixcluster for h100 GPUs "
        "(it has some for a100); ask your tenant admin or a portal admin for one."
    )
    Allocation.objects.filter(pk=allocation.pk).update(gpu_type="h100")
    assert _submit(member, project, gpus=1, gpu_type="h100", time_limit_minutes=10).status_code == 202


@pytest.mark.django_db
def test_cancelling_a_queued_job_gives_its_reservation_back_at_once() -> None:
    _, project, allocation, member = _world("10")
    job_id = _submit(member, project, gpus=2, time_limit_minutes=60).json()["id"]
    api = APIClient()
    api.force_authenticate(member)

    assert api.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 202

    allocation.refresh_from_db()
    assert Job.objects.get(pk=job_id).state == JobState.CANCELLED
    assert allocation.reserved_gpu_seconds == 0
    assert allocation.remaining_gpu_seconds == 10 * 3600
    assert list(LedgerEntry.objects.filter(job_id=job_id).values_list("kind", "gpu_seconds")) == [
        ("reserve", 7200),
        ("release", 7200),
    ]


@pytest.mark.django_db(transaction=True)
def test_twenty_simultaneous_submissions_against_room_for_five_accept_exactly_five() -> None:
    _, project, allocation, member = _world("5")
    barrier = threading.Barrier(20)
    statuses: list[int] = []
    lock = threading.Lock()

    def submit() -> None:
        try:
            barrier.wait(timeout=30)
            status = _submit(member, project, gpus=1, time_limit_minutes=60).status_code
            with lock:
                statuses.append(status)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert sorted(statuses) == [202] * 5 + [409] * 15
    allocation.refresh_from_db()
    assert allocation.reserved_gpu_seconds == 5 * 3600
    assert allocation.remaining_gpu_seconds == 0
    assert Job.objects.count() == 5
    assert LedgerEntry.objects.filter(kind=LedgerKind.RESERVE).count() == 5


@pytest.mark.django_db(transaction=True)
def test_crossing_half_the_allocation_notifies_managers_and_tenant_admins_through_the_worker(
    celery_worker: str,
) -> None:
    _, project, allocation, member = _world("4")
    manager, tenant_admin = make_user(), make_user()
    add_project_member(project, manager, "manager")
    add_tenant_member(project.tenant, tenant_admin, "admin")

    assert _submit(member, project, gpus=1, time_limit_minutes=150).status_code == 202  # 2.5 of 4: 62.5%

    wait_until(lambda: Notification.objects.filter(kind="quota.threshold").count() == 2, timeout_seconds=30)
    notified = Notification.objects.filter(kind="quota.threshold")
    assert {notification.user_id for notification in notified} == {manager.pk, tenant_admin.pk}
    assert {notification.title for notification in notified} == {
        f"{project}: 50% of the GPU-hours on matrixcluster are used"
    }
    assert list(allocation.alerts.values_list("threshold_percent", flat=True)) == [50]
    assert member.notifications.count() == 0
