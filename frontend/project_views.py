"""Browser pages for projects and tenants: members and roles, allocations with their burn-down and projected
exhaustion, asking for more GPU-hours, and the user's API tokens.

Access goes through the selectors' `*_get_for_user` helpers only, so outsiders get the same 404 as for a name
that does not exist and roles that are too low get the 403 page naming the role needed, exactly as the API.
Writes are the services'; a form here only parses input types, and shows the services' errors beside fields.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from jobs.efficiency_policy import efficiency_policy_of, efficiency_policy_update, efficiency_policy_values
from jobs.selectors import job_template_list_for_user
from portal.errors import Conflict
from quotas.models import Allocation, QuotaRequestState
from quotas.requests import (
    QuotaRequestAction,
    quota_request_create,
    quota_request_get_for_user,
    quota_request_list_for_user,
    quota_request_problems,
    quota_request_withdraw,
)
from quotas.selectors import allocation_get_for_user, allocation_ledger, allocation_list_for_user
from quotas.units import SECONDS_PER_HOUR, format_gpu_hours, gpu_seconds_to_hours
from quotas.usage import UsageSeries, allocation_usage_series
from tenants import services
from tenants.invitations import (
    INVITATION_VALID_DAYS,
    InviteOutcome,
    invitation_get,
    invitation_list_open,
    invitation_withdraw,
    member_invite,
)
from tenants.models import Project, ProjectRole, Tenant, TenantRole
from tenants.selectors import (
    ProjectAction,
    TenantAction,
    is_portal_admin,
    project_get_for_user,
    project_list_for_user,
    project_membership_get,
    project_membership_list,
    project_role_of,
    tenant_get_for_user,
    tenant_list_for_user,
    tenant_membership_get,
    tenant_membership_list,
    tenant_role_of,
    token_get_for_user,
    token_list_for_user,
)

PAGE_SIZE = 25
Errors = dict[str, list[str]]


# Helpers -----------------------------------------------------------------------------------------------


def _page(request: HttpRequest, items: Any, parameter: str = "page") -> Page[Any]:
    """One page of 25, with the links to its neighbours keeping the other query parameters (other lists' pages)."""
    page = Paginator(items, PAGE_SIZE).get_page(request.GET.get(parameter))

    def link(number: int) -> str:
        query = request.GET.copy()
        query[parameter] = str(number)
        return f"?{query.urlencode()}"

    page.previous_link = link(page.previous_page_number()) if page.has_previous() else ""  # type: ignore[attr-defined]
    page.next_link = link(page.next_page_number()) if page.has_next() else ""  # type: ignore[attr-defined]
    return page


def _user(request: HttpRequest) -> User:
    # login_required ran first: the user is a real one.
    assert isinstance(request.user, User)
    return request.user


def _may(check: Any) -> bool:
    """Whether an access helper lets the user through (the pages offer only the forms that would succeed)."""
    try:
        check()
    except (PermissionDenied, Http404):
        return False
    return True


# Errors that concern no one field are kept under "form" (templates cannot read "__all__").
NON_FIELD = "form"


def _form_errors(form: forms.Form) -> Errors:
    return {
        NON_FIELD if field == "__all__" else field: [str(message) for message in messages]
        for field, messages in form.errors.items()
    }


def _service_errors(error: ValidationError) -> Errors:
    if hasattr(error, "error_dict"):
        return {NON_FIELD if field == "__all__" else field: messages for field, messages in error.message_dict.items()}
    return {NON_FIELD: list(error.messages)}


def _every_error(form: forms.Form, problems: dict[str, list[str]]) -> Errors:
    """The form's errors, and the service's problems with the fields the form did read: a field that would not
    parse must not hide the others' errors until the next try."""
    errors = _form_errors(form)
    for field, messages_ in problems.items():
        errors.setdefault(NON_FIELD if field == "__all__" else field, list(messages_))
    return errors


def _member_add_errors(form: MemberAddForm, roles: type[TenantRole] | type[ProjectRole]) -> Errors:
    """Every error of the add form that can be told before inviting, at once: an unknown username and a bad role
    together. An e-mail address is the invitation's to check (tenants.invitations)."""
    form.is_valid()
    problems: dict[str, list[str]] = {}
    invitee = form.cleaned_data.get("username", "").strip()
    if invitee and "@" not in invitee:
        try:
            services.user_get_by_username(username=invitee)
        except ValidationError as error:
            problems.update(error.message_dict)
    role = form.cleaned_data.get("role", "")
    if role and (problem := services.role_problem(role, roles)):
        problems["role"] = [problem]
    return _every_error(form, problems)


def _project(request: HttpRequest, tenant: str, project: str, action: ProjectAction = ProjectAction.VIEW) -> Project:
    return project_get_for_user(user=request.user, tenant_slug=tenant, project_slug=project, action=action)


def _my_project_role(user: User, project: Project) -> str:
    """The user's role in the project, in words."""
    role = project_role_of(user=user, project=project)
    if role is not None:
        return str(role.label)
    if tenant_role_of(user=user, tenant=project.tenant) == TenantRole.ADMIN:
        return "Tenant admin (no project role)"
    return "Portal admin" if is_portal_admin(user) else "None"


def _my_tenant_role(user: User, tenant: Tenant) -> str:
    role = tenant_role_of(user=user, tenant=tenant)
    if role is not None:
        return str(role.label)
    return "Portal admin" if is_portal_admin(user) else "None"


class MemberAddForm(forms.Form):
    # A username, or an e-mail address (tenants.invitations decides which it is).
    username = forms.CharField(
        max_length=254, error_messages={"required": "Give the person's portal username or e-mail address."}
    )
    # The services say which roles exist; the form only reads the text.
    role = forms.CharField(max_length=20, error_messages={"required": "Choose a role."})


class RoleForm(forms.Form):
    role = forms.CharField(max_length=20, error_messages={"required": "Choose a role."})


# Projects ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectRow:
    project: Project
    role: str
    allocations: list[Allocation]


@require_safe
@login_required
def project_list(request: HttpRequest) -> HttpResponse:
    """The projects the user can see with their role in each, and each project's current allocations."""
    user = _user(request)
    page = _page(request, project_list_for_user(user=user))
    projects: list[Project] = list(page.object_list)
    administered = {
        tenant.pk for tenant in tenant_list_for_user(user=user) if getattr(tenant, "my_role", None) == TenantRole.ADMIN
    }
    today = timezone.now().date()
    current: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in allocation_list_for_user(user=user).filter(
        project__in=[project.pk for project in projects], starts_on__lte=today, ends_on__gte=today
    ):
        current[allocation.project_id].append(allocation)
    rows = []
    for project in projects:
        role = getattr(project, "my_role", None)
        if role:
            label = str(ProjectRole(role).label)
        elif project.tenant_id in administered:
            label = "Tenant admin (no project role)"
        else:
            label = "Portal admin"
        rows.append(ProjectRow(project, label, current[project.pk]))
    context = {
        "page": page,
        "rows": rows,
        "tenants": _page(request, tenant_list_for_user(user=user), "tenants_page"),
        "is_portal_admin": is_portal_admin(user),
    }
    return render(request, "frontend/projects/list.html", context)


class EfficiencyPolicyForm(forms.Form):
    # An unticked box is absent from the post: the form reads it as False, so the page's values are all sent.
    notify_managers = forms.BooleanField(required=False)
    end_idle_jobs = forms.BooleanField(required=False)
    end_after_idle_minutes = forms.IntegerField(error_messages={"required": "Give the limit in minutes."})
    warning_minutes = forms.IntegerField(min_value=0, error_messages={"required": "Give the warning in minutes."})


@require_safe
@login_required
def project_detail(request: HttpRequest, tenant: str, project: str) -> HttpResponse:
    return _project_detail_page(request, _project(request, tenant, project))


def _project_detail_page(
    request: HttpRequest,
    found: Project,
    *,
    policy_values: dict[str, Any] | None = None,
    policy_errors: Errors | None = None,
    status: int = 200,
) -> HttpResponse:
    """A project's overview: what it is, the user's role, its allocations with gauges, its job templates, and its
    idle-GPU policy (a form for those who may change it)."""
    user = _user(request)
    tenant, project = found.tenant.slug, found.slug
    allocations = allocation_list_for_user(user=user).filter(project=found).order_by("-ends_on", "cluster__name")
    today = timezone.now().date()
    context = {
        "project": found,
        "tab": "overview",
        "my_role": _my_project_role(user, found),
        "allocations": _page(request, allocations, "allocations_page"),
        "templates": _page(request, job_template_list_for_user(user=user, project=found), "templates_page"),
        "today": today,
        "may_submit": _may(lambda: _project(request, tenant, project, ProjectAction.SUBMIT)),
        "jobs_link": f"/jobs/?project={found.tenant.slug}/{found.slug}",
        "policy": policy_values or efficiency_policy_values(efficiency_policy_of(project=found)),
        "policy_errors": policy_errors or {},
        "may_manage": _may(lambda: _project(request, tenant, project, ProjectAction.MANAGE)),
    }
    return render(request, "frontend/projects/detail.html", context, status=status)


@require_POST
@login_required
def project_efficiency_policy(request: HttpRequest, tenant: str, project: str) -> HttpResponse:
    """Managers and tenant admins change the project's idle-GPU policy."""
    found = _project(request, tenant, project, ProjectAction.MANAGE)
    form = EfficiencyPolicyForm(request.POST)
    values: dict[str, Any] = {name: request.POST.get(name, "") for name in form.fields}
    values |= {name: name in request.POST for name in ("notify_managers", "end_idle_jobs")}
    if not form.is_valid():
        return _project_detail_page(request, found, policy_values=values, policy_errors=_form_errors(form), status=400)
    try:
        efficiency_policy_update(actor=request.user, project=found, **form.cleaned_data)
    except ValidationError as error:
        errors = _service_errors(error)
        return _project_detail_page(request, found, policy_values=values, policy_errors=errors, status=400)
    messages.success(request, f"The idle-GPU policy of {found} is saved.")
    return redirect("project-detail", tenant=tenant, project=project)


# Project members -------------------------------------------------------------------------------------------


def _project_members_page(
    request: HttpRequest,
    project: Project,
    *,
    add_values: dict[str, str] | None = None,
    add_errors: Errors | None = None,
    row_errors: dict[str, list[str]] | None = None,
    status: int = 200,
) -> HttpResponse:
    user = _user(request)
    may_manage = _may(lambda: _project(request, project.tenant.slug, project.slug, ProjectAction.MANAGE))
    members = project_membership_list(project=project).order_by("user__username")
    candidates: list[str] = []
    if may_manage:
        in_project = set(members.values_list("user__username", flat=True))
        candidates = [
            username
            for username in tenant_membership_list(tenant=project.tenant)
            .order_by("user__username")
            .values_list("user__username", flat=True)
            if username not in in_project
        ]
    context = {
        "project": project,
        "tab": "members",
        "my_role": _my_project_role(user, project),
        "members": _page(request, members),
        "may_manage": may_manage,
        "roles": ProjectRole.choices,
        "candidates": candidates,
        "add_values": add_values or {"role": ProjectRole.MEMBER.value},
        "add_errors": add_errors or {},
        "row_errors": row_errors or {},
        "invitations": invitation_list_open(tenant=project.tenant, project=project) if may_manage else [],
        "invitation_base": f"/projects/{project.tenant.slug}/{project.slug}/invitations/",
        "invitation_valid_days": INVITATION_VALID_DAYS,
        "now": timezone.now(),
    }
    return render(request, "frontend/projects/members.html", context, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def project_members(request: HttpRequest, tenant: str, project: str) -> HttpResponse:
    """Everyone in the project with their role; managers and tenant admins add people here (POST)."""
    if request.method != "POST":
        return _project_members_page(request, _project(request, tenant, project))
    found = _project(request, tenant, project, ProjectAction.MANAGE)
    form = MemberAddForm(request.POST)
    values = {"username": request.POST.get("username", "").strip(), "role": request.POST.get("role", "")}
    if errors := _member_add_errors(form, ProjectRole):
        return _project_members_page(request, found, add_values=values, add_errors=errors, status=400)
    administers_tenant = _may(lambda: tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE))
    try:
        outcome = member_invite(
            actor=_user(request),
            tenant=found.tenant,
            project=found,
            invitee=form.cleaned_data["username"],
            role=form.cleaned_data["role"],
            may_add_to_tenant=administers_tenant,
        )
    except ValidationError as error:
        return _project_members_page(request, found, add_values=values, add_errors=_service_errors(error), status=400)
    messages.success(request, _invited_message(outcome, where=str(found), role=ProjectRole(form.cleaned_data["role"])))
    return redirect("project-members", tenant=tenant, project=project)


def _invited_message(outcome: InviteOutcome, *, where: str, role: ProjectRole | TenantRole) -> str:
    if outcome.membership is not None:
        return f"{outcome.membership.user.get_username()} joined {where} as {role.label}. They have been told."
    assert outcome.invitation is not None
    return (
        f"Nobody in the portal has the address {outcome.invitation.email} yet: an invitation to {where} as "
        f"{role.label} was sent to it, and waits until {outcome.invitation.expires_at:%Y-%m-%d} for them to sign in "
        "with that address."
    )


@require_POST
@login_required
def project_invitation_withdraw(request: HttpRequest, tenant: str, project: str, invitation_id: int) -> HttpResponse:
    found = _project(request, tenant, project, ProjectAction.MANAGE)
    invitation = invitation_get(tenant=found.tenant, project=found, invitation_id=invitation_id)
    try:
        invitation_withdraw(actor=_user(request), invitation=invitation)
    except Conflict as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"The invitation of {invitation.email} to {found} is withdrawn.")
    return redirect("project-members", tenant=tenant, project=project)


