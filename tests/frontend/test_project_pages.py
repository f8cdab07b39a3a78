"""The projects area in the browser, through Django's test client: projects and tenants with their members and
roles, allocations with the burn-down and the projected exhaustion, asking for more GPU-hours, API tokens."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job, JobTemplate
from quotas.models import Allocation, QuotaRequest, period_start
from quotas.requests import quota_request_create
from quotas.services import quota_charge
from tenants.models import ApiToken, AuditEvent, Notification, Project, ProjectMembership, Tenant, TenantMembership
from tenants.services import token_create
from tests.conftest import SentTask
from tests.factories import (
    add_project_member,
    add_tenant_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """The services queue Slurm and quota tasks after commit; these tests run no worker."""


@dataclass
class Acme:
    tenant: Tenant
    project: Project
    cluster: Cluster
    allocation: Allocation
    admin: User  # the tenant's only admin
    manager: User
    member: User
    viewer: User
    tenant_member: User  # in the tenant, in no project
    outsider: User  # admin of another tenant


@pytest.fixture
def acme() -> Acme:
    admin = make_user("alice")
    tenant = make_tenant("acme", admin=admin)
    project = make_project(tenant, "vision")
    users = {role: make_user(name) for role, name in (("manager", "mia"), ("member", "bob"), ("viewer", "vera"))}
    for role, user in users.items():
        add_project_member(project, user, role)
    tenant_member = make_user("tom")
    add_tenant_member(tenant, tenant_member)
    outsider = make_user("oscar")
    make_project(make_tenant("globex", admin=outsider), "rival")
    cluster = make_matrix_cluster("gpucluster")
    today = timezone.now().date()
    allocation = grant_allocation(
        project, cluster, gpu_hours=100, starts_on=today - timedelta(days=9), ends_on=today + timedelta(days=20)
    )
    return Acme(tenant, project, cluster, allocation, admin, tenant_member=tenant_member, outsider=outsider, **users)


def client_for(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def text(response: Any) -> str:
    """The page's text without tags and with runs of white space as one space, for asserting sentences."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode())))


def noon(day: date) -> datetime:
    return period_start(day) + timedelta(hours=12)


def charge(acme: Acme, *, day: date, gpu_seconds: int) -> None:
    """A job found in Slurm's accounting after it ended at noon that day, charged through the quota service."""
    job = Job.objects.create(
        project=acme.project,
        cluster=acme.cluster,
        cluster_username="bob",
        name="burn",
        partition="gpu",
        gpu_type="h100",
        gpus=1,
        time_limit_minutes=1,
        ended_at=noon(day),
    )
    assert quota_charge(job=job, gpu_seconds=gpu_seconds, now=noon(day), note="from accounting")


PROJECT_URL = "/projects/acme/vision/"


# Projects ------------------------------------------------------------------------------------------------


def test_the_project_list_shows_my_projects_with_my_role_and_current_gauges(acme: Acme) -> None:
    response = client_for(acme.member).get("/projects/")
    assert response.status_code == 200
    page = text(response)
    assert "Test project acme/vision · your role: Member" in page
    assert "Left 100.0 of 100.0 GPU-hours (0% taken)" in page
    assert 'href="/tenants/acme/"' in response.content.decode()

    admin_page = text(client_for(acme.admin).get("/projects/"))
    assert "your role: Tenant admin (no project role)" in admin_page


def test_the_project_list_empty_states_and_no_other_tenant(acme: Acme) -> None:
    loner = make_user("lonely")
    page = text(client_for(loner).get("/projects/"))
    assert "You are not in any project yet." in page
    assert "You are not a member of any tenant yet" in page
    assert "acme" not in client_for(acme.outsider).get("/projects/").content.decode()


def test_a_project_without_a_current_allocation_says_what_to_do(acme: Acme) -> None:
    other = make_project(acme.tenant, "empty")
    add_project_member(other, acme.member, "member")
    page = text(client_for(acme.member).get("/projects/acme/empty/"))
    assert "No allocation yet: a portal admin grants GPU-hours to a project on a cluster for a period." in page
    assert "No job templates yet." in page
    assert "No current allocation: a portal admin grants GPU-hours" in text(client_for(acme.member).get("/projects/"))


