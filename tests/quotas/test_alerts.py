"""Usage alerts: 50, 80 and 100 % of an allocation (counting reservations) are announced once each, to the
project's managers and the tenant's admins, in the portal and by e-mail."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import pytest
from django.core import mail
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job
from quotas import tasks
from quotas.models import Allocation, QuotaAlert
from quotas.services import quota_charge, quota_reserve
from tenants.models import Notification, Project
from tests.conftest import SentArguments, SentTask
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db


class CaptureOnCommit(Protocol):
    def __call__(self, *, execute: bool = ...) -> AbstractContextManager[list[Any]]: ...


@pytest.fixture(autouse=True)
def queued_checks(sent_tasks: list[SentTask]) -> SentArguments:
    """Alert checks the services queue after commit (their allocation ids), recorded instead of sent."""
    return SentArguments(sent_tasks, "quotas.tasks.allocation_alerts_check")


class Vision:
    def __init__(self) -> None:
        self.cluster: Cluster = make_matrix_cluster()
        self.ada = make_user("ada")  # tenant admin
        tenant = make_tenant("acme", admin=self.ada)
        self.project: Project = make_project(tenant, "vision")
        self.mona, self.max, self.alice = make_user("mona"), make_user("max"), make_user("alice")
        add_project_member(self.project, self.mona, "manager")
        add_project_member(self.project, self.max, "manager")
        add_project_member(self.project, self.alice, "member")
        for user in (self.ada, self.mona, self.alice):  # max has no address: told in the portal only
            user.email = f"{user.username}@example.org"
            user.save(update_fields=["email"])
        self.allocation = grant_allocation(self.project, self.cluster, gpu_hours=10)

    def job(self, *, gpus: int, minutes: int) -> Job:
        return Job.objects.create(
            project=self.project,
            cluster=self.cluster,
            cluster_username="alice",
            name="train",
            partition="gpu",
            gpu_type="h100",
            gpus=gpus,
            time_limit_minutes=minutes,
        )


@pytest.fixture
def vision() -> Vision:
    return Vision()


def deliver(queued: SentArguments | list[Any], capture: CaptureOnCommit, *, times: int = 2) -> None:
    """Run each queued check as a worker would, `times` over (a redelivery, a second worker)."""
    checks: list[Any] = list(queued)
    queued.clear()
    with capture(execute=True):
        for allocation_id in checks:
            for _ in range(times):
                tasks.allocation_alerts_check(allocation_id)


def told(title_part: str) -> list[str]:
    return sorted(
        n.user.username for n in Notification.objects.filter(kind="quota.threshold", title__contains=title_part)
    )


def test_each_threshold_is_announced_once_to_managers_and_tenant_admins(
    vision: Vision, queued_checks: list[int], django_capture_on_commit_callbacks: CaptureOnCommit
) -> None:
    allocation_id = vision.allocation.pk
    # 4 of 10 GPU-hours reserved: below every threshold.
    with django_capture_on_commit_callbacks(execute=True):
        quota_reserve(job=vision.job(gpus=1, minutes=240), gpu_type="h100", now=timezone.now())
    assert queued_checks == []  # crossing no threshold costs the workers no task
    deliver([allocation_id], django_capture_on_commit_callbacks)
    assert not Notification.objects.exists()
    assert mail.outbox == []

    # A reservation of 1 more GPU-hour reaches 50 %: reservations count.
    with django_capture_on_commit_callbacks(execute=True):
        quota_reserve(job=vision.job(gpus=1, minutes=60), gpu_type="h100", now=timezone.now())
    assert queued_checks == [allocation_id]
    deliver(queued_checks, django_capture_on_commit_callbacks)
    assert told("50%") == ["ada", "max", "mona"]
    notification = Notification.objects.filter(user=vision.mona).get()
    assert notification.title == "acme/vision: 50% of the GPU-hours on matrixcluster are used"
    allocation = Allocation.objects.get(pk=allocation_id)
    assert notification.body == (
        "acme/vision has used or reserved 5.0 of its 10.0 GPU-hours on cluster matrixcluster for "
        f"{allocation.starts_on} to {allocation.ends_on}; 5.0 GPU-hours are left. New jobs that need more than "
        "that are refused. Members can request more hours on the allocation."
    )
    assert notification.link == f"/projects/acme/vision/allocations/{allocation_id}/"
    assert sorted((m.to[0], m.subject) for m in mail.outbox) == [
        ("ada@example.org", "[GPU portal] acme/vision: 50% of the GPU-hours on matrixcluster are used"),
        ("mona@example.org", "[GPU portal] acme/vision: 50% of the GPU-hours on matrixcluster are used"),
    ]
    mail.outbox.clear()

    # 8 GPU-hours: 80 %, once, even though the check runs again for an earlier reservation.
    with django_capture_on_commit_callbacks(execute=True):
        quota_reserve(job=vision.job(gpus=3, minutes=60), gpu_type="h100", now=timezone.now())
    deliver([*queued_checks, allocation_id], django_capture_on_commit_callbacks)
    queued_checks.clear()
    assert told("50%") == ["ada", "max", "mona"]
    assert told("80%") == ["ada", "max", "mona"]
    assert sorted(m.to[0] for m in mail.outbox) == ["ada@example.org", "mona@example.org"]
    mail.outbox.clear()

    # A job charged 2 GPU-hours from accounting: 10 of 10 used, 100 %.
    ended = vision.job(gpus=1, minutes=120)
    with django_capture_on_commit_callbacks(execute=True):
        assert quota_charge(job=ended, gpu_seconds=7_200, now=timezone.now(), note="from accounting")
    deliver(queued_checks, django_capture_on_commit_callbacks)
    assert told("used up") == ["ada", "max", "mona"]
    assert Notification.objects.get(user=vision.ada, title__contains="used up").title == (
        "acme/vision: GPU-hours on matrixcluster are used up"
    )
    assert sorted(m.to[0] for m in mail.outbox) == ["ada@example.org", "mona@example.org"]
    mail.outbox.clear()

    # Nothing is announced twice, whatever runs the check again.
    deliver([allocation_id], django_capture_on_commit_callbacks, times=3)
    assert Notification.objects.filter(kind="quota.threshold").count() == 9
    assert not Notification.objects.filter(user=vision.alice).exists()
    assert mail.outbox == []
    assert list(QuotaAlert.objects.filter(allocation_id=allocation_id).values_list("threshold_percent", flat=True)) == [
        50,
        80,
        100,
    ]


def test_thresholds_crossed_at_once_are_announced_once_by_the_highest(
    vision: Vision, queued_checks: list[int], django_capture_on_commit_callbacks: CaptureOnCommit
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        quota_reserve(job=vision.job(gpus=3, minutes=180), gpu_type="h100", now=timezone.now())  # 9 of 10

    deliver(queued_checks, django_capture_on_commit_callbacks)

    assert told("") == ["ada", "max", "mona"]
    assert told("80%") == ["ada", "max", "mona"]
    assert sorted(QuotaAlert.objects.values_list("threshold_percent", flat=True)) == [50, 80]
    assert len(mail.outbox) == 2
