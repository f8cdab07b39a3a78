"""Reads of tenant data, and the access helpers every view, API endpoint and consumer goes through.

The rule, in one place: a user with no role in a tenant gets 404 for anything in it, worded the same
whether the object exists or not; a user with a role that is not enough gets 403 naming the role needed.
Portal admins (Django staff) may do everything.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model, OuterRef, Q, QuerySet, Subquery
from django.http import Http404

from portal.db import RelatedRows, prepared_cursor
from tenants.models import (
    ApiToken,
    AuditEvent,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
)

AnyUser = User | AnonymousUser


class TenantAction(enum.Enum):
    VIEW = "view"  # any tenant member
    MANAGE = "manage"  # tenant admin: projects, members, quota requests, costs, audit log


class ProjectAction(enum.Enum):
    VIEW = "view"  # viewer, member, manager; tenant admin
    SUBMIT = "submit"  # member, manager: the roles that hold a Slurm association
    MANAGE = "manage"  # manager; tenant admin: members, settings, cancelling anyone's job


PROJECT_ROLES_ALLOWED = {
    ProjectAction.VIEW: frozenset(ProjectRole),
    ProjectAction.SUBMIT: frozenset({ProjectRole.MEMBER, ProjectRole.MANAGER}),
    ProjectAction.MANAGE: frozenset({ProjectRole.MANAGER}),
}
# A tenant admin may view and manage every project of the tenant, but submits only where they hold a
# project role, because only project roles get a Slurm association.
TENANT_ADMIN_PROJECT_ACTIONS = frozenset({ProjectAction.VIEW, ProjectAction.MANAGE})


M = TypeVar("M", bound=Model)


def is_portal_admin(user: AnyUser) -> bool:
    return bool(user.is_authenticated and user.is_active and getattr(user, "is_staff", False))


# Who may see a project's data: the one rule, for every list of rows that belong to a project or a tenant ------


def visible_to(queryset: QuerySet[M], *, user: AnyUser, project_field: str = "project") -> QuerySet[M]:
    """The rows of `queryset` whose project the user may view: every row for portal admins; for anyone else the
    projects they are a member of and every project of the tenants they administer; none for anonymous users.

    `project_field` leads from the row to its project ("allocation__project"); "" when the rows are projects.
    """
    if not user.is_authenticated:
        return queryset.none()
    if is_portal_admin(user):
        return queryset
    member_of = ProjectMembership.objects.filter(user=user).values("project")
    project = project_field or "pk"
    tenant = f"{project_field}__tenant" if project_field else "tenant"
    return queryset.filter(Q(**{f"{project}__in": member_of}) | Q(**{f"{tenant}__in": _administered(user)}))


def visible_project_ids(*, user: AnyUser) -> list[int]:
    """The ids of the projects `visible_to` lets the user view (the same rule), by one prepared statement: every
    list of jobs starts from them."""
    if not user.is_authenticated:
        return []
    if is_portal_admin(user):
        return list(Project.objects.order_by().values_list("pk", flat=True))
    with prepared_cursor() as cursor:
        cursor.execute(_VISIBLE_PROJECT_IDS, {"user": user.pk, "admin": TenantRole.ADMIN.value})
        return [project_id for (project_id,) in cursor.fetchall()]


_VISIBLE_PROJECT_IDS = (
    "SELECT id FROM tenants_project "
    "WHERE id IN (SELECT project_id FROM tenants_projectmembership WHERE user_id = %(user)s) "
    "OR tenant_id IN (SELECT tenant_id FROM tenants_tenantmembership WHERE user_id = %(user)s AND role = %(admin)s)"
)


def administered_by(queryset: QuerySet[M], *, user: AnyUser, tenant_field: str = "tenant") -> QuerySet[M]:
    """The rows of `queryset` that belong to a tenant the user administers (every row for portal admins, none
    for anonymous users): invoices, tenant pools, the audit log."""
    if not user.is_authenticated:
        return queryset.none()
    if is_portal_admin(user):
        return queryset
    return queryset.filter(**{f"{tenant_field}__in": _administered(user)})


def _administered(user: AnyUser) -> QuerySet[TenantMembership, Any]:
    return TenantMembership.objects.filter(user=user.pk, role=TenantRole.ADMIN).values("tenant")


def _not_found(kind: str, label: str) -> Http404:
    return Http404(f"No {kind} '{label}' exists among the ones you can see; check the name or ask for access.")


# Roles -------------------------------------------------------------------------------------------------


def tenant_role_of(*, user: AnyUser, tenant: Tenant) -> TenantRole | None:
    if not user.is_authenticated:
        return None
    role = TenantMembership.objects.filter(tenant=tenant, user=user).values_list("role", flat=True).first()
    return TenantRole(role) if role else None


def project_role_of(*, user: AnyUser, project: Project) -> ProjectRole | None:
    if not user.is_authenticated:
        return None
    role = ProjectMembership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    return ProjectRole(role) if role else None


# Tenants -----------------------------------------------------------------------------------------------


def tenant_list_for_user(*, user: AnyUser) -> QuerySet[Tenant]:
    """Tenants the user may view, each annotated with `my_role` (None where only portal admin rights apply)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    my_role = TenantMembership.objects.filter(tenant=OuterRef("pk"), user=user.pk).values("role")[:1]
    tenants = Tenant.objects.annotate(my_role=Subquery(my_role)).order_by("slug")
    if is_portal_admin(user):
        return tenants
    # A subquery rather than a join, so that counts annotated on the result see every membership.
    return tenants.filter(pk__in=TenantMembership.objects.filter(user=user).values("tenant"))