@require_POST
@login_required
def project_member_role(request: HttpRequest, tenant: str, project: str, username: str) -> HttpResponse:
    found = _project(request, tenant, project, ProjectAction.MANAGE)
    membership = project_membership_get(project=found, username=username)
    form = RoleForm(request.POST)
    try:
        if not form.is_valid():
            raise ValidationError(form.errors["role"][0])
        services.project_member_change_role(actor=request.user, membership=membership, role=form.cleaned_data["role"])
    except ValidationError as error:
        problems = [message for messages_ in _service_errors(error).values() for message in messages_]
        return _project_members_page(request, found, row_errors={username: problems}, status=400)
    role = ProjectRole(form.cleaned_data["role"]).label
    messages.success(request, f"{username} is now {role} in {found}.")
    return redirect("project-members", tenant=tenant, project=project)


@require_POST
@login_required
def project_member_remove(request: HttpRequest, tenant: str, project: str, username: str) -> HttpResponse:
    found = _project(request, tenant, project, ProjectAction.MANAGE)
    membership = project_membership_get(project=found, username=username)
    services.project_member_remove(actor=request.user, membership=membership)
    messages.success(request, f"{username} was removed from {found}; their Slurm association follows shortly.")
    return redirect("project-members", tenant=tenant, project=project)


