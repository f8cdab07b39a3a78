"""Browser pages: the dashboard after login, the user's notifications, and printable invoices.

Login and logout are Django's own views (see frontend/urls.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from billing.apis import invoice_data
from billing.efficiency import efficiency_report
from billing.selectors import invoice_get_for_user, invoice_lines
from billing.spend import SpendScope, spend_daily, spend_period, spend_scope_for_user
from jobs.selectors import job_list_own_for_user
from quotas.selectors import allocation_list_for_user
from tenants.models import Project, ProjectRole, Tenant, TenantRole
from tenants.notification_apis import (
    notification_get_for_user,
    notification_list_for_user,
    notification_mark_read,
    notifications_mark_all_read,
)
from tenants.selectors import AnyUser, is_portal_admin, project_list_for_user, tenant_list_for_user

# The dashboard shows a glance; the full lists are a click away.
DASHBOARD_GAUGES = 12
DASHBOARD_ACTIVE_JOBS = 10
DASHBOARD_RECENT_JOBS = 5
DASHBOARD_NOTIFICATIONS = 5
DASHBOARD_SPEND_SCOPES = 10
PAGE_SIZE = 25


@dataclass(frozen=True)
class Row:
    """A tenant or project with what the user is in it, in words."""

    item: Tenant | Project
    role: str


@dataclass(frozen=True)
class SpendLine:
    """This month's spend of one scope the user may read it for (a tenant, a project, or every tenant)."""

    label: str
    link: str
    amount: Decimal | None
    currency: str | None
    gpu_seconds: int
    problem: str = ""
    # The month's idle GPU-hours of the scope's jobs and what they cost, per currency (the efficiency report's).
    idle_gpu_hours: Decimal = Decimal(0)
    idle_amounts: dict[str, Decimal] = field(default_factory=dict)
    efficiency_link: str = ""


