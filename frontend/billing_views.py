"""Browser pages for billing: spend per day, per project and per user for a tenant or project, the tenant's
invoices, and one invoice with its lines and its CSV and printable downloads.

Who sees what follows the spend API exactly (billing.spend.spend_scope_for_user): a tenant's spend its admins
and portal admins, a project's spend its managers as well; members get 403 and outsiders 404. Invoices follow
billing.selectors.invoice_get_for_user: a tenant's admins and portal admins, 404 for everyone else.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_safe

from billing.apis import invoice_data
from billing.efficiency import efficiency_report
from billing.money import minor_unit_places
from billing.selectors import invoice_get_for_user, invoice_lines, invoice_list_for_user, rate_list
from billing.spend import (
    DailySpend,
    SpendScope,
    SpendScopeKind,
    SpendTopBy,
    TopSpend,
    spend_daily,
    spend_scope_for_user,
    spend_top,
)
from quotas.units import gpu_seconds_to_hours
from tenants.models import ProjectRole, TenantRole
from tenants.selectors import AnyUser, is_portal_admin, project_list_for_user, tenant_list_for_user

PAGE_SIZE = 25
TOP_USERS = 10


@dataclass(frozen=True)
class ScopeOption:
    """One entry of the tenant/project select: a tenant's slug, or a project's 'tenant/project'."""

    value: str
    label: str


def _scope_options(user: AnyUser) -> list[ScopeOption]:
    """The tenants whose spend the user may read, then the projects they manage outside those tenants."""
    portal_admin = is_portal_admin(user)
    options = []
    administered: set[int] = set()
    for tenant in tenant_list_for_user(user=user):
        if portal_admin or tenant.my_role == TenantRole.ADMIN:  # type: ignore[attr-defined]  # annotated
            administered.add(tenant.pk)
            options.append(ScopeOption(tenant.slug, f"Tenant {tenant.slug} (all its projects)"))
    for project in project_list_for_user(user=user):
        if project.tenant_id in administered or project.my_role != ProjectRole.MANAGER:  # type: ignore[attr-defined]
            continue
        label = f"{project.tenant.slug}/{project.slug}"
        options.append(ScopeOption(label, f"Project {label}"))
    return options


def _chosen(request: HttpRequest, options: list[ScopeOption], *, nobody: str) -> str:
    """The scope named in the query, else the first the user may read; 403 with `nobody` when there is none."""
    chosen = request.GET.get("scope", "").strip()
    if chosen:
        return chosen
    if not options:
        raise PermissionDenied(nobody)
    return options[0].value


def _scope_for(user: AnyUser, value: str) -> SpendScope:
    """The scope named in the select, with the API's rules: 404 for outsiders, 403 for a role too low."""
    try:
        if "/" in value:
            return spend_scope_for_user(user=user, project=value)
        return spend_scope_for_user(user=user, tenant=value)
    except ValidationError:
        # A malformed name names nothing the user can see.
        raise Http404(f"No tenant or project '{value}' exists among the ones you can see.") from None


def _month(text: str, today: date) -> tuple[date, str | None]:
    """The first day of the month asked for (YYYY-MM), else this month with the reason why."""
    this_month = today.replace(day=1)
    if not text:
        return this_month, None
    try:
        month = date.fromisoformat(f"{text}-01")
    except ValueError:
        return this_month, f"'{text}' is not a month; pick one as YYYY-MM, e.g. {this_month:%Y-%m}."
    if month > this_month:
        return this_month, f"{month:%B %Y} has not begun yet; showing {this_month:%B %Y}."
    return month, None


def _unix(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())


def _percent(amount: Decimal, largest: Decimal) -> str:
    """A bar's length as an SVG width (0..100)."""
    if largest <= 0:
        return "0"
    return f"{amount * 100 / largest:.2f}"


def _day_chart(spend: DailySpend) -> dict[str, Any]:
    # Floats only for drawing: the amounts are already rounded by billing.money, and the table beside the chart
    # shows them exactly; `places` only pads the tooltip (0 for JPY, 2 for EUR).
    return {
        "kind": "bars",
        "x": [_unix(day.day) for day in spend.days],
        "unit": spend.currency or "",
        "quantity": "Spend per day",
        "places": minor_unit_places(spend.currency or ""),
        "series": [
            {"label": f"Spend ({spend.currency or 'no usage'})", "values": [float(d.amount) for d in spend.days]}
        ],
    }


def _project_rows(spend: DailySpend) -> list[dict[str, Any]]:
    projects = spend.projects or []
    largest = max((row.amount for row in projects), default=Decimal(0))
    return [
        {
            "project": row.project,
            "amount": row.amount,
            "gpu_hours": gpu_seconds_to_hours(row.gpu_seconds),
            "width": _percent(row.amount, largest),
        }
        for row in projects
    ]


def _user_rows(top: TopSpend) -> list[dict[str, Any]]:
    largest = max((row.amount for row in top.spenders), default=Decimal(0))
    return [
        {
            "name": row.name,
            "portal_user": row.portal_user,
            "amount": row.amount,
            "gpu_hours": gpu_seconds_to_hours(row.gpu_seconds),
            "jobs": row.jobs,
            "width": _percent(row.amount, largest),
        }
        for row in top.spenders
    ]


def _currencies() -> list[str]:
    return sorted(set(rate_list().order_by().values_list("currency", flat=True).distinct()))