# Tenants -------------------------------------------------------------------------------------------------


def _tenant_page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    add_values: dict[str, str] | None = None,
    add_errors: Errors | None = None,
    row_errors: dict[str, list[str]] | None = None,
    status: int = 200,
) -> HttpResponse:
    user = _user(request)
    may_manage = _may(lambda: tenant_get_for_user(user=user, slug=tenant.slug, action=TenantAction.MANAGE))
    context = {
        "tenant": tenant,
        "my_role": _my_tenant_role(user, tenant),
        "may_manage": may_manage,
        "projects": _page(request, project_list_for_user(user=user, tenant=tenant), "projects_page"),
        "members": _page(request, tenant_membership_list(tenant=tenant).order_by("user__username"), "members_page"),
        "roles": TenantRole.choices,
        "add_values": add_values or {"role": TenantRole.MEMBER.value},
        "add_errors": add_errors or {},
        "row_errors": row_errors or {},
        "invitations": invitation_list_open(tenant=tenant) if may_manage else [],
        "invitation_base": f"/tenants/{tenant.slug}/invitations/",
        "invitation_valid_days": INVITATION_VALID_DAYS,
        "now": timezone.now(),
    }
    return render(request, "frontend/tenants/detail.html", context, status=status)


@require_safe
@login_required
def tenant_detail(request: HttpRequest, tenant: str) -> HttpResponse:
    """A tenant's projects (those the user can see) and members; its admins manage the members here."""
    return _tenant_page(request, tenant_get_for_user(user=request.user, slug=tenant))


