"""What project managers and tenant admins reach from the navigation (requests with the count of those they may
decide, members, allocations, spend: at most two clicks away), and inviting people from the members pages."""

from __future__ import annotations

import html
import re
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from quotas.requests import quota_request_create
from tenants.models import AuditEvent, InvitationState, MembershipInvitation, ProjectMembership, TenantMembership
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
    """The services queue Slurm and quota tasks after commit; these tests run no worker."""


class World:
    def __init__(self) -> None:
        self.admin = make_user("ada")
        self.tenant = make_tenant("acme", admin=self.admin)
        self.project = make_project(self.tenant, "vision")
        self.manager, self.researcher = make_user("mia"), make_user("rob")
        add_project_member(self.project, self.manager, "manager")
        add_project_member(self.project, self.researcher, "member")
        cluster = make_matrix_cluster("gpucluster")
        self.allocation = grant_allocation(self.project, cluster)
        for hours in (5, 7):
            quota_request_create(
                actor=self.researcher, allocation=self.allocation, gpu_hours=Decimal(hours), justification="runs"
            )
        # Another tenant's pending request, which acme's admin must not count.
        self.outsider = make_user("oscar")
        other = make_project(make_tenant("globex", admin=self.outsider), "rival")
        add_project_member(other, self.outsider, "member")
        quota_request_create(
            actor=self.outsider, allocation=grant_allocation(other, cluster), gpu_hours=Decimal(1), justification="x"
        )
        self.staff = make_user("root", is_staff=True)


@pytest.fixture
def world() -> World:
    return World()


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def text(response: Any) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode())))


def nav_links(response: Any) -> dict[str, str]:
    """The main navigation's links: path -> the link's markup inside <a>."""
    nav = re.search(r'<nav class="site-nav" aria-label="Main">(.*?)</nav>', response.content.decode(), re.S)
    assert nav is not None
    return dict(re.findall(r'<a href="([^"]+)"[^>]*>(.*?)</a>', nav[1], re.S))


def links(response: Any) -> set[str]:
    return set(re.findall(r'href="(/[^"]*)"', response.content.decode()))


# Navigation --------------------------------------------------------------------------------------------


def test_a_researcher_sees_no_requests_link(world: World) -> None:
    response = client_for(world.researcher).get("/")
    assert "/requests/" not in nav_links(response)
    assert "/billing/" not in nav_links(response)


def test_a_tenant_admin_sees_requests_with_the_count_of_their_tenants_pending_ones(world: World) -> None:
    navigation = nav_links(client_for(world.admin).get("/"))
    assert navigation["/requests/"] == (
        'Requests <span class="count-badge"><span aria-hidden="true">2</span>'
        '<span class="visually-hidden">2 pending</span></span>'
    )
    # The queue lists exactly what the badge counts.
    queue = client_for(world.admin).get("/requests/")
    assert queue.status_code == 200
    assert len(re.findall(r'href="/requests/\d+/"', queue.content.decode())) == 2


def test_the_other_tenants_admin_counts_only_their_own(world: World) -> None:
    assert "1 pending" in nav_links(client_for(world.outsider).get("/"))["/requests/"]


def test_a_portal_admin_counts_every_tenants_requests_and_none_shows_no_badge(world: World) -> None:
    assert "3 pending" in nav_links(client_for(world.staff).get("/"))["/requests/"]
    loner_admin = make_user("lone")
    make_tenant("quiet", admin=loner_admin)
    assert nav_links(client_for(loner_admin).get("/"))["/requests/"] == "Requests"


def test_a_project_manager_sees_spend_but_no_requests_they_cannot_decide(world: World) -> None:
    navigation = nav_links(client_for(world.manager).get("/"))
    assert "/billing/" in navigation
    assert "/requests/" not in navigation


def two_clicks(user: User) -> set[str]:
    """Every path the navigation and the pages it links to link to."""
    client = client_for(user)
    first = set(nav_links(client.get("/")))
    reached = set(first)
    for path in first:
        response = client.get(path)
        if response.status_code == 200:
            reached |= links(response)
    return reached


def test_every_page_of_a_tenant_admin_is_at_most_two_clicks_from_the_navigation(world: World) -> None:
    reached = two_clicks(world.admin)
    allocation = f"/projects/acme/vision/allocations/{world.allocation.pk}/"
    for path in ("/requests/", "/billing/", "/tenants/acme/", "/projects/acme/vision/members/", allocation):
        assert path in reached, path


