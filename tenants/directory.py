"""Memberships that follow a provider's directory: at each sign-in, the roles a person's groups give them.

Admins map a provider's groups (values of its `groups` claim) to tenant and project roles (DirectoryGroupRole).
A sign-in applies the mapping just in time, in the sign-in's transaction, through tenants.services (so every
change is audited, with the directory as its origin): roles the groups give are added or changed, roles the
directory gave earlier and the groups no longer give are removed. Roles granted by hand are never touched.
Other apps add what they derive from the claims through `directory_claims_applier_register` (clusters: the
POSIX user on each cluster).

Claims that cannot be applied (a group mapped to a tenant or project that does not exist, a claim missing, a
POSIX name already someone else's, a service refusing) raise DirectoryConflict: the sign-in's transaction rolls
back, so nobody is left half made, the person gets a page saying what is wrong and the portal admins a notice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from tenants import services
from tenants.models import (
    DirectoryGroupRole,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
    directory_origin,
)
from tenants.notifications import notifications_send

GROUPS_CLAIM = "groups"
# The stronger of two roles a person's groups give in one place.
_TENANT_RANK: dict[str, int] = {TenantRole.MEMBER: 1, TenantRole.ADMIN: 2}
_PROJECT_RANK: dict[str, int] = {ProjectRole.VIEWER: 1, ProjectRole.MEMBER: 2, ProjectRole.MANAGER: 3}


@dataclass(frozen=True)
class SignInClaims:
    user: User
    provider_id: str
    provider_name: str
    claims: dict[str, Any]


class DirectoryConflict(Exception):
    """The claims cannot be applied; `problem` says why, in words for the person and for the admins."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


ClaimsApplier = Callable[[SignInClaims], None]
_claims_appliers: list[ClaimsApplier] = []


def directory_claims_applier_register(applier: ClaimsApplier) -> None:
    """Another app applies the claims too, in the same transaction (may raise DirectoryConflict)."""
    if applier not in _claims_appliers:
        _claims_appliers.append(applier)


def _groups(sign_in: SignInClaims) -> set[str]:
    groups = sign_in.claims.get(GROUPS_CLAIM)
    if groups is None:
        raise DirectoryConflict(
            f"{sign_in.provider_name} did not send your groups (the '{GROUPS_CLAIM}' claim), which this portal "
            "needs to know your tenants and projects."
        )
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list) or not all(isinstance(group, str) for group in groups):
        raise DirectoryConflict(f"{sign_in.provider_name} sent a '{GROUPS_CLAIM}' claim that is not a list of names.")
    return set(groups)


def _stronger(current: str | None, role: str, rank: dict[str, int]) -> str:
    return role if current is None or rank[role] > rank[current] else current


