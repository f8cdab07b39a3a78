"""Spend over time: a tenant's or project's amounts per day, and the projects and users that spent most in a
period, each summed in SQL over usage shares (one share is a job's part of one UTC day at one rate) per invoice
line, then rounded by billing.money's one rule, so that spend says to the cent what the invoices say.

Spend is counted on the day the GPUs were used, whichever invoice carries it (late usage included). Amounts
are per currency: a period whose usage is priced in several currencies is shown one currency at a time.
Who may read it: a tenant's spend its admins and portal admins; a project's spend its managers as well.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Case, CharField, F, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce

from billing.models import UsageDaily, first_of_month
from billing.selectors import usage_amount, usage_per_line
from tenants.models import Project, Tenant
from tenants.selectors import (
    AnyUser,
    ProjectAction,
    TenantAction,
    is_portal_admin,
    project_get_by_label_for_user,
    tenant_get_for_user,
)

MAX_PERIOD_DAYS = 366
TOP_LIMIT_MAX = 100


class SpendScopeKind(enum.Enum):
    ALL = "all"
    TENANT = "tenant"
    PROJECT = "project"


@dataclass(frozen=True)
class SpendScope:
    """Whose usage is summed: every tenant's (portal admins), one tenant's, or one project's."""

    tenant: Tenant | None = None
    project: Project | None = None

    @property
    def kind(self) -> SpendScopeKind:
        if self.project is not None:
            return SpendScopeKind.PROJECT
        return SpendScopeKind.TENANT if self.tenant is not None else SpendScopeKind.ALL

    @property
    def name(self) -> str:
        if self.project is not None:
            return f"{self.project.tenant.slug}/{self.project.slug}"
        return self.tenant.slug if self.tenant is not None else ""

    def shares(self, *, start: date, end: date) -> QuerySet[UsageDaily]:
        """The daily sums of the usage shares of [start, end] (billing.models.UsageDaily): a row per day, line
        and user, so a year is read in a few thousand rows however many jobs ran."""
        shares = UsageDaily.objects.filter(day__gte=start, day__lte=end)
        if self.project is not None:
            return shares.filter(project=self.project)
        return shares.filter(tenant=self.tenant) if self.tenant is not None else shares


def spend_scope_for_user(
    *, user: AnyUser, tenant: str | None = None, project: str | None = None, all_allowed: bool = False
) -> SpendScope:
    """The scope the user asked for, if they may read its spend: 404 for outsiders, 403 for a role too low.

    `all_allowed`: no tenant and no project means every tenant (for portal admins only).
    """
    if tenant and project:
        raise ValidationError({"project": ["Give either tenant or project, not both: a project names its tenant."]})
    if project:
        return SpendScope(project=project_get_by_label_for_user(user=user, label=project, action=ProjectAction.MANAGE))
    if tenant:
        return SpendScope(tenant=tenant_get_for_user(user=user, slug=tenant, action=TenantAction.MANAGE))
    if not all_allowed:
        raise ValidationError({"tenant": ["Give tenant=<slug> or project=<tenant/project>."]})
    if not is_portal_admin(user):
        raise PermissionDenied(
            "Spend across all tenants is for portal admins; give tenant=<slug> for a tenant you administer."
        )
    return SpendScope()


def spend_period(*, start: date | None, end: date | None, today: date) -> tuple[date, date]:
    """The days asked for, both included; by default the current month so far."""
    end = end or (today if start is None or start <= today else start)
    start = start or first_of_month(end)
    if end < start:
        raise ValidationError({"end": [f"The period ends ({end}) before it starts ({start}); swap the dates."]})
    days = (end - start).days + 1
    if days > MAX_PERIOD_DAYS:
        raise ValidationError(
            {"end": [f"The period has {days} days; ask for at most {MAX_PERIOD_DAYS} at a time (e.g. one year)."]}
        )
    return start, end


def currency_chosen(*, found: set[str], asked: str | None, scope: SpendScope) -> str | None:
    """The currency to show: the one asked for, else the only one the usage has (None when there is no usage)."""
    if asked:
        return asked.upper()
    if len(found) > 1:
        whose = f"{scope.kind.value} {scope.name}" if scope.name else "all tenants"
        choices = " or ".join(f"currency={currency}" for currency in sorted(found))
        raise ValidationError(
            {
                "currency": [
                    f"The usage of {whose} in this period is priced in {', '.join(sorted(found))}; "
                    f"add {choices} to see one currency at a time."
                ]
            }
        )
    return next(iter(found), None)


@dataclass(frozen=True)
class DaySpend:
    day: date
    amount: Decimal
    gpu_seconds: int


@dataclass(frozen=True)
class ProjectSpend:
    project: str  # tenant/project
    amount: Decimal
    gpu_seconds: int


