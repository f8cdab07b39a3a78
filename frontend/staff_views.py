"""Browser pages for the admins' workflows: the queue of quota requests (portal admins, and tenant admins for
their tenants) under /requests/, and, for portal admins only, under /staff/: an overview, allocations, rates,
Slurm drift reports and reconciliation reports.

The pages parse forms and call the same services as the API; the rules (who may decide, overlapping rates,
pools too small) stay in the services, whose errors are shown beside the field they concern or above the form.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_safe

from billing import rates as rate_services
from billing.models import Rate, ReconciliationKind, ReconciliationState
from billing.rates import RateBook, rate_priced_usage_count
from billing.reconciliation import (
    reconciliation_report_get_for_user,
    reconciliation_report_list_for_user,
    reconciliation_report_request,
)
from billing.selectors import rate_chain_priced_until_list, rate_currency_by_cluster, rate_get, rate_list
from clusters.models import Cluster, SlurmDriftKind
from clusters.selectors import cluster_list_active, slurm_drift_report_list
from portal.errors import Conflict
from quotas.models import QuotaRequestState
from quotas.requests import (
    QuotaRequestAction,
    quota_request_decide,
    quota_request_get_for_user,
    quota_request_list_for_user,
    quota_request_pending_to_decide_for_user,
    tenant_pool_list_for_user,
)
from quotas.selectors import allocation_get_for_user, allocation_list_for_user
from quotas.services import allocation_create, allocation_grant
from quotas.units import format_gpu_hours, gpu_hours_to_seconds
from tenants.models import TenantRole
from tenants.selectors import AnyUser, is_portal_admin, project_list_for_user, tenant_list_for_user

PAGE_SIZE = 25


# Shared helpers ----------------------------------------------------------------------------------------


def _require_portal_admin(user: AnyUser) -> None:
    if not is_portal_admin(user):
        raise PermissionDenied("The admin pages are for portal admins; ask one of the portal's admins.")


def _page(request: HttpRequest, items: QuerySet[Any] | list[Any]) -> Page[Any]:
    return Paginator(items, PAGE_SIZE).get_page(request.GET.get("page"))


def _query_without_page(request: HttpRequest) -> str:
    """The list's filters, to keep in its pagination links."""
    query = request.GET.copy()
    query.pop("page", None)
    return query.urlencode()


def _mark_errors(form: forms.Form) -> None:
    """Tie each field's error to its input for assistive technology (the error's id is <input id>-error)."""
    for name, field in form.fields.items():
        if name in form.errors:
            field.widget.attrs["aria-invalid"] = "true"
            described = f"{form[name].auto_id}-error"
            if field.help_text:
                described += f" {form[name].auto_id}_helptext"
            field.widget.attrs["aria-describedby"] = described


def _service_error(form: forms.Form, error: Exception, aliases: dict[str, str] | None = None) -> int:
    """Put a service's error beside its field (or above the form); the HTTP status to answer with."""
    if isinstance(error, ValidationError) and hasattr(error, "error_dict"):
        for field, problems in error.message_dict.items():
            field = (aliases or {}).get(field, field)
            for problem in problems:
                form.add_error(field if field in form.fields else None, problem)
        return 400
    form.add_error(None, str(error.messages[0] if isinstance(error, ValidationError) else error))
    return 409 if isinstance(error, Conflict) else 400


def _moment(text: str) -> datetime:
    """A date (its midnight UTC) or an ISO date-time (UTC when it names no offset)."""
    text = text.strip()
    if len(text) == 10:
        day = date.fromisoformat(text)
        return datetime(day.year, day.month, day.day, tzinfo=UTC)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    # In UTC: PostgreSQL refuses offsets past 15:59 that Python accepts.
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