def test_the_project_overview_for_each_role(acme: Acme) -> None:
    JobTemplate.objects.create(project=acme.project, name="train-resnet", script="#!/bin/bash\n", gpus=2)

    viewer = client_for(acme.viewer).get(PROJECT_URL)
    assert viewer.status_code == 200
    body = viewer.content.decode()
    page = text(viewer)
    assert "your role: Viewer" in page
    assert f"Slurm account {acme.project.slurm_account} Your role Viewer" in page
    assert 'href="/jobs/?project=acme/vision"' in body
    assert f'href="/projects/acme/vision/allocations/{acme.allocation.pk}/"' in body
    assert "train-resnet" in page
    assert "Submit a job" not in page
    assert "Your role lets you read this project's jobs; members and managers submit them." in page

    member = client_for(acme.member).get(PROJECT_URL)
    assert "Submit a job" in text(member)
    assert "/jobs/new/?template=" in member.content.decode()

    admin = text(client_for(acme.admin).get(PROJECT_URL))
    assert "your role: Tenant admin (no project role)" in admin


def test_outsiders_get_the_same_404_as_for_a_project_that_does_not_exist(acme: Acme) -> None:
    outsider = client_for(acme.outsider)
    for url in (PROJECT_URL, PROJECT_URL + "members/", f"{PROJECT_URL}allocations/{acme.allocation.pk}/"):
        real = outsider.get(url)
        ghost = outsider.get(url.replace("acme/vision", "ghost/nothing"))
        assert (real.status_code, ghost.status_code) == (404, 404)
        assert real.content == ghost.content
    assert (
        client_for(acme.outsider).get("/tenants/acme/").content
        == client_for(acme.outsider).get("/tenants/ghost/").content
    )


def test_tenant_members_without_a_project_role_get_the_403_page_naming_the_role(acme: Acme) -> None:
    response = client_for(acme.tenant_member).get(PROJECT_URL)
    assert response.status_code == 403
    assert (
        "This needs the project role &#x27;manager&#x27; or &#x27;member&#x27; or &#x27;viewer&#x27;, or the tenant "
        "role &#x27;admin&#x27; in &#x27;acme&#x27; in project &#x27;acme/vision&#x27;; you have no role in it."
    ) in response.content.decode()


def test_anonymous_visitors_are_sent_to_log_in(acme: Acme) -> None:
    response = Client().get(PROJECT_URL)
    assert response.status_code == 302
    assert response.headers["Location"] == f"/login/?next={PROJECT_URL}"


# Project members -----------------------------------------------------------------------------------------


def test_viewers_see_the_members_but_no_forms(acme: Acme) -> None:
    response = client_for(acme.viewer).get(PROJECT_URL + "members/")
    assert response.status_code == 200
    page = text(response)
    for username in ("bob", "mia", "vera"):
        assert f'id="member-{username}"' in response.content.decode()
    assert "Project manager" in page
    assert "Viewer" in page
    assert "Add a member" not in page
    assert 'class="role-form"' not in response.content.decode()
    assert "Only the project's managers and the tenant's admins change members; ask one of them." in page


def test_members_cannot_change_members(acme: Acme) -> None:
    events = AuditEvent.objects.count()
    client = client_for(acme.member)
    added = client.post(PROJECT_URL + "members/", {"username": "tom", "role": "viewer"})
    changed = client.post(PROJECT_URL + "members/vera/", {"role": "manager"})
    removed = client.post(PROJECT_URL + "members/vera/remove/")
    assert [added.status_code, changed.status_code, removed.status_code] == [403, 403, 403]
    assert "you are &#x27;member&#x27;" in added.content.decode()
    assert not ProjectMembership.objects.filter(user=acme.tenant_member).exists()
    assert ProjectMembership.objects.get(user=acme.viewer).role == "viewer"
    assert AuditEvent.objects.count() == events