@dataclass(frozen=True)
class DailySpend:
    scope: SpendScope
    start: date
    end: date
    currency: str | None
    total: Decimal
    gpu_seconds: int
    days: list[DaySpend]  # every day of the period, zeros included
    projects: list[ProjectSpend] | None  # for a tenant (or every tenant), most spent first


def spend_daily(*, scope: SpendScope, start: date, end: date, currency: str | None = None) -> DailySpend:
    """Spend per day of [start, end], and per project for a tenant: two queries, whatever the period's length.

    Every amount follows billing.money's rule (each invoice line's cost rounded once, then summed): the total of a
    month equals its invoices' totals, and the projects add up to it; a day's amount may differ by a cent from its
    share of the total, as it is what an invoice for that day alone would say.
    """
    shares = scope.shares(start=start, end=end)
    rows = list(usage_per_line(shares, "day"))
    chosen = currency_chosen(found={row["currency"] for row in rows}, asked=currency, scope=scope)
    rows = [row for row in rows if row["currency"] == chosen]
    by_day: dict[date, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_day[row["day"]].append(row)
    days = []
    for offset in range((end - start).days + 1):
        day = start + timedelta(days=offset)
        day_rows = by_day.get(day, [])
        days.append(
            DaySpend(
                day=day, amount=usage_amount(day_rows, chosen), gpu_seconds=sum(row["seconds"] for row in day_rows)
            )
        )
    projects = None
    if scope.kind is not SpendScopeKind.PROJECT:
        by_project: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in usage_per_line(shares.filter(currency=chosen or ""), "project__tenant__slug", "project__slug"):
            by_project[f"{row['project__tenant__slug']}/{row['project__slug']}"].append(row)
        projects = sorted(
            (
                ProjectSpend(
                    project=project,
                    amount=usage_amount(project_rows, chosen),
                    gpu_seconds=sum(row["seconds"] for row in project_rows),
                )
                for project, project_rows in by_project.items()
            ),
            key=lambda row: (-row.amount, row.project),
        )
    return DailySpend(
        scope=scope,
        start=start,
        end=end,
        currency=chosen,
        total=usage_amount(rows, chosen),
        gpu_seconds=sum(row["seconds"] for row in rows),
        days=days,
        projects=projects,
    )


class SpendTopBy(enum.Enum):
    PROJECT = "project"
    USER = "user"


@dataclass(frozen=True)
class TopSpender:
    name: str  # tenant/project, or a username (a portal user's, else the POSIX user of an external job)
    portal_user: bool  # by user: False for an external job's POSIX user that no portal account maps to
    amount: Decimal
    gpu_seconds: int
    jobs: int


@dataclass(frozen=True)
class TopSpend:
    scope: SpendScope
    start: date
    end: date
    by: SpendTopBy
    currency: str | None
    spenders: list[TopSpender]


def spend_top(
    *, scope: SpendScope, start: date, end: date, by: SpendTopBy, limit: int, currency: str | None = None
) -> TopSpend:
    """The projects or users that spent most in [start, end], most first: two queries over the daily sums
    (amounts per invoice line, then jobs per spender, as a job's usage may go on several lines: those begun in
    the period and those carried into its first day)."""
    shares = scope.shares(start=start, end=end)
    if by is SpendTopBy.PROJECT:
        spender: tuple[str, ...] = ("project__tenant__slug", "project__slug")
    else:
        # Usage without a portal user (external jobs) is grouped by the POSIX user it ran as.
        posix_user = Case(
            When(user__isnull=True, then=F("cluster_username")), default=Value(""), output_field=CharField()
        )
        shares = shares.annotate(posix_user=posix_user)
        spender = ("user_id", "user__username", "posix_user")
    rows = list(usage_per_line(shares, *spender))
    chosen = currency_chosen(found={row["currency"] for row in rows}, asked=currency, scope=scope)
    by_spender: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["currency"] == chosen:
            by_spender[tuple(row[field] for field in spender)].append(row)
    jobs = {
        tuple(row[field] for field in spender): row["jobs"]
        for row in shares.filter(currency=chosen or "")
        .values(*spender)
        .annotate(jobs=Sum("jobs") + Coalesce(Sum("carried_jobs", filter=Q(day=start)), 0))
        .order_by()
    }
    spenders = []
    for key, spender_rows in by_spender.items():
        if by is SpendTopBy.PROJECT:
            name, portal_user = f"{key[0]}/{key[1]}", False
        else:
            name, portal_user = key[1] or key[2], key[0] is not None
        spenders.append(
            TopSpender(
                name=name,
                portal_user=portal_user,
                amount=usage_amount(spender_rows, chosen),
                gpu_seconds=sum(row["seconds"] for row in spender_rows),
                jobs=jobs.get(key, 0),
            )
        )
    spenders.sort(key=lambda row: (-row.amount, row.name))
    return TopSpend(scope=scope, start=start, end=end, by=by, currency=chosen, spenders=spenders[:limit])
