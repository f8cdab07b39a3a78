"""Browser pages of the spend overview: a period's spend grouped by tenant, project, cluster or GPU type with its
change against the period before, as a sortable table, a chart and a CSV of the same figures.

/staff/spend/ is every tenant's, for portal admins only (403 for everyone else, as every /staff/ page);
/billing/spend/ is one tenant's (or one project's), with the rules of the billing pages: a tenant's spend its
admins and portal admins, a project's its managers as well; members 403, outsiders 404. Both read one selector
(billing.spend_overview.spend_overview) with the scope applied in SQL, so no page can show another tenant's figures.
"""

from __future__ import annotations

import calendar
import csv
import io
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_safe

from billing.money import minor_unit_places
from billing.spend import SpendScope, SpendScopeKind, spend_period, spend_scope_for_user
from billing.spend_overview import SpendGroup, SpendGroupBy, SpendOverview, spend_overview
from frontend.billing_views import ScopeOption, _chosen, _currencies, _scope_for, _scope_options
from quotas.units import gpu_seconds_to_hours

CHART_GROUPS = 12  # the chart draws the largest groups; the table and the CSV hold them all

# Sort keys of the table: the column's name in the URL, and what it sorts by.
SORTS: dict[str, Any] = {
    "name": lambda group: group.name,
    "amount": lambda group: group.amount,
    "previous": lambda group: group.previous_amount,
    "change": lambda group: group.change,
    # A group new in this period (no previous spend) sorts above any percentage.
    "percent": lambda group: (group.change_percent is None, group.change_percent or Decimal(0)),
    "gpu_hours": lambda group: group.gpu_seconds,
}


@dataclass
class OverviewQuery:
    """What the page was asked for, read from the URL; `problems` says what was wrong with it."""

    start: date
    end: date
    month: str  # YYYY-MM when a month was picked, else ""
    custom: bool
    group_by: SpendGroupBy
    sort: str  # a key of SORTS, "-" first for descending
    currency: str | None
    problems: list[str] = field(default_factory=list)


def _parse_day(text: str, name: str, problems: list[str]) -> date | None:
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        problems.append(f"'{text}' is not a date for {name}; give it as YYYY-MM-DD, e.g. 2026-03-01.")
        return None


def _parse_month(text: str, today: date, problems: list[str]) -> tuple[date, date] | None:
    this_month = today.replace(day=1)
    try:
        month = date.fromisoformat(f"{text}-01")
    except ValueError:
        problems.append(f"'{text}' is not a month; pick one as YYYY-MM, e.g. {this_month:%Y-%m}.")
        return None
    if month > this_month:
        problems.append(f"{month:%B %Y} has not begun yet; pick {this_month:%B %Y} or an earlier month.")
        return None
    last_day = month.replace(day=calendar.monthrange(month.year, month.month)[1])
    return month, min(last_day, today)


def overview_query(request: HttpRequest, *, groupings: list[SpendGroupBy]) -> OverviewQuery:
    """The period (a month, or from/to; this month so far by default), grouping, sort and currency asked for."""
    today = timezone.now().date()
    problems: list[str] = []
    month_text = request.GET.get("month", "").strip()
    from_text, to_text = request.GET.get("from", "").strip(), request.GET.get("to", "").strip()
    custom = bool(from_text or to_text)
    start, end = spend_period(start=None, end=None, today=today)
    if custom:
        asked_start = _parse_day(from_text, "from", problems)
        asked_end = _parse_day(to_text, "to", problems)
        if not problems:
            try:
                start, end = spend_period(start=asked_start, end=asked_end, today=today)
            except ValidationError as error:
                problems.extend(message for messages in error.message_dict.values() for message in messages)
    elif month_text:
        month = _parse_month(month_text, today, problems)
        if month is not None:
            start, end = month
    group_text = request.GET.get("group", "").strip() or groupings[0].value
    group_by = next((grouping for grouping in groupings if grouping.value == group_text), None)
    if group_by is None:
        problems.append(f"'{group_text}' is not a grouping here; pick one of {', '.join(g.value for g in groupings)}.")
        group_by = groupings[0]
    sort = request.GET.get("sort", "").strip() or "-amount"
    if sort.removeprefix("-") not in SORTS:
        problems.append(f"'{sort}' is not a column to sort by; pick one of {', '.join(SORTS)} (- first: descending).")
        sort = "-amount"
    currency = request.GET.get("currency", "").strip().upper() or None
    return OverviewQuery(
        start=start,
        end=end,
        month="" if custom else f"{start:%Y-%m}",
        custom=custom,
        group_by=group_by,
        sort=sort,
        currency=currency,
        problems=problems,
    )


def sorted_groups(overview: SpendOverview, sort: str) -> list[SpendGroup]:
    """The groups in the order asked for; ties by name, so the order never depends on the database's."""
    key = SORTS[sort.removeprefix("-")]
    by_name = sorted(overview.groups, key=lambda group: group.name)
    return sorted(by_name, key=key, reverse=sort.startswith("-"))


def _percent_text(group: SpendGroup) -> str:
    percent = group.change_percent
    if percent is None:
        return "new" if group.amount else "no spend"
    return f"{percent:+}%"


def table_rows(groups: list[SpendGroup]) -> list[dict[str, Any]]:
    return [
        {
            "name": group.name,
            "gpu_hours": gpu_seconds_to_hours(group.gpu_seconds),
            "amount": group.amount,
            "previous_amount": group.previous_amount,
            "change": group.change,
            "percent": _percent_text(group),
        }
        for group in groups
    ]