def _wanted_roles(sign_in: SignInClaims) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The tenant role per tenant slug and the project role per (tenant, project) slugs that the groups give."""
    mappings = list(DirectoryGroupRole.objects.filter(provider=sign_in.provider_id))
    if not mappings:
        return {}, {}
    groups = _groups(sign_in)
    tenant_roles: dict[str, str] = {}
    project_roles: dict[tuple[str, str], str] = {}
    for mapping in mappings:
        if mapping.group not in groups:
            continue
        if mapping.project_slug:
            key = (mapping.tenant_slug, mapping.project_slug)
            project_roles[key] = _stronger(project_roles.get(key), mapping.role, _PROJECT_RANK)
            # A project's people belong to its tenant.
            tenant_roles[mapping.tenant_slug] = _stronger(
                tenant_roles.get(mapping.tenant_slug), TenantRole.MEMBER, _TENANT_RANK
            )
        else:
            tenant_roles[mapping.tenant_slug] = _stronger(
                tenant_roles.get(mapping.tenant_slug), mapping.role, _TENANT_RANK
            )
    return tenant_roles, project_roles


def _unknown(what: str, names: set[str], sign_in: SignInClaims) -> DirectoryConflict:
    listed = ", ".join(f"'{name}'" for name in sorted(names))
    return DirectoryConflict(
        f"Your groups at {sign_in.provider_name} give you a role in {what} {listed}, which this portal does not have."
    )


def directory_roles_apply(sign_in: SignInClaims) -> None:
    """Bring the person's directory roles in line with their groups. Call inside the sign-in's transaction."""
    origin = directory_origin(sign_in.provider_id)
    tenant_roles, project_roles = _wanted_roles(sign_in)
    tenants = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=tenant_roles)}
    if missing_tenants := set(tenant_roles) - set(tenants):
        raise _unknown("the tenant" if len(missing_tenants) == 1 else "the tenants", missing_tenants, sign_in)
    projects = {
        (project.tenant.slug, project.slug): project
        for project in Project.objects.select_related("tenant").filter(tenant__slug__in=tenant_roles)
        if (project.tenant.slug, project.slug) in project_roles
    }
    if missing_projects := set(project_roles) - set(projects):
        names = {f"{tenant}/{project}" for tenant, project in missing_projects}
        raise _unknown("the project" if len(names) == 1 else "the projects", names, sign_in)
    user = sign_in.user
    tenant_memberships = {
        membership.tenant.slug: membership
        for membership in TenantMembership.objects.select_related("tenant", "user").filter(user=user)
    }
    project_memberships = {
        (membership.project.tenant.slug, membership.project.slug): membership
        for membership in ProjectMembership.objects.select_related("project__tenant", "user").filter(user=user)
    }
    try:
        for slug, role in tenant_roles.items():
            _grant(
                tenant_memberships.get(slug),
                role,
                origin,
                add=partial(
                    services.tenant_member_add, actor=None, tenant=tenants[slug], user=user, role=role, origin=origin
                ),
                change_role=services.tenant_member_change_role,
            )
        for key, role in project_roles.items():
            _grant(
                project_memberships.get(key),
                role,
                origin,
                add=partial(
                    services.project_member_add, actor=None, project=projects[key], user=user, role=role, origin=origin
                ),
                change_role=services.project_member_change_role,
            )
        # What the directory gave earlier and the groups no longer give.
        for key, project_membership in project_memberships.items():
            if project_membership.origin == origin and key not in project_roles:
                services.project_member_remove(actor=None, membership=project_membership)
        for slug, tenant_membership in tenant_memberships.items():
            if tenant_membership.origin != origin or slug in tenant_roles:
                continue
            # Leaving the tenant would take the projects granted there by hand with it: those keep it.
            kept_by_hand = ProjectMembership.objects.filter(project__tenant__slug=slug, user=user).exclude(
                origin=origin
            )
            if not kept_by_hand.exists():
                services.tenant_member_remove(actor=None, membership=tenant_membership)
    except ValidationError as refusal:
        raise DirectoryConflict(" ".join(refusal.messages)) from refusal


def _grant(
    membership: TenantMembership | ProjectMembership | None,
    role: str,
    origin: str,
    *,
    add: Callable[[], object],
    change_role: Callable[..., object],
) -> None:
    """The role the groups give: added where the person has none there, changed where the directory gave
    another, left alone where it was granted by hand."""
    if membership is None:
        add()
    elif membership.origin == origin and membership.role != role:
        change_role(actor=None, membership=membership, role=role, origin=origin)


def directory_sign_in_apply(sign_in: SignInClaims) -> None:
    """Everything the portal derives from a sign-in's claims: roles here, then the other apps' (in the caller's
    transaction; DirectoryConflict rolls it back)."""
    directory_roles_apply(sign_in)
    for applier in _claims_appliers:
        applier(sign_in)


def directory_conflict_notify(*, provider_name: str, username: str, problem: str) -> None:
    """Tell the portal admins (staff) that a sign-in was refused for a directory conflict; its own transaction,
    since the sign-in's was rolled back."""
    admins = get_user_model().objects.filter(is_staff=True, is_active=True)
    with transaction.atomic():
        notifications_send(
            users=admins,
            tenant=None,
            kind="directory.conflict",
            title=f"Sign-in of '{username}' through {provider_name} refused: the directory does not fit the portal",
            body=f"{problem} Fix the group mappings or the portal (Django admin), then ask them to sign in again.",
            link="/admin/tenants/directorygrouprole/",
        )