@require_POST
@login_required
def tenant_member_add(request: HttpRequest, tenant: str) -> HttpResponse:
    found = tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
    form = MemberAddForm(request.POST)
    values = {"username": request.POST.get("username", "").strip(), "role": request.POST.get("role", "")}
    if errors := _member_add_errors(form, TenantRole):
        return _tenant_page(request, found, add_values=values, add_errors=errors, status=400)
    try:
        outcome = member_invite(
            actor=_user(request),
            tenant=found,
            project=None,
            invitee=form.cleaned_data["username"],
            role=form.cleaned_data["role"],
            may_add_to_tenant=True,
        )
    except ValidationError as error:
        return _tenant_page(request, found, add_values=values, add_errors=_service_errors(error), status=400)
    role = TenantRole(form.cleaned_data["role"])
    messages.success(request, _invited_message(outcome, where=f"tenant {found.slug}", role=role))
    return redirect("tenant-detail", tenant=tenant)


@require_POST
@login_required
def tenant_invitation_withdraw(request: HttpRequest, tenant: str, invitation_id: int) -> HttpResponse:
    found = tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
    invitation = invitation_get(tenant=found, invitation_id=invitation_id)
    try:
        invitation_withdraw(actor=_user(request), invitation=invitation)
    except Conflict as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"The invitation of {invitation.email} is withdrawn.")
    return redirect("tenant-detail", tenant=tenant)


