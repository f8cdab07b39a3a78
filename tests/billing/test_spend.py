"""Spend over time through the API: exact daily series (a job across midnight split between its two days), the
top projects and users of a period, one currency at a time, and who may read a tenant's or project's spend.

Usage is made as the workers make it, without Slurm: finished jobs charged in the quota ledger, then imported.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from itertools import count
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import UsageShare
from billing.rates import rate_create
from billing.usage import usage_import
from clusters.models import Cluster
from jobs.models import Job, JobState
from quotas.services import quota_charge
from tenants.models import Project
from tests.factories import (
    add_project_member,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db

_slurm_ids = count(1000)


def _at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2025, 3, day, hour, minute, tzinfo=UTC)


def _used(
    project: Project,
    cluster: Cluster,
    *,
    user: User | None,
    start: datetime,
    minutes: int,
    gpus: int,
    gpu_type: str = "",
    posix_user: str = "",
) -> Job:
    """A finished job, charged its GPUs x elapsed time as Slurm's accounting would report it."""
    end = start + timedelta(minutes=minutes)
    job = Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username=posix_user or (user.username[:32] if user else ""),
        is_external=user is None,
        name="job",
        partition="gpu",
        gpu_type=gpu_type,
        gpus=gpus,
        time_limit_minutes=minutes,
        state=JobState.COMPLETED,
        slurm_job_id=next(_slurm_ids),
        started_at=start,
        ended_at=end,
    )
    assert quota_charge(job=job, gpu_seconds=gpus * minutes * 60, now=end, note="test")
    return job


class World:
    """Tenant acme (projects vision and speech) and tenant other, with usage in March 2025."""

    def __init__(self) -> None:
        self.cluster = make_matrix_cluster("spendcluster")
        self.us_cluster = make_matrix_cluster("uscluster")
        since = datetime(2025, 1, 1, tzinfo=UTC)
        for gpu_type, price in (("h100", "3"), ("", "2")):
            rate_create(
                actor=None,
                cluster=self.cluster,
                gpu_type=gpu_type,
                price_per_gpu_hour=Decimal(price),
                currency="EUR",
                valid_from=since,
            )
        rate_create(
            actor=None,
            cluster=self.us_cluster,
            gpu_type="",
            price_per_gpu_hour=Decimal("1.5"),
            currency="USD",
            valid_from=since,
        )
        self.tenant_admin = make_user("tadmin")
        self.acme = make_tenant("acme", admin=self.tenant_admin)
        self.vision = make_project(self.acme, "vision")
        self.speech = make_project(self.acme, "speech")
        self.other = make_project(make_tenant("other"), "lab")
        self.ann, self.bob = make_user("ann"), make_user("bob")
        add_project_member(self.vision, self.ann)
        add_project_member(self.speech, self.bob)
        cluster = self.cluster
        # 2 h on one h100 at 3 EUR: 6.00 on the 10th.
        _used(self.vision, cluster, user=self.ann, start=_at(10, 10), minutes=120, gpus=1, gpu_type="h100")
        # 23:00-01:00 on two GPUs of any type at 2 EUR: 2 GPU-hours and 4.00 on each of the 10th and 11th.
        _used(self.vision, cluster, user=self.ann, start=_at(10, 23), minutes=120, gpus=2)
        # 30 min on four h100s: 2 GPU-hours, 6.00 on the 12th.
        _used(self.speech, cluster, user=self.bob, start=_at(12, 0), minutes=30, gpus=4, gpu_type="h100")
        # An external job of a POSIX user without a portal account: 20 GPU-minutes at 2 EUR = 0.666667.
        _used(self.speech, cluster, user=None, posix_user="carol", start=_at(12, 6), minutes=20, gpus=1)
        # Another tenant: 3.00 EUR on the 10th, and 1.50 USD on a cluster priced in dollars.
        _used(self.other, cluster, user=make_user(), start=_at(10, 8), minutes=60, gpus=1, gpu_type="h100")
        _used(self.other, self.us_cluster, user=make_user(), start=_at(13, 8), minutes=60, gpus=1)
        assert usage_import().imported == 6


