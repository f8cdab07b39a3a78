"""The world the API fuzz (tests/portal/test_api_fuzz.py) runs in: a tenant with every role, an allocation, a
template, jobs in several states, a quota request, a notification, a price, an invoice and a reconciliation
report, plus a second tenant the fuzzing user must never reach.

The cluster's slurmrestd address is a closed port and nothing here commits, so no Celery task is ever
delivered: submitted jobs stay `queued`, and no request of the fuzz can reach the real Slurm cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from billing.models import Invoice, ReconciliationReport
from billing.rates import rate_create
from billing.usage import usage_import
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobState, JobTemplate
from quotas.requests import quota_request_create
from tenants.invitations import member_invite
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

# The identities the fuzz authenticates as; each gets a Bearer token.
IDENTITIES = ("member", "staff")

# Final states a job of the world is put in, besides the `queued` one a submission leaves.
FINISHED_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Identity:
    token: str
    token_id: str


@dataclass(frozen=True)
class FuzzWorld:
    identities: dict[str, Identity]
    # Path parameter name -> a value that names an object of the world, for the fuzz to aim at.
    path_values: dict[str, str]
    # The same for fields of bodies and query strings, where a project is "tenant/project".
    field_values: dict[str, str]


def fuzz_world_build(log_root: Path) -> FuzzWorld:
    """Everything a portal of a few weeks holds, built through the services as users would have."""
    users: dict[str, User] = {"staff": make_user("fz-staff", is_staff=True), "tenant_admin": make_user("fz-admin")}
    tenant = make_tenant("fuzzco", admin=users["tenant_admin"])
    project = make_project(tenant, "fuzzproj")
    make_project(tenant, "sideproj")
    for role in ("viewer", "member", "manager"):
        users[role] = make_user(f"fz-{role}")
        add_project_member(project, users[role], role)
    add_tenant_member(tenant, make_user("fz-tenant-member"))
    outsider = make_user("fz-outsider")
    add_project_member(make_project(make_tenant("elsewhere", admin=outsider), "theirproj"), outsider, "manager")

    cluster = make_matrix_cluster("fuzzcluster")
    cluster.log_root = str(log_root)
    cluster.save(update_fields=["log_root"])
    give_cluster_accounts(cluster, users, ("member", "manager", "staff"))
    allocation = grant_allocation(project, cluster)
    job = _jobs_in_several_states(users["member"], project, cluster)
    template = JobTemplate.objects.create(
        project=project, name="fuzz template", script="#!/bin/bash\necho fuzz\n", created_by=users["member"]
    )
    quota_request = quota_request_create(
        actor=users["member"], allocation=allocation, gpu_hours=Decimal(5), justification="fuzz"
    )
    (notification,) = notifications_send(users=[users["member"]], tenant=tenant, kind="x", title="fuzz", body="")
    invoice_id, rate_id, report_id = _billing(users["member"], project, cluster)
    invitation = member_invite(
        actor=users["tenant_admin"],
        tenant=tenant,
        project=project,
        invitee="fz-invitee@example.org",
        role="viewer",
        may_add_to_tenant=True,
    ).invitation
    assert invitation is not None
    return FuzzWorld(
        identities={name: _identity(users[name]) for name in IDENTITIES},
        path_values={
            "tenant": tenant.slug,
            "project": project.slug,
            "username": users["viewer"].username,
            "cluster": cluster.name,
            "job_id": str(job.pk),
            "allocation_id": str(allocation.pk),
            "template_id": str(template.pk),
            "request_id": str(quota_request.pk),
            "notification_id": str(notification.pk),
            "rate_id": rate_id,
            "invoice_id": invoice_id,
            "report_id": report_id,
            "invitation_id": str(invitation.pk),
        },
        field_values={
            "tenant": tenant.slug,
            "project": f"{tenant.slug}/{project.slug}",
            "cluster": cluster.name,
            "partition": "gpu",
            "gpu_type": "h100",
            "template": str(template.pk),
            "username": make_user("fz-newcomer").username,
        },
    )


def _identity(user: User) -> Identity:
    token, secret = token_create(user=user, name="fuzz")
    return Identity(token=secret, token_id=str(token.pk))


def _jobs_in_several_states(user: User, project: Any, cluster: Any) -> Job:
    """One submitted job (left `queued`, with output on disk for the log route) and a few that moved on."""

    def submit(name: str) -> Job:
        request = JobRequest(cluster=cluster.name, name=name, script="#!/bin/bash\necho fuzz\n")
        return job_submit(user=user, project=project, request=request)[0]

    job = submit("queued")
    Path(job.stdout_path).parent.mkdir(parents=True, exist_ok=True)
    Path(job.stdout_path).write_bytes(b"fuzz output\n")
    running = submit("running")
    Job.objects.filter(pk=running.pk).update(
        state=JobState.RUNNING, slurm_job_id=800_001, started_at=timezone.now() - timedelta(minutes=5)
    )
    for index, state in enumerate(FINISHED_STATES):
        finished = submit(state)
        Job.objects.filter(pk=finished.pk).update(state=state, slurm_job_id=800_100 + index, ended_at=timezone.now())
    return job


def _billing(user: User, project: Any, cluster: Any) -> tuple[str, str, str]:
    """Last month's usage, priced: a draft invoice; plus a price and a reconciliation report."""
    last_month = previous_month(timezone.now().date().replace(day=1))
    price = Decimal(2)
    rate = rate_create(
        actor=None, cluster=cluster, gpu_type="", price_per_gpu_hour=price, currency="EUR", valid_from=at(last_month)
    )
    charged_job(project, cluster, start=at(last_month, 10), end=at(last_month, 11), user=user)
    usage_import()
    report = ReconciliationReport.objects.create(
        cluster=cluster, period_start=at(last_month), period_end=at(last_month, 1)
    )
    invoice = Invoice.objects.get(tenant=project.tenant)
    return str(invoice.pk), str(rate.pk), str(report.pk)
