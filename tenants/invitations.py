"""Inviting people into a tenant or a project by username or e-mail address, and the invitations that wait for
an address nobody has yet until its owner signs in with it.

Callers check who may invite (tenant admins for the tenant; project managers and tenant admins for a project,
`tenants.selectors`); the rules that hold for everyone are here: a project takes only the tenant's members
unless a tenant admin invites, an address several accounts share must be invited by username, one open
invitation per address and place. Each change is one transaction with its audit event.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from portal.errors import Conflict
from tenants import services
from tenants.models import (
    InvitationState,
    MembershipInvitation,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
)
from tenants.notifications import notifications_send

logger = logging.getLogger(__name__)

# Long enough for someone away for a week or two, short enough that a mistyped address does not wait for ever.
INVITATION_VALID_DAYS = 14
FIELD = "username"  # the one box of the pages' form takes a username or an address; errors show beside it


@dataclass(frozen=True)
class InviteOutcome:
    """What an invitation did: a membership at once (`membership`), and for an address the invitation's record
    (`invitation`, accepted at once when an account has that address, else pending)."""

    membership: TenantMembership | ProjectMembership | None
    invitation: MembershipInvitation | None


# Reads -------------------------------------------------------------------------------------------------


def invitation_list_open(*, tenant: Tenant, project: Project | None = None) -> QuerySet[MembershipInvitation]:
    """A tenant's pending invitations (a project's only, with `project`), expired ones included until closed."""
    invitations = MembershipInvitation.objects.filter(tenant=tenant, state=InvitationState.PENDING).select_related(
        "tenant", "project", "invited_by"
    )
    if project is not None:
        invitations = invitations.filter(project=project)
    return invitations.order_by("-created_at", "-id")


def invitation_get(*, tenant: Tenant, invitation_id: int, project: Project | None = None) -> MembershipInvitation:
    """An invitation of the tenant (of the project, with `project`), open or not: 404 for any other."""
    invitations = MembershipInvitation.objects.select_related("tenant", "project", "invited_by").filter(tenant=tenant)
    if project is not None:
        invitations = invitations.filter(project=project)
    invitation = invitations.filter(pk=invitation_id).first()
    if invitation is None:
        where = str(project) if project is not None else tenant.slug
        raise Http404(f"No invitation {invitation_id} exists in '{where}'.")
    return invitation


def _state(invitation: MembershipInvitation) -> dict[str, Any]:
    state = {
        "tenant": invitation.tenant.slug,
        "email": invitation.email,
        "tenant_role": invitation.tenant_role,
        "state": invitation.state,
        "expires_at": invitation.expires_at.isoformat(),
    }
    if invitation.project_id:
        state |= {"project": str(invitation.project), "project_role": invitation.project_role}
    return state


# Inviting ----------------------------------------------------------------------------------------------


def _check_role(role: str, choices: type[TenantRole] | type[ProjectRole]) -> None:
    if role not in choices.values:
        allowed = ", ".join(f"'{choice}'" for choice in choices.values)
        raise ValidationError({"role": [f"'{role}' is not a role here; use one of {allowed}."]})


def _users_with_address(email: str) -> list[User]:
    return list(get_user_model().objects.filter(email__iexact=email, is_active=True).order_by("pk")[:2])


def member_invite(
    *,
    actor: User,
    tenant: Tenant,
    project: Project | None,
    invitee: str,
    role: str,
    may_add_to_tenant: bool,
    field: str = FIELD,
    by_username: bool = True,
) -> InviteOutcome:
    """Give `invitee` (a username or an e-mail address) `role` in the tenant, or in `project` when given.

    A username or an address one account has: the membership at once, and the person is told. An address no
    account has: a pending invitation, e-mailed to it. Into a project, someone outside the tenant comes only
    with `may_add_to_tenant` (the inviter is a tenant admin), and joins the tenant as a member. Errors about the
    invitee are `field`'s (the pages' one box, the API's `email`, which takes addresses only: `by_username` False).
    """
    try:
        return _member_invite(
            actor=actor,
            tenant=tenant,
            project=project,
            invitee=invitee,
            role=role,
            may_add_to_tenant=may_add_to_tenant,
            by_username=by_username,
        )
    except ValidationError as error:
        if field == FIELD or not hasattr(error, "error_dict"):
            raise
        raise ValidationError(
            {field if name == FIELD else name: messages for name, messages in error.message_dict.items()}
        ) from None


def _member_invite(
    *,
    actor: User,
    tenant: Tenant,
    project: Project | None,
    invitee: str,
    role: str,
    may_add_to_tenant: bool,
    by_username: bool,
) -> InviteOutcome:
    invitee = invitee.strip()
    _check_role(role, ProjectRole if project is not None else TenantRole)
    if not invitee:
        raise ValidationError({FIELD: ["Give the person's portal username or e-mail address."]})
    user = get_user_model().objects.filter(username=invitee, is_active=True).first() if by_username else None
    if user is not None:
        return InviteOutcome(
            membership=_add(actor=actor, tenant=tenant, project=project, user=user, role=role), invitation=None
        )
    if "@" not in invitee and by_username:
        services.user_get_by_username(username=invitee)  # raises its field error, naming the username
    try:
        validate_email(invitee)
    except ValidationError:
        raise ValidationError(
            {FIELD: [f"'{invitee}' is neither a portal username nor an e-mail address; check the spelling."]}
        ) from None
    owners = _users_with_address(invitee)
    if len(owners) > 1:
        raise ValidationError(
            {FIELD: [f"Several portal accounts use {invitee}; invite the right one by their username."]}
        )
    if project is not None and not may_add_to_tenant and not _in_tenant(owners, tenant):
        raise ValidationError(
            {
                FIELD: [
                    f"{invitee} is not a member of tenant '{tenant.slug}', and only its tenant admins invite people "
                    "into the tenant; ask one of them."
                ]
            }
        )
    with transaction.atomic():
        invitation = _invitation_create(actor=actor, tenant=tenant, project=project, email=invitee, role=role)
        if not owners:
            _email_invitation(invitation)
            return InviteOutcome(membership=None, invitation=invitation)
        # Someone has the address: the membership at once (the services refuse one the person already holds),
        # and the invitation's record says it was accepted by them.
        if project is not None and not _in_tenant(owners, tenant):
            services.tenant_member_add(actor=actor, tenant=tenant, user=owners[0], role=TenantRole.MEMBER)
        membership = _add(actor=actor, tenant=tenant, project=project, user=owners[0], role=role)
        _close(invitation, state=InvitationState.ACCEPTED, by=owners[0], actor=actor, action="invitation.accepted")
    return InviteOutcome(membership=membership, invitation=invitation)


def _in_tenant(owners: list[User], tenant: Tenant) -> bool:
    return bool(owners) and TenantMembership.objects.filter(tenant=tenant, user=owners[0]).exists()


def _add(
    *, actor: User, tenant: Tenant, project: Project | None, user: User, role: str
) -> TenantMembership | ProjectMembership:
    """The membership by username, with the services' own rules (a project takes only the tenant's members)."""
    with transaction.atomic():
        membership: TenantMembership | ProjectMembership
        if project is None:
            membership = services.tenant_member_add(actor=actor, tenant=tenant, user=user, role=role)
            where, label = f"tenant {tenant.slug}", TenantRole(role).label
            link = f"/tenants/{tenant.slug}/"
        else:
            membership = services.project_member_add(actor=actor, project=project, user=user, role=role)
            where, label = f"project {project}", ProjectRole(role).label
            link = f"/projects/{tenant.slug}/{project.slug}/"
        _tell_member(user=user, actor=actor, tenant=tenant, where=where, label=str(label), link=link)
    return membership


def _tell_member(*, user: User, actor: User | None, tenant: Tenant, where: str, label: str, link: str) -> None:
    who = actor.get_username() if actor is not None else "An admin"
    notifications_send(
        users=[user],
        tenant=tenant,
        kind="membership.added",
        title=f"You joined {where} as {label}",
        body=f"{who} gave you the role {label} in {where}.",
        link=link,
    )


def _invitation_create(
    *, actor: User, tenant: Tenant, project: Project | None, email: str, role: str
) -> MembershipInvitation:
    now = timezone.now()
    open_ones = (
        MembershipInvitation.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, project=project, email__iexact=email, state=InvitationState.PENDING)
        .first()
    )
    if open_ones is not None:
        if open_ones.expires_at > now:
            raise ValidationError(
                {
                    FIELD: [
                        f"{open_ones.email} was already invited on {open_ones.created_at:%Y-%m-%d}; the invitation "
                        f"waits until {open_ones.expires_at:%Y-%m-%d}. Withdraw it first to invite again."
                    ]
                }
            )
        _close(open_ones, state=InvitationState.EXPIRED, by=None, actor=actor, action="invitation.expired")
    invitation = MembershipInvitation.objects.create(
        tenant=tenant,
        project=project,
        email=email,
        tenant_role=TenantRole.MEMBER if project is not None else role,
        project_role=role if project is not None else "",
        invited_by=actor,
        created_at=now,
        expires_at=now + timedelta(days=INVITATION_VALID_DAYS),
    )
    services.audit_record(
        actor=actor,
        action="invitation.created",
        target=invitation,
        tenant=tenant,
        before=None,
        after=_state(invitation),
    )
    return invitation


def _email_invitation(invitation: MembershipInvitation) -> None:
    """Once committed, e-mail the address (EMAIL_BACKEND; the console's by default). A failure is logged: the
    invitation waits on the members page all the same."""
    who = invitation.invited_by.get_username() if invitation.invited_by else "An admin"
    where = f"project {invitation.project}" if invitation.project_id else f"tenant {invitation.tenant.slug}"
    text = (
        f"{who} invited you to {where} on the GPU portal as {invitation.role_label}.\n\n"
        f"Sign in at {settings.PORTAL_BASE_URL}/login/ with an account that has this address "
        f"({invitation.email}) before {invitation.expires_at:%Y-%m-%d %H:%M} UTC; the role is yours from then on.\n"
    )

    def send() -> None:
        try:
            send_mail(f"[GPU portal] Invitation to {where}", text, settings.DEFAULT_FROM_EMAIL, [invitation.email])
        except Exception:
            logger.exception("could not e-mail invitation %s", invitation.pk)

    transaction.on_commit(send)


def _close(
    invitation: MembershipInvitation, *, state: InvitationState, by: User | None, actor: User | None, action: str
) -> None:
    before = _state(invitation)
    invitation.state, invitation.closed_by, invitation.closed_at = state, by, timezone.now()
    invitation.save(update_fields=["state", "closed_by", "closed_at"])
    services.audit_record(
        actor=actor, action=action, target=invitation, tenant=invitation.tenant, before=before, after=_state(invitation)
    )


def _accept(
    invitation: MembershipInvitation, *, user: User, actor: User | None
) -> TenantMembership | ProjectMembership:
    """The invitation's roles for `user`. A role the person already holds stays as it is: an invitation adds
    people, it does not change roles behind an admin's back."""
    tenant_membership = TenantMembership.objects.filter(tenant=invitation.tenant, user=user).first()
    if tenant_membership is None:
        tenant_membership = services.tenant_member_add(
            actor=actor, tenant=invitation.tenant, user=user, role=invitation.tenant_role
        )
    membership: TenantMembership | ProjectMembership = tenant_membership
    project = invitation.project
    if project is not None:
        existing = ProjectMembership.objects.filter(project=project, user=user).first()
        membership = existing or services.project_member_add(
            actor=actor, project=project, user=user, role=invitation.project_role
        )
    _close(invitation, state=InvitationState.ACCEPTED, by=user, actor=actor, action="invitation.accepted")
    where = f"project {project}" if project is not None else f"tenant {invitation.tenant.slug}"
    link = f"/projects/{invitation.tenant.slug}/{project.slug}/" if project else f"/tenants/{invitation.tenant.slug}/"
    _tell_member(
        user=user,
        actor=invitation.invited_by,
        tenant=invitation.tenant,
        where=where,
        label=invitation.role_label,
        link=link,
    )
    return membership


# Closing -----------------------------------------------------------------------------------------------


@transaction.atomic
def invitation_withdraw(*, actor: User, invitation: MembershipInvitation) -> MembershipInvitation:
    """Take back a pending invitation (an expired one too, to clear it from the list)."""
    invitation = (
        MembershipInvitation.objects.select_for_update(of=("self",))
        .select_related("tenant", "project")
        .get(pk=invitation.pk)
    )
    if invitation.state != InvitationState.PENDING:
        raise Conflict(
            f"The invitation of {invitation.email} is {invitation.get_state_display().lower()}; there is nothing "
            "to withdraw."
        )
    _close(invitation, state=InvitationState.WITHDRAWN, by=actor, actor=actor, action="invitation.withdrawn")
    return invitation


@transaction.atomic
def invitations_accept(*, user: User, verified_email: str) -> list[MembershipInvitation]:
    """At sign-in: the pending invitations to `verified_email` become `user`'s memberships; expired ones are
    marked so. The caller passes only an address it trusts: the one a portal admin gave the account, or one the
    OpenID provider says it verified."""
    if not verified_email or not user.is_active:
        return []
    now = timezone.now()
    waiting = list(
        MembershipInvitation.objects.select_for_update(of=("self",))
        .select_related("tenant", "project", "invited_by")
        .filter(email__iexact=verified_email, state=InvitationState.PENDING)
        .order_by("created_at", "pk")
    )
    accepted = []
    for invitation in waiting:
        if invitation.expires_at <= now:
            _close(invitation, state=InvitationState.EXPIRED, by=None, actor=user, action="invitation.expired")
            continue
        _accept(invitation, user=user, actor=user)
        accepted.append(invitation)
    return accepted
