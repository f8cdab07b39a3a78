"""Browser pages: the home page after login. Login and logout are Django's own views (see frontend/urls.py)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from tenants.models import Project, ProjectMembership, ProjectRole, Tenant, TenantMembership, TenantRole
from tenants.selectors import is_portal_admin, project_list_for_user, tenant_list_for_user


@dataclass(frozen=True)
class Row:
    """A tenant or project with what the user is in it, in words."""

    item: Tenant | Project
    role: str


@require_safe
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The user's tenants and projects with their roles, and where to go next."""
    user = request.user
    portal_admin = is_portal_admin(user)
    # The user's own role rides along as a subquery: one query per list, however many a portal admin sees.
    own_tenant_role = TenantMembership.objects.filter(tenant=OuterRef("pk"), user=user.pk).values("role")[:1]
    own_project_role = ProjectMembership.objects.filter(project=OuterRef("pk"), user=user.pk).values("role")[:1]
    tenants = tenant_list_for_user(user=user).annotate(own_role=Subquery(own_tenant_role))
    projects = project_list_for_user(user=user).annotate(own_role=Subquery(own_project_role))

    tenant_rows = []
    administered: set[int] = set()
    for tenant in tenants:
        role = tenant.own_role
        if role == TenantRole.ADMIN:
            administered.add(tenant.pk)
        tenant_rows.append(Row(tenant, str(TenantRole(role).label) if role else "Portal admin"))

    project_rows = []
    for project in projects:
        role = project.own_role
        if role:
            label = str(ProjectRole(role).label)
        elif project.tenant_id in administered:
            # Tenant admins see every project of their tenant, also those they hold no project role in.
            label = "Tenant admin (no project role)"
        else:
            label = "Portal admin"
        project_rows.append(Row(project, label))

    context = {"tenant_rows": tenant_rows, "project_rows": project_rows, "is_portal_admin": portal_admin}
    return render(request, "frontend/home.html", context)