def test_every_page_of_a_project_manager_is_at_most_two_clicks_from_the_navigation(world: World) -> None:
    reached = two_clicks(world.manager)
    allocation = f"/projects/acme/vision/allocations/{world.allocation.pk}/"
    for path in ("/billing/", "/projects/acme/vision/members/", allocation, "/tenants/acme/"):
        assert path in reached, path


# Inviting from the members pages -------------------------------------------------------------------------


def test_a_tenant_admin_invites_an_unknown_address_sees_it_pending_and_withdraws_it(world: World) -> None:
    client = client_for(world.admin)
    invited = client.post("/tenants/acme/members/", {"username": "new@example.org", "role": "admin"}, follow=True)
    page = text(invited)
    assert "Nobody in the portal has the address new@example.org yet: an invitation to tenant acme as Tenant admin" in (
        page
    )
    invitation = MembershipInvitation.objects.get()
    assert re.search(r"new@example.org Tenant Tenant admin ada \d{4}-\d\d-\d\d \d\d:\d\d UTC Withdraw", page), page

    withdrawn = client.post(f"/tenants/acme/invitations/{invitation.pk}/withdraw/", follow=True)
    assert "The invitation of new@example.org is withdrawn." in text(withdrawn)
    assert "No invitation is waiting." in text(withdrawn)
    assert MembershipInvitation.objects.get().state == InvitationState.WITHDRAWN
    assert list(AuditEvent.objects.filter(actor=world.admin).order_by("id").values_list("action", flat=True)) == [
        "invitation.created",
        "invitation.withdrawn",
    ]


def test_a_tenant_admin_invites_into_a_project_by_address_and_sets_the_role(world: World) -> None:
    sam = make_user("sam")
    sam.email = "sam@example.org"
    sam.save()
    client = client_for(world.admin)
    added = client.post("/projects/acme/vision/members/", {"username": "sam@example.org", "role": "viewer"})
    assert added.status_code == 302
    assert TenantMembership.objects.get(tenant=world.tenant, user=sam).role == "member"
    changed = client.post("/projects/acme/vision/members/sam/", {"role": "manager"}, follow=True)
    assert "sam is now Project manager in acme/vision." in text(changed)
    assert ProjectMembership.objects.get(project=world.project, user=sam).role == "manager"


def test_a_manager_cannot_bring_an_outside_address_into_the_tenant(world: World) -> None:
    response = client_for(world.manager).post(
        "/projects/acme/vision/members/", {"username": "ext@example.org", "role": "member"}
    )
    assert response.status_code == 400
    assert (
        '<p class="field-error" id="add-username-error">ext@example.org is not a member of tenant &#x27;acme&#x27;'
    ) in response.content.decode()
    assert not MembershipInvitation.objects.exists()


def test_a_researcher_cannot_invite_and_nothing_happens(world: World) -> None:
    before = AuditEvent.objects.count()
    response = client_for(world.researcher).post(
        "/projects/acme/vision/members/", {"username": "x@example.org", "role": "member"}
    )
    assert response.status_code == 403
    assert (MembershipInvitation.objects.count(), AuditEvent.objects.count()) == (0, before)
    assert "Add a member" not in text(client_for(world.researcher).get("/projects/acme/vision/members/"))


def test_a_tenant_admin_cannot_invite_into_or_withdraw_from_another_tenant(world: World) -> None:
    invitation = client_for(world.admin).post("/tenants/acme/members/", {"username": "y@example.org", "role": "member"})
    assert invitation.status_code == 302
    pk = MembershipInvitation.objects.get().pk
    outsider = client_for(world.outsider)
    assert outsider.post("/tenants/acme/members/", {"username": "z@example.org", "role": "member"}).status_code == 404
    assert outsider.post(f"/tenants/acme/invitations/{pk}/withdraw/").status_code == 404
    # Under their own tenant, acme's invitation does not exist.
    assert outsider.post(f"/tenants/globex/invitations/{pk}/withdraw/").status_code == 404
    assert list(MembershipInvitation.objects.values_list("email", "state")) == [("y@example.org", "pending")]