def test_a_manager_adds_changes_and_removes_members(acme: Acme) -> None:
    client = client_for(acme.manager)
    form_page = client.get(PROJECT_URL + "members/")
    assert "Add a member" in text(form_page)
    assert '<option value="tom">' in form_page.content.decode()  # the tenant's members not yet in the project

    added = client.post(PROJECT_URL + "members/", {"username": "tom", "role": "viewer"}, follow=True)
    assert added.redirect_chain == [(PROJECT_URL + "members/", 302)]
    assert "tom joined acme/vision as Viewer." in text(added)
    assert ProjectMembership.objects.get(project=acme.project, user=acme.tenant_member).role == "viewer"

    changed = client.post(PROJECT_URL + "members/tom/", {"role": "member"}, follow=True)
    assert "tom is now Member in acme/vision." in text(changed)
    assert ProjectMembership.objects.get(project=acme.project, user=acme.tenant_member).role == "member"

    removed = client.post(PROJECT_URL + "members/tom/remove/", follow=True)
    assert "tom was removed from acme/vision" in text(removed)
    assert not ProjectMembership.objects.filter(project=acme.project, user=acme.tenant_member).exists()
    assert list(AuditEvent.objects.filter(actor=acme.manager).order_by("id").values_list("action", flat=True)) == [
        "project_member.added",
        "project_member.role_changed",
        "project_member.removed",
    ]


def test_adding_a_member_shows_the_services_errors_beside_the_fields(acme: Acme) -> None:
    client = client_for(acme.admin)
    unknown = client.post(PROJECT_URL + "members/", {"username": "nobody", "role": "viewer"})
    assert unknown.status_code == 400
    body = unknown.content.decode()
    assert (
        '<p class="field-error" id="add-username-error">There is no active user &#x27;nobody&#x27;; check the '
        "spelling, or ask a portal admin to create it.</p>"
    ) in body
    assert 'aria-invalid="true"' in body
    assert 'aria-describedby="add-username-hint add-username-error"' in body
    assert 'value="nobody"' in body  # what was typed stays

    stranger = make_user("sam")
    outside = client.post(PROJECT_URL + "members/", {"username": stranger.username, "role": "viewer"})
    assert "&#x27;sam&#x27; is not a member of tenant &#x27;acme&#x27;; add them to the tenant first." in (
        outside.content.decode()
    )
    twice = client.post(PROJECT_URL + "members/", {"username": "bob", "role": "viewer"})
    assert "&#x27;bob&#x27; is already in project &#x27;acme/vision&#x27;; change their role instead." in (
        twice.content.decode()
    )
    bad_role = client.post(PROJECT_URL + "members/", {"username": "tom", "role": "owner"})
    assert (
        '<p class="field-error" id="add-role-error">&#x27;owner&#x27; is not a role here; use one of '
        "&#x27;manager&#x27;, &#x27;member&#x27;, &#x27;viewer&#x27;.</p>"
    ) in bad_role.content.decode()
    empty = client.post(PROJECT_URL + "members/", {"username": "", "role": "viewer"})
    assert "Give the person&#x27;s portal username or e-mail address." in empty.content.decode()
    assert ProjectMembership.objects.filter(project=acme.project).count() == 3


# Tenants -------------------------------------------------------------------------------------------------


def test_the_tenant_page_lists_projects_and_members_for_members_without_forms(acme: Acme) -> None:
    response = client_for(acme.tenant_member).get("/tenants/acme/")
    assert response.status_code == 200
    page = text(response)
    assert "Tenant acme · your role: Member" in page
    for username in ("alice", "bob", "mia", "tom", "vera"):
        assert f'id="member-{username}"' in response.content.decode()
    assert "Tenant admin" in page
    assert "Add a member" not in page
    assert "You are in no project of this tenant." in page  # tom sees no project of it

    denied = client_for(acme.tenant_member).post("/tenants/acme/members/", {"username": "sam", "role": "member"})
    assert denied.status_code == 403