@require_safe
@login_required
def billing_home(request: HttpRequest) -> HttpResponse:
    """Spend of the chosen tenant or project in a month (per day, per project, per user) and its invoices."""
    user = request.user
    options = _scope_options(user)
    chosen = _chosen(
        request,
        options,
        nobody="Billing shows spend to tenant admins and project managers; you are neither. "
        "Ask your tenant admin for the figures.",
    )
    scope = _scope_for(user, chosen)
    if chosen not in {option.value for option in options}:
        options.append(ScopeOption(chosen, chosen))  # e.g. a portal admin naming a project directly

    today = timezone.now().date()
    month, month_problem = _month(request.GET.get("month", "").strip(), today)
    last_day = date(month.year, month.month, calendar.monthrange(month.year, month.month)[1])
    end = min(last_day, today)
    currency = request.GET.get("currency", "").strip().upper() or None
    problems = [month_problem] if month_problem else []
    spend = top = None
    try:
        spend = spend_daily(scope=scope, start=month, end=end, currency=currency)
        top = spend_top(scope=scope, start=month, end=end, by=SpendTopBy.USER, limit=TOP_USERS, currency=currency)
    except ValidationError as error:
        problems.extend(message for messages in error.message_dict.values() for message in messages)

    invoices_page = None
    if scope.kind is SpendScopeKind.TENANT and scope.tenant is not None:
        invoices = invoice_list_for_user(user=user, tenant=scope.tenant.slug)
        invoices_page = Paginator(invoices, PAGE_SIZE).get_page(request.GET.get("page"))

    context = {
        "options": options,
        "chosen": chosen,
        "scope": scope,
        "is_tenant": scope.kind is SpendScopeKind.TENANT,
        "month": month,
        "month_value": f"{month:%Y-%m}",
        "this_month": month == today.replace(day=1),
        "start": month,
        "end": end,
        "currency": currency or "",
        "currencies": _currencies(),
        "problems": problems,
        "spend": spend,
        "spent": spend is not None and spend.gpu_seconds > 0,
        "gpu_hours": gpu_seconds_to_hours(spend.gpu_seconds) if spend else None,
        "day_chart": _day_chart(spend) if spend else None,
        "day_rows": [
            {"day": day.day, "gpu_hours": gpu_seconds_to_hours(day.gpu_seconds), "amount": day.amount}
            for day in (spend.days if spend else [])
            if day.gpu_seconds
        ],
        "project_rows": _project_rows(spend) if spend else [],
        "user_rows": _user_rows(top) if top else [],
        "invoices_page": invoices_page,
    }
    return render(request, "frontend/billing/home.html", context)


@require_safe
@login_required
def invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """One invoice with its lines, and its downloads: CSV (the API's) and the printable page."""
    invoice = invoice_get_for_user(user=request.user, invoice_id=invoice_id)
    lines = list(invoice_lines(invoice=invoice).select_related("project__tenant"))
    context = {
        "invoice": invoice_data(invoice, lines=lines),
        "print_url": reverse("invoice-print", kwargs={"invoice_id": invoice.pk}),
        # Beside the charges: what of them idled (whoever may read the invoice may read its tenant's report).
        "efficiency": efficiency_report(scope=SpendScope(tenant=invoice.tenant), month=invoice.month, worst=5),
        "efficiency_url": f"{reverse('billing-efficiency')}?scope={invoice.tenant.slug}&month={invoice.month:%Y-%m}",
    }
    return render(request, "frontend/billing/invoice.html", context)


ALL_TENANTS = "all"


@require_safe
@login_required
def efficiency_page(request: HttpRequest) -> HttpResponse:
    """A month's GPU efficiency of the chosen tenant or project, or of every tenant for portal admins: idle
    GPU-hours, their cost, per project (or tenant), the worst jobs, what ending idle jobs saved; and its CSV."""
    user = request.user
    options = _scope_options(user)
    if is_portal_admin(user):
        options.insert(0, ScopeOption(ALL_TENANTS, "Every tenant"))
    chosen = _chosen(
        request,
        options,
        nobody="The efficiency report is for tenant admins and project managers; you are neither. "
        "Each of your jobs shows its own GPU utilisation on its page.",
    )
    every = chosen == ALL_TENANTS
    scope = spend_scope_for_user(user=user, all_allowed=True) if every else _scope_for(user, chosen)
    today = timezone.now().date()
    month, month_problem = _month(request.GET.get("month", "").strip(), today)
    report = efficiency_report(scope=scope, month=month)
    csv_scope = {SpendScopeKind.PROJECT: "project", SpendScopeKind.TENANT: "tenant"}.get(scope.kind)
    csv_query = f"month={month:%Y-%m}" + (f"&{csv_scope}={scope.name}" if csv_scope else "")
    context = {
        "options": options,
        "chosen": chosen,
        "scope": scope,
        "month_value": f"{month:%Y-%m}",
        "month": month,
        "problems": [month_problem] if month_problem else [],
        "report": report,
        "group_label": "Tenant" if scope.kind is SpendScopeKind.ALL else "Project",
        "csv_url": f"{reverse('api-efficiency-csv')}?{csv_query}",
    }
    return render(request, "frontend/billing/efficiency.html", context)


urlpatterns = [
    path("billing/", billing_home, name="billing"),
    path("billing/invoices/<int:invoice_id>/", invoice_detail, name="billing-invoice"),
    path("billing/efficiency/", efficiency_page, name="billing-efficiency"),
]
