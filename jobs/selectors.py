"""Reads for clusters, their inventory, and the projects' Slurm accounts on them."""

from __future__ import annotations

import enum
import uuid
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch, QuerySet
from django.http import Http404

from jobs.models import (
    Cluster,
    ClusterAccount,
    GpuType,
    Job,
    JobTemplate,
    JobTransition,
    Partition,
    ProjectSlurmAccount,
    SlurmDriftReport,
)
from tenants.models import SUBMITTING_PROJECT_ROLES, Project, ProjectMembership, Tenant
from tenants.selectors import AnyUser, ProjectAction, is_portal_admin, project_get_by_id_for_user, project_list_for_user


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


# Clusters a user may submit to ---------------------------------------------------------------------------


def cluster_list_for_user(*, user: AnyUser) -> QuerySet[Cluster]:
    """Active clusters where the user has a username (all active ones for portal admins), with their
    partitions and GPU types prefetched: a constant number of queries whatever their count."""
    if not user.is_authenticated:
        return Cluster.objects.none()
    clusters = cluster_list_active().prefetch_related(
        Prefetch("partitions", queryset=Partition.objects.order_by("name")),
        Prefetch("gpu_types", queryset=GpuType.objects.order_by("name")),
        Prefetch("accounts", queryset=ClusterAccount.objects.filter(user=user.pk), to_attr="my_accounts"),
    )
    if is_portal_admin(user):
        return clusters
    return clusters.filter(accounts__user=user.pk)


def cluster_get_for_user(*, user: AnyUser, name: str) -> Cluster:
    cluster = cluster_list_for_user(user=user).filter(name=name).first()
    if cluster is None:
        raise Http404(f"No cluster '{name}' exists among the ones you can submit to; see GET /api/v1/clusters/.")
    return cluster


# Jobs --------------------------------------------------------------------------------------------------


class JobAction(enum.Enum):
    VIEW = "view"  # anyone who may view the project
    CANCEL = "cancel"  # the job's owner, project managers, tenant admins


def job_list_for_user(*, user: AnyUser) -> QuerySet[Job]:
    """Jobs in projects the user may view, newest first, with what a list row shows joined in."""
    if not user.is_authenticated:
        return Job.objects.none()
    jobs = Job.objects.select_related("project__tenant", "cluster", "user").order_by("-created_at", "-id")
    if is_portal_admin(user):
        return jobs
    return jobs.filter(project__in=project_list_for_user(user=user).values("pk"))


def _job_details() -> QuerySet[Job]:
    return Job.objects.select_related("project__tenant", "cluster", "user").prefetch_related(
        Prefetch("transitions", queryset=JobTransition.objects.order_by("id"))
    )


def job_detail_load(*, job_id: uuid.UUID) -> Job:
    """A job with what its detail view shows, for a caller that has already checked access (after a submit)."""
    return _job_details().get(pk=job_id)


def _job_not_found(job_id: object) -> Http404:
    return Http404(f"No job '{job_id}' exists among the ones you can see; check the id or ask for access.")


def job_get_for_user(*, user: AnyUser, job_id: uuid.UUID | str, action: JobAction = JobAction.VIEW) -> Job:
    """The job if `user` may do `action` on it: 404 for users who may not see its project, 403 otherwise."""
    try:
        job_uuid = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    except ValueError:
        raise _job_not_found(job_id) from None
    job = _job_details().filter(pk=job_uuid).first()
    if job is None:
        raise _job_not_found(job_id)
    try:
        project_get_by_id_for_user(user=user, project_id=job.project_id, action=ProjectAction.VIEW)
    except Http404:
        raise _job_not_found(job_id) from None
    if action is JobAction.CANCEL:
        is_owner = job.user_id is not None and job.user_id == user.pk
        if not is_owner:
            try:
                project_get_by_id_for_user(user=user, project_id=job.project_id, action=ProjectAction.MANAGE)
            except PermissionDenied:
                raise PermissionDenied(
                    f"Only the job's owner, the managers of project '{job.project}' and its tenant's admins "
                    "may cancel this job."
                ) from None
    return job


# Templates -----------------------------------------------------------------------------------------------


def job_template_list_for_user(*, user: AnyUser, project: Project | None = None) -> QuerySet[JobTemplate]:
    """Saved templates of the projects the user may view (of `project` only, when given)."""
    templates = JobTemplate.objects.select_related("project__tenant", "created_by").order_by(
        "project__tenant__slug", "project__slug", "name"
    )
    if project is not None:
        return templates.filter(project=project)
    if is_portal_admin(user):
        return templates
    return templates.filter(project__in=project_list_for_user(user=user).values("pk"))


def job_template_get_for_user(*, user: AnyUser, template_id: str, change: bool = False) -> JobTemplate:
    """A saved template the user may view (404 otherwise); with `change`, also one they may edit or delete:
    its author while they may still submit to the project, or someone who may manage the project."""
    not_found = Http404(
        f"No template '{template_id}' exists among the ones you can see; see GET /api/v1/job-templates/."
    )
    try:
        template_uuid = uuid.UUID(template_id)
    except ValueError:
        raise not_found from None
    template = JobTemplate.objects.select_related("project__tenant", "created_by").filter(pk=template_uuid).first()
    if template is None:
        raise not_found
    try:
        project_get_by_id_for_user(user=user, project_id=template.project_id, action=ProjectAction.VIEW)
    except Http404:
        raise not_found from None
    if change:
        is_author = template.created_by_id is not None and template.created_by_id == user.pk
        action = ProjectAction.SUBMIT if is_author else ProjectAction.MANAGE
        try:
            project_get_by_id_for_user(user=user, project_id=template.project_id, action=action)
        except PermissionDenied:
            raise PermissionDenied(
                f"Only the template's author, the managers of project '{template.project}' and its tenant's "
                "admins may change this template."
            ) from None
    return template