def tenant_get_for_user(*, user: AnyUser, slug: str, action: TenantAction = TenantAction.VIEW) -> Tenant:
    """The tenant `slug` if `user` may do `action` on it: 404 for outsiders, 403 for a role too low."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise _not_found("tenant", slug)
    if is_portal_admin(user):
        return tenant
    role = tenant_role_of(user=user, tenant=tenant)
    if role is None:
        raise _not_found("tenant", slug)
    if action is TenantAction.MANAGE and role != TenantRole.ADMIN:
        raise PermissionDenied(
            f"This needs the tenant role 'admin' in tenant '{tenant.slug}'; you are '{role.value}'. "
            "Ask one of the tenant's admins."
        )
    return tenant


# Projects ----------------------------------------------------------------------------------------------


def project_list_for_user(*, user: AnyUser, tenant: Tenant | None = None) -> QuerySet[Project]:
    """Projects the user may view: all for portal admins, all of a tenant for its admins, else their own.

    Each is annotated with `my_role`, the user's project role (None for tenant or portal admins without one).
    """
    if not user.is_authenticated:
        return Project.objects.none()
    my_role = ProjectMembership.objects.filter(project=OuterRef("pk"), user=user.pk).values("role")[:1]
    projects = (
        Project.objects.select_related("tenant").annotate(my_role=Subquery(my_role)).order_by("tenant__slug", "slug")
    )
    if tenant is not None:
        projects = projects.filter(tenant=tenant)
    return visible_to(projects, user=user, project_field="")


def project_get_for_user(
    *,
    user: AnyUser,
    tenant_slug: str,
    project_slug: str,
    action: ProjectAction = ProjectAction.VIEW,
) -> Project:
    """The project if `user` may do `action` on it: 404 for users outside its tenant, 403 for a role too low.

    One prepared statement: the project comes with its tenant and the user's roles in them.
    """
    params = {"user": _user_id(user), "tenant": tenant_slug, "project": project_slug}
    found = _PROJECT_WITH_ROLES.fetch(_PROJECT_BY_SLUGS, params)
    return _project_checked(user=user, found=found, label=f"{tenant_slug}/{project_slug}", action=action)


def project_access_check(
    *,
    user: AnyUser,
    project: Project | None,
    label: str,
    action: ProjectAction,
    tenant_role: str | None,
    project_role: str | None,
) -> None:
    """The rule of `project_get_for_user`, for a caller that read the project (None: no such project) and the
    user's roles in its tenant and in it (None: no role) itself: raises 404 or 403, else returns."""
    if project is None:
        raise _not_found("project", label)
    if is_portal_admin(user):
        return
    held_tenant_role = TenantRole(tenant_role) if tenant_role else None
    if held_tenant_role is None:
        raise _not_found("project", label)
    if held_tenant_role == TenantRole.ADMIN and action in TENANT_ADMIN_PROJECT_ACTIONS:
        return
    held_project_role = ProjectRole(project_role) if project_role else None
    if held_project_role is not None and held_project_role in PROJECT_ROLES_ALLOWED[action]:
        return
    needed = " or ".join(f"'{role.value}'" for role in ProjectRole if role in PROJECT_ROLES_ALLOWED[action])
    if action in TENANT_ADMIN_PROJECT_ACTIONS:
        needed += f", or the tenant role 'admin' in '{project.tenant.slug}'"
    held = f"you are '{held_project_role.value}'" if held_project_role else "you have no role in it"
    raise PermissionDenied(f"This needs the project role {needed} in project '{label}'; {held}.")