@pytest.fixture
def world() -> World:
    return World()


def _get(user: Any, url: str, **params: Any) -> Any:
    api = APIClient()
    api.force_authenticate(user)
    return api.get(url, params)


def _daily(user: Any, **params: Any) -> Any:
    return _get(user, "/api/v1/spend/daily/", **params)


def _top(user: Any, **params: Any) -> Any:
    return _get(user, "/api/v1/spend/top/", **params)


MARCH = {"start": "2025-03-09", "end": "2025-03-13"}


# Daily series ------------------------------------------------------------------------------------------


def test_a_tenants_daily_spend_has_every_day_and_splits_a_job_across_midnight(world: World) -> None:
    response = _daily(world.tenant_admin, tenant="acme", **MARCH)

    assert response.status_code == 200, response.json()
    assert response.json() == {
        "scope": {"kind": "tenant", "name": "acme"},
        "start": "2025-03-09",
        "end": "2025-03-13",
        "currency": "EUR",
        "total": "20.67",  # per invoice line, 6.00 + 8.00 + 6.00 + 0.67 (0.666667 rounded once)
        "gpu_hours": "8.33",  # 30,000 GPU-seconds
        "days": [
            {"day": "2025-03-09", "amount": "0.00", "gpu_hours": "0.00"},
            {"day": "2025-03-10", "amount": "10.00", "gpu_hours": "4.00"},
            {"day": "2025-03-11", "amount": "4.00", "gpu_hours": "2.00"},
            {"day": "2025-03-12", "amount": "6.67", "gpu_hours": "2.33"},
            {"day": "2025-03-13", "amount": "0.00", "gpu_hours": "0.00"},
        ],
        "projects": [
            {"project": "acme/vision", "total": "14.00", "gpu_hours": "6.00"},
            {"project": "acme/speech", "total": "6.67", "gpu_hours": "2.33"},
        ],
    }


def test_a_projects_daily_spend_is_its_own_usage_only(world: World) -> None:
    manager = make_user()
    add_project_member(world.vision, manager, "manager")

    body = _daily(manager, project="acme/vision", start="2025-03-10", end="2025-03-11").json()

    assert body == {
        "scope": {"kind": "project", "name": "acme/vision"},
        "start": "2025-03-10",
        "end": "2025-03-11",
        "currency": "EUR",
        "total": "14.00",
        "gpu_hours": "6.00",
        "days": [
            {"day": "2025-03-10", "amount": "10.00", "gpu_hours": "4.00"},
            {"day": "2025-03-11", "amount": "4.00", "gpu_hours": "2.00"},
        ],
        "projects": None,
    }
    shares = UsageShare.objects.filter(project=world.vision).order_by("day", "starts_at")
    assert [(share.day, share.gpu_seconds, share.cost) for share in shares] == [
        (date(2025, 3, 10), 7200, Decimal("6.000000")),
        (date(2025, 3, 10), 7200, Decimal("4.000000")),
        (date(2025, 3, 11), 7200, Decimal("4.000000")),
    ]


def test_the_default_period_is_the_current_month_so_far(world: World) -> None:
    today = timezone.now().date()

    body = _daily(world.tenant_admin, tenant="acme").json()

    assert (body["start"], body["end"]) == (today.replace(day=1).isoformat(), today.isoformat())
    assert len(body["days"]) == today.day
    assert (body["currency"], body["total"], body["projects"]) == (None, "0.00", [])


