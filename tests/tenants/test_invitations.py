"""Inviting people by username or e-mail: at once for someone with an account, pending for an address nobody has
until its owner signs in with it (by password, or through a provider that verified it), withdrawn, expired; who
may invite where; the audit events; and the API over it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from django.utils import timezone

from portal.errors import Conflict
from tenants.invitations import INVITATION_VALID_DAYS, invitation_withdraw, invitations_accept, member_invite
from tenants.models import (
    AuditEvent,
    InvitationState,
    MembershipInvitation,
    Notification,
    Project,
    ProjectMembership,
    Tenant,
    TenantMembership,
)
from tenants.selectors import ProjectAction, TenantAction, project_get_for_user, tenant_get_for_user
from tests.conftest import SentTask
from tests.factories import PASSWORD, add_project_member, add_tenant_member, make_project, make_tenant, make_user
from tests.frontend.test_two_factor import code_for, enrol, password_sign_in
from tests.oidc_provider import sign_in

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """Project memberships queue a Slurm sync after commit; these tests run no worker."""


class Acme:
    def __init__(self) -> None:
        self.admin = make_user("ada")
        self.tenant = make_tenant("acme", admin=self.admin)
        self.project = make_project(self.tenant, "vision")
        self.manager = make_user("mia")
        add_project_member(self.project, self.manager, "manager")
        self.researcher = make_user("rob")
        add_project_member(self.project, self.researcher, "member")
        self.outsider = make_user("oscar")
        self.other = make_tenant("globex", admin=self.outsider)


@pytest.fixture
def acme() -> Acme:
    return Acme()


def invite(actor: User, *, tenant: Tenant, invitee: str, role: str, project: Project | None = None) -> Any:
    return member_invite(
        actor=actor,
        tenant=tenant,
        project=project,
        invitee=invitee,
        role=role,
        may_add_to_tenant=tenant.memberships.filter(user=actor, role="admin").exists(),
    )


def field_errors(error: ValidationError) -> dict[str, list[str]]:
    return error.message_dict


def log_in(username: str) -> Client:
    client = Client()
    response = client.post("/login/", {"username": username, "password": PASSWORD})
    assert response.status_code == 302, response.content
    return client


# By username and by an address someone has ------------------------------------------------------------


def test_a_username_becomes_a_membership_at_once_and_the_person_is_told(acme: Acme) -> None:
    sam = make_user("sam")
    outcome = invite(acme.admin, tenant=acme.tenant, invitee="sam", role="member")

    assert outcome.invitation is None
    assert TenantMembership.objects.get(tenant=acme.tenant, user=sam).role == "member"
    assert Notification.objects.get(user=sam).title == "You joined tenant acme as Member"
    assert list(AuditEvent.objects.filter(actor=acme.admin).values_list("action", flat=True)) == ["tenant_member.added"]


def test_an_address_an_account_has_is_a_membership_at_once_with_an_accepted_record(acme: Acme) -> None:
    sam = make_user("sam")
    sam.email = "Sam@Example.org"
    sam.save()
    outcome = invite(acme.admin, tenant=acme.tenant, invitee="sam@example.org", role="admin")

    assert TenantMembership.objects.get(tenant=acme.tenant, user=sam).role == "admin"
    assert outcome.invitation is not None
    assert (outcome.invitation.state, outcome.invitation.closed_by) == (InvitationState.ACCEPTED, sam)
    assert list(AuditEvent.objects.filter(actor=acme.admin).order_by("id").values_list("action", flat=True)) == [
        "invitation.created",
        "tenant_member.added",
        "invitation.accepted",
    ]


def test_an_address_several_accounts_share_must_be_invited_by_username(acme: Acme) -> None:
    for name in ("lab1", "lab2"):
        user = make_user(name)
        user.email = "lab@example.org"
        user.save()
    with pytest.raises(ValidationError) as refused:
        invite(acme.admin, tenant=acme.tenant, invitee="lab@example.org", role="member")
    assert field_errors(refused.value) == {
        "username": ["Several portal accounts use lab@example.org; invite the right one by their username."]
    }
    assert not MembershipInvitation.objects.exists()


def test_neither_a_username_nor_an_address_is_refused_by_name(acme: Acme) -> None:
    with pytest.raises(ValidationError) as unknown:
        invite(acme.admin, tenant=acme.tenant, invitee="nobody", role="member")
    assert "There is no active user 'nobody'" in field_errors(unknown.value)["username"][0]
    with pytest.raises(ValidationError) as bad:
        invite(acme.admin, tenant=acme.tenant, invitee="a@b@c", role="member")
    assert field_errors(bad.value) == {
        "username": ["'a@b@c' is neither a portal username nor an e-mail address; check the spelling."]
    }
    with pytest.raises(ValidationError) as role:
        invite(acme.admin, tenant=acme.tenant, invitee="new@example.org", role="owner")
    assert field_errors(role.value) == {"role": ["'owner' is not a role here; use one of 'admin', 'member'."]}


# Pending invitations -------------------------------------------------------------------------------------


def test_an_unknown_address_waits_is_emailed_and_becomes_the_membership_at_password_sign_in(
    acme: Acme, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        outcome = invite(acme.admin, tenant=acme.tenant, invitee="newbie@example.org", role="member")
    invitation = outcome.invitation
    assert outcome.membership is None
    assert invitation is not None
    assert invitation.state == InvitationState.PENDING
    assert invitation.expires_at - invitation.created_at == timedelta(days=INVITATION_VALID_DAYS)
    (message,) = mail.outbox
    assert (message.to, message.subject) == (["newbie@example.org"], "[GPU portal] Invitation to tenant acme")
    assert "ada invited you to tenant acme on the GPU portal as Member." in message.body

    # A portal admin makes the account with that address; the first sign-in claims the invitation.
    newbie = make_user("newbie")
    newbie.email = "NewBie@example.org"
    newbie.save()
    log_in("newbie")

    assert TenantMembership.objects.get(tenant=acme.tenant, user=newbie).role == "member"
    invitation.refresh_from_db()
    assert (invitation.state, invitation.closed_by) == (InvitationState.ACCEPTED, newbie)
    assert list(AuditEvent.objects.filter(actor=newbie).order_by("id").values_list("action", flat=True)) == [
        "tenant_member.added",
        "invitation.accepted",
    ]
    assert Notification.objects.get(user=newbie).title == "You joined tenant acme as Member"


def test_with_two_factor_sign_in_the_invitation_waits_for_the_code(acme: Acme) -> None:
    carol = make_user("carol")
    client = Client()
    password_sign_in(client, "carol")
    secret = enrol(client)
    client.post("/logout/")
    invite(acme.admin, tenant=acme.tenant, invitee="carol@example.org", role="member")
    carol.email = "carol@example.org"  # a portal admin gives her account the address afterwards
    carol.save()

    assert password_sign_in(client, "carol")["Location"] == "/login/code/"
    assert MembershipInvitation.objects.get().state == InvitationState.PENDING  # a password alone claims nothing

    assert client.post("/login/code/", {"code": code_for(secret, periods_from_now=1)}).status_code == 302
    assert MembershipInvitation.objects.get().state == InvitationState.ACCEPTED
    assert TenantMembership.objects.get(tenant=acme.tenant, user=carol).role == "member"


def test_a_project_invitation_brings_the_invitee_into_the_tenant_and_the_project(acme: Acme) -> None:
    outcome = invite(acme.admin, tenant=acme.tenant, project=acme.project, invitee="pat@example.org", role="viewer")
    assert outcome.invitation is not None
    pat = make_user("pat")
    pat.email = "pat@example.org"
    pat.save()

    assert [invitation.pk for invitation in invitations_accept(user=pat, verified_email=pat.email)] == [
        outcome.invitation.pk
    ]
    assert TenantMembership.objects.get(tenant=acme.tenant, user=pat).role == "member"
    assert ProjectMembership.objects.get(project=acme.project, user=pat).role == "viewer"
    assert invitations_accept(user=pat, verified_email=pat.email) == []  # once only


def test_a_provider_sign_in_with_a_verified_address_claims_the_invitation(
    acme: Acme, configure: Callable[..., Any]
) -> None:
    invite(acme.admin, tenant=acme.tenant, invitee="dana@example.org", role="admin")  # the demo provider's dana

    response = sign_in(Client(), "dana")

    assert response.status_code == 302
    dana = get_user_model().objects.get(username="dana")
    assert TenantMembership.objects.get(tenant=acme.tenant, user=dana).role == "admin"
    assert MembershipInvitation.objects.get().state == InvitationState.ACCEPTED


def test_an_invitation_that_expired_is_not_accepted_and_is_marked_so(acme: Acme) -> None:
    outcome = invite(acme.admin, tenant=acme.tenant, invitee="late@example.org", role="member")
    assert outcome.invitation is not None
    MembershipInvitation.objects.filter(pk=outcome.invitation.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    late = make_user("late")
    late.email = "late@example.org"
    late.save()
    log_in("late")

    assert not TenantMembership.objects.filter(user=late).exists()
    assert MembershipInvitation.objects.get().state == InvitationState.EXPIRED
    assert AuditEvent.objects.filter(action="invitation.expired", actor=late).count() == 1


def test_a_second_invitation_waits_for_the_first_unless_it_expired(acme: Acme) -> None:
    first = invite(acme.admin, tenant=acme.tenant, invitee="twice@example.org", role="member").invitation
    with pytest.raises(ValidationError) as again:
        invite(acme.admin, tenant=acme.tenant, invitee="TWICE@example.org", role="admin")
    assert "twice@example.org was already invited on" in field_errors(again.value)["username"][0]

    MembershipInvitation.objects.filter(pk=first.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    second = invite(acme.admin, tenant=acme.tenant, invitee="twice@example.org", role="admin").invitation
    assert second.tenant_role == "admin"
    assert MembershipInvitation.objects.get(pk=first.pk).state == InvitationState.EXPIRED


def test_a_withdrawn_invitation_is_not_accepted(acme: Acme) -> None:
    invitation = invite(acme.admin, tenant=acme.tenant, invitee="gone@example.org", role="member").invitation
    invitation_withdraw(actor=acme.admin, invitation=invitation)
    with pytest.raises(Conflict, match="is withdrawn; there is nothing to withdraw"):
        invitation_withdraw(actor=acme.admin, invitation=invitation)
    gone = make_user("gone")
    gone.email = "gone@example.org"
    gone.save()

    assert invitations_accept(user=gone, verified_email=gone.email) == []
    assert not TenantMembership.objects.filter(user=gone).exists()
    event = AuditEvent.objects.get(action="invitation.withdrawn")
    assert event.actor == acme.admin
    assert (event.before or {}).get("state") == "pending"
    assert (event.after or {}).get("state") == "withdrawn"


# Who may invite ------------------------------------------------------------------------------------------


def test_a_project_manager_invites_only_the_tenants_members_into_the_project(acme: Acme) -> None:
    with pytest.raises(ValidationError) as refused:
        invite(acme.manager, tenant=acme.tenant, project=acme.project, invitee="ext@example.org", role="member")
    assert "only its tenant admins invite people into the tenant" in field_errors(refused.value)["username"][0]
    assert not MembershipInvitation.objects.exists()

    tom = make_user("tom")
    add_tenant_member(acme.tenant, tom)
    invite(acme.manager, tenant=acme.tenant, project=acme.project, invitee="tom", role="viewer")
    assert ProjectMembership.objects.get(project=acme.project, user=tom).role == "viewer"


def test_the_access_helpers_refuse_researchers_and_other_tenants_admins(acme: Acme) -> None:
    with pytest.raises(PermissionDenied):
        project_get_for_user(
            user=acme.researcher, tenant_slug="acme", project_slug="vision", action=ProjectAction.MANAGE
        )
    with pytest.raises(PermissionDenied):
        tenant_get_for_user(user=acme.manager, slug="acme", action=TenantAction.MANAGE)
    with pytest.raises(Exception, match="No tenant 'acme'"):
        tenant_get_for_user(user=acme.outsider, slug="acme", action=TenantAction.MANAGE)


# The API -------------------------------------------------------------------------------------------------


def call(client: Client, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    return client.generic(
        method, url, data=json.dumps(body) if body is not None else "", content_type="application/json"
    )


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_api_invites_lists_reads_and_withdraws(acme: Acme) -> None:
    client = logged_in(acme.admin)
    created = call(client, "POST", "/api/v1/tenants/acme/invitations/", {"email": "api@example.org", "role": "admin"})
    assert created.status_code == 201, created.content
    body = created.json()
    assert {
        key: body[key] for key in ("email", "tenant", "project", "tenant_role", "state", "expired", "invited_by")
    } == {
        "email": "api@example.org",
        "tenant": "acme",
        "project": None,
        "tenant_role": "admin",
        "state": "pending",
        "expired": False,
        "invited_by": "ada",
    }
    listed = call(client, "GET", "/api/v1/tenants/acme/invitations/").json()
    assert [row["email"] for row in listed["results"]] == ["api@example.org"]
    url = f"/api/v1/tenants/acme/invitations/{body['id']}/"
    assert call(client, "GET", url).json()["id"] == body["id"]
    assert call(client, "DELETE", url).status_code == 204
    again = call(client, "DELETE", url)
    assert again.status_code == 409
    assert call(client, "GET", "/api/v1/tenants/acme/invitations/").json()["results"] == []


def test_the_api_refuses_unknown_fields_and_bad_values_by_name(acme: Acme) -> None:
    client = logged_in(acme.admin)
    unknown = call(client, "POST", "/api/v1/tenants/acme/invitations/", {"email": "x@example.org", "colour": "red"})
    assert unknown.status_code == 400
    assert list(unknown.json()["fields"]) == ["colour"]
    not_an_address = call(client, "POST", "/api/v1/tenants/acme/invitations/", {"email": "ada"})
    assert not_an_address.status_code == 400
    assert not_an_address.json()["fields"] == {
        "email": ["'ada' is neither a portal username nor an e-mail address; check the spelling."]
    }
    project_url = "/api/v1/tenants/acme/projects/vision/invitations/"
    manager = call(logged_in(acme.manager), "POST", project_url, {"email": "ext@example.org"})
    assert manager.status_code == 400
    assert list(manager.json()["fields"]) == ["email"]
    assert not MembershipInvitation.objects.exists()


def test_the_api_refuses_researchers_and_other_tenants(acme: Acme) -> None:
    project_url = "/api/v1/tenants/acme/projects/vision/invitations/"
    assert call(logged_in(acme.researcher), "POST", project_url, {"email": "r@example.org"}).status_code == 403
    assert (
        call(
            logged_in(acme.manager), "POST", "/api/v1/tenants/acme/invitations/", {"email": "m@example.org"}
        ).status_code
        == 403
    )
    outsider = call(logged_in(acme.outsider), "POST", "/api/v1/tenants/acme/invitations/", {"email": "o@example.org"})
    assert outsider.status_code == 404
    assert not MembershipInvitation.objects.exists()
    # An invitation of one tenant is not found under another, for that one's admin.
    invitation = invite(acme.admin, tenant=acme.tenant, invitee="x@example.org", role="member").invitation
    other = call(logged_in(acme.outsider), "DELETE", f"/api/v1/tenants/globex/invitations/{invitation.pk}/")
    assert other.status_code == 404
    assert MembershipInvitation.objects.get().state == InvitationState.PENDING