@require_POST
@login_required
def tenant_member_role(request: HttpRequest, tenant: str, username: str) -> HttpResponse:
    found = tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
    membership = tenant_membership_get(tenant=found, username=username)
    form = RoleForm(request.POST)
    try:
        if not form.is_valid():
            raise ValidationError(form.errors["role"][0])
        services.tenant_member_change_role(actor=request.user, membership=membership, role=form.cleaned_data["role"])
    except ValidationError as error:
        problems = [message for messages_ in _service_errors(error).values() for message in messages_]
        return _tenant_page(request, found, row_errors={username: problems}, status=400)
    role = TenantRole(form.cleaned_data["role"]).label
    messages.success(request, f"{username} is now {role} in tenant {found.slug}.")
    return redirect("tenant-detail", tenant=tenant)


@require_POST
@login_required
def tenant_member_remove(request: HttpRequest, tenant: str, username: str) -> HttpResponse:
    found = tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
    membership = tenant_membership_get(tenant=found, username=username)
    try:
        services.tenant_member_remove(actor=request.user, membership=membership)
    except ValidationError as error:
        problems = [message for messages_ in _service_errors(error).values() for message in messages_]
        return _tenant_page(request, found, row_errors={username: problems}, status=400)
    messages.success(request, f"{username} was removed from tenant {found.slug} and from all its projects.")
    return redirect("tenant-detail", tenant=tenant)


# Allocations -----------------------------------------------------------------------------------------------


def _allocation(
    request: HttpRequest, tenant: str, project: str, allocation_id: int, action: ProjectAction = ProjectAction.VIEW
) -> tuple[Project, Allocation]:
    """The project (404 for outsiders) and its allocation (404 if it is not this project's), then `action`."""
    found = _project(request, tenant, project)
    allocation = allocation_get_for_user(user=request.user, allocation_id=allocation_id)
    if allocation.project_id != found.pk:
        raise Http404(f"No allocation {allocation_id} in project {found}.")
    if action is not ProjectAction.VIEW:
        _project(request, tenant, project, action)
    return found, allocation


@dataclass(frozen=True)
class Projection:
    """When the allocation runs out at the recent burn rate, in numbers and in words."""

    remaining_gpu_seconds: int
    burn_rate_days: int
    gpu_hours_per_day: Decimal
    exhaustion_on: date | None
    days_before_period_end: int | None
    sentence: str


def _days(count: int) -> str:
    return f"{count} day" if count == 1 else f"{count} days"


