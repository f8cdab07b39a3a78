"""The isolation matrix: every route the project defines, against every role, with the status each must get.

The route list is not written by hand: it is walked from the URL resolver and the WebSocket router, and
`test_every_route_has_an_entry` fails when a route appears without an entry here. Denied writes must
leave the database exactly as it was; an outsider's 404 must be indistinguishable from the 404 for an
object that does not exist, and no answer to an outsider may contain the other tenant's names.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib import admin
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from billing.models import Invoice, InvoiceLine, Rate, ReconciliationReport, UsageRecord
from billing.rates import rate_create
from billing.usage import usage_import
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobTemplate, ProjectEfficiencyPolicy
from portal.routing import websocket_urlpatterns
from quotas.models import Allocation, LedgerEntry, QuotaRequest, TenantPool
from quotas.requests import quota_request_create
from tenants.invitations import member_invite
from tenants.models import (
    ApiToken,
    AuditEvent,
    MembershipInvitation,
    Notification,
    Project,
    ProjectMembership,
    Tenant,
    TenantMembership,
    UserProfile,
)
from tenants.notifications import notifications_send
from tenants.services import token_create
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import (
    add_project_member,
    add_tenant_member,
    give_cluster_accounts,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.frontend.page_matrix import PAGES
from tests.isolation_rules import (
    INSIDERS,
    PROJECT_MANAGERS,
    PROJECT_VIEWERS,
    ROLES,
    SUBMITTERS,
    TENANT_ADMINS,
    Case,
    everyone,
    only,
)
from tests.websockets import handshake

TENANT_SLUG, PROJECT_SLUG = "matrixco", "matrixproj"


@dataclass
class World:
    users: dict[str, Any]
    tenant: Tenant
    project: Project
    member_token_id: int
    newcomer: Any
    job_id: str
    allocation_id: str
    template_id: str
    request_id: str
    notification_id: str
    rate_id: str
    invoice_id: str
    report_id: str
    invitation_id: str


@pytest.fixture
def world(db: None, tmp_path: Path) -> World:
    users: dict[str, Any] = {"anonymous": None, "staff": make_user("m-staff", is_staff=True)}
    users["tenant_admin"] = make_user("m-tenant-admin")
    tenant = make_tenant(TENANT_SLUG, admin=users["tenant_admin"])
    project = make_project(tenant, PROJECT_SLUG)
    make_project(tenant, "sideproj")
    users["tenant_member"] = make_user("m-tenant-member")
    # An address, so that project managers may invite this member of the tenant into the project by e-mail.
    users["tenant_member"].email = "m-tenant-member@example.org"
    users["tenant_member"].save(update_fields=["email"])
    add_tenant_member(tenant, users["tenant_member"])
    for role in ("viewer", "member", "manager"):
        users[role] = make_user(f"m-{role}")
        add_project_member(project, users[role], role)
    users["outsider"] = make_user("m-outsider")
    other = make_tenant("othercorp", admin=users["outsider"])
    add_project_member(make_project(other, "otherproj"), users["outsider"], "manager")
    token, _ = token_create(user=users["member"], name="member-token")
    cluster = make_matrix_cluster()
    cluster.log_root = str(tmp_path)
    cluster.save(update_fields=["log_root"])
    give_cluster_accounts(cluster, users, ("member", "manager", "staff"))
    allocation = grant_allocation(project, cluster)
    job, _ = job_submit(
        user=users["member"],
        project=project,
        request=JobRequest(cluster=cluster.name, script="#!/bin/bash\necho matrix\n"),
    )
    # The job's output as Slurm would have written it, for the log route to serve.
    Path(job.stdout_path).parent.mkdir(parents=True)
    Path(job.stdout_path).write_bytes(b"matrix output\n")
    template = JobTemplate.objects.create(
        project=project, name="matrix template", script="#!/bin/bash\n", created_by=users["member"]
    )
    quota_request = quota_request_create(
        actor=users["member"], allocation=allocation, gpu_hours=Decimal(5), justification="matrix"
    )
    (notification,) = notifications_send(users=[users["member"]], tenant=tenant, kind="x", title="matrix", body="")
    # Last month's usage of the project, priced: a draft invoice of the tenant's that a portal admin may finalise.
    last_month = previous_month(timezone.now().date().replace(day=1))
    rate = rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal(2),
        currency="EUR",
        valid_from=at(last_month),
    )
    charged_job(project, cluster, start=at(last_month, 10), end=at(last_month, 11), user=users["member"])
    usage_import()
    invitation = member_invite(
        actor=users["tenant_admin"],
        tenant=tenant,
        project=project,
        invitee="matrix-invitee@example.org",
        role="viewer",
        may_add_to_tenant=True,
    ).invitation
    assert invitation is not None
    return World(
        invitation_id=str(invitation.pk),
        rate_id=str(rate.pk),
        report_id=str(
            ReconciliationReport.objects.create(
                cluster=cluster, period_start=at(last_month), period_end=at(last_month, 1)
            ).pk
        ),
        invoice_id=str(Invoice.objects.get(tenant=tenant).pk),
        request_id=str(quota_request.pk),
        notification_id=str(notification.pk),
        users=users,
        tenant=tenant,
        project=project,
        member_token_id=token.pk,
        newcomer=make_user("m-new"),
        job_id=str(job.pk),
        template_id=str(template.pk),
        allocation_id=str(allocation.pk),
    )


# The matrix ---------------------------------------------------------------------------------------------

ALLOWED_ON_CLUSTER = {"member": 200, "manager": 200, "staff": 200}

# route pattern -> method -> case. Every non-admin route must be here.
MATRIX: dict[str, dict[str, Case]] = {
    "": {"GET": Case(everyone(200, anonymous=302))},
    "login/": {"GET": Case(everyone(302, anonymous=200))},  # logged-in users go straight home
    "logout/": {"GET": Case(everyone(405, anonymous=405)), "POST": Case(everyone(302, anonymous=302))},
    # The code step exists only between a right password and the code: without one, back to the login page.
    "login/code/": {"GET": Case(everyone(302, anonymous=302)), "POST": Case(everyone(302, anonymous=302))},
    "account/two-factor/": {"GET": Case(everyone(200, anonymous=302))},  # one's own second factor
    # One's own profile (time zone); anonymous visitors go to the login page and change nothing.
    "account/profile/": {
        "GET": Case(everyone(200, anonymous=302)),
        "POST": Case(everyone(302, anonymous=302), body=lambda w: {"time_zone": "Europe/Berlin"}, form=True),
    },
    # Single sign-on is for anyone; the matrix has no provider configured (tests/tenants/test_oidc.py has one).
    "oidc/<str:provider_id>/login/": {
        "GET": Case(everyone(404, anonymous=404)),
        "POST": Case(everyone(404, anonymous=404)),
    },
    "oidc/<str:provider_id>/login/callback/": {"GET": Case(everyone(404, anonymous=404))},
    "healthz": {"GET": Case({})},  # infrastructure state, the same answer for every role (checked below)
    # For scrapers (an address in PORTAL_METRICS_ALLOW, a token when set), whoever is signed in; no tenant in it.
    "metrics": {"GET": Case({})},
    "api/schema/": {"GET": Case(everyone(200, anonymous=200))},
    "api/docs/": {"GET": Case(everyone(200, anonymous=200))},
    "api/v1/me/": {"GET": Case(everyone(200))},
    "api/v1/tenants/": {
        "GET": Case(everyone(200)),
        "POST": Case(
            {"anonymous": 401, **{role: 403 for role in ROLES if role != "anonymous"}, "staff": 201},
            body=lambda w: {"slug": "brandnew", "name": "Brand new"},
        ),
    },
    "api/v1/tenants/<str:tenant>/": {
        "GET": Case(only(200, INSIDERS)),
        "PATCH": Case(only(200, TENANT_ADMINS), body=lambda w: {"name": "Renamed"}),
    },
    "api/v1/tenants/<str:tenant>/members/": {
        "GET": Case(only(200, INSIDERS)),
        "POST": Case(only(201, TENANT_ADMINS), body=lambda w: {"username": w.newcomer.username, "role": "member"}),
    },
    "api/v1/tenants/<str:tenant>/members/<str:username>/": {
        "GET": Case(only(200, INSIDERS)),
        "PATCH": Case(only(200, TENANT_ADMINS), body=lambda w: {"role": "admin"}),
        "DELETE": Case(only(204, TENANT_ADMINS)),
    },
    # Invitations by e-mail: the tenant's by its admins, a project's by its managers (the world's one is a project's).
    "api/v1/tenants/<str:tenant>/invitations/": {
        "GET": Case(only(200, TENANT_ADMINS)),
        "POST": Case(only(201, TENANT_ADMINS), body=lambda w: {"email": "brand-new@example.org", "role": "member"}),
    },
    "api/v1/tenants/<str:tenant>/invitations/<int:invitation_id>/": {
        "GET": Case(only(200, TENANT_ADMINS)),
        "DELETE": Case(only(204, TENANT_ADMINS)),
    },
    "api/v1/tenants/<str:tenant>/projects/<str:project>/invitations/": {
        "GET": Case(only(200, PROJECT_MANAGERS)),
        "POST": Case(
            only(201, PROJECT_MANAGERS), body=lambda w: {"email": w.users["tenant_member"].email, "role": "viewer"}
        ),
    },
    "api/v1/tenants/<str:tenant>/projects/<str:project>/invitations/<int:invitation_id>/": {
        "GET": Case(only(200, PROJECT_MANAGERS)),
        "DELETE": Case(only(204, PROJECT_MANAGERS)),
    },
    "api/v1/tenants/<str:tenant>/projects/": {
        "GET": Case(only(200, INSIDERS)),
        "POST": Case(only(201, TENANT_ADMINS), body=lambda w: {"slug": "fresh", "name": "Fresh"}),
    },
    "api/v1/tenants/<str:tenant>/projects/<str:project>/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
        "PATCH": Case(only(200, PROJECT_MANAGERS), body=lambda w: {"description": "changed"}),
    },
    "api/v1/tenants/<str:tenant>/projects/<str:project>/members/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
        "POST": Case(
            only(201, PROJECT_MANAGERS),
            body=lambda w: {"username": w.users["tenant_member"].username, "role": "viewer"},
        ),
    },
    "api/v1/tenants/<str:tenant>/projects/<str:project>/members/<str:username>/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
        "PATCH": Case(only(200, PROJECT_MANAGERS), body=lambda w: {"role": "viewer"}),
        "DELETE": Case(only(204, PROJECT_MANAGERS)),
    },
    "api/v1/tenants/<str:tenant>/archived-transitions/": {"GET": Case(only(200, TENANT_ADMINS))},
    "api/v1/tenants/<str:tenant>/projects/<str:project>/efficiency-policy/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
        "PATCH": Case(only(200, PROJECT_MANAGERS), body=lambda w: {"end_idle_jobs": True}),
    },
    "api/v1/tenants/<str:tenant>/projects/<str:project>/slurm-accounts/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
    },
    "api/v1/projects/": {"GET": Case(everyone(200))},
    "api/v1/tokens/": {"GET": Case(everyone(200)), "POST": Case(everyone(201), body=lambda w: {"name": "matrix"})},
    # Tokens are private to their owner, portal admins included.
    "api/v1/tokens/<int:token_id>/": {
        "GET": Case(everyone(404) | {"member": 200}),
        "DELETE": Case(everyone(404) | {"member": 204}),
    },
    "api/v1/audit-events/": {"GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member", "member"))},
    "api/v1/slurm-drift-reports/": {"GET": Case(everyone(403) | {"staff": 200})},
    # Clusters hold no tenant data: listed to everyone, each one to those who may submit to it.
    "api/v1/clusters/": {"GET": Case(everyone(200))},
    "api/v1/clusters/<str:cluster>/": {"GET": Case(everyone(404) | {"anonymous": 401, **ALLOWED_ON_CLUSTER})},
    "api/v1/jobs/": {
        "GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member")),
        "POST": Case(
            only(202, SUBMITTERS),
            body=lambda w: {
                "project": f"{TENANT_SLUG}/{PROJECT_SLUG}",
                "cluster": "matrixcluster",
                "script": "#!/bin/sh",
            },
        ),
    },
    # A batch is submitting many: those who may submit to the project, all or nothing.
    "api/v1/jobs/batch/": {
        "POST": Case(
            only(202, SUBMITTERS),
            body=lambda w: {
                "jobs": [
                    {"project": f"{TENANT_SLUG}/{PROJECT_SLUG}", "cluster": "matrixcluster", "script": "#!/bin/sh"}
                ]
                * 2
            },
        ),
    },
    "api/v1/jobs/<uuid:job_id>/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    # The job's owner is the member; managers and tenant admins cancel anyone's job.
    "api/v1/jobs/<uuid:job_id>/cancel/": {"POST": Case(only(202, ("member", *PROJECT_MANAGERS)))},
    "api/v1/jobs/<uuid:job_id>/log/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    "api/v1/jobs/<uuid:job_id>/efficiency/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    # A job array's tasks: whoever sees the job reads them (the world's job is a plain one: no tasks); whoever may
    # cancel the job may cancel a task (409 here: not an array, so past the access check and changing nothing).
    "api/v1/jobs/<uuid:job_id>/tasks/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    "api/v1/jobs/<uuid:job_id>/tasks/<int:index>/cancel/": {"POST": Case(only(409, ("member", *PROJECT_MANAGERS)))},
    # Running a job again is submitting: those who may submit to its project.
    "api/v1/jobs/<uuid:job_id>/rerun/": {"POST": Case(only(202, SUBMITTERS), body=lambda w: {"name": "again"})},
    # Being told when a job ends: whoever sees it.
    "api/v1/jobs/<uuid:job_id>/pipeline/watch/": {
        "POST": Case(only(200, PROJECT_VIEWERS)),
        "DELETE": Case(only(200, PROJECT_VIEWERS)),
    },
    "api/v1/jobs/<uuid:job_id>/watch/": {
        "POST": Case(only(200, PROJECT_VIEWERS)),
        "DELETE": Case(only(200, PROJECT_VIEWERS)),
    },
    # Allocations: read by those who see the project; created and changed by portal admins only.
    "api/v1/allocations/": {
        "GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member")),
        "POST": Case(
            everyone(403) | {"staff": 201},
            body=lambda w: {
                "project": f"{TENANT_SLUG}/{PROJECT_SLUG}",
                "cluster": "matrixcluster",
                "gpu_hours": "10",
                "starts_on": (timezone.now().date() + timedelta(days=60)).isoformat(),
                "ends_on": (timezone.now().date() + timedelta(days=90)).isoformat(),
            },
        ),
    },
    "api/v1/allocations/<int:allocation_id>/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    "api/v1/allocations/<int:allocation_id>/grant/": {
        "POST": Case(only(200, ("staff",)), body=lambda w: {"gpu_hours": "5", "note": "matrix"})
    },
    "api/v1/allocations/<int:allocation_id>/ledger/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    "api/v1/job-templates/": {
        "GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member")),
        "POST": Case(
            only(201, SUBMITTERS),
            body=lambda w: {"project": f"{TENANT_SLUG}/{PROJECT_SLUG}", "name": "new", "script": "#!/bin/sh"},
        ),
    },
    # The template's author is the member.
    "api/v1/job-templates/<str:template_id>/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
        "PATCH": Case(only(200, ("member", *PROJECT_MANAGERS)), body=lambda w: {"gpus": 2}),
        "DELETE": Case(only(204, ("member", *PROJECT_MANAGERS))),
    },
    # Asking for more GPU-hours: project viewers read, members and managers ask, tenant and portal admins decide.
    "api/v1/allocations/<int:allocation_id>/requests/": {
        "GET": Case(only(200, PROJECT_VIEWERS)),
        "POST": Case(only(201, SUBMITTERS), body=lambda w: {"gpu_hours": "5", "justification": "matrix"}),
    },
    "api/v1/allocations/<int:allocation_id>/usage/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    "api/v1/quota-requests/": {"GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member"))},
    "api/v1/quota-requests/<int:request_id>/": {"GET": Case(only(200, PROJECT_VIEWERS))},
    "api/v1/quota-requests/<int:request_id>/decide/": {
        "POST": Case(only(200, TENANT_ADMINS), body=lambda w: {"approve_gpu_hours": None, "reason": "matrix"})
    },
    # The requester is the member.
    "api/v1/quota-requests/<int:request_id>/withdraw/": {"POST": Case(only(200, ("member",)))},
    "api/v1/tenant-pools/": {
        "GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member", "viewer", "member", "manager")),
        "POST": Case(
            everyone(403) | {"staff": 201},
            body=lambda w: {
                "tenant": TENANT_SLUG,
                "cluster": "matrixcluster",
                "gpu_hours": "100",
                "starts_on": timezone.now().date().isoformat(),
                "ends_on": (timezone.now().date() + timedelta(days=30)).isoformat(),
            },
        ),
    },
    # Notifications are private to their user (the member holds one), portal admins included.
    "api/v1/notifications/": {"GET": Case(everyone(200))},
    "api/v1/notifications/read-all/": {"POST": Case(everyone(200))},
    "api/v1/notifications/<int:notification_id>/read/": {"POST": Case(everyone(404) | {"member": 200})},
    # Prices are no secret: everyone reads them; portal admins set them, and a rate that priced usage is frozen.
    "api/v1/rates/": {
        "GET": Case(everyone(200)),
        "POST": Case(
            everyone(403) | {"staff": 201},
            body=lambda w: {
                "cluster": "matrixcluster",
                "gpu_type": "h100",
                "price_per_gpu_hour": "3",
                "currency": "EUR",
                "valid_from": "2099-01-01",
            },
        ),
    },
    "api/v1/rates/<int:rate_id>/": {
        "GET": Case(everyone(200)),
        "PATCH": Case(everyone(403) | {"staff": 409}, body=lambda w: {"note": "changed"}),
        "DELETE": Case(everyone(403) | {"staff": 409}),
    },
    # Invoices are the tenant admins' (and portal admins'); everyone else is told they do not exist.
    "api/v1/invoices/": {
        "GET": Case(everyone(200), leak_free_for=("outsider", "tenant_member", "viewer", "member", "manager"))
    },
    "api/v1/invoices/<int:invoice_id>/": {"GET": Case(only(200, TENANT_ADMINS, denied=404))},
    "api/v1/invoices/<int:invoice_id>/csv/": {"GET": Case(only(200, TENANT_ADMINS, denied=404))},
    "api/v1/invoices/<int:invoice_id>/finalise/": {
        "POST": Case(only(200, ("staff",), denied=404) | {"tenant_admin": 403})
    },
    # An estimate only reads: anyone who sees the project may ask.
    "api/v1/estimates/": {
        "POST": Case(
            only(200, PROJECT_VIEWERS),
            body=lambda w: {"project": f"{TENANT_SLUG}/{PROJECT_SLUG}", "cluster": "matrixcluster"},
        )
    },
    "api/v1/spend/daily/": {
        "GET": Case(everyone(400)),  # a scope is required; the scoped cases are below
    },
    "api/v1/spend/top/": {"GET": Case(everyone(403) | {"staff": 200})},  # across all tenants: portal admins
    # Without a scope, the efficiency report is every tenant's: portal admins only (scoped: tests/billing).
    "api/v1/efficiency/": {"GET": Case(everyone(403) | {"staff": 200})},
    "api/v1/efficiency/csv/": {"GET": Case(everyone(403) | {"staff": 200})},
    # Reconciliation compares every tenant's usage with Slurm: portal admins only. The POST's period ends before
    # the world's usage, so the report (run by a worker) would find nothing of it; here it only gets queued.
    "api/v1/reconciliation-reports/": {
        "GET": Case(everyone(403) | {"staff": 200}),
        "POST": Case(
            everyone(403) | {"staff": 202},
            body=lambda w: {"cluster": "matrixcluster", "start": "2026-01-01", "end": "2026-01-02"},
        ),
    },
    "api/v1/reconciliation-reports/<int:report_id>/": {"GET": Case(everyone(403) | {"staff": 200})},
    "billing/invoices/<int:invoice_id>/print/": {
        "GET": Case(only(200, TENANT_ADMINS, denied=404) | {"anonymous": 302})
    },
}

# route -> role -> whether the handshake is accepted.
# The browser pages' entries live with the pages (tests/frontend/page_matrix.py).
assert not MATRIX.keys() & PAGES.keys(), "a page is in both matrices"
MATRIX.update(PAGES)

WEBSOCKET_MATRIX: dict[str, dict[str, bool]] = {
    "ws/clusters/": {role: role != "anonymous" for role in ROLES},
    "ws/projects/<str:tenant>/<str:project>/jobs/": {role: role in PROJECT_VIEWERS for role in ROLES},
    "ws/jobs/<uuid:job_id>/": {role: role in PROJECT_VIEWERS for role in ROLES},
    "ws/jobs/<uuid:job_id>/log/": {role: role in PROJECT_VIEWERS for role in ROLES},
}


# Walking the routers ------------------------------------------------------------------------------------


def _walk(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, route)
        else:
            yield route, entry


def project_routes() -> set[str]:
    return {route for route, _ in _walk(get_resolver().url_patterns) if not route.startswith("admin/")}


def admin_routes() -> list[tuple[str, URLPattern]]:
    return [(route, pattern) for route, pattern in _walk(get_resolver().url_patterns) if route.startswith("admin/")]


def test_every_route_has_an_entry() -> None:
    routes = project_routes()
    assert routes - MATRIX.keys() == set(), "new routes need an entry in the isolation matrix"
    assert MATRIX.keys() - routes == set(), "the matrix lists routes that no longer exist"
    websocket_routes = {str(entry.pattern) for entry in websocket_urlpatterns}
    assert websocket_routes == WEBSOCKET_MATRIX.keys()


# Running one case ---------------------------------------------------------------------------------------


def _url(route: str, world: World, **overrides: str) -> str:
    values = {
        "tenant": world.tenant.slug,
        "project": world.project.slug,
        "username": world.users["member"].username,
        "token_id": str(world.member_token_id),
        "job_id": world.job_id,
        "template_id": world.template_id,
        "allocation_id": world.allocation_id,
        "request_id": world.request_id,
        "notification_id": world.notification_id,
        "rate_id": world.rate_id,
        "invoice_id": world.invoice_id,
        "report_id": world.report_id,
        "invitation_id": world.invitation_id,
        "cluster": "matrixcluster",
        "provider_id": "no-such-provider",
        "index": "0",
        "stream": "stdout",
        **overrides,
    }
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda match: values[str(match.group(1))], route)


def _client(world: World, role: str) -> Client:
    client = Client()
    if world.users[role] is not None:
        client.force_login(world.users[role])
    return client


def _request(client: Client, method: str, url: str, body: dict[str, Any] | None, *, form: bool = False) -> Any:
    if form:
        return client.generic(method, url, data=urlencode(body or {}, doseq=True), content_type=FORM)
    data = json.dumps(body) if body is not None else None
    return client.generic(method, url, data=data or "", content_type="application/json")


FORM = "application/x-www-form-urlencoded"


def database_fingerprint() -> str:
    """Everything a write on these routes could change, as one digest."""
    rows = [
        list(Tenant.objects.order_by("pk").values_list("pk", "slug", "name", "description")),
        list(Project.objects.order_by("pk").values_list("pk", "slug", "name", "description")),
        list(TenantMembership.objects.order_by("pk").values_list("pk", "user_id", "role")),
        list(ProjectMembership.objects.order_by("pk").values_list("pk", "user_id", "role")),
        list(MembershipInvitation.objects.order_by("pk").values_list("pk", "state")),
        list(ApiToken.objects.order_by("pk").values_list("pk", "name", "revoked_at")),
        list(Job.objects.order_by("pk").values_list("pk", "state", "cancel_requested_at")),
        list(JobTemplate.objects.order_by("pk").values_list("pk", "name", "gpus")),
        list(ProjectEfficiencyPolicy.objects.order_by("pk").values_list()),
        list(Allocation.objects.order_by("pk").values_list("pk", "granted_gpu_seconds", "reserved_gpu_seconds")),
        LedgerEntry.objects.count(),
        list(QuotaRequest.objects.order_by("pk").values_list("pk", "state", "granted_gpu_seconds")),
        list(TenantPool.objects.order_by("pk").values_list("pk", "gpu_seconds", "distributed_gpu_seconds")),
        list(Notification.objects.order_by("pk").values_list("pk", "read_at")),
        list(Rate.objects.order_by("pk").values_list("pk", "price_per_gpu_hour", "valid_from", "note")),
        list(Invoice.objects.order_by("pk").values_list("pk", "state", "total", "number")),
        InvoiceLine.objects.count(),
        UsageRecord.objects.count(),
        ReconciliationReport.objects.count(),
        AuditEvent.objects.count(),
        list(UserProfile.objects.order_by("pk").values_list("pk", "user_id", "time_zone")),
    ]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


MATRIX_CASES = [
    pytest.param(route, method, id=f"{method} /{route}") for route, methods in MATRIX.items() for method in methods
]


@pytest.mark.parametrize(("route", "method"), MATRIX_CASES)
def test_route_answers_each_role_as_the_matrix_says(world: World, route: str, method: str) -> None:
    case = MATRIX[route][method]
    answers: dict[str, int] = {}
    for role in ROLES:
        with transaction.atomic():
            before = database_fingerprint()
            events_before = AuditEvent.objects.count()
            url = _url(route, world)
            body = case.body(world) if case.body else None
            response = _request(_client(world, role), method, url, body, form=case.form)
            answers[role] = response.status_code
            if method != "GET" and response.status_code >= 400:
                assert database_fingerprint() == before, f"{role}: a denied {method} {url} changed the database"
            if method != "GET" and response.status_code < 300 and not re.search("notifications/|estimates/", route):
                assert AuditEvent.objects.count() > events_before, f"{role}: {method} {url} left no audit event"
            _check_no_leak(world, role, route, method, response, case)
            transaction.set_rollback(True)
    if not case.expected:
        assert len(set(answers.values())) == 1, f"/{route} must answer every role alike: {answers}"
        return
    assert answers == case.expected


def _check_no_leak(world: World, role: str, route: str, method: str, response: Any, case: Case) -> None:
    content = b"".join(response.streaming_content) if response.streaming else response.content
    body = content.decode(errors="replace")
    if role in case.leak_free_for and response.status_code == 200 and "<str:tenant>" not in route:
        assert TENANT_SLUG not in body, f"{role} sees the other tenant at /{route}"
        assert PROJECT_SLUG not in body, f"{role} sees the other tenant's project at /{route}"
    if role == "outsider" and response.status_code == 404 and "<str:tenant>" in route:
        # The answer for the real tenant must be the answer for a tenant that does not exist.
        ghost = _request(
            _client(world, role),
            method,
            _url(route, world, tenant="ghosttenant", project="ghostproject"),
            case.body(world) if case.body else None,
            form=case.form,
        )
        assert ghost.status_code == 404
        normalised = body.replace(TENANT_SLUG, "ghosttenant").replace(PROJECT_SLUG, "ghostproject")
        assert normalised == ghost.content.decode(), f"the outsider can tell that /{route} exists"
    if role == "outsider" and response.status_code == 404 and "<int:allocation_id>" in route:
        ghost = _request(
            _client(world, role),
            method,
            _url(route, world, allocation_id="999999"),
            case.body(world) if case.body else None,
            form=case.form,
        )
        assert ghost.status_code == 404
        normalised = re.sub(rf"(?<![\w-]){world.allocation_id}(?![\w-])", "999999", body)
        assert normalised == ghost.content.decode(), f"the outsider can tell that /{route} exists"


# The Django admin: staff only -------------------------------------------------------------------------------


def _admin_url(pattern: URLPattern, world: World) -> str | None:
    name = pattern.name
    if name is None:
        return None
    kwargs: dict[str, Any] = {}
    groups = set(pattern.pattern.regex.groupindex)
    if groups & {"object_id", "id"}:
        model = next(
            (m for m in admin.site._registry if name.startswith(f"{m._meta.app_label}_{m._meta.model_name}_")), None
        )
        instance = model._default_manager.order_by("pk").first() if model is not None else None
        kwargs[(groups & {"object_id", "id"}).pop()] = str(instance.pk) if instance is not None else "999999"
    if "app_label" in groups:
        kwargs["app_label"] = "tenants"
    if "content_type_id" in groups:
        return None  # "view on site" redirects to the object's own page, covered by the matrix above
    if "url" in groups:
        kwargs["url"] = "no-such-page/"
    return reverse(f"admin:{name}", kwargs=kwargs)


def test_admin_pages_are_for_portal_admins_only(world: World) -> None:
    checked = 0
    clients = {role: _client(world, role) for role in ROLES}
    for _route, pattern in admin_routes():
        url = _admin_url(pattern, world)
        if url is None or pattern.name in {"login", "logout"}:
            continue
        for role in ROLES:
            response = clients[role].get(url)
            if role == "staff":
                assert response.status_code < 500, f"{url} fails for staff"
            else:
                assert response.status_code == 302, f"{role} reached {url} ({response.status_code})"
                assert response.headers["Location"].startswith("/admin/login/")
        checked += 1
    assert checked > 30  # every registered model's changelist, add, change, delete and history pages


# WebSockets ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_websocket_routes_accept_exactly_the_matrix_roles() -> None:
    from portal.asgi import application

    users = {role: make_user(f"ws-{role}", is_staff=role == "staff") for role in ROLES if role != "anonymous"}
    tenant = make_tenant("wsmatrix", admin=users["tenant_admin"])
    add_tenant_member(tenant, users["tenant_member"])
    project = make_project(tenant, "wsproj")
    for role in ("viewer", "member", "manager"):
        add_project_member(project, users[role], role)
    make_tenant("wsother", admin=users["outsider"])
    cluster = make_matrix_cluster("wscluster")
    give_cluster_accounts(cluster, users, ("member",))
    grant_allocation(project, cluster)
    job, _ = job_submit(
        user=users["member"], project=project, request=JobRequest(cluster=cluster.name, script="#!/bin/bash\n")
    )
    values = {"tenant": "wsmatrix", "project": "wsproj", "job_id": str(job.pk)}

    def session_cookie(user: Any) -> bytes | None:
        if user is None:
            return None
        client = Client()
        client.force_login(user)
        return f"sessionid={client.cookies['sessionid'].value}".encode()

    async def connects(path: str, cookie: bytes | None) -> bool:
        headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
        if cookie is not None:
            headers.append((b"cookie", cookie))
        communicator = WebsocketCommunicator(application, "/" + path, headers=headers)
        connected, _ = await handshake(communicator, timeout=5)
        await communicator.disconnect()
        return bool(connected)

    for route, expected in WEBSOCKET_MATRIX.items():
        path = re.sub(r"<(?:\w+:)?(\w+)>", lambda match: values[str(match.group(1))], route)
        answers = {role: async_to_sync(connects)(path, session_cookie(users.get(role))) for role in ROLES}
        assert answers == expected, route
