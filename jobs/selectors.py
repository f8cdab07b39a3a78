"""Reads for clusters, their inventory, and the projects' Slurm accounts on them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from django.db.models import QuerySet

from jobs.models import Cluster, ClusterAccount, ProjectSlurmAccount, SlurmDriftReport
from tenants.models import SUBMITTING_PROJECT_ROLES, Project, ProjectMembership, Tenant


def cluster_list_active() -> QuerySet[Cluster]:
    return Cluster.objects.filter(is_active=True).order_by("name")


def cluster_status(*, cluster: Cluster) -> dict[str, object]:
    """The cluster's last recorded health and inventory, as pushed to watchers and shown on status pages."""
    return {
        "name": cluster.name,
        "ok": cluster.last_ping_ok,
        "api_version": cluster.api_version,
        "checked_at": cluster.last_ping_at.isoformat() if cluster.last_ping_at else None,
        "error": cluster.last_ping_error,
        "gpu_types": [
            {"name": gpu.name, "total": gpu.gpus_total, "used": gpu.gpus_used}
            for gpu in cluster.gpu_types.order_by("name")
        ],
        "nodes": [
            {
                "name": node.name,
                "state": node.state,
                "gpu_type": node.gpu_type,
                "gpus_total": node.gpus_total,
                "gpus_used": node.gpus_used,
            }
            for node in cluster.nodes.order_by("name")
        ],
    }


# Projects' Slurm accounts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectSlurmTarget:
    """What Slurm should hold for one project on one cluster, according to the portal."""

    project_id: int
    project_label: str  # tenant/project, for messages
    project_name: str
    account: str
    tenant_slug: str
    tenant_name: str
    parent_account: str
    # Cluster usernames of the active members with a submitting role.
    cluster_usernames: frozenset[str]
    # Portal usernames of active submitting members with no username on the cluster, sorted.
    members_without_username: tuple[str, ...]


def project_slurm_targets(*, cluster: Cluster, project_ids: Collection[int] | None = None) -> list[ProjectSlurmTarget]:
    """The desired Slurm state of the given projects (all when None) on `cluster`, in three queries."""
    projects = Project.objects.select_related("tenant").order_by("pk")
    if project_ids is not None:
        projects = projects.filter(pk__in=project_ids)
    project_list = list(projects)
    # A deactivated portal user keeps no Slurm association: they could otherwise go on using the
    # cluster directly (sbatch on a login node) after losing the portal.
    memberships = ProjectMembership.objects.filter(
        project__in=[project.pk for project in project_list],
        role__in=SUBMITTING_PROJECT_ROLES,
        user__is_active=True,
    ).values_list("project_id", "user_id", "user__username")
    members_by_project: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for project_id, user_id, username in memberships:
        members_by_project[project_id].append((user_id, username))
    user_ids = {user_id for members in members_by_project.values() for user_id, _ in members}
    cluster_usernames = dict(
        ClusterAccount.objects.filter(cluster=cluster, user_id__in=user_ids).values_list("user_id", "username")
    )
    targets = []
    for project in project_list:
        members = members_by_project.get(project.pk, [])
        targets.append(
            ProjectSlurmTarget(
                project_id=project.pk,
                project_label=f"{project.tenant.slug}/{project.slug}",
                project_name=project.name,
                account=project.slurm_account,
                tenant_slug=project.tenant.slug,
                tenant_name=project.tenant.name,
                parent_account=project.tenant.slurm_parent_account,
                cluster_usernames=frozenset(
                    cluster_usernames[user_id] for user_id, _ in members if user_id in cluster_usernames
                ),
                members_without_username=tuple(
                    sorted(username for user_id, username in members if user_id not in cluster_usernames)
                ),
            )
        )
    return targets


def tenant_parent_account_names() -> set[str]:
    """Every tenant's parent account name: the Slurm subtrees the portal manages."""
    return set(Tenant.objects.values_list("slurm_parent_account", flat=True))


def project_account_names() -> set[str]:
    return set(Project.objects.values_list("slurm_account", flat=True))


def project_slurm_account_list(*, project: Project) -> list[ProjectSlurmAccount]:
    """The project's account on each cluster: its recorded row, or a pending (unsaved) one for an active
    cluster the workers have not synced the project to yet. Ordered by cluster name."""
    rows = {
        row.cluster_id: row
        for row in ProjectSlurmAccount.objects.filter(project=project).select_related("cluster", "project")
    }
    for cluster in cluster_list_active():
        if cluster.pk not in rows:
            rows[cluster.pk] = ProjectSlurmAccount(project=project, cluster=cluster)
    return sorted(rows.values(), key=lambda row: row.cluster.name)


def slurm_drift_report_list(*, cluster_name: str | None = None) -> QuerySet[SlurmDriftReport]:
    reports = SlurmDriftReport.objects.select_related("cluster").order_by("-started_at", "-id")
    if cluster_name:
        reports = reports.filter(cluster__name=cluster_name)
    return reports
