"""The dashboard and the notifications pages: gauges, jobs, spend and notifications, for each role."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from billing.models import first_of_month
from billing.rates import rate_create
from billing.usage import usage_import
from clusters.models import Cluster, ClusterAccount
from jobs.job_services import JobRequest, job_submit
from quotas.models import Allocation
from quotas.units import format_gpu_hours
from tenants.models import Notification, Project
from tenants.notifications import notifications_send
from tests.billing.usage_factories import at, charged_job
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db

SPEND_HEADING = '<h2 id="spend-heading">Spend this month</h2>'


def hours(gpu_hours: int) -> str:
    return format_gpu_hours(gpu_hours * 3600)


@dataclass
class Acme:
    cluster: Cluster
    vision: Project
    nlp: Project
    genomics: Project  # another tenant's
    vision_allocation: Allocation
    users: dict[str, User]


@pytest.fixture
def acme(tmp_path: Path) -> Acme:
    cluster = make_matrix_cluster("gpucluster")
    cluster.log_root = str(tmp_path)
    cluster.save(update_fields=["log_root"])
    users = {name: make_user(name) for name in ("member", "viewer", "manager", "admin", "carol", "nobody")}
    users["staff"] = make_user("root", is_staff=True)
    tenant = make_tenant("acme", admin=users["admin"])
    vision, nlp = make_project(tenant, "vision"), make_project(tenant, "nlp")
    globex = make_tenant("globex", admin=users["carol"])
    genomics = make_project(globex, "genomics")
    add_project_member(vision, users["member"], "member")
    add_project_member(vision, users["viewer"], "viewer")
    add_project_member(vision, users["manager"], "manager")
    add_project_member(genomics, users["carol"], "manager")
    ClusterAccount.objects.create(cluster=cluster, user=users["member"], username="alice")
    vision_allocation = grant_allocation(vision, cluster, 100)
    grant_allocation(nlp, cluster, 50)
    grant_allocation(genomics, cluster, 70)
    return Acme(cluster, vision, nlp, genomics, vision_allocation, users)


def page_of(client: Client, user: User, url: str = "/") -> str:
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200
    return " ".join(response.content.decode().split())


def gauge_labels(page: str) -> list[str]:
    """The projects whose quota gauges the page shows, from each gauge's label in words."""
    return re.findall(r'role="img" aria-label="([\w/-]+): ', page)


def test_a_member_sees_the_gauges_of_their_projects_only(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["member"])

    assert gauge_labels(page) == ["acme/vision"]
    assert f"Used <strong>{hours(0)}</strong>" in page
    assert f"Left <strong>{hours(100)}</strong> of {hours(100)} GPU-hours (0% taken)" in page
    assert "genomics" not in page
    assert "globex" not in page
    assert "acme/nlp" not in page


def test_a_viewer_sees_the_gauges_but_not_the_spend(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["viewer"])

    assert gauge_labels(page) == ["acme/vision"]
    assert SPEND_HEADING not in page


def test_a_tenant_admin_sees_every_project_of_the_tenant_and_nothing_of_another(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["admin"])

    assert gauge_labels(page) == ["acme/nlp", "acme/vision"]
    assert "genomics" not in page
    assert "globex" not in page


def test_an_outsiders_dashboard_shows_nothing_of_acme(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["carol"])

    assert gauge_labels(page) == ["globex/genomics"]
    assert "acme" not in page
    assert "vision" not in page


def test_a_queued_jobs_reservation_shows_as_reserved_at_once(client: Client, acme: Acme) -> None:
    assert f"Reserved <strong>{hours(0)}</strong>" in page_of(client, acme.users["member"])

    job, _ = job_submit(
        user=acme.users["member"],
        project=acme.vision,
        request=JobRequest(cluster="gpucluster", gpus=2, time_limit_minutes=90, script="#!/bin/bash\necho hi\n"),
    )

    acme.vision_allocation.refresh_from_db()
    reserved = acme.vision_allocation.reserved_gpu_seconds
    assert reserved == 2 * 90 * 60
    page = page_of(client, acme.users["member"])
    assert f"Reserved <strong>{format_gpu_hours(reserved)}</strong>" in page
    assert f"Reserved <strong>{hours(3)}</strong>" in page
    # The job is listed as the member's, with a link to its page.
    assert f'<a href="/jobs/{job.pk}/">{job.name}</a>' in page
    assert '<span class="badge badge-queued">Queued</span>' in page


def test_someone_without_jobs_is_pointed_to_submit(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["viewer"])

    assert (
        'You have not submitted any job yet. <a href="/jobs/new/">Submit your first job</a> from a template or '
        "from scratch." in page
    )


def test_someone_without_a_project_is_told_whom_to_ask(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["nobody"])

    assert "You are not in any project yet; ask your tenant admin to add you." in page
    assert gauge_labels(page) == []


def month_spend(acme: Acme) -> None:
    """2 GPU-hours used this month in acme/vision at 3 EUR, and 1 in globex/genomics."""
    first = at(first_of_month(timezone.now().date()))
    rate_create(
        actor=None, cluster=acme.cluster, gpu_type="", price_per_gpu_hour=Decimal(3), currency="EUR", valid_from=first
    )
    minute = timedelta(minutes=1)
    charged_job(acme.vision, acme.cluster, start=first, end=first + minute, gpu_seconds=7200, user=acme.users["member"])
    charged_job(acme.genomics, acme.cluster, start=first, end=first + minute, gpu_seconds=3600)
    usage_import()