CSV_HEADER = ["group", "gpu_hours", "amount", "previous_amount", "change", "change_percent", "currency"]


def overview_csv(overview: SpendOverview, groups: list[SpendGroup], filename: str) -> HttpResponse:
    """The table as CSV: its rows in its order, then its totals row, with the same figures the page shows."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["# period", f"{overview.start}", f"{overview.end}", "previous", f"{overview.previous_start}"])
    writer.writerow([f"# {overview.group_by.value}", *CSV_HEADER[1:]])
    for row in [*table_rows(groups), *table_rows([overview.total])]:
        writer.writerow(
            [
                row["name"],
                row["gpu_hours"],
                row["amount"],
                row["previous_amount"],
                row["change"],
                row["percent"],
                overview.currency or "",
            ]
        )
    response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _chart(overview: SpendOverview) -> dict[str, Any]:
    # Floats only for drawing: the table beside the chart shows the exact amounts.
    largest = overview.groups[:CHART_GROUPS]
    return {
        "labels": [group.name for group in largest],
        "unit": overview.currency or "",
        "places": minor_unit_places(overview.currency or ""),
        "series": [
            {"label": f"{overview.start} to {overview.end}", "values": [float(g.amount) for g in largest]},
            {
                "label": f"{overview.previous_start} to {overview.previous_end}",
                "values": [float(g.previous_amount) for g in largest],
            },
        ],
    }


def _render(
    request: HttpRequest,
    *,
    scope: SpendScope | None,
    groupings: list[SpendGroupBy],
    template: str,
    extra: dict[str, Any],
    filename_prefix: str,
) -> HttpResponse:
    query = overview_query(request, groupings=groupings)
    overview = None
    problems = list(query.problems)
    if scope is not None and not problems:
        try:
            overview = spend_overview(
                scope=scope, group_by=query.group_by, start=query.start, end=query.end, currency=query.currency
            )
        except ValidationError as error:
            problems.extend(message for messages in error.message_dict.values() for message in messages)
    groups = sorted_groups(overview, query.sort) if overview else []
    if overview is not None and request.GET.get("format") == "csv":
        return overview_csv(
            overview, groups, f"{filename_prefix}-{overview.group_by.value}-{overview.start}-{overview.end}.csv"
        )
    base_query = request.GET.copy()
    for name in ("sort", "format"):
        base_query.pop(name, None)
    csv_query = request.GET.copy()
    csv_query["format"] = "csv"
    context = {
        **extra,
        "query": query,
        "groupings": groupings,
        "problems": problems,
        "overview": overview,
        "rows": table_rows(groups),
        "total": table_rows([overview.total])[0] if overview else None,
        "chart": _chart(overview) if overview and overview.groups else None,
        "chart_groups": CHART_GROUPS,
        "currencies": _currencies(),
        "sort_links": _sort_links(base_query.urlencode(), query.sort),
        "csv_url": f"{request.path}?{csv_query.urlencode()}",
    }
    return render(request, template, context, status=400 if problems else 200)


def _sort_links(base: str, sort: str) -> dict[str, dict[str, str]]:
    """Each column's link (descending first, ascending when it already sorts descending) and its aria-sort."""
    links = {}
    for column in SORTS:
        descending = sort == f"-{column}"
        ascending = sort == column
        target = column if descending else f"-{column}"
        if column == "name" and not ascending and not descending:
            target = column  # names read A to Z first
        links[column] = {
            "url": f"?{base}&sort={target}" if base else f"?sort={target}",
            "aria": "descending" if descending else "ascending" if ascending else "none",
        }
    return links


@require_safe
@login_required
def staff_spend(request: HttpRequest) -> HttpResponse:
    """Every tenant's spend of a period by tenant, project, cluster or GPU type, this period against the last."""
    # The same refusal (403) as the other /staff/ pages, from the selector's own rule.
    scope = spend_scope_for_user(user=request.user, all_allowed=True)
    return _render(
        request,
        scope=scope,
        groupings=list(SpendGroupBy),
        template="frontend/staff/spend.html",
        extra={"page_url": reverse("staff-spend")},
        filename_prefix="spend-all-tenants",
    )


def _tenant_groupings(scope: SpendScope) -> list[SpendGroupBy]:
    if scope.kind is SpendScopeKind.PROJECT:
        return [SpendGroupBy.CLUSTER, SpendGroupBy.GPU_TYPE]
    return [SpendGroupBy.PROJECT, SpendGroupBy.CLUSTER, SpendGroupBy.GPU_TYPE]


@require_safe
@login_required
def tenant_spend(request: HttpRequest) -> HttpResponse:
    """One tenant's (or project's) spend of a period by project, cluster or GPU type, this period against the last."""
    user = request.user
    options = _scope_options(user)
    chosen = _chosen(
        request,
        options,
        nobody="The spend overview is for tenant admins and project managers; you are neither. "
        "Ask your tenant admin for the figures.",
    )
    scope = _scope_for(user, chosen)
    if chosen not in {option.value for option in options}:
        options.append(ScopeOption(chosen, chosen))
    return _render(
        request,
        scope=scope,
        groupings=_tenant_groupings(scope),
        template="frontend/billing/spend.html",
        extra={"options": options, "chosen": chosen, "page_url": reverse("billing-spend")},
        filename_prefix=f"spend-{scope.name.replace('/', '-')}",
    )


urlpatterns = [
    path("staff/spend/", staff_spend, name="staff-spend"),
    path("billing/spend/", tenant_spend, name="billing-spend"),
]