def test_a_tenant_admin_adds_changes_and_removes_members(acme: Acme) -> None:
    make_user("sam")
    client = client_for(acme.admin)
    page = client.get("/tenants/acme/")
    assert "Add a member" in text(page)
    assert 'href="/projects/acme/vision/"' in page.content.decode()

    added = client.post("/tenants/acme/members/", {"username": "sam", "role": "member"}, follow=True)
    assert "sam joined tenant acme as Member." in text(added)
    promoted = client.post("/tenants/acme/members/sam/", {"role": "admin"}, follow=True)
    assert "sam is now Tenant admin in tenant acme." in text(promoted)
    assert TenantMembership.objects.get(tenant=acme.tenant, user__username="sam").role == "admin"
    removed = client.post("/tenants/acme/members/bob/remove/", follow=True)
    assert "bob was removed from tenant acme and from all its projects." in text(removed)
    assert not ProjectMembership.objects.filter(user=acme.member).exists()

    unknown = client.post("/tenants/acme/members/", {"username": "nobody", "role": "member"})
    assert unknown.status_code == 400
    assert "There is no active user &#x27;nobody&#x27;" in unknown.content.decode()


def test_the_last_admin_rule_is_shown_beside_the_member(acme: Acme) -> None:
    client = client_for(acme.admin)
    demoted = client.post("/tenants/acme/members/alice/", {"role": "member"})
    assert demoted.status_code == 400
    message = (
        "&#x27;alice&#x27; is the last admin of tenant &#x27;acme&#x27;; make another member an admin before "
        "changing their role."
    )
    body = demoted.content.decode()
    assert f'<p class="field-error" id="role-error-alice" role="alert">{message} </p>' in body
    assert 'aria-describedby="role-error-alice"' in body
    removed = client.post("/tenants/acme/members/alice/remove/")
    assert removed.status_code == 400
    assert "make another member an admin before removing them." in removed.content.decode()
    assert TenantMembership.objects.get(user=acme.admin).role == "admin"


# Allocations ---------------------------------------------------------------------------------------------


def allocation_url(acme: Acme) -> str:
    return f"{PROJECT_URL}allocations/{acme.allocation.pk}/"


def test_the_burn_down_and_the_projected_exhaustion(acme: Acme) -> None:
    today = timezone.now().date()
    charge(acme, day=today - timedelta(days=5), gpu_seconds=36_000)  # 10 GPU-hours
    charge(acme, day=today - timedelta(days=2), gpu_seconds=126_000)  # 35 GPU-hours

    response = client_for(acme.viewer).get(allocation_url(acme))
    assert response.status_code == 200
    projection = response.context["projection"]
    # 45 GPU-hours over the last 7 days: 6.43 a day; 55 remain, which last 8 whole days.
    assert projection.gpu_hours_per_day == Decimal("6.43")
    assert projection.burn_rate_days == 7
    assert projection.remaining_gpu_seconds == 198_000
    assert projection.exhaustion_on == today + timedelta(days=8)
    assert projection.days_before_period_end == 12
    sentence = (
        f"At the last 7 days' rate (6.43 GPU-hours/day), this allocation runs out on {today + timedelta(days=8)}, "
        f"12 days before its period ends ({today + timedelta(days=20)})."
    )
    assert projection.sentence == sentence
    assert sentence.replace("'", "&#x27;") in response.content.decode()

    chart = response.context["chart"]
    assert len(chart["x"]) == 30  # every day of the period
    remaining, projected = chart["series"]
    assert remaining["values"][:10] == [100.0, 100.0, 100.0, 100.0, 90.0, 90.0, 90.0, 55.0, 55.0, 55.0]
    assert remaining["values"][10:] == [None] * 20
    assert projected["dash"] is True
    assert projected["values"][:9] == [None] * 9
    assert projected["values"][9] == 55.0
    assert projected["values"][17] == 0.0
    assert projected["values"][13] == 27.5  # halfway down the straight line
    assert projected["values"][18:] == [None] * 12
    assert 'id="burn-down-data"' in response.content.decode()

    ledger = response.context["ledger"]
    # Newest first: the grant was made now, the charges are dated on the days the jobs ended.
    assert [(entry.kind, entry.gpu_seconds) for entry in ledger] == [
        ("grant", 360_000),
        ("charge", 126_000),
        ("charge", 36_000),
    ]
    assert "Left 55.0 of 100.0 GPU-hours (45% taken)" in text(response)