def test_a_period_without_usage_still_lists_every_day(world: World) -> None:
    body = _daily(world.tenant_admin, tenant="acme", start="2025-02-27", end="2025-03-02").json()

    assert [(day["day"], day["amount"]) for day in body["days"]] == [
        ("2025-02-27", "0.00"),
        ("2025-02-28", "0.00"),
        ("2025-03-01", "0.00"),
        ("2025-03-02", "0.00"),
    ]


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        (
            {"tenant": "acme", "start": "2025-03-10", "end": "2025-03-09"},
            "end",
            "The period ends (2025-03-09) before it starts (2025-03-10); swap the dates.",
        ),
        (
            {"tenant": "acme", "start": "2024-01-01", "end": "2025-01-01"},
            "end",
            "The period has 367 days; ask for at most 366 at a time (e.g. one year).",
        ),
        ({"start": "2025-03-01"}, "tenant", "Give tenant=<slug> or project=<tenant/project>."),
        (
            {"tenant": "acme", "project": "acme/vision"},
            "project",
            "Give either tenant or project, not both: a project names its tenant.",
        ),
    ],
)
def test_a_bad_request_says_what_to_change(world: World, params: dict[str, str], field: str, message: str) -> None:
    response = _daily(world.tenant_admin, **params)

    assert response.status_code == 400
    assert response.json()["fields"] == {field: [message]}


def test_a_year_of_366_days_is_allowed_and_costs_the_same_queries(world: World) -> None:
    with CaptureQueriesContext(connection) as short:
        assert _daily(world.tenant_admin, tenant="acme", **MARCH).status_code == 200
    with CaptureQueriesContext(connection) as year:
        response = _daily(world.tenant_admin, tenant="acme", start="2024-03-14", end="2025-03-14")

    assert response.status_code == 200
    assert len(response.json()["days"]) == 366
    assert response.json()["total"] == "20.67"
    assert len(year) == len(short) == 4  # the tenant, the caller's role, the days, the projects


def test_usage_in_several_currencies_is_shown_one_currency_at_a_time(world: World) -> None:
    portal_admin = make_user(is_staff=True)

    refused = _top(portal_admin, **MARCH)
    dollars = _top(portal_admin, currency="usd", **MARCH)

    assert refused.status_code == 400
    assert refused.json()["fields"] == {
        "currency": [
            "The usage of all tenants in this period is priced in EUR, USD; add currency=EUR or currency=USD to see "
            "one currency at a time."
        ]
    }
    assert (dollars.json()["currency"], dollars.json()["results"]) == (
        "USD",
        [{"project": "other/lab", "amount": "1.50", "gpu_hours": "1.00", "jobs": 1}],
    )


# Top spenders ------------------------------------------------------------------------------------------


def test_the_top_projects_of_all_tenants_for_a_portal_admin(world: World) -> None:
    portal_admin = make_user(is_staff=True)

    body = _top(portal_admin, currency="EUR", **MARCH).json()

    assert body == {
        "scope": {"kind": "all", "name": ""},
        "start": "2025-03-09",
        "end": "2025-03-13",
        "by": "project",
        "currency": "EUR",
        "results": [
            {"project": "acme/vision", "amount": "14.00", "gpu_hours": "6.00", "jobs": 2},
            {"project": "acme/speech", "amount": "6.67", "gpu_hours": "2.33", "jobs": 2},
            {"project": "other/lab", "amount": "3.00", "gpu_hours": "1.00", "jobs": 1},
        ],
    }
    limited = _top(portal_admin, currency="EUR", limit=1, **MARCH).json()["results"]
    assert [row["project"] for row in limited] == ["acme/vision"]


def test_the_top_users_of_a_tenant_name_external_jobs_by_their_posix_user(world: World) -> None:
    body = _top(world.tenant_admin, tenant="acme", by="user", **MARCH).json()

    assert (body["scope"], body["currency"]) == ({"kind": "tenant", "name": "acme"}, "EUR")
    assert body["results"] == [
        {"user": "ann", "portal_user": True, "amount": "14.00", "gpu_hours": "6.00", "jobs": 2},
        {"user": "bob", "portal_user": True, "amount": "6.00", "gpu_hours": "2.00", "jobs": 1},
        {"user": "carol", "portal_user": False, "amount": "0.67", "gpu_hours": "0.33", "jobs": 1},
    ]


