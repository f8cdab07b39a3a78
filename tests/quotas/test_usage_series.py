"""The burn-down series of an allocation: daily used and reserved GPU-hours, the burn rate, the projected end."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster
from jobs.models import Job
from quotas.models import Allocation, period_start
from quotas.services import quota_charge, quota_release, quota_reserve
from quotas.usage import allocation_usage_series
from tenants.models import Project
from tests.conftest import SentTask
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """The services queue a limit sync and an alert check after commit; these tests run no worker."""


def noon(day: date) -> datetime:
    return period_start(day) + timedelta(hours=12)


class Ledger:
    """Jobs made directly on the matrix cluster, reserved and charged through the quota services."""

    def __init__(self, project: Project, cluster: Cluster) -> None:
        self.project, self.cluster = project, cluster

    def job(self, *, gpus: int, minutes: int, ended_at: datetime | None = None) -> Job:
        return Job.objects.create(
            project=self.project,
            cluster=self.cluster,
            cluster_username="alice",
            name="burn",
            partition="gpu",
            gpu_type="h100",
            gpus=gpus,
            time_limit_minutes=minutes,
            ended_at=ended_at,
        )

    def charge_ended(self, *, day: date, gpu_seconds: int) -> None:
        """A job found in Slurm's accounting after it ended that day (no reservation to replace)."""
        job = self.job(gpus=1, minutes=1, ended_at=noon(day))
        assert quota_charge(job=job, gpu_seconds=gpu_seconds, now=noon(day), note="from accounting")

    def reserve(self, *, gpus: int, minutes: int) -> Job:
        job = self.job(gpus=gpus, minutes=minutes)
        assert quota_reserve(job=job, gpu_type="h100", now=timezone.now()) is not None
        return job


@pytest.fixture
def vision() -> tuple[Project, Cluster]:
    return make_project(make_tenant("acme"), "vision"), make_matrix_cluster()


def test_daily_used_and_reserved_the_burn_rate_and_the_projected_exhaustion(vision: tuple[Project, Cluster]) -> None:
    project, cluster = vision
    today = timezone.now().date()
    allocation = grant_allocation(
        project, cluster, gpu_hours=100, starts_on=today - timedelta(days=9), ends_on=today + timedelta(days=20)
    )
    ledger = Ledger(project, cluster)
    ledger.charge_ended(day=today - timedelta(days=8), gpu_seconds=36_000)  # before the last 7 days
    ledger.charge_ended(day=today - timedelta(days=5), gpu_seconds=18_000)
    ledger.charge_ended(day=today - timedelta(days=5), gpu_seconds=7_200)
    ledger.charge_ended(day=today - timedelta(days=2), gpu_seconds=54_000)
    ledger.reserve(gpus=3, minutes=120)  # 21,600 GPU-s, still open tonight
    quota_release(job=ledger.reserve(gpus=1, minutes=60), note="cancelled before it ran")
    finished = ledger.reserve(gpus=1, minutes=60)
    assert quota_charge(job=finished, gpu_seconds=1_800, now=timezone.now(), note="from accounting")
    allocation.refresh_from_db()

    series = allocation_usage_series(allocation=allocation, now=timezone.now())

    used = {9 - index: day.used_gpu_seconds for index, day in enumerate(series.days)}
    assert [day.day for day in series.days] == [today - timedelta(days=ago) for ago in range(9, -1, -1)]
    assert used == {9: 0, 8: 36_000, 7: 0, 6: 0, 5: 25_200, 4: 0, 3: 0, 2: 54_000, 1: 0, 0: 1_800}
    assert [day.cumulative_used_gpu_seconds for day in series.days] == [
        0,
        36_000,
        36_000,
        36_000,
        61_200,
        61_200,
        61_200,
        115_200,
        115_200,
        117_000,
    ]
    assert [day.reserved_gpu_seconds for day in series.days] == [0] * 9 + [21_600]
    # The last 7 days burned 25,200 + 54,000 + 1,800 GPU-s = 22.5 GPU-hours: 3.21 a day.
    assert (series.burn_rate_days, series.burn_rate_gpu_seconds) == (7, 81_000)
    assert str(series.burn_rate_gpu_hours_per_day) == "3.21"
    # 360,000 - 117,000 - 21,600 = 221,400 GPU-s remain: 19.1 days at that rate.
    assert allocation.remaining_gpu_seconds == 221_400
    assert series.projected_exhaustion_on == today + timedelta(days=19)
    assert series.exhausted_before_period_end is True

    # The same through the API, in hours next to the exact GPU-seconds.
    member = make_user("alice")
    add_project_member(project, member, "viewer")
    client = APIClient()
    client.force_authenticate(member)
    body: dict[str, Any] = client.get(f"/api/v1/allocations/{allocation.pk}/usage/").json()
    assert body["burn_rate_gpu_hours_per_day"] == "3.21"
    assert body["burn_rate_days"] == 7
    assert body["projected_exhaustion_on"] == (today + timedelta(days=19)).isoformat()
    assert body["exhausted_before_period_end"] is True
    assert body["as_of"] == today.isoformat()
    assert body["allocation"]["remaining_gpu_hours"] == "61.50"
    assert body["days"][1] == {
        "date": (today - timedelta(days=8)).isoformat(),
        "used_gpu_hours": "10.00",
        "reserved_gpu_hours": "0.00",
        "cumulative_used_gpu_hours": "10.00",
        "used_gpu_seconds": 36_000,
        "reserved_gpu_seconds": 0,
        "cumulative_used_gpu_seconds": 36_000,
    }
    assert body["days"][-1] == {
        "date": today.isoformat(),
        "used_gpu_hours": "0.50",
        "reserved_gpu_hours": "6.00",
        "cumulative_used_gpu_hours": "32.50",
        "used_gpu_seconds": 1_800,
        "reserved_gpu_seconds": 21_600,
        "cumulative_used_gpu_seconds": 117_000,
    }
    # The last 3 days only: the totals still count everything before them.
    recent = client.get(f"/api/v1/allocations/{allocation.pk}/usage/?days=3").json()
    assert [(d["date"], d["used_gpu_seconds"], d["cumulative_used_gpu_seconds"]) for d in recent["days"]] == [
        ((today - timedelta(days=2)).isoformat(), 54_000, 115_200),
        ((today - timedelta(days=1)).isoformat(), 0, 115_200),
        (today.isoformat(), 1_800, 117_000),
    ]
    assert recent["burn_rate_gpu_hours_per_day"] == "3.21"
    invalid = client.get(f"/api/v1/allocations/{allocation.pk}/usage/?days=0")
    assert invalid.status_code == 400
    assert list(invalid.json()["fields"]) == ["days"]