def allocation_projection(series: UsageSeries, today: date) -> Projection:
    allocation = series.allocation
    remaining = allocation.remaining_gpu_seconds
    rate = series.burn_rate_gpu_hours_per_day
    exhaustion = series.projected_exhaustion_on
    before_end = (allocation.ends_on - exhaustion).days if exhaustion is not None else None
    period = "the last day" if series.burn_rate_days == 1 else f"the last {series.burn_rate_days} days"
    window = f"{period}'s" if series.burn_rate_days == 1 else f"{period}'"
    if today < allocation.starts_on:
        sentence = f"This allocation starts on {allocation.starts_on}; nothing can be used from it before then."
    elif today > allocation.ends_on:
        sentence = (
            f"This allocation's period ended on {allocation.ends_on}, with {format_gpu_hours(max(remaining, 0))} "
            "GPU-hours left unused."
        )
    elif remaining <= 0:
        sentence = (
            "This allocation is used up: new jobs on it are refused until more GPU-hours are granted. "
            "Request more below."
        )
    elif exhaustion is not None:
        sentence = (
            f"At {window} rate ({rate} GPU-hours/day), this allocation runs out on {exhaustion}, "
            f"{_days(before_end or 0)} before its period ends ({allocation.ends_on})."
        )
    elif series.burn_rate_gpu_seconds == 0:
        sentence = (
            f"No GPU-hours were charged over {period}, so at this rate this allocation lasts until its period "
            f"ends on {allocation.ends_on}."
        )
    else:
        sentence = (
            f"At {window} rate ({rate} GPU-hours/day), this allocation lasts until its period ends on "
            f"{allocation.ends_on}."
        )
    return Projection(
        remaining_gpu_seconds=remaining,
        burn_rate_days=series.burn_rate_days,
        gpu_hours_per_day=rate,
        exhaustion_on=exhaustion,
        days_before_period_end=before_end,
        sentence=sentence,
    )


def _unix(day: date) -> int:
    return int(datetime.combine(day, time.min, tzinfo=UTC).timestamp())


def _hours(gpu_seconds: float) -> float:
    return round(gpu_seconds / SECONDS_PER_HOUR, 2)


def burn_down_chart(series: UsageSeries, projection: Projection, today: date) -> dict[str, Any]:
    """Remaining GPU-hours each day of the period so far, and the line to the projected exhaustion (dashed).

    Remaining is measured against what is granted now, so a top-up lifts the whole line: the chart answers
    "how long does what we have last", not "what did we have on each day"."""
    allocation = series.allocation
    granted = allocation.granted_gpu_seconds
    used_until = {day.day: granted - day.cumulative_used_gpu_seconds - day.reserved_gpu_seconds for day in series.days}
    days = [
        allocation.starts_on + timedelta(days=offset)
        for offset in range((allocation.ends_on - allocation.starts_on).days + 1)
    ]
    actual = [_hours(used_until[day]) if day in used_until else None for day in days]
    projected: list[float | None] = [None] * len(days)
    if allocation.starts_on <= today <= allocation.ends_on and projection.remaining_gpu_seconds > 0:
        rate_seconds = series.burn_rate_gpu_seconds / series.burn_rate_days if series.burn_rate_days else 0
        end = projection.exhaustion_on or allocation.ends_on
        span = (end - today).days
        for index, day in enumerate(days):
            if today <= day <= end:
                elapsed = (day - today).days
                if projection.exhaustion_on is not None:
                    # A straight line to zero on the date the sentence names.
                    value = projection.remaining_gpu_seconds * (1 - elapsed / span) if span else 0
                else:
                    value = projection.remaining_gpu_seconds - rate_seconds * elapsed
                projected[index] = _hours(max(value, 0))
    return {
        "kind": "line",
        "x": [_unix(day) for day in days],
        "unit": "GPU-hours",
        "quantity": "Remaining",
        "series": [
            {"label": "Remaining", "values": actual, "color": "#0b5cad"},
            {"label": "Projected", "values": projected, "color": "#b35900", "dash": True},
        ],
    }


class QuotaRequestForm(forms.Form):
    gpu_hours = forms.DecimalField(
        max_digits=12,
        decimal_places=2,
        error_messages={
            "required": "Give the GPU-hours you need, e.g. 20 or 12.5.",
            "invalid": "Give a number of GPU-hours, e.g. 20 or 12.5.",
            "max_decimal_places": "Give at most two decimals, e.g. 12.25.",
            "max_digits": "That is more GPU-hours than any allocation holds; ask for less.",
            "max_whole_digits": "That is more GPU-hours than any allocation holds; ask for less.",
        },
    )
    # The service says what a justification needs; blank reaches it so its message shows.
    justification = forms.CharField(required=False, max_length=5000)