def test_a_job_across_midnight_counts_once_in_a_period_holding_both_days(world: World) -> None:
    body = _top(world.tenant_admin, project="acme/vision", by="user", start="2025-03-11", end="2025-03-11").json()

    assert body["results"] == [
        {"user": "ann", "portal_user": True, "amount": "4.00", "gpu_hours": "2.00", "jobs": 1},
    ]


@pytest.mark.parametrize("limit", ["0", "101"])
def test_the_limit_is_between_1_and_100(world: World, limit: str) -> None:
    response = _top(world.tenant_admin, tenant="acme", limit=limit)

    assert response.status_code == 400
    assert set(response.json()["fields"]) == {"limit"}


# Who may read spend ------------------------------------------------------------------------------------


def _assert_denied(response: Any, status: int, message: str) -> None:
    assert response.status_code == status
    assert response.json() == {
        "code": "permission_denied" if status == 403 else "not_found",
        "message": message,
        "fields": {},
    }


TENANT_ADMIN_NEEDED = (
    "This needs the tenant role 'admin' in tenant 'acme'; you are 'member'. Ask one of the tenant's admins."
)


def test_who_may_read_a_tenants_spend(world: World) -> None:
    manager = make_user()
    add_project_member(world.vision, manager, "manager")

    assert _daily(world.tenant_admin, tenant="acme", **MARCH).json()["total"] == "20.67"
    assert _daily(make_user(is_staff=True), tenant="acme", **MARCH).json()["total"] == "20.67"
    # A project manager is a tenant member, not its admin: the tenant's spend is not theirs to read.
    _assert_denied(_daily(manager, tenant="acme", **MARCH), 403, TENANT_ADMIN_NEEDED)
    _assert_denied(_top(world.ann, tenant="acme", **MARCH), 403, TENANT_ADMIN_NEEDED)
    _assert_denied(
        _daily(make_user(), tenant="acme", **MARCH),
        404,
        "No tenant 'acme' exists among the ones you can see; check the name or ask for access.",
    )


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_may_not_read_a_projects_spend(world: World, role: str) -> None:
    user = make_user()
    add_project_member(world.vision, user, role)

    _assert_denied(
        _daily(user, project="acme/vision", **MARCH),
        403,
        "This needs the project role 'manager', or the tenant role 'admin' in 'acme' in project 'acme/vision'; "
        f"you are '{role}'.",
    )


def test_who_may_read_a_projects_spend(world: World) -> None:
    manager = make_user()
    add_project_member(world.vision, manager, "manager")
    speech_manager = make_user()
    add_project_member(world.speech, speech_manager, "manager")

    assert _daily(manager, project="acme/vision", **MARCH).json()["total"] == "14.00"
    assert _daily(world.tenant_admin, project="acme/vision", **MARCH).json()["total"] == "14.00"
    assert _top(manager, project="acme/vision", by="user", **MARCH).json()["results"][0]["amount"] == "14.00"
    _assert_denied(
        _daily(speech_manager, project="acme/vision", **MARCH),
        403,
        "This needs the project role 'manager', or the tenant role 'admin' in 'acme' in project 'acme/vision'; "
        "you have no role in it.",
    )
    _assert_denied(
        _daily(make_user(), project="acme/vision", **MARCH),
        404,
        "No project 'acme/vision' exists among the ones you can see; check the name or ask for access.",
    )


def test_spend_of_all_tenants_is_for_portal_admins_only(world: World) -> None:
    _assert_denied(
        _top(world.tenant_admin, **MARCH),
        403,
        "Spend across all tenants is for portal admins; give tenant=<slug> for a tenant you administer.",
    )
    assert _top(make_user(is_staff=True), currency="EUR", **MARCH).status_code == 200
