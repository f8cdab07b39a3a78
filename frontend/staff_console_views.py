"""The portal admins' console under /staff/: tenants and projects (created and edited here, their members on the
tenant's and project's own pages, which portal admins manage too), registering and checking clusters, and the
audit log of recent changes.

The pages parse forms and call the same services as the API and the management commands; every change those
services make is written to the audit log in the same transaction.
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from clusters.models import Cluster
from clusters.selectors import cluster_list_active, project_slurm_account_list
from clusters.services import cluster_check_request, cluster_create
from frontend.staff_views import _mark_errors, _page, _query_without_page, _require_portal_admin, _service_error
from tenants import services as tenant_services
from tenants.models import Project, Tenant
from tenants.selectors import audit_event_list_for_user, tenant_list_for_user

# The kinds of change the audit list filters by: the part of an event's action before the dot.
AUDIT_KINDS = [
    ("tenant", "Tenants"),
    ("tenant_member", "Tenant members"),
    ("project", "Projects"),
    ("project_member", "Project members"),
    ("cluster", "Clusters"),
    ("cluster_account", "Cluster accounts"),
    ("rate", "Rates"),
    ("allocation", "Allocations"),
    ("tenant_pool", "Tenant pools"),
    ("quota_request", "Quota requests"),
    ("invoice", "Invoices"),
    ("reconciliation_report", "Reconciliation"),
    ("job", "Jobs"),
    ("token", "API tokens"),
    ("user", "Users"),
]


# Tenants -------------------------------------------------------------------------------------------------


class TenantEditForm(forms.Form):
    name = forms.CharField(
        label="Name",
        max_length=200,
        help_text="A few words people will recognise, e.g. Acme Research.",
        error_messages={"required": "A name is required: a few words people will recognise."},
    )
    description = forms.CharField(label="Description", required=False, widget=forms.Textarea(attrs={"rows": 3}))


class TenantCreateForm(TenantEditForm):
    slug = forms.CharField(
        label="Slug",
        max_length=40,
        help_text="2 to 40 lower-case letters, digits and single hyphens, e.g. acme-research. It names the tenant in "
        "URLs and its Slurm parent account, and never changes.",
        error_messages={
            "required": "Give a slug, e.g. acme-research.",
            "max_length": "Keep the slug to 40 characters.",
        },
    )
    field_order = ["slug", "name", "description"]


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def tenants(request: HttpRequest) -> HttpResponse:
    """Every tenant, searchable by slug or name, with its counts; and the form that creates one."""
    user = request.user
    _require_portal_admin(user)
    form = TenantCreateForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                created = tenant_services.tenant_create(
                    actor=user, slug=data["slug"], name=data["name"], description=data["description"]
                )
            except ValidationError as error:
                status = _service_error(form, error)
            else:
                messages.success(request, f"Tenant {created.slug} created; add its members and projects below.")
                return redirect("staff-tenant", tenant=created.slug)
        else:
            status = 400
        _mark_errors(form)
    search = request.GET.get("q", "").strip()
    found = tenant_list_for_user(user=user).annotate(
        project_count=Count("projects", distinct=True), member_count=Count("memberships", distinct=True)
    )
    if search:
        found = found.filter(Q(slug__icontains=search) | Q(name__icontains=search))
    context = {"page": _page(request, found), "query": _query_without_page(request), "search": search, "form": form}
    return render(request, "frontend/staff/tenants.html", context, status=status)


def _tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise Http404(f"No tenant '{slug}' exists; find it under /staff/tenants/.")
    return tenant


class ProjectEditForm(forms.Form):
    name = forms.CharField(
        label="Name",
        max_length=200,
        help_text="A few words people will recognise, e.g. Vision models.",
        error_messages={"required": "A name is required: a few words people will recognise."},
    )
    description = forms.CharField(label="Description", required=False, widget=forms.Textarea(attrs={"rows": 3}))


# The tenant's page holds the tenant's form and this one: their inputs need ids of their own.
PROJECT_FORM_IDS = "id_project_%s"


class ProjectCreateForm(ProjectEditForm):
    slug = forms.CharField(
        label="Slug",
        max_length=40,
        help_text="2 to 40 lower-case letters, digits and single hyphens, e.g. vision. With the tenant's slug it "
        "names the project's Slurm account, so it never changes.",
        error_messages={"required": "Give a slug, e.g. vision.", "max_length": "Keep the slug to 40 characters."},
    )
    field_order = ["slug", "name", "description"]


def _tenant_page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    form: TenantEditForm | None = None,
    project_form: ProjectCreateForm | None = None,
    status: int = 200,
) -> HttpResponse:
    projects = tenant.projects.annotate(member_count=Count("memberships")).order_by("slug")
    context = {
        "tenant": tenant,
        "form": form or TenantEditForm(initial={"name": tenant.name, "description": tenant.description}),
        "project_form": project_form or ProjectCreateForm(auto_id=PROJECT_FORM_IDS),
        "page": _page(request, projects),
        "query": _query_without_page(request),
        "member_count": tenant.memberships.count(),
    }
    return render(request, "frontend/staff/tenant.html", context, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def tenant_edit(request: HttpRequest, tenant: str) -> HttpResponse:
    """One tenant: its name and description (the slug never changes), its projects and the form for a new one."""
    user = request.user
    _require_portal_admin(user)
    found = _tenant(tenant)
    if request.method != "POST":
        return _tenant_page(request, found)
    form = TenantEditForm(request.POST)
    status = 400
    if form.is_valid():
        try:
            tenant_services.tenant_update(
                actor=user, tenant=found, name=form.cleaned_data["name"], description=form.cleaned_data["description"]
            )
        except ValidationError as error:
            status = _service_error(form, error)
        else:
            messages.success(request, f"Tenant {found.slug} saved.")
            return redirect("staff-tenant", tenant=found.slug)
    _mark_errors(form)
    return _tenant_page(request, found, form=form, status=status)


@require_POST
@login_required
def project_create(request: HttpRequest, tenant: str) -> HttpResponse:
    """A new project of the tenant; the workers then create its Slurm account on every active cluster."""
    user = request.user
    _require_portal_admin(user)
    found = _tenant(tenant)
    form = ProjectCreateForm(request.POST, auto_id=PROJECT_FORM_IDS)
    status = 400
    if form.is_valid():
        data = form.cleaned_data
        try:
            created = tenant_services.project_create(
                actor=user, tenant=found, slug=data["slug"], name=data["name"], description=data["description"]
            )
        except ValidationError as error:
            status = _service_error(form, error)
        else:
            messages.success(
                request,
                f"Project {created} created; its Slurm account {created.slurm_account} is being created on every "
                "active cluster.",
            )
            return redirect("staff-project", tenant=found.slug, project=created.slug)
    _mark_errors(form)
    return _tenant_page(request, found, project_form=form, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def project_edit(request: HttpRequest, tenant: str, project: str) -> HttpResponse:
    """One project: its name and description (slug and Slurm account never change) and its Slurm accounts."""
    user = request.user
    _require_portal_admin(user)
    found = Project.objects.select_related("tenant").filter(tenant__slug=tenant, slug=project).first()
    if found is None:
        raise Http404(f"No project '{tenant}/{project}' exists; find it on its tenant's page under /staff/tenants/.")
    form = ProjectEditForm(request.POST or None, initial={"name": found.name, "description": found.description})
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                tenant_services.project_update(
                    actor=user,
                    project=found,
                    name=form.cleaned_data["name"],
                    description=form.cleaned_data["description"],
                )
            except ValidationError as error:
                status = _service_error(form, error)
            else:
                messages.success(request, f"Project {found} saved.")
                return redirect("staff-project", tenant=tenant, project=project)
        _mark_errors(form)
    context = {
        "project": found,
        "form": form,
        "slurm_accounts": project_slurm_account_list(project=found),
        "member_count": found.memberships.count(),
    }
    return render(request, "frontend/staff/project.html", context, status=status)


# Clusters ------------------------------------------------------------------------------------------------


class ClusterRegisterForm(forms.Form):
    name = forms.SlugField(
        label="Name",
        max_length=40,
        help_text="The portal's name for the cluster, e.g. north; users see it. Letters, digits, hyphens.",
        error_messages={"invalid": "Use letters, digits, hyphens and underscores only, e.g. north."},
    )
    slurmrestd_url = forms.URLField(
        assume_scheme="http",
        label="slurmrestd URL",
        max_length=200,
        help_text="slurmrestd's base URL, e.g. http://slurm-head.example.org:6820 (a host name with its domain, "
        "or an IP address).",
        error_messages={
            "invalid": "Give a URL with its scheme and a full host name or IP address, "
            "e.g. http://slurm-head.example.org:6820."
        },
    )
    jwt_key_file = forms.CharField(
        label="JWT key file",
        max_length=500,
        help_text="Path on the workers of the cluster's HS256 key (AuthAltParameters=jwt_key=... in slurm.conf); "
        "only the workers read it.",
    )
    admin_user = forms.CharField(
        label="Admin user",
        max_length=64,
        initial="root",
        help_text="Slurm operator or admin account for cluster-wide reads and account management.",
    )
    log_root = forms.CharField(
        label="Log root",
        max_length=500,
        help_text="Directory on the shared filesystem (same path on the cluster and the portal) for job output.",
    )


def _clusters_page(request: HttpRequest, form: ClusterRegisterForm, status: int = 200) -> HttpResponse:
    found = cluster_list_active().prefetch_related("gpu_types")
    return render(request, "frontend/staff/clusters.html", {"clusters": list(found), "form": form}, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def clusters(request: HttpRequest) -> HttpResponse:
    """The clusters' health as the workers last recorded it, and the form that registers one.

    A registered cluster is checked by a worker at once (the web tier never reads its key); its page shows
    what the check found.
    """
    user = request.user
    _require_portal_admin(user)
    form = ClusterRegisterForm(request.POST or None)
    if request.method != "POST":
        return _clusters_page(request, form)
    status = 400
    if form.is_valid():
        try:
            cluster = cluster_create(actor=user, **form.cleaned_data)
        except ValidationError as error:
            status = _service_error(form, error)
        else:
            messages.success(request, f"Cluster {cluster.name} registered; a worker is checking it now.")
            return redirect("staff-cluster", cluster=cluster.name)
    _mark_errors(form)
    return _clusters_page(request, form, status)


def _cluster(name: str) -> Cluster:
    cluster = cluster_list_active().filter(name=name).first()
    if cluster is None:
        raise Http404(f"No active cluster '{name}' is registered; see /staff/clusters/.")
    return cluster


def _asked_at(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else None


@require_safe
@login_required
def cluster_detail(request: HttpRequest, cluster: str) -> HttpResponse:
    """What the workers last recorded of a cluster: reachable or not, its versions, partitions and GPU types.

    With `?since=` (the moment a check was asked for) the status part reloads itself until the check answered.
    """
    _require_portal_admin(request.user)
    found = _cluster(cluster)
    asked_at = _asked_at(request.GET.get("since", ""))
    waiting = asked_at is not None and (found.last_ping_at is None or found.last_ping_at < asked_at)
    context = {
        "cluster": found,
        "partitions": list(found.partitions.order_by("name")),
        "gpu_types": list(found.gpu_types.order_by("name")),
        "waiting": waiting,
        "since": asked_at.isoformat() if asked_at else "",
    }
    partial = request.headers.get("HX-Request") == "true"
    return render(request, "frontend/staff/_cluster_status.html" if partial else "frontend/staff/cluster.html", context)


@require_POST
@login_required
def cluster_check(request: HttpRequest, cluster: str) -> HttpResponse:
    """Have a worker check the cluster now; its page waits for the answer."""
    _require_portal_admin(request.user)
    found = _cluster(cluster)
    asked_at = timezone.now()
    cluster_check_request(cluster=found)
    messages.info(request, f"A worker is checking {found.name}; this page shows its answer when it comes.")
    return redirect(f"{reverse('staff-cluster', args=[found.name])}?{urlencode({'since': asked_at.isoformat()})}")


# Audit log -----------------------------------------------------------------------------------------------


@require_safe
@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    """Recent changes across the portal, newest first, optionally of one kind."""
    user = request.user
    _require_portal_admin(user)
    kind = request.GET.get("kind", "")
    events = audit_event_list_for_user(user=user)
    if kind in dict(AUDIT_KINDS):
        events = events.filter(action__startswith=f"{kind}.")
    else:
        kind = ""
    context = {
        "page": _page(request, events),
        "query": _query_without_page(request),
        "kinds": AUDIT_KINDS,
        "kind": kind,
    }
    return render(request, "frontend/staff/audit.html", context)


urlpatterns = [
    path("staff/tenants/", tenants, name="staff-tenants"),
    path("staff/tenants/<str:tenant>/", tenant_edit, name="staff-tenant"),
    path("staff/tenants/<str:tenant>/projects/", project_create, name="staff-project-create"),
    path("staff/tenants/<str:tenant>/projects/<str:project>/", project_edit, name="staff-project"),
    path("staff/clusters/", clusters, name="staff-clusters"),
    path("staff/clusters/<str:cluster>/", cluster_detail, name="staff-cluster"),
    path("staff/clusters/<str:cluster>/check/", cluster_check, name="staff-cluster-check"),
    path("staff/audit/", audit_log, name="staff-audit"),
]