def _allocation_page(
    request: HttpRequest,
    project: Project,
    allocation: Allocation,
    *,
    values: dict[str, str] | None = None,
    errors: Errors | None = None,
    status: int = 200,
) -> HttpResponse:
    user = _user(request)
    now = timezone.now()
    series = allocation_usage_series(allocation=allocation, now=now)
    projection = allocation_projection(series, now.date())
    requests = quota_request_list_for_user(user=user).filter(allocation=allocation)
    ledger = allocation_ledger(allocation=allocation).order_by("-created_at", "-id")
    context = {
        "project": project,
        "allocation": allocation,
        "tab": "overview",
        "series": series,
        "projection": projection,
        "chart": burn_down_chart(series, projection, now.date()),
        "remaining_gpu_hours": gpu_seconds_to_hours(allocation.remaining_gpu_seconds),
        "ledger": _page(request, ledger, "ledger_page"),
        "requests": _page(request, requests, "requests_page"),
        "pending_state": QuotaRequestState.PENDING.value,
        "may_request": _may(lambda: _project(request, project.tenant.slug, project.slug, ProjectAction.SUBMIT)),
        "period_over": allocation.ends_on < now.date(),
        "values": values or {},
        "errors": errors or {},
    }
    return render(request, "frontend/projects/allocation.html", context, status=status)


@require_safe
@login_required
def allocation_detail(request: HttpRequest, tenant: str, project: str, allocation_id: int) -> HttpResponse:
    """One allocation: its gauge, burn-down, projected exhaustion, ledger and requests for more hours."""
    found, allocation = _allocation(request, tenant, project, allocation_id)
    return _allocation_page(request, found, allocation)


@require_POST
@login_required
def allocation_request_create(request: HttpRequest, tenant: str, project: str, allocation_id: int) -> HttpResponse:
    """Ask for more GPU-hours (members and managers); the tenant's admins and the portal admins are told."""
    found, allocation = _allocation(request, tenant, project, allocation_id, ProjectAction.SUBMIT)
    values = {key: request.POST.get(key, "") for key in ("gpu_hours", "justification")}
    form = QuotaRequestForm(request.POST)
    if not form.is_valid():
        problems = quota_request_problems(
            gpu_hours=form.cleaned_data.get("gpu_hours"), justification=form.cleaned_data.get("justification", "")
        )
        errors = _every_error(form, problems)
        return _allocation_page(request, found, allocation, values=values, errors=errors, status=400)
    try:
        created = quota_request_create(
            actor=_user(request),
            allocation=allocation,
            gpu_hours=form.cleaned_data["gpu_hours"],
            justification=form.cleaned_data["justification"],
        )
    except ValidationError as error:
        return _allocation_page(request, found, allocation, values=values, errors=_service_errors(error), status=400)
    except Conflict as error:
        return _allocation_page(request, found, allocation, values=values, errors={NON_FIELD: [str(error)]}, status=409)
    messages.success(
        request,
        f"You asked for {format_gpu_hours(created.requested_gpu_seconds)} more GPU-hours; the tenant's admins "
        "have been told and you will get a notification when they decide.",
    )
    return redirect("allocation-detail", tenant=tenant, project=project, allocation_id=allocation_id)


@require_POST
@login_required
def quota_request_withdraw_view(
    request: HttpRequest, tenant: str, project: str, allocation_id: int, request_id: int
) -> HttpResponse:
    """The requester takes back their own pending request."""
    _found, allocation = _allocation(request, tenant, project, allocation_id)
    quota_request = quota_request_get_for_user(user=request.user, request_id=request_id)
    if quota_request.allocation_id != allocation.pk:
        raise Http404(f"No quota request {request_id} on allocation {allocation_id}.")
    quota_request = quota_request_get_for_user(
        user=request.user, request_id=request_id, action=QuotaRequestAction.WITHDRAW
    )
    try:
        quota_request_withdraw(actor=_user(request), request=quota_request)
    except Conflict as error:
        messages.error(request, str(error))
    else:
        messages.success(
            request,
            f"Your request for {format_gpu_hours(quota_request.requested_gpu_seconds)} GPU-hours was withdrawn.",
        )
    return redirect("allocation-detail", tenant=tenant, project=project, allocation_id=allocation_id)


# Tokens ----------------------------------------------------------------------------------------------------


class TokenForm(forms.Form):
    name = forms.CharField(required=False, max_length=services.TOKEN_NAME_MAX_LENGTH)
    # A day: the token works until the end of it (UTC).
    expires_at = forms.DateField(
        required=False, error_messages={"invalid": "Give the last day the token works as YYYY-MM-DD, or none."}
    )


