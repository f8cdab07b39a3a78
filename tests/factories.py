"""Small factories for tenant data, built through the public services so that tests see what users see."""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.utils import timezone

from clusters.models import Cluster, ClusterAccount, GpuType, Node, Partition
from jobs.models import Job, JobState
from quotas.models import Allocation
from quotas.services import allocation_create
from tenants import services
from tenants.models import Project, ProjectMembership, Tenant, TenantMembership

PASSWORD = "correct-horse-battery"


def unique_slug(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def make_user(username: str | None = None, *, is_staff: bool = False) -> User:
    user = get_user_model().objects.create_user(
        username=username or unique_slug("user"), password=PASSWORD, is_staff=is_staff, is_superuser=is_staff
    )
    return user


def make_tenant(slug: str | None = None, *, admin: User | None = None) -> Tenant:
    tenant = services.tenant_create(actor=None, slug=slug or unique_slug("tn"), name="Test tenant")
    if admin is not None:
        services.tenant_member_add(actor=None, tenant=tenant, user=admin, role="admin")
    return tenant


def make_project(tenant: Tenant, slug: str | None = None) -> Project:
    return services.project_create(actor=None, tenant=tenant, slug=slug or unique_slug("pr"), name="Test project")


def add_tenant_member(tenant: Tenant, user: User, role: str = "member") -> TenantMembership:
    return services.tenant_member_add(actor=None, tenant=tenant, user=user, role=role)


def add_project_member(project: Project, user: User, role: str = "member") -> ProjectMembership:
    """Adds the user to the project's tenant first when needed."""
    if not TenantMembership.objects.filter(tenant=project.tenant, user=user).exists():
        add_tenant_member(project.tenant, user)
    return services.project_member_add(actor=None, project=project, user=user, role=role)


def make_matrix_cluster(name: str = "matrixcluster") -> Cluster:
    """A cluster as a sync would have recorded it (no Slurm is called by the web tier)."""
    now = timezone.now()
    cluster = Cluster.objects.create(
        name=name, slurmrestd_url="http://127.0.0.1:9", jwt_key_file="/nonexistent", log_root="/tmp/matrix-logs"
    )
    Node.objects.create(
        cluster=cluster, name="n1", state="idle", cpus=8, memory_mb=16384, gpu_type="h100", gpus_total=4, synced_at=now
    )
    Partition.objects.create(
        cluster=cluster,
        name="gpu",
        state="UP",
        is_default=True,
        max_time_minutes=600,
        node_names=["n1"],
        gpu_types=["h100"],
        max_gpus_per_node=4,
        max_cpus_per_node=8,
        max_memory_mb_per_node=16384,
        gpus_per_node_by_type={"h100": 4},
        synced_at=now,
    )
    GpuType.objects.create(cluster=cluster, name="h100", gpus_total=4, max_gpus_per_node=4, synced_at=now)
    return cluster


def give_cluster_accounts(cluster: Cluster, users: dict[str, Any], roles: tuple[str, ...]) -> None:
    for index, role in enumerate(roles):
        ClusterAccount.objects.create(cluster=cluster, user=users[role], username=f"matrix{index}")


def grant_allocation(
    project: Project,
    cluster: Cluster,
    gpu_hours: Decimal | int | str = 1000,
    *,
    gpu_type: str = "",
    starts_on: date | None = None,
    ends_on: date | None = None,
) -> Allocation:
    """GPU-hours for `project` on `cluster`, by default for a period around today that tests cannot outrun."""
    today = timezone.now().date()
    return allocation_create(
        actor=None,
        project=project,
        cluster=cluster,
        gpu_hours=Decimal(str(gpu_hours)),
        gpu_type=gpu_type,
        starts_on=starts_on or today - timedelta(days=1),
        ends_on=ends_on or today + timedelta(days=30),
    )


def make_job(cluster: Cluster | None = None, *, allocation_gpu_hours: int | None = None, **fields: Any) -> Job:
    """A job row in a new project of a new tenant, by a member whose cluster username is alice.

    Stored directly, without the submit service: for tests of what happens to a job after it reached Slurm.
    `fields` override the defaults (name, partition, gpus, time limit, state); with `allocation_gpu_hours`
    the project gets an allocation on the cluster first.
    """
    cluster = cluster or make_matrix_cluster()
    project = make_project(make_tenant())
    user = make_user()
    add_project_member(project, user)
    ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")
    if allocation_gpu_hours is not None:
        grant_allocation(project, cluster, allocation_gpu_hours)
    defaults: dict[str, Any] = {
        "name": "job",
        "partition": "gpu",
        "gpus": 1,
        "time_limit_minutes": 5,
        "state": JobState.PENDING,
    }
    return Job.objects.create(
        project=project, cluster=cluster, user=user, cluster_username="alice", **{**defaults, **fields}
    )