_PROJECT_LABEL = re.compile(r"^([^/]+)/([^/]+)$")


def project_get_by_label_for_user(
    *,
    user: AnyUser,
    label: str,
    action: ProjectAction = ProjectAction.VIEW,
    field: str = "project",
) -> Project:
    """The project written 'tenant/project' (as the API takes it), with the access rules of project_get_for_user."""
    tenant_slug, project_slug = project_label_parse(label, field=field)
    return project_get_for_user(user=user, tenant_slug=tenant_slug, project_slug=project_slug, action=action)


def project_label_parse(label: str, *, field: str = "project") -> tuple[str, str]:
    """The tenant and project slugs of 'tenant/project'; a 400 naming `field` for anything else."""
    match = _PROJECT_LABEL.match(label)
    if match is None:
        raise ValidationError({field: ["Give the project as 'tenant/project', e.g. 'acme/vision'."]})
    return match[1], match[2]


def project_get_by_id_for_user(
    *, user: AnyUser, project_id: int, action: ProjectAction = ProjectAction.VIEW
) -> Project:
    """The same rule as `project_get_for_user`, for callers holding a project's id (WebSocket routes, jobs: a
    job's page, its API and its streams ask this on every request)."""
    found = _PROJECT_WITH_ROLES.fetch(_PROJECT_BY_ID, {"user": _user_id(user), "project": project_id})
    label = f"{found[0].tenant.slug}/{found[0].slug}" if found else str(project_id)
    return _project_checked(user=user, found=found, label=label, action=action)


def project_roles_check(*, user: AnyUser, project: Project, action: ProjectAction) -> None:
    """The rule of `project_get_for_user` for another action, on a project that a `project_get_*_for_user` call
    returned for the same `user` (it carries their roles): a page that asks for several actions reads them once."""
    _project_checked(user=user, found=[project], label=f"{project.tenant.slug}/{project.slug}", action=action)


def _project_checked(*, user: AnyUser, found: list[Project], label: str, action: ProjectAction) -> Project:
    project = found[0] if found else None
    project_access_check(
        user=user,
        project=project,
        label=label,
        action=action,
        tenant_role=getattr(project, "viewer_tenant_role", None),  # the annotations below, unknown to the type checker
        project_role=getattr(project, "viewer_project_role", None),
    )
    assert project is not None
    return project


def _user_id(user: AnyUser) -> int | None:
    return user.pk if user.is_authenticated else None


# A project with its tenant and the roles `%(user)s` holds in them (None where none, and for anonymous).
_PROJECT_WITH_ROLES = RelatedRows(
    Project,
    "tenant",
    alias="project",
    annotations=(
        (
            "viewer_tenant_role",
            "(SELECT role FROM tenants_tenantmembership "
            "WHERE tenant_id = project.tenant_id AND user_id = %(user)s LIMIT 1)",
        ),
        (
            "viewer_project_role",
            "(SELECT role FROM tenants_projectmembership WHERE project_id = project.id AND user_id = %(user)s LIMIT 1)",
        ),
    ),
)
_PROJECT_BY_ID = f"{_PROJECT_WITH_ROLES.select} WHERE project.id = %(project)s"
_PROJECT_BY_SLUGS = (
    f"{_PROJECT_WITH_ROLES.select} WHERE project.slug = %(project)s "  # noqa: S608
    "AND project.tenant_id = (SELECT id FROM tenants_tenant WHERE slug = %(tenant)s)"
)