def _token_list_page(
    request: HttpRequest, *, values: dict[str, str] | None = None, errors: Errors | None = None, status: int = 200
) -> HttpResponse:
    tokens: QuerySet[Any] = token_list_for_user(user=request.user)
    context = {
        "tokens": _page(request, tokens),
        "now": timezone.now(),
        "values": values or {},
        "errors": errors or {},
    }
    return render(request, "frontend/tokens/list.html", context, status=status)


def _token_expiry(last_day: date | None) -> datetime | None:
    """The token works until the end of its last day (UTC)."""
    return datetime.combine(last_day + timedelta(days=1), time.min, tzinfo=UTC) if last_day else None


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """The user's API tokens; POST creates one and shows its secret on the reply, once."""
    if request.method != "POST":
        return _token_list_page(request)
    values = {key: request.POST.get(key, "") for key in ("name", "expires_at")}
    form = TokenForm(request.POST)
    if not form.is_valid():
        problems = services.token_problems(
            user=_user(request),
            name=form.cleaned_data.get("name", ""),
            expires_at=_token_expiry(form.cleaned_data.get("expires_at")),
        )
        return _token_list_page(request, values=values, errors=_every_error(form, problems), status=400)
    try:
        token, secret = services.token_create(
            user=_user(request),
            name=form.cleaned_data["name"],
            expires_at=_token_expiry(form.cleaned_data["expires_at"]),
        )
    except ValidationError as error:
        return _token_list_page(request, values=values, errors=_service_errors(error), status=400)
    # The secret is in this reply only: not in the URL, the session or any cache.
    response = render(request, "frontend/tokens/created.html", {"token": token, "secret": secret})
    patch_cache_control(response, no_store=True, private=True)
    return response


@require_POST
@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = token_get_for_user(user=request.user, token_id=token_id)
    services.token_revoke(actor=request.user, token=token)
    messages.success(request, f"The token '{token.name}' is revoked: requests that send it are refused from now on.")
    return redirect(reverse("token-list"))


urlpatterns = [
    path("projects/", project_list, name="project-list"),
    path("projects/<str:tenant>/<str:project>/", project_detail, name="project-detail"),
    path(
        "projects/<str:tenant>/<str:project>/efficiency-policy/",
        project_efficiency_policy,
        name="project-efficiency-policy",
    ),
    path("projects/<str:tenant>/<str:project>/members/", project_members, name="project-members"),
    path(
        "projects/<str:tenant>/<str:project>/members/<str:username>/",
        project_member_role,
        name="project-member-role",
    ),
    path(
        "projects/<str:tenant>/<str:project>/members/<str:username>/remove/",
        project_member_remove,
        name="project-member-remove",
    ),
    path(
        "projects/<str:tenant>/<str:project>/invitations/<int:invitation_id>/withdraw/",
        project_invitation_withdraw,
        name="project-invitation-withdraw",
    ),
    path(
        "projects/<str:tenant>/<str:project>/allocations/<int:allocation_id>/",
        allocation_detail,
        name="allocation-detail",
    ),
    path(
        "projects/<str:tenant>/<str:project>/allocations/<int:allocation_id>/requests/",
        allocation_request_create,
        name="allocation-request-create",
    ),
    path(
        "projects/<str:tenant>/<str:project>/allocations/<int:allocation_id>/requests/<int:request_id>/withdraw/",
        quota_request_withdraw_view,
        name="quota-request-withdraw",
    ),
    path("tenants/<str:tenant>/", tenant_detail, name="tenant-detail"),
    path("tenants/<str:tenant>/members/", tenant_member_add, name="tenant-member-add"),
    path("tenants/<str:tenant>/members/<str:username>/", tenant_member_role, name="tenant-member-role"),
    path("tenants/<str:tenant>/members/<str:username>/remove/", tenant_member_remove, name="tenant-member-remove"),
    path(
        "tenants/<str:tenant>/invitations/<int:invitation_id>/withdraw/",
        tenant_invitation_withdraw,
        name="tenant-invitation-withdraw",
    ),
    path("tokens/", token_list, name="token-list"),
    path("tokens/<int:token_id>/revoke/", token_revoke, name="token-revoke"),
]