class MomentField(forms.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault(
            "help_text", "A date (midnight UTC), e.g. 2026-12-01, or a date and time, e.g. 2026-12-01T08:00"
        )
        super().__init__(**kwargs)

    def clean(self, value: Any) -> datetime | None:
        text = super().clean(value)
        if not text:
            return None
        try:
            return _moment(text)
        except (ValueError, OverflowError):
            raise ValidationError("Give a date (2026-12-01) or a date and time (2026-12-01T08:00).") from None


def _choices(form: forms.Form, name: str, choices: list[tuple[str, str]]) -> None:
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    field.choices = choices


def _cluster_choices() -> list[tuple[str, str]]:
    return [(cluster.name, cluster.name) for cluster in cluster_list_active()]


def _cluster_named(name: str) -> Cluster:
    return cluster_list_active().get(name=name)  # the form offered only active clusters' names


# Quota requests: the decision queue ----------------------------------------------------------------------


def _administered_tenant_ids(user: AnyUser) -> set[int]:
    return {
        tenant.pk
        for tenant in tenant_list_for_user(user=user)
        if tenant.my_role == TenantRole.ADMIN  # type: ignore[attr-defined]  # annotated by the selector
    }


@require_safe
@login_required
def request_queue(request: HttpRequest) -> HttpResponse:
    """Pending requests the user may decide: all for portal admins, their tenants' for tenant admins."""
    user = request.user
    if not is_portal_admin(user) and not _administered_tenant_ids(user):
        raise PermissionDenied(
            "Quota requests are decided by tenant admins and portal admins; ask yours to decide your request."
        )
    # The same selector as the navigation's count, so the badge and the list agree.
    pending = quota_request_pending_to_decide_for_user(user=user)
    context = {"page": _page(request, pending), "query": _query_without_page(request)}
    return render(request, "frontend/staff/requests.html", context)


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("full", "Approve in full"), ("part", "Approve in part"), ("deny", "Deny")],
        widget=forms.RadioSelect,
        error_messages={"required": "Choose to approve in full, approve in part or deny."},
    )
    gpu_hours = forms.DecimalField(
        label="GPU-hours to approve",
        required=False,
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        help_text="Only when approving in part: fewer than requested.",
    )
    reason = forms.CharField(
        label="Reason",
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Required when denying; the requester reads it.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("decision") == "part" and data.get("gpu_hours") is None and "gpu_hours" not in self.errors:
            self.add_error("gpu_hours", "Give the GPU-hours to approve in part, e.g. 5.")
        return data


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def request_decide(request: HttpRequest, request_id: int) -> HttpResponse:
    """One request with its allocation's gauge and the requester's justification, and the decision form."""
    user = request.user
    quota_request = quota_request_get_for_user(user=user, request_id=request_id, action=QuotaRequestAction.DECIDE)
    form = DecisionForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            decision = form.cleaned_data["decision"]
            hours: Decimal | None = None
            if decision == "full":
                hours = Decimal(quota_request.requested_gpu_seconds) / 3600
            elif decision == "part":
                hours = form.cleaned_data["gpu_hours"]
            try:
                assert isinstance(user, User)
                decided = quota_request_decide(
                    actor=user, request=quota_request, approve_gpu_hours=hours, reason=form.cleaned_data["reason"]
                )
            except (ValidationError, Conflict) as error:
                status = _service_error(form, error, aliases={"approve_gpu_hours": "gpu_hours"})
            else:
                messages.success(request, _decided_message(decided))
                return redirect("request-queue")
        else:
            status = 400
        _mark_errors(form)
    allocation = quota_request.allocation
    pools = None
    if not is_portal_admin(user):
        pools = tenant_pool_list_for_user(user=user).filter(
            tenant=allocation.project.tenant, cluster=allocation.cluster
        )
    context = {
        "quota_request": quota_request,
        "allocation": allocation,
        "pending": quota_request.state == QuotaRequestState.PENDING,
        "form": form,
        "pools": pools,
    }
    return render(request, "frontend/staff/request_detail.html", context, status=status)


def _decided_message(decided: Any) -> str:
    requested = format_gpu_hours(decided.requested_gpu_seconds)
    project = decided.allocation.project
    who = decided.requested_by.get_username()
    if decided.state == QuotaRequestState.DENIED:
        return f"Request {decided.pk} denied; {who} has been told why."
    granted = format_gpu_hours(decided.granted_gpu_seconds)
    how = "in part" if decided.state == QuotaRequestState.PARTIALLY_APPROVED else "in full"
    return (
        f"Request {decided.pk} approved {how}: {granted} of {requested} GPU-hours granted to {project}; "
        f"{who} has been told."
    )


# Overview ----------------------------------------------------------------------------------------------


@require_safe
@login_required
def overview(request: HttpRequest) -> HttpResponse:
    user = request.user
    _require_portal_admin(user)
    context = {
        "pending_count": quota_request_list_for_user(user=user).filter(state=QuotaRequestState.PENDING).count(),
        "clusters": list(cluster_list_active()),
        "drift": slurm_drift_report_list().first(),
        "reconciliation": reconciliation_report_list_for_user(user=user).defer(None).first(),
    }
    return render(request, "frontend/staff/overview.html", context)


# Allocations -------------------------------------------------------------------------------------------


def _check_gpu_type(form: forms.Form, data: dict[str, Any]) -> None:
    """A GPU type the chosen cluster offers, named beside the field when it does not."""
    if not (data.get("cluster") and data.get("gpu_type")):
        return
    cluster = _cluster_named(data["cluster"])
    offered = [gpu.name for gpu in cluster.gpu_types.order_by("name")]
    if data["gpu_type"] not in offered:
        form.add_error(
            "gpu_type",
            f"Cluster '{cluster.name}' has no GPUs of type '{data['gpu_type']}'; it has: "
            f"{', '.join(offered) or 'none synced yet'}.",
        )


class AllocationCreateForm(forms.Form):
    project = forms.ChoiceField(label="Project")
    cluster = forms.ChoiceField(label="Cluster")
    gpu_type = forms.CharField(
        label="GPU type",
        required=False,
        max_length=64,
        help_text="Empty: GPUs of any type on the cluster.",
        widget=forms.TextInput(attrs={"list": "gpu-type-names"}),
    )
    gpu_hours = forms.DecimalField(label="GPU-hours", max_digits=12, decimal_places=2, min_value=0)
    starts_on = forms.DateField(label="Starts on", widget=forms.DateInput(attrs={"type": "date"}))
    ends_on = forms.DateField(
        label="Ends on", widget=forms.DateInput(attrs={"type": "date"}), help_text="The last day (inclusive)."
    )
    note = forms.CharField(label="Note", required=False, max_length=500)

    def __init__(self, *args: Any, user: AnyUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        projects = project_list_for_user(user=user)
        self.projects = {f"{project.tenant.slug}/{project.slug}": project for project in projects}
        _choices(self, "project", [("", "Choose a project")] + [(label, label) for label in self.projects])
        _choices(self, "cluster", [("", "Choose a cluster"), *_cluster_choices()])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        _check_gpu_type(self, data)
        if data.get("starts_on") and data.get("ends_on") and data["ends_on"] < data["starts_on"]:
            self.add_error("ends_on", "The period must end on or after the day it starts.")
        return data


class AllocationGrantForm(forms.Form):
    gpu_hours = forms.DecimalField(
        label="GPU-hours to add",
        max_digits=12,
        decimal_places=2,
        help_text="Negative takes unused hours back.",
    )
    note = forms.CharField(label="Note", max_length=500, help_text="Why: kept in the ledger and the audit log.")

    def clean_gpu_hours(self) -> Decimal:
        hours: Decimal = self.cleaned_data["gpu_hours"]
        if gpu_hours_to_seconds(hours) == 0:
            raise ValidationError("Give a number of GPU-hours other than 0.")
        return hours


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def allocations(request: HttpRequest) -> HttpResponse:
    """Allocations with filters, and the form that creates one."""
    user = request.user
    _require_portal_admin(user)
    form = AllocationCreateForm(request.POST or None, user=user)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                created = allocation_create(
                    actor=user,
                    project=form.projects[data["project"]],
                    cluster=_cluster_named(data["cluster"]),
                    gpu_hours=data["gpu_hours"],
                    gpu_type=data["gpu_type"],
                    starts_on=data["starts_on"],
                    ends_on=data["ends_on"],
                    note=data["note"],
                )
            except (ValidationError, Conflict) as error:
                status = _service_error(form, error)
            else:
                messages.success(
                    request,
                    f"Allocation created: {format_gpu_hours(created.granted_gpu_seconds)} GPU-hours for "
                    f"{created.project} on {created.cluster.name} from {created.starts_on} to {created.ends_on}.",
                )
                return redirect("staff-allocations")
        else:
            status = 400
        _mark_errors(form)

    found = allocation_list_for_user(user=user)
    tenant = request.GET.get("tenant", "")
    cluster = request.GET.get("cluster", "")
    current = request.GET.get("current", "")
    if tenant:
        found = found.filter(project__tenant__slug=tenant)
    if cluster:
        found = found.filter(cluster__name=cluster)
    if current in {"yes", "no"}:
        today = timezone.now().date()
        open_now = {"starts_on__lte": today, "ends_on__gte": today}
        found = found.filter(**open_now) if current == "yes" else found.exclude(**open_now)
    gpu_type_names = sorted({gpu.name for one in cluster_list_active() for gpu in one.gpu_types.all()})
    context = {
        "page": _page(request, found),
        "query": _query_without_page(request),
        "form": form,
        "tenants": [one.slug for one in tenant_list_for_user(user=user)],
        "clusters": [name for name, _ in _cluster_choices()],
        "filters": {"tenant": tenant, "cluster": cluster, "current": current},
        "filtered": bool(tenant or cluster or current),
        "gpu_type_names": gpu_type_names,
        "today": timezone.now().date(),
    }
    return render(request, "frontend/staff/allocations.html", context, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def allocation_grant_page(request: HttpRequest, allocation_id: int) -> HttpResponse:
    """One allocation's gauge and the form that adds GPU-hours to it (or takes unused ones back)."""
    user = request.user
    _require_portal_admin(user)
    allocation = allocation_get_for_user(user=user, allocation_id=allocation_id)
    form = AllocationGrantForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            seconds = gpu_hours_to_seconds(form.cleaned_data["gpu_hours"])
            try:
                updated = allocation_grant(
                    actor=user, allocation=allocation, gpu_seconds=seconds, note=form.cleaned_data["note"]
                )
            except (ValidationError, Conflict) as error:
                status = _service_error(form, error)
            else:
                verb = "added to" if seconds > 0 else "taken back from"
                messages.success(
                    request,
                    f"{format_gpu_hours(abs(seconds))} GPU-hours {verb} {updated.project} on {updated.cluster.name}; "
                    f"{format_gpu_hours(updated.granted_gpu_seconds)} granted now.",
                )
                return redirect("staff-allocations")
        else:
            status = 400
        _mark_errors(form)
    return render(
        request, "frontend/staff/allocation_grant.html", {"allocation": allocation, "form": form}, status=status
    )


# Rates -------------------------------------------------------------------------------------------------


# The rule of billing.rates, shown on the forms that set a rate's start.
PRICED_USAGE_RULE = (
    "A new rate never changes past charges: it may not start before the end of the usage already priced for its "
    "cluster and GPU type (listed on the rates page)."
)


class RateEditForm(forms.Form):
    # A number input with the model's 4 decimals and no negatives; text typed past the browser is refused by name.
    price_per_gpu_hour = forms.DecimalField(
        label="Price per GPU-hour",
        max_digits=12,
        decimal_places=4,
        min_value=0,
        widget=forms.NumberInput(attrs={"inputmode": "decimal"}),
        help_text="In the cluster's currency, with up to 4 decimals, e.g. 2.50.",
        error_messages={
            "required": "Give the price of one GPU-hour, e.g. 2.50.",
            "invalid": "Give the price as a number, e.g. 2.50: digits and a decimal point only, no currency or words.",
            "max_decimal_places": "Give at most 4 decimals, e.g. 2.1250.",
            "max_digits": "Give a price under 100000000, with at most 4 decimals.",
            "max_whole_digits": "Give a price under 100000000.",
            "min_value": "A price cannot be negative; 0 makes the GPU-hours free.",
        },
    )
    currency = forms.RegexField(
        label="Currency",
        regex=r"^[A-Za-z]{3}$",
        max_length=3,
        error_messages={"invalid": "Give an ISO 4217 code, e.g. EUR."},
        help_text="A cluster prices in one currency.",
    )
    valid_from = MomentField(
        label="Valid from",
        help_text="A date (midnight UTC), e.g. 2026-12-01, or a date and time, e.g. 2026-12-01T08:00. "
        + PRICED_USAGE_RULE,
    )
    note = forms.CharField(label="Note", required=False, max_length=300)


class RateCreateForm(RateEditForm):
    cluster = forms.ChoiceField(label="Cluster")
    gpu_type = forms.CharField(
        label="GPU type", required=False, max_length=64, help_text="Empty: every GPU type without a rate of its own."
    )
    field_order = ["cluster", "gpu_type", "price_per_gpu_hour", "currency", "valid_from", "note"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "cluster", [("", "Choose a cluster"), *_cluster_choices()])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        _check_gpu_type(self, data)
        return data


def _rate_rows(rates: list[Rate]) -> list[dict[str, Any]]:
    now = timezone.now()
    book = RateBook.for_clusters({rate.cluster_id for rate in rates})
    in_force = set()
    for cluster_id, gpu_type in {(rate.cluster_id, rate.gpu_type) for rate in rates}:
        found = book.in_force(cluster_id=cluster_id, gpu_type=gpu_type, at=now)
        if found is not None:
            in_force.add(found.pk)
    return [{"rate": rate, "in_force": rate.pk in in_force, "used": rate_priced_usage_count(rate)} for rate in rates]


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def rates(request: HttpRequest) -> HttpResponse:
    """Rates per cluster and GPU type, the one in force now marked, and the form that sets a new price."""
    user = request.user
    _require_portal_admin(user)
    form = RateCreateForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                created = rate_services.rate_create(
                    actor=user,
                    cluster=_cluster_named(data["cluster"]),
                    gpu_type=data["gpu_type"],
                    price_per_gpu_hour=data["price_per_gpu_hour"],
                    currency=data["currency"],
                    valid_from=data["valid_from"],
                    note=data["note"],
                )
            except (ValidationError, Conflict) as error:
                status = _service_error(form, error)
            else:
                messages.success(request, f"Rate set: {created}.")
                return redirect("staff-rates")
        else:
            status = 400
        _mark_errors(form)
    page = _page(request, rate_list())
    context = {
        "page": page,
        "rows": _rate_rows(list(page)),
        "form": form,
        "query": _query_without_page(request),
        "priced_until": rate_chain_priced_until_list(),
        "currencies": sorted(rate_currency_by_cluster().items()),
    }
    return render(request, "frontend/staff/rates.html", context, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def rate_edit(request: HttpRequest, rate_id: int) -> HttpResponse:
    """Correct a rate that has priced nothing yet; a used rate says why it is locked."""
    user = request.user
    _require_portal_admin(user)
    rate = rate_get(rate_id=rate_id)
    initial = {
        "price_per_gpu_hour": rate.price_per_gpu_hour,
        "currency": rate.currency,
        "valid_from": rate.valid_from.astimezone(UTC).strftime("%Y-%m-%dT%H:%M"),
        "note": rate.note,
    }
    form = RateEditForm(request.POST or None, initial=initial)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                rate_services.rate_update(actor=user, rate=rate, changes=dict(form.cleaned_data))
            except (ValidationError, Conflict) as error:
                status = _service_error(form, error)
            else:
                messages.success(request, f"Rate {rate.pk} changed.")
                return redirect("staff-rates")
        else:
            status = 400
        _mark_errors(form)
    return _rate_page(request, rate, form, status)


def _rate_page(request: HttpRequest, rate: Rate, form: RateEditForm, status: int, problem: str = "") -> HttpResponse:
    context = {"rate": rate, "form": form, "used": rate_priced_usage_count(rate), "problem": problem}
    return render(request, "frontend/staff/rate_edit.html", context, status=status)


@require_http_methods(["POST"])
@login_required
def rate_delete(request: HttpRequest, rate_id: int) -> HttpResponse:
    user = request.user
    _require_portal_admin(user)
    rate = rate_get(rate_id=rate_id)
    described = str(rate)
    try:
        rate_services.rate_delete(actor=user, rate=rate)
    except Conflict as error:
        return _rate_page(request, rate, RateEditForm(), 409, problem=str(error))
    messages.success(request, f"Rate removed: {described}.")
    return redirect("staff-rates")


# Clusters and drift ------------------------------------------------------------------------------------


@require_safe
@login_required
def drift_reports(request: HttpRequest) -> HttpResponse:
    """Slurm drift reports, latest first, each with its findings."""
    _require_portal_admin(request.user)
    cluster = request.GET.get("cluster", "")
    page = _page(request, slurm_drift_report_list(cluster_name=cluster or None))
    context = {
        "page": page,
        "query": _query_without_page(request),
        "cluster": cluster,
        "clusters": [name for name, _ in _cluster_choices()],
        "kinds": dict(SlurmDriftKind.choices),
    }
    return render(request, "frontend/staff/drift.html", context)


# Reconciliation ----------------------------------------------------------------------------------------


class ReconciliationForm(forms.Form):
    cluster = forms.ChoiceField(label="Cluster")
    start = MomentField(label="Start")
    end = MomentField(
        label="End",
        required=False,
        help_text="Exclusive, at most 92 days after the start, not in the future; empty means now. "
        "A month is e.g. 2026-05-01 to 2026-06-01.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "cluster", [("", "Choose a cluster"), *_cluster_choices()])


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def reconciliation_reports(request: HttpRequest) -> HttpResponse:
    """Reconciliation reports, newest first, and the form that asks a worker for a new one."""
    user = request.user
    _require_portal_admin(user)
    form = ReconciliationForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                report = reconciliation_report_request(
                    actor=user,
                    cluster=_cluster_named(data["cluster"]),
                    period_start=data["start"],
                    period_end=data["end"] or timezone.now(),
                )
            except (ValidationError, Conflict) as error:
                status = _service_error(form, error)
            else:
                messages.success(
                    request,
                    f"Report {report.pk} requested: a worker compares the cluster's usage with Slurm's accounting; "
                    "reload this page in a minute.",
                )
                return redirect("staff-reconciliation")
        else:
            status = 400
        _mark_errors(form)
    page = _page(request, reconciliation_report_list_for_user(user=user))
    context = {"page": page, "query": _query_without_page(request), "form": form}
    return render(request, "frontend/staff/reconciliation.html", context, status=status)


@require_safe
@login_required
def reconciliation_report(request: HttpRequest, report_id: int) -> HttpResponse:
    """One report's summary and its findings, a page at a time (optionally one kind)."""
    report = reconciliation_report_get_for_user(user=request.user, report_id=report_id)
    kind = request.GET.get("kind", "")
    findings = [finding for finding in report.findings if not kind or finding["kind"] == kind]
    context = {
        "report": report,
        "done": report.state == ReconciliationState.DONE,
        "summary": report.summary,
        "kinds": ReconciliationKind.choices,
        "kind_labels": dict(ReconciliationKind.choices),
        "kind": kind,
        "page": _page(request, findings),
        "query": _query_without_page(request),
    }
    return render(request, "frontend/staff/reconciliation_detail.html", context)


urlpatterns = [
    path("requests/", request_queue, name="request-queue"),
    path("requests/<int:request_id>/", request_decide, name="request-decide"),
    path("staff/", overview, name="staff"),
    path("staff/allocations/", allocations, name="staff-allocations"),
    path("staff/allocations/<int:allocation_id>/grant/", allocation_grant_page, name="staff-allocation-grant"),
    path("staff/rates/", rates, name="staff-rates"),
    path("staff/rates/<int:rate_id>/", rate_edit, name="staff-rate"),
    path("staff/rates/<int:rate_id>/delete/", rate_delete, name="staff-rate-delete"),
    path("staff/drift/", drift_reports, name="staff-drift"),
    path("staff/reconciliation/", reconciliation_reports, name="staff-reconciliation"),
    path("staff/reconciliation/<int:report_id>/", reconciliation_report, name="staff-reconciliation-report"),
]