@require_safe
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The dashboard: quota gauges of my projects, my jobs, this month's spend where my role allows, and what
    is new for me."""
    user = request.user
    now = timezone.now()
    portal_admin = is_portal_admin(user)
    tenants = tenant_list_for_user(user=user)
    projects = project_list_for_user(user=user)

    tenant_rows = []
    administered: list[Tenant] = []
    for tenant in tenants:
        role = tenant.my_role  # type: ignore[attr-defined]  # annotated by the selector
        if role == TenantRole.ADMIN:
            administered.append(tenant)
        tenant_rows.append(Row(tenant, str(TenantRole(role).label) if role else "Portal admin"))
    administered_ids = {tenant.pk for tenant in administered}

    project_rows = []
    managed: list[Project] = []
    for project in projects:
        role = project.my_role  # type: ignore[attr-defined]  # annotated by the selector
        if role:
            label = str(ProjectRole(role).label)
            if role == ProjectRole.MANAGER and project.tenant_id not in administered_ids:
                managed.append(project)
        elif project.tenant_id in administered_ids:
            # Tenant admins see every project of their tenant, also those they hold no project role in.
            label = "Tenant admin (no project role)"
        else:
            label = "Portal admin"
        project_rows.append(Row(project, label))

    allocations = [allocation for allocation in allocation_list_for_user(user=user) if allocation.is_current(now)]
    unread = notification_list_for_user(user=user).filter(read_at__isnull=True)
    context = {
        "tenant_rows": tenant_rows,
        "project_rows": project_rows,
        "is_portal_admin": portal_admin,
        "allocations": allocations[:DASHBOARD_GAUGES],
        "more_allocations": max(0, len(allocations) - DASHBOARD_GAUGES),
        "active_jobs": list(job_list_own_for_user(user=user, active=True)[:DASHBOARD_ACTIVE_JOBS]),
        "recent_jobs": list(job_list_own_for_user(user=user, active=False)[:DASHBOARD_RECENT_JOBS]),
        "spend": _spend_lines(user=user, portal_admin=portal_admin, tenants=administered, projects=managed),
        "sees_spend": portal_admin or bool(administered) or bool(managed),
        "unread_list": list(unread[:DASHBOARD_NOTIFICATIONS]),
        "month_start": now.date().replace(day=1),
        "today": now.date(),
    }
    return render(request, "frontend/dashboard/home.html", context)


def _spend_lines(
    *, user: AnyUser, portal_admin: bool, tenants: list[Tenant], projects: list[Project]
) -> list[SpendLine]:
    """The month so far for every scope the spend API would answer this user for (billing/spend.py rules)."""
    today = timezone.now().date()
    start, end = spend_period(start=None, end=None, today=today)
    # Each scope: its label, its value in the billing pages' select, and its scope.
    scopes: list[tuple[str, str, SpendScope]] = []
    if portal_admin:
        scopes.append(("All tenants", "all", spend_scope_for_user(user=user, all_allowed=True)))
    for tenant in tenants:
        scope = spend_scope_for_user(user=user, tenant=tenant.slug)
        scopes.append((f"Tenant {tenant.slug}", tenant.slug, scope))
    for project in projects:
        label = f"{project.tenant.slug}/{project.slug}"
        scope = spend_scope_for_user(user=user, project=label)
        scopes.append((f"Project {label}", label, scope))
    lines = []
    for label, value, scope in scopes[:DASHBOARD_SPEND_SCOPES]:
        link = "/billing/" if value == "all" else f"/billing/?scope={value}"
        try:
            spend = spend_daily(scope=scope, start=start, end=end)
            line = SpendLine(label, link, spend.total, spend.currency, spend.gpu_seconds)
        except ValidationError:
            line = SpendLine(label, link, None, None, 0, "priced in several currencies: see Billing")
        idle = efficiency_report(scope=scope, month=today.replace(day=1), worst=0).totals
        efficiency_link = f"/billing/efficiency/?scope={value}"
        lines.append(
            replace(
                line,
                idle_gpu_hours=idle.idle_gpu_hours,
                idle_amounts=idle.idle_amounts,
                efficiency_link=efficiency_link,
            )
        )
    return lines


# Notifications ---------------------------------------------------------------------------------------


@require_safe
@login_required
def notification_list(request: HttpRequest) -> HttpResponse:
    """The user's notifications, newest first; `?unread=1` for the unread ones only."""
    notifications = notification_list_for_user(user=request.user)
    unread_count = notifications.filter(read_at__isnull=True).count()
    unread_only = request.GET.get("unread") == "1"
    if unread_only:
        notifications = notifications.filter(read_at__isnull=True)
    page = Paginator(notifications, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"page": page, "unread_only": unread_only, "unread_count": unread_count}
    return render(request, "frontend/dashboard/notifications.html", context)


@require_POST
@login_required
def notification_read(request: HttpRequest, notification_id: int) -> HttpResponse:
    notification = notification_get_for_user(user=request.user, notification_id=notification_id)
    notification_mark_read(notification=notification)
    messages.success(request, f"Marked \u201c{notification.title}\u201d as read.")
    return _back(request)


@require_POST
@login_required
def notification_read_all(request: HttpRequest) -> HttpResponse:
    marked = notifications_mark_all_read(user=request.user)
    if marked:
        messages.success(request, f"Marked {marked} notification{'s' if marked != 1 else ''} as read.")
    else:
        messages.success(request, "There were no unread notifications.")
    return _back(request)


def _back(request: HttpRequest) -> HttpResponse:
    """Back to the page the form was on (a path of this site only), else the notifications page."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    return redirect("notifications")


@require_safe
@login_required
def invoice_print(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """An invoice laid out for paper: the browser's "Print" (or "Save as PDF") gives the document."""
    invoice = invoice_get_for_user(user=request.user, invoice_id=invoice_id)
    lines = list(invoice_lines(invoice=invoice).select_related("project__tenant"))
    return render(request, "frontend/invoice_print.html", {"invoice": invoice_data(invoice, lines=lines)})


urlpatterns = [
    path("", home, name="home"),
    path("notifications/", notification_list, name="notifications"),
    path("notifications/read-all/", notification_read_all, name="notifications-read-all"),
    path("notifications/<int:notification_id>/read/", notification_read, name="notification-read"),
    path("billing/invoices/<int:invoice_id>/print/", invoice_print, name="invoice-print"),
]