def test_an_allocation_that_lasts_and_one_that_ended(acme: Acme) -> None:
    page = text(client_for(acme.viewer).get(allocation_url(acme)))
    today = timezone.now().date()
    assert (
        "No GPU-hours were charged over the last 7 days, so at this rate this allocation lasts until its period "
        f"ends on {today + timedelta(days=20)}."
    ) in page

    old = grant_allocation(
        acme.project,
        acme.cluster,
        gpu_hours=10,
        starts_on=today - timedelta(days=60),
        ends_on=today - timedelta(days=31),
    )
    ended = client_for(acme.member).get(f"{PROJECT_URL}allocations/{old.pk}/")
    assert f"This allocation's period ended on {today - timedelta(days=31)}, with 10.0 GPU-hours left unused." in text(
        ended
    )
    assert "This allocation's period is over; ask for hours on the project's current allocation" in text(ended)
    assert ended.context["chart"]["series"][1]["values"] == [None] * 30


def test_an_allocation_of_another_project_is_not_found_here(acme: Acme) -> None:
    other = make_project(acme.tenant, "other")
    foreign = grant_allocation(other, acme.cluster)
    assert client_for(acme.admin).get(f"{PROJECT_URL}allocations/{foreign.pk}/").status_code == 404
    assert client_for(acme.admin).get(f"{PROJECT_URL}allocations/999999/").status_code == 404


def test_a_member_requests_more_hours_and_the_deciders_are_told(acme: Acme) -> None:
    client = client_for(acme.member)
    assert "Send the request" in text(client.get(allocation_url(acme)))

    response = client.post(
        allocation_url(acme) + "requests/", {"gpu_hours": "12.5", "justification": "ablation runs"}, follow=True
    )
    assert response.redirect_chain == [(allocation_url(acme), 302)]
    assert (
        "You asked for 12.5 more GPU-hours; the tenant's admins have been told and you will get a notification "
        "when they decide."
    ) in text(response)
    request = QuotaRequest.objects.get()
    assert (request.state, request.requested_gpu_seconds, request.requested_by) == ("pending", 45_000, acme.member)
    assert request.justification == "ablation runs"
    assert list(Notification.objects.filter(kind="quota.request").values_list("user__username", flat=True)) == ["alice"]
    assert f'id="request-{request.pk}"' in response.content.decode()
    assert "Withdraw" in text(response)


def test_asking_for_hours_shows_errors_beside_the_fields(acme: Acme) -> None:
    client = client_for(acme.member)
    url = allocation_url(acme) + "requests/"
    zero = client.post(url, {"gpu_hours": "0", "justification": ""})
    assert zero.status_code == 400
    body = zero.content.decode()
    assert (
        '<p class="field-error" id="request-gpu-hours-error">Ask for more than 0 GPU-hours, e.g. 20 or 12.5.</p>'
    ) in body
    assert (
        '<p class="field-error" id="request-justification-error">Say what the hours are for, so that an admin can '
        "decide.</p>"
    ) in body
    words = client.post(url, {"gpu_hours": "lots", "justification": "big model"})
    assert "Give a number of GPU-hours, e.g. 20 or 12.5." in words.content.decode()
    assert ">big model</textarea>" in words.content.decode()
    assert QuotaRequest.objects.count() == 0


def test_viewers_and_tenant_admins_without_a_project_role_cannot_ask(acme: Acme) -> None:
    page = text(client_for(acme.viewer).get(allocation_url(acme)))
    assert "Send the request" not in page
    assert "Members and managers of the project ask for more GPU-hours" in page
    for user in (acme.viewer, acme.admin):
        response = client_for(user).post(allocation_url(acme) + "requests/", {"gpu_hours": "5", "justification": "x"})
        assert response.status_code == 403
    assert QuotaRequest.objects.count() == 0


def test_the_requester_withdraws_a_pending_request(acme: Acme) -> None:
    request = quota_request_create(
        actor=acme.member, allocation=acme.allocation, gpu_hours=Decimal(5), justification="more"
    )
    withdraw_url = f"{allocation_url(acme)}requests/{request.pk}/withdraw/"

    other = client_for(acme.manager)
    assert "Withdraw" not in text(other.get(allocation_url(acme)))
    denied = other.post(withdraw_url)
    assert denied.status_code == 403
    assert "Only bob, who asked, may withdraw this request; admins deny it instead." in denied.content.decode()

    client = client_for(acme.member)
    response = client.post(withdraw_url, follow=True)
    assert "Your request for 5.0 GPU-hours was withdrawn." in text(response)
    request.refresh_from_db()
    assert request.state == "withdrawn"
    again = client.post(withdraw_url, follow=True)
    assert f"Request {request.pk} is withdrawn already; only pending requests can be decided or withdrawn." in text(
        again
    )