def test_spend_is_shown_to_managers_and_admins_and_hidden_from_members(client: Client, acme: Acme) -> None:
    month_spend(acme)

    assert SPEND_HEADING not in page_of(client, acme.users["member"])
    assert SPEND_HEADING not in page_of(client, acme.users["viewer"])

    manager = page_of(client, acme.users["manager"])
    assert SPEND_HEADING in manager
    assert (
        '<th scope="row"><a href="/billing/?scope=acme/vision">Project acme/vision</a></th> '
        f'<td class="number">{hours(2)}</td> <td class="number">6.00 EUR</td>' in manager
    )
    assert "genomics" not in manager

    admin = page_of(client, acme.users["admin"])
    assert f'<a href="/billing/?scope=acme">Tenant acme</a></th> <td class="number">{hours(2)}</td> ' in admin
    assert '<td class="number">6.00 EUR</td>' in admin
    assert "globex" not in admin

    staff = page_of(client, acme.users["staff"])
    assert (
        f'<a href="/billing/">All tenants</a></th> <td class="number">{hours(3)}</td> <td class="number">9.00 EUR</td>'
        in staff
    )


# Notifications -----------------------------------------------------------------------------------------


def notify(user: User, count: int, *, title: str = "Quota low") -> list[Notification]:
    return [
        notification
        for index in range(count)
        for notification in notifications_send(
            users=[user], tenant=None, kind="quota.threshold", title=f"{title} {index}", body="", link="/projects/"
        )
    ]


def test_the_dashboard_shows_the_latest_unread_notifications(client: Client, acme: Acme) -> None:
    notify(acme.users["member"], 7)
    notify(acme.users["carol"], 1, title="Carol's secret")

    page = page_of(client, acme.users["member"])

    assert '<span class="count-badge">7</span>' in page
    assert '<a href="/projects/">Quota low 6</a>' in page
    assert '<a href="/projects/">Quota low 2</a>' in page
    assert "Quota low 1<" not in page  # only the latest five
    assert '<a href="/notifications/">All notifications</a>' in page
    assert "Carol" not in page


def test_the_notifications_page_paginates_and_keeps_the_filter(client: Client, acme: Acme) -> None:
    made = notify(acme.users["member"], 27)
    Notification.objects.filter(pk=made[0].pk).update(read_at=timezone.now())

    first = page_of(client, acme.users["member"], "/notifications/")
    assert "26 unread." in first
    assert first.count('<li class="card notification') == 25
    assert "Page 1 of 2" in first
    assert '<a href="?page=2">Next</a>' in first
    assert "Mark all 26 read" in first

    second = page_of(client, acme.users["member"], "/notifications/?page=2")
    assert second.count('<li class="card notification') == 2
    assert "Quota low 0" in second
    assert "read <time" in second

    unread = page_of(client, acme.users["member"], "/notifications/?unread=1")
    assert '<a href="?unread=1&amp;page=2">Next</a>' in unread
    assert page_of(client, acme.users["member"], "/notifications/?unread=1&page=2").count("Mark as read<") == 1


def test_marking_one_read_and_all_read(client: Client, acme: Acme) -> None:
    _first, second, _third = notify(acme.users["member"], 3)
    client.force_login(acme.users["member"])

    response = client.post(f"/notifications/{second.pk}/read/", {"next": "/notifications/?unread=1"})

    assert (response.status_code, response["Location"]) == (302, "/notifications/?unread=1")
    second.refresh_from_db()
    assert second.read_at is not None
    page = " ".join(client.get("/notifications/?unread=1").content.decode().split())
    assert "Marked “Quota low 1” as read." in page
    assert "Quota low 0" in page
    assert "Quota low 1" not in page.replace("Marked “Quota low 1”", "")

    response = client.post("/notifications/read-all/")
    assert (response.status_code, response["Location"]) == (302, "/notifications/")
    assert Notification.objects.filter(user=acme.users["member"], read_at__isnull=True).count() == 0
    assert "Marked 2 notifications as read." in client.get("/notifications/").content.decode()


def test_an_offsite_next_is_ignored(client: Client, acme: Acme) -> None:
    (notification,) = notify(acme.users["member"], 1)
    client.force_login(acme.users["member"])

    response = client.post(f"/notifications/{notification.pk}/read/", {"next": "https://evil.example/"})

    assert response["Location"] == "/notifications/"


def test_someone_elses_notification_is_not_found_and_stays_unread(client: Client, acme: Acme) -> None:
    (secret,) = notify(acme.users["carol"], 1)
    client.force_login(acme.users["member"])

    assert client.post(f"/notifications/{secret.pk}/read/").status_code == 404
    assert client.post("/notifications/read-all/").status_code == 302

    secret.refresh_from_db()
    assert secret.read_at is None


def test_marking_needs_a_post(client: Client, acme: Acme) -> None:
    (notification,) = notify(acme.users["member"], 1)
    client.force_login(acme.users["member"])

    assert client.get(f"/notifications/{notification.pk}/read/").status_code == 405
    notification.refresh_from_db()
    assert notification.read_at is None


def test_no_notifications_is_explained(client: Client, acme: Acme) -> None:
    page = page_of(client, acme.users["viewer"], "/notifications/")

    assert "No notifications yet. You will hear here when a project's GPU-hours run low" in page
    assert "Mark all" not in page
