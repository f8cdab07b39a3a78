"""Reads for clusters, their inventory and utilisation, and the projects' Slurm accounts on them."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, Prefetch, QuerySet
from django.http import Http404

from clusters.models import (
    Cluster,
    ClusterAccount,
    ClusterUsageSample,
    GpuType,
    Node,
    Partition,
    ProjectSlurmAccount,
    SlurmDriftReport,
)
from clusters.slurm.codecs.base import SWITCH_FEATURE_PREFIX, expand_hostlist
from clusters.usage_samples import UNAVAILABLE_NODE_STATES
from tenants.models import SUBMITTING_PROJECT_ROLES, Project, ProjectMembership, Tenant
from tenants.selectors import AnyUser, is_portal_admin


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


def cluster_usage_latest(*, cluster: Cluster) -> ClusterUsageSample | None:
    """The cluster's most recent utilisation sample (None before its first sync)."""
    return ClusterUsageSample.objects.filter(cluster=cluster).order_by("-at").first()


@dataclass(frozen=True)
class UsagePoint:
    at: datetime
    gpus_total: int
    gpus_used: int


def cluster_usage_series(
    *, cluster: Cluster, since: datetime, until: datetime | None = None, max_points: int = 720
) -> list[UsagePoint]:
    """GPUs in use and in total from `since`, oldest first; thinned to at most `max_points` evenly spaced samples
    (the 7-day chart would otherwise carry 10,080 points)."""
    samples = ClusterUsageSample.objects.filter(cluster=cluster, at__gte=since)
    if until is not None:
        samples = samples.filter(at__lte=until)
    rows = list(samples.order_by("at").values_list("at", "gpus_total", "gpus_used"))
    step = max(1, -(-len(rows) // max_points))
    thinned = rows[::step]
    if rows and thinned[-1] is not rows[-1]:
        thinned.append(rows[-1])  # always end on the latest figures
    return [UsagePoint(at=at, gpus_total=total, gpus_used=used) for at, total, used in thinned]


@dataclass(frozen=True)
class PartitionQueue:
    name: str
    pending: int
    running: int
    pending_gpus: int
    running_gpus: int
    pending_reasons: dict[str, int]


def cluster_queue_by_partition(*, cluster: Cluster, sample: ClusterUsageSample | None) -> list[PartitionQueue] | None:
    """Pending and running jobs per partition from the sample (every synced partition listed, zeros included);
    None when the sample's queue is unknown."""
    if sample is None or sample.partitions is None:
        return None
    queue: dict[str, dict[str, Any]] = dict(sample.partitions)
    names = sorted(set(cluster.partitions.values_list("name", flat=True)) | set(queue))
    rows = []
    for name in names:
        entry = queue.get(name, {})
        rows.append(
            PartitionQueue(
                name=name,
                pending=int(entry.get("pending", 0)),
                running=int(entry.get("running", 0)),
                pending_gpus=int(entry.get("pending_gpus", 0)),
                running_gpus=int(entry.get("running_gpus", 0)),
                pending_reasons=dict(entry.get("pending_reasons", {})),
            )
        )
    return rows


@dataclass(frozen=True)
class GpuTypeQueue:
    """Jobs of one partition that ask for one GPU type ("": any type, or none), waiting and running."""

    partition: str
    gpu_type: str
    pending: int
    pending_gpus: int
    running: int | None  # None: the sample predates the running figures per type
    running_gpus: int | None


def cluster_queue_by_gpu_type(*, sample: ClusterUsageSample | None) -> list[GpuTypeQueue] | None:
    """The sample's queue split by partition and the GPU type the jobs ask for, by partition then type; None when
    the queue is unknown. Jobs asking for no particular type are the type "" (the page says "any")."""
    if sample is None or sample.partitions is None:
        return None
    rows = []
    for partition, entry in sorted(dict(sample.partitions).items()):
        pending = dict(entry.get("pending_by_gpu_type", {}))
        running = entry.get("running_by_gpu_type")
        types = set(pending) | set(running or {})
        for gpu_type in sorted(types):
            waiting = pending.get(gpu_type, {})
            held = (running or {}).get(gpu_type, {})
            rows.append(
                GpuTypeQueue(
                    partition=partition,
                    gpu_type=gpu_type,
                    pending=int(waiting.get("jobs", 0)),
                    pending_gpus=int(waiting.get("gpus", 0)),
                    running=None if running is None else int(held.get("jobs", 0)),
                    running_gpus=None if running is None else int(held.get("gpus", 0)),
                )
            )
    return rows


@dataclass(frozen=True)
class GpuTypeUsage:
    name: str
    total: int
    used: int
    idle: int  # free on nodes that take jobs
    unavailable: int  # free but on drained or down nodes

    @property
    def percent_used(self) -> int:
        return round(100 * self.used / self.total) if self.total else 0


def cluster_gpu_type_usage(*, cluster: Cluster) -> list[GpuTypeUsage]:
    """GPUs per type as of the last inventory sync: in use, idle, and free but on nodes that take no jobs."""
    unavailable_states = [state.value for state in UNAVAILABLE_NODE_STATES]
    figures: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for gpu_type, state, total, used in cluster.nodes.exclude(gpu_type="").values_list(
        "gpu_type", "state", "gpus_total", "gpus_used"
    ):
        entry = figures[gpu_type]
        entry[0] += total
        entry[1] += used
        entry[3 if state in unavailable_states else 2] += total - used
    return [
        GpuTypeUsage(name=name, total=total, used=used, idle=idle, unavailable=unavailable)
        for name, (total, used, idle, unavailable) in sorted(figures.items())
        if total
    ]


@dataclass(frozen=True)
class IdleWhileWaiting:
    """GPUs of one type (or of any type: `gpu_type` "") free in a partition while jobs there wait for GPUs."""

    partition: str
    gpu_type: str
    idle_gpus: int
    waiting_jobs: int
    waiting_gpus: int
    pending_reasons: dict[str, int]


def cluster_idle_while_waiting(*, cluster: Cluster, sample: ClusterUsageSample | None) -> list[IdleWhileWaiting]:
    """Where GPUs sit idle on nodes that take jobs while jobs wait in the same partition for that GPU type.

    Nodes are as of the last inventory sync, the queue as of the sample; jobs asking for no particular type
    count against every type in their partition."""
    if sample is None or not sample.partitions:
        return []
    unavailable_states = [state.value for state in UNAVAILABLE_NODE_STATES]
    idle: dict[tuple[str, str], int] = defaultdict(int)
    for gpu_type, partitions, total, used in (
        cluster.nodes.exclude(gpu_type="")
        .exclude(state__in=unavailable_states)
        .values_list("gpu_type", "partition_names", "gpus_total", "gpus_used")
    ):
        for partition in partitions:
            idle[(partition, gpu_type)] += total - used
    findings = []
    for partition, entry in sorted(dict(sample.partitions).items()):
        reasons = dict(entry.get("pending_reasons", {}))
        for gpu_type, waiting in sorted(dict(entry.get("pending_by_gpu_type", {})).items()):
            if not waiting.get("gpus"):
                continue  # jobs asking for no GPU do not wait for one
            if gpu_type:
                free = idle.get((partition, gpu_type), 0)
            else:
                free = sum(count for (name, _), count in idle.items() if name == partition)
            if free > 0:
                findings.append(
                    IdleWhileWaiting(
                        partition=partition,
                        gpu_type=gpu_type,
                        idle_gpus=free,
                        waiting_jobs=int(waiting["jobs"]),
                        waiting_gpus=int(waiting["gpus"]),
                        pending_reasons=reasons,
                    )
                )
    return findings


def cluster_node_state_counts(*, cluster: Cluster) -> dict[str, int]:
    """How many nodes are in each state (idle, mixed, allocated, draining, drained, down, unknown)."""
    rows = Node.objects.filter(cluster=cluster).values("state").annotate(count=Count("pk")).order_by("state")
    return {row["state"]: row["count"] for row in rows}


# What a submission checks against -------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmissionTarget:
    """An active cluster as its last sync left it, with its partitions and the submitting user's username there
    (None: the user has no cluster account on it)."""

    cluster: Cluster
    partitions: dict[str, Partition]
    username: str | None


_PARTITION_FIELDS = (
    "name",
    "is_default",
    "max_time_minutes",
    "default_time_minutes",
    "gpu_types",
    "max_gpus_per_node",
    "max_cpus_per_node",
    "max_memory_mb_per_node",
    "gpus_per_node_by_type",
    "node_names",
    "gpu_nodes_by_type",
    "nodes_by_switch",
)


def submission_target_get(*, cluster_name: str, user: AnyUser) -> SubmissionTarget | None:
    """The active cluster `cluster_name` as a submission checks against it; None when no such cluster is active."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {SUBMISSION_TARGET_SQL}", submission_target_parameters(cluster_name=cluster_name, user=user)
        )
        return submission_target_from(cursor.fetchone()[0])


def submission_target_parameters(*, cluster_name: str, user: AnyUser) -> dict[str, Any]:
    return {"target_cluster_name": cluster_name, "target_user_id": user.pk if user.is_authenticated else None}


def submission_target_from(data: dict[str, Any] | str | None) -> SubmissionTarget | None:
    """Decodes what `SUBMISSION_TARGET_SQL` answers."""
    if data is None:
        return None
    if isinstance(data, str):  # Django's psycopg setup leaves jsonb undecoded
        data = json.loads(data)
        assert isinstance(data, dict)
    cluster = Cluster(
        id=data["id"],
        name=data["name"],
        log_root=data["log_root"],
        api_version=data.get("api_version") or "",
        is_active=True,
    )
    partitions = {partition["name"]: Partition(cluster=cluster, **partition) for partition in data["partitions"] or []}
    return SubmissionTarget(cluster=cluster, partitions=partitions, username=data["username"])


# What a submission checks against, as one scalar SQL expression (JSON, or null when no such cluster is active)
# with the parameters of `submission_target_parameters`: a submission reads it in the query that reads its
# project. Written out rather than built with the ORM, whose building and compiling of it cost more CPU than the
# rest of a submission's queries together (bench/job_submission.py). The partition fields are `_PARTITION_FIELDS`.
SUBMISSION_TARGET_SQL = """(
    SELECT jsonb_build_object(
        'id', c.id, 'name', c.name, 'log_root', c.log_root, 'api_version', c.api_version,
        'username', (
            SELECT a.username FROM clusters_clusteraccount a
            WHERE a.cluster_id = c.id AND a.user_id = %(target_user_id)s
            LIMIT 1
        ),
        'partitions', ARRAY(
            SELECT jsonb_build_object(
                'name', p.name, 'is_default', p.is_default, 'max_time_minutes', p.max_time_minutes,
                'default_time_minutes', p.default_time_minutes, 'gpu_types', p.gpu_types,
                'max_gpus_per_node', p.max_gpus_per_node, 'max_cpus_per_node', p.max_cpus_per_node,
                'max_memory_mb_per_node', p.max_memory_mb_per_node, 'gpus_per_node_by_type', p.gpus_per_node_by_type,
                'node_names', p.node_names, 'gpu_nodes_by_type', p.gpu_nodes_by_type,
                'nodes_by_switch', p.nodes_by_switch
            )
            FROM clusters_partition p WHERE p.cluster_id = c.id ORDER BY p.name
        )
    )
    FROM clusters_cluster c WHERE c.name = %(target_cluster_name)s AND c.is_active
    LIMIT 1
)"""


# Network topology --------------------------------------------------------------------------------------


def node_switch_map(*, cluster_id: int) -> dict[str, str]:
    """Each node of the cluster and its leaf switch ("" where the sync knows none), as last synced."""
    return dict(Node.objects.filter(cluster_id=cluster_id).values_list("name", "switch"))


def node_switches_of(*, cluster_id: int, nodes: str, switch_of: Mapping[str, str] | None = None) -> list[str]:
    """The leaf switches the nodes of a Slurm host list ("gpu[01-02]") hang under, in node order, each once; a node
    the sync knows no switch for is left out (so [] when the cluster describes none). `switch_of`: the cluster's
    `node_switch_map`, when the caller has it (no query then)."""
    names = expand_hostlist(nodes)
    if not names:
        return []
    if switch_of is None:
        switch_of = dict(Node.objects.filter(cluster_id=cluster_id, name__in=names).values_list("name", "switch"))
    switches: list[str] = []
    for name in names:
        switch = switch_of.get(name, "")
        if switch and switch not in switches:
            switches.append(switch)
    return switches


def one_switch_constraint(*, cluster_id: int, partition: str) -> str:
    """Slurm's matching-OR constraint that puts all of a job's nodes under one of the partition's leaf switches:
    "[switch-leaf1|switch-leaf2]" (how API v0.0.38, which refuses `required_switches`, asks for one switch)."""
    found = Partition.objects.filter(cluster_id=cluster_id, name=partition).values_list("nodes_by_switch", flat=True)
    switches = sorted(next(iter(found), None) or {})
    return f"[{'|'.join(SWITCH_FEATURE_PREFIX + switch for switch in switches)}]" if switches else ""
