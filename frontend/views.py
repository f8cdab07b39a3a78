"""Browser pages: the home page after login, and printable invoices.

Login and logout are Django's own views (see frontend/urls.py)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe

from billing.apis import invoice_data
from billing.selectors import invoice_get_for_user, invoice_lines
from tenants.models import Project, ProjectRole, Tenant, TenantRole
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
    tenants = tenant_list_for_user(user=user)
    projects = project_list_for_user(user=user)

    tenant_rows = []
    administered: set[int] = set()
    for tenant in tenants:
        role = tenant.my_role  # type: ignore[attr-defined]  # annotated by the selector
        if role == TenantRole.ADMIN:
            administered.add(tenant.pk)
        tenant_rows.append(Row(tenant, str(TenantRole(role).label) if role else "Portal admin"))

    project_rows = []
    for project in projects:
        role = project.my_role  # type: ignore[attr-defined]  # annotated by the selector
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


@require_safe
@login_required
def invoice_print(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """An invoice laid out for paper: the browser's "Print" (or "Save as PDF") gives the document."""
    invoice = invoice_get_for_user(user=request.user, invoice_id=invoice_id)
    lines = list(invoice_lines(invoice=invoice).select_related("project__tenant"))
    return render(request, "frontend/invoice_print.html", {"invoice": invoice_data(invoice, lines=lines)})


urlpatterns = [
    path("", home, name="home"),
    path("billing/invoices/<int:invoice_id>/print/", invoice_print, name="invoice-print"),
]