# Tokens --------------------------------------------------------------------------------------------------


def test_a_token_is_shown_once_works_and_stops_working_when_revoked(acme: Acme) -> None:
    client = client_for(acme.member)
    assert "You have no API tokens." in text(client.get("/tokens/"))

    created = client.post("/tokens/", {"name": "ci-pipeline", "expires_at": ""})
    assert created.status_code == 200
    assert "no-store" in created.headers["Cache-Control"]
    secret = created.context["secret"]
    assert secret.startswith("gpp_")
    body = created.content.decode()
    assert (
        f'<code id="token-secret" class="secret" tabindex="0" aria-labelledby="token-secret-label">{secret}</code>'
        in body
    )
    assert "Copy it now: it will not be shown again." in text(created)

    listing = client.get("/tokens/")
    assert secret not in listing.content.decode()
    assert "ci-pipeline" in text(listing)
    assert "Live" in text(listing)

    api = Client()
    me = api.get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"})
    assert me.status_code == 200
    assert me.json()["username"] == "bob"

    token = ApiToken.objects.get(name="ci-pipeline")
    revoked = client.post(f"/tokens/{token.pk}/revoke/", follow=True)
    assert "The token 'ci-pipeline' is revoked" in text(revoked)
    assert "Revoked" in text(revoked)
    assert api.get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"}).status_code == 401


def test_token_errors_and_expiry(acme: Acme) -> None:
    client = client_for(acme.member)
    blank = client.post("/tokens/", {"name": " ", "expires_at": ""})
    assert blank.status_code == 400
    assert (
        '<p class="field-error" id="token-name-error">Give the token a name that says where it is used, e.g. '
        "&#x27;ci-pipeline&#x27;.</p>"
    ) in blank.content.decode()
    past = client.post("/tokens/", {"name": "old", "expires_at": "2020-01-01"})
    assert (
        '<p class="field-error" id="token-expires-error">The expiry is in the past; give a future date, or none.</p>'
    ) in past.content.decode()
    nonsense = client.post("/tokens/", {"name": "old", "expires_at": "soon"})
    assert "Give the last day the token works as YYYY-MM-DD, or none." in nonsense.content.decode()
    assert ApiToken.objects.count() == 0

    last_day = timezone.now().date() + timedelta(days=3)
    client.post("/tokens/", {"name": "short", "expires_at": last_day.isoformat()})
    token = ApiToken.objects.get(name="short")
    assert token.expires_at == period_start(last_day + timedelta(days=1))
    duplicate = client.post("/tokens/", {"name": "short"})
    assert "You already have a token named &#x27;short&#x27;; revoke it or choose another name." in (
        duplicate.content.decode()
    )


def test_tokens_are_private_to_their_owner(acme: Acme) -> None:
    token, _secret = token_create(user=acme.member, name="mine")
    staff = make_user("root", is_staff=True)
    for user in (acme.manager, staff):
        assert "mine" not in text(client_for(user).get("/tokens/"))
        assert client_for(user).post(f"/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_lists_are_paginated_keeping_other_parameters(acme: Acme) -> None:
    for index in range(27):
        token_create(user=acme.member, name=f"token-{index:02d}")
    client = client_for(acme.member)
    first = client.get("/tokens/")
    assert "Page 1 of 2" in text(first)
    assert 'href="?page=2"' in first.content.decode()
    second = client.get("/tokens/?page=2")
    assert [token.name for token in second.context["tokens"]] == ["token-01", "token-00"]

    for index in range(26):
        charge(acme, day=timezone.now().date(), gpu_seconds=60 + index)
    ledger = client.get(allocation_url(acme) + "?requests_page=1")
    assert 'href="?requests_page=1&amp;ledger_page=2"' in ledger.content.decode()