# Memberships -------------------------------------------------------------------------------------------


def tenant_membership_list(*, tenant: Tenant) -> QuerySet[TenantMembership]:
    return TenantMembership.objects.filter(tenant=tenant).select_related("user", "tenant")


def tenant_membership_get(*, tenant: Tenant, username: str) -> TenantMembership:
    membership = tenant_membership_list(tenant=tenant).filter(user__username=username).first()
    if membership is None:
        raise Http404(f"'{username}' is not a member of tenant '{tenant.slug}'.")
    return membership


def project_membership_list(*, project: Project) -> QuerySet[ProjectMembership]:
    return ProjectMembership.objects.filter(project=project).select_related("user", "project__tenant")


def project_membership_get(*, project: Project, username: str) -> ProjectMembership:
    membership = project_membership_list(project=project).filter(user__username=username).first()
    if membership is None:
        raise Http404(f"'{username}' is not a member of project '{project}'.")
    return membership


# Tokens ------------------------------------------------------------------------------------------------


def token_list_for_user(*, user: AnyUser) -> QuerySet[ApiToken]:
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)


def token_get_for_user(*, user: AnyUser, token_id: int) -> ApiToken:
    """Tokens are private to their owner, portal admins included: they revoke tokens in the Django admin."""
    token = token_list_for_user(user=user).filter(pk=token_id).first()
    if token is None:
        raise _not_found("token", str(token_id))
    return token


# Audit log ---------------------------------------------------------------------------------------------


def audit_event_list_for_user(*, user: AnyUser, tenant: Tenant | None = None) -> QuerySet[AuditEvent]:
    """Portal admins read every event; tenant admins read their tenants' events; nobody else reads any."""
    events = AuditEvent.objects.select_related("tenant")
    if tenant is not None:
        events = events.filter(tenant=tenant)
    return administered_by(events, user=user)


# What the user may reach, for the browser's navigation --------------------------------------------------


@dataclass(frozen=True)
class UserReach:
    """Which parts of the portal the user has a role for, so the navigation offers only what answers."""

    is_portal_admin: bool
    administers_a_tenant: bool
    manages_a_project: bool

    @property
    def decides_requests(self) -> bool:
        return self.is_portal_admin or self.administers_a_tenant

    @property
    def sees_spend(self) -> bool:
        return self.is_portal_admin or self.administers_a_tenant or self.manages_a_project


def user_reach_with_unread(*, user: AnyUser) -> tuple[UserReach, int]:
    """The user's reach and how many of their notifications are unread: what every page's navigation shows, read
    by one prepared statement (it runs on every page)."""
    if not user.is_authenticated:
        return UserReach(False, False, False), 0
    params: dict[str, Any] = {"user": user.pk, "admin": TenantRole.ADMIN.value, "manager": ProjectRole.MANAGER.value}
    with prepared_cursor() as cursor:
        cursor.execute(_REACH_WITH_UNREAD, params)
        administers_a_tenant, manages_a_project, unread = cursor.fetchone()
    reach = UserReach(
        is_portal_admin=is_portal_admin(user),
        administers_a_tenant=administers_a_tenant,
        manages_a_project=manages_a_project,
    )
    return reach, unread


# A notification belongs to its addressee alone (tenants/notification_apis.py `notification_list_for_user`).
_REACH_WITH_UNREAD = (
    "SELECT EXISTS (SELECT 1 FROM tenants_tenantmembership WHERE user_id = %(user)s AND role = %(admin)s), "
    "EXISTS (SELECT 1 FROM tenants_projectmembership WHERE user_id = %(user)s AND role = %(manager)s), "
    "(SELECT count(*) FROM tenants_notification WHERE user_id = %(user)s AND read_at IS NULL)"
)