def test_the_series_costs_two_queries_whatever_the_ledger_holds(vision: tuple[Project, Cluster]) -> None:
    project, cluster = vision
    today = timezone.now().date()
    allocation = grant_allocation(project, cluster, gpu_hours=1000, starts_on=today - timedelta(days=29), ends_on=today)
    ledger = Ledger(project, cluster)
    counts = []
    for round_ in range(2):
        for ago in range(0, 30, 1 + round_):
            ledger.charge_ended(day=today - timedelta(days=ago), gpu_seconds=60)
        allocation.refresh_from_db()
        with CaptureQueriesContext(connection) as queries:
            series = allocation_usage_series(allocation=allocation, now=timezone.now())
        counts.append(len(queries))
        assert len(series.days) == 30
    assert counts == [2, 2]
    assert series.days[-1].cumulative_used_gpu_seconds == (30 + 15) * 60


def test_early_in_the_period_the_burn_rate_averages_over_the_days_elapsed(vision: tuple[Project, Cluster]) -> None:
    project, cluster = vision
    today = timezone.now().date()
    allocation = grant_allocation(
        project, cluster, gpu_hours=10, starts_on=today - timedelta(days=2), ends_on=today + timedelta(days=27)
    )
    Ledger(project, cluster).charge_ended(day=today - timedelta(days=1), gpu_seconds=10_800)
    allocation.refresh_from_db()

    series = allocation_usage_series(allocation=allocation, now=timezone.now())

    # 3 GPU-hours over the 3 days elapsed: 1 a day; 7 remain: gone in 7 days.
    assert (series.burn_rate_days, str(series.burn_rate_gpu_hours_per_day)) == (3, "1.00")
    assert series.projected_exhaustion_on == today + timedelta(days=7)
    assert series.exhausted_before_period_end is True


def test_no_projection_when_nothing_burns_or_the_period_ends_first(vision: tuple[Project, Cluster]) -> None:
    project, cluster = vision
    today = timezone.now().date()
    idle = grant_allocation(
        project, cluster, gpu_hours=10, starts_on=today - timedelta(days=3), ends_on=today + timedelta(days=3)
    )

    series = allocation_usage_series(allocation=idle, now=timezone.now())

    assert [day.used_gpu_seconds for day in series.days] == [0, 0, 0, 0]
    assert (str(series.burn_rate_gpu_hours_per_day), series.projected_exhaustion_on) == ("0.00", None)
    assert series.exhausted_before_period_end is False

    # 4 GPU-hours in 4 days: 1 a day; the 6 left would last until after the period's last day.
    Ledger(project, cluster).charge_ended(day=today, gpu_seconds=14_400)
    idle.refresh_from_db()
    slow = allocation_usage_series(allocation=idle, now=timezone.now())
    assert str(slow.burn_rate_gpu_hours_per_day) == "1.00"
    assert (slow.projected_exhaustion_on, slow.exhausted_before_period_end) == (None, False)


def test_a_used_up_allocation_is_exhausted_today(vision: tuple[Project, Cluster]) -> None:
    project, cluster = vision
    today = timezone.now().date()
    allocation = grant_allocation(project, cluster, gpu_hours=1)
    Ledger(project, cluster).reserve(gpus=1, minutes=60)
    allocation = Allocation.objects.get(pk=allocation.pk)

    series = allocation_usage_series(allocation=allocation, now=timezone.now())

    assert allocation.remaining_gpu_seconds == 0
    assert (series.projected_exhaustion_on, series.exhausted_before_period_end) == (today, True)
    assert series.days[-1].reserved_gpu_seconds == 3_600
