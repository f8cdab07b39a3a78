"""Writes for clusters: recording their health, storing the inventory synced from Slurm, people's POSIX users."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from clusters.consumers import CLUSTER_STATUS_GROUP
from clusters.models import Cluster, ClusterAccount, GpuType, Node, Partition
from clusters.selectors import cluster_status
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import NodeInfo, PartitionInfo, PingResult
from clusters.usage_samples import cluster_usage_sample_record
from portal.channel_sends import group_send_all
from portal.queue import task_enqueue_on_commit
from tenants.models import SUBMITTING_PROJECT_ROLES, ProjectMembership
from tenants.services import Actor, audit_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterProbe:
    """What a cluster said when it was registered: its API versions, health and inventory."""

    served_versions: tuple[str, ...]
    ping: PingResult
    partitions: list[PartitionInfo]
    nodes: list[NodeInfo]

    @property
    def gpus_by_type(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for node in self.nodes:
            if node.gpu_type:
                totals[node.gpu_type] += node.gpus_total
        return dict(totals)


def cluster_probe(*, slurmrestd_url: str, jwt_key_file: str, admin_user: str, log_root: str) -> ClusterProbe:
    """Connect to a cluster that is not registered yet: negotiate the API version, ping it, read its inventory.

    Raises SlurmError (or OSError for an unreadable key) with what is wrong. Runs where the key is: a worker's
    host or an admin's shell there, never the web tier.
    """
    with SlurmClient(base_url=slurmrestd_url, key_file=jwt_key_file, admin_user=admin_user) as client:
        client.tokens.token_for(admin_user)  # an unreadable key file fails here, with its path
        try:
            served = client.served_versions()
        except SlurmError:
            served = ()  # an older slurmrestd without /openapi/v3: the version is probed instead
        ping = client.ping()
        return ClusterProbe(served_versions=served, ping=ping, partitions=client.partitions(), nodes=client.nodes())


def cluster_register(
    *, name: str, probe: ClusterProbe | None, slurmrestd_url: str, jwt_key_file: str, admin_user: str, log_root: str
) -> tuple[Cluster, bool]:
    """Store a cluster's connection (new or changed) and, when it was probed, its version, health and inventory."""
    connection = {
        "slurmrestd_url": slurmrestd_url,
        "jwt_key_file": jwt_key_file,
        "admin_user": admin_user,
        "log_root": log_root,
        "is_active": True,
    }
    with transaction.atomic():
        cluster = Cluster.objects.filter(name=name).first()
        created = cluster is None
        if cluster is None:
            cluster = Cluster(name=name)
        for field, value in connection.items():
            setattr(cluster, field, value)
        if probe is not None:
            now = timezone.now()
            cluster.api_version = probe.ping.api_version
            cluster.slurm_release = probe.ping.slurm_release or ""
            cluster.last_ping_at = now
            cluster.last_ping_ok = probe.ping.responding
            cluster.last_ping_latency_ms = round(probe.ping.latency_seconds * 1000, 2)
            cluster.last_ping_error = "" if probe.ping.responding else "slurmctld not responding"
        else:
            # Whatever was negotiated with an earlier address no longer holds.
            cluster.api_version = ""
        cluster.full_clean()
        cluster.save()
        if probe is not None:
            _store_nodes(cluster=cluster, nodes=probe.nodes, now=now)
            _store_partitions(cluster=cluster, partitions=probe.partitions, nodes=probe.nodes, now=now)
            _store_gpu_types(cluster=cluster, nodes=probe.nodes, now=now)
            Cluster.objects.filter(pk=cluster.pk).update(inventory_synced_at=now)
        transaction.on_commit(lambda: _push_status(cluster_pk=cluster.pk))
    return cluster, created


def _cluster_connection_state(cluster: Cluster) -> dict[str, str]:
    return {
        "name": cluster.name,
        "slurmrestd_url": cluster.slurmrestd_url,
        "jwt_key_file": cluster.jwt_key_file,
        "admin_user": cluster.admin_user,
        "log_root": cluster.log_root,
    }


def cluster_create(
    *, actor: Actor, name: str, slurmrestd_url: str, jwt_key_file: str, admin_user: str, log_root: str
) -> Cluster:
    """Register a new cluster from the admin console, then have a worker check it.

    The web tier never reads the cluster's key (it is root on the cluster), so nothing is probed here: the
    connection is stored as `cluster_add --no-check` stores it, and the worker's check records the version,
    health and inventory that the console then shows.
    """
    if Cluster.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"A cluster '{name}' is already registered; choose another name."]})
    with transaction.atomic():
        cluster, _ = cluster_register(
            name=name,
            probe=None,
            slurmrestd_url=slurmrestd_url,
            jwt_key_file=jwt_key_file,
            admin_user=admin_user,
            log_root=log_root,
        )
        audit_record(
            actor=actor,
            action="cluster.registered",
            target=cluster,
            tenant=None,
            before=None,
            after=_cluster_connection_state(cluster),
        )
        cluster_check_request(cluster=cluster)
    return cluster


def cluster_check_request(*, cluster: Cluster) -> None:
    """Have a worker check the cluster now (ping, version, inventory) instead of at the next periodic sync."""
    task_enqueue_on_commit(
        "clusters.tasks.cluster_sync", cluster.pk, fallback="the periodic health check runs within a minute"
    )


def cluster_check(*, cluster: Cluster, client: SlurmClient) -> bool:
    """Ping the cluster (detecting its API version on first contact) and record the outcome."""
    now = timezone.now()
    try:
        result = client.ping()
    except SlurmError as exc:
        cluster_unreachable_record(cluster_id=cluster.pk, error=str(exc), at=now)
        logger.warning("cluster %s: ping failed: %s", cluster.name, exc)
        return False
    error = "" if result.responding else "slurmrestd answers but reports slurmctld not responding"
    Cluster.objects.filter(pk=cluster.pk).update(
        api_version=result.api_version,
        slurm_release=result.slurm_release or "",
        last_ping_at=now,
        last_ping_ok=result.responding,
        last_ping_latency_ms=round(result.latency_seconds * 1000, 2),
        last_ping_error=error,
    )
    cluster.refresh_from_db()
    return result.responding


def cluster_unreachable_record(*, cluster_id: int, error: str, at: datetime | None = None) -> None:
    """Record that the cluster did not answer: its status shows it unreachable until a health check succeeds.

    Any worker task that meets the outage records it, not only the periodic health check: while slurmctld is
    down every slurmrestd request takes about 9 s to fail, so deliveries can keep every worker busy and the
    check waits in the queue behind them (the slurmctld drill saw the portal show "ok" through a 45 s outage).
    Watchers are told when the cluster goes from reachable to unreachable.
    """
    fields = {"last_ping_at": at or timezone.now(), "last_ping_ok": False, "last_ping_error": error}
    went_down = Cluster.objects.filter(pk=cluster_id, last_ping_ok=True).update(**fields)
    if went_down:
        transaction.on_commit(lambda: _push_status(cluster_pk=cluster_id))
    else:
        Cluster.objects.filter(pk=cluster_id).update(**fields)


def cluster_sync_inventory(*, cluster: Cluster, client: SlurmClient) -> None:
    """Replace the stored partitions, nodes and GPU types with what Slurm reports now."""
    nodes = client.nodes()
    partitions = client.partitions()
    now = timezone.now()
    with transaction.atomic():
        _store_nodes(cluster=cluster, nodes=nodes, now=now)
        _store_partitions(cluster=cluster, partitions=partitions, nodes=nodes, now=now)
        _store_gpu_types(cluster=cluster, nodes=nodes, now=now)
        Cluster.objects.filter(pk=cluster.pk).update(inventory_synced_at=now)
        transaction.on_commit(lambda: _push_status(cluster_pk=cluster.pk))
    # The utilisation history of the status pages: one sample a minute, never a reason to fail the sync.
    try:
        with transaction.atomic():
            cluster_usage_sample_record(cluster=cluster, client=client, nodes=nodes, now=now)
    except Exception:
        logger.exception("cluster %s: could not record the usage sample", cluster.name)


def _push_status(*, cluster_pk: int) -> None:
    """Tell the browsers watching cluster status; a lost push only delays what the next sync shows."""
    cluster = Cluster.objects.get(pk=cluster_pk)
    try:
        group_send_all([(CLUSTER_STATUS_GROUP, {"type": "cluster.status", "cluster": cluster_status(cluster=cluster)})])
    except Exception:  # Redis down must not fail the sync; the database already holds the truth.
        logger.warning("cluster %s: could not push status to watchers", cluster.name, exc_info=True)


def _store_nodes(*, cluster: Cluster, nodes: list[NodeInfo], now: datetime) -> None:
    for node in nodes:
        Node.objects.update_or_create(
            cluster=cluster,
            name=node.name,
            defaults={
                "state": node.state.value,
                "state_flags": list(node.state_flags),
                "reason": node.reason[:500],
                "partition_names": list(node.partitions),
                "cpus": node.cpus,
                "cpus_allocated": node.cpus_allocated,
                "memory_mb": node.real_memory_mb,
                "gpu_type": node.gpu_type or "",
                "gpus_total": node.gpus_total,
                "gpus_used": min(node.gpus_used, node.gpus_total),
                "switch": node.switch[:64],
                "synced_at": now,
            },
        )
    Node.objects.filter(cluster=cluster).exclude(name__in=[node.name for node in nodes]).delete()


def _store_partitions(
    *, cluster: Cluster, partitions: list[PartitionInfo], nodes: list[NodeInfo], now: datetime
) -> None:
    nodes_by_name = {node.name: node for node in nodes}
    for partition in partitions:
        # Partitions list their nodes; nodes list their partitions. Either may be empty depending on version.
        members = [nodes_by_name[name] for name in partition.nodes if name in nodes_by_name] or [
            node for node in nodes if partition.name in node.partitions
        ]
        gpu_types = sorted({node.gpu_type for node in members if node.gpu_type and node.gpus_total})
        gpus_by_type: dict[str, int] = {}
        gpu_nodes_by_type: dict[str, int] = defaultdict(int)
        nodes_by_switch: dict[str, int] = defaultdict(int)
        for node in members:
            if node.gpu_type and node.gpus_total:
                gpus_by_type[node.gpu_type] = max(gpus_by_type.get(node.gpu_type, 0), node.gpus_total)
                gpu_nodes_by_type[node.gpu_type] += 1
            if node.switch:
                nodes_by_switch[node.switch] += 1
        Partition.objects.update_or_create(
            cluster=cluster,
            name=partition.name,
            defaults={
                "state": partition.state,
                "is_default": partition.is_default,
                "max_time_minutes": partition.max_time_minutes,
                "default_time_minutes": partition.default_time_minutes,
                "node_names": [node.name for node in members],
                "gpu_types": gpu_types,
                "max_gpus_per_node": max((node.gpus_total for node in members), default=0),
                "max_cpus_per_node": max((node.cpus for node in members), default=0),
                "max_memory_mb_per_node": max((node.real_memory_mb for node in members), default=0),
                "gpus_per_node_by_type": gpus_by_type,
                "gpu_nodes_by_type": dict(gpu_nodes_by_type),
                "nodes_by_switch": dict(sorted(nodes_by_switch.items())),
                "synced_at": now,
            },
        )
    Partition.objects.filter(cluster=cluster).exclude(name__in=[p.name for p in partitions]).delete()


def _store_gpu_types(*, cluster: Cluster, nodes: list[NodeInfo], now: datetime) -> None:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for node in nodes:
        if node.gpu_type and node.gpus_total:
            entry = totals[node.gpu_type]
            entry[0] += node.gpus_total
            entry[1] += min(node.gpus_used, node.gpus_total)
            entry[2] = max(entry[2], node.gpus_total)
    for name, (total, used, per_node) in totals.items():
        GpuType.objects.update_or_create(
            cluster=cluster,
            name=name,
            defaults={"gpus_total": total, "gpus_used": used, "max_gpus_per_node": per_node, "synced_at": now},
        )
    GpuType.objects.filter(cluster=cluster).exclude(name__in=list(totals)).delete()


@transaction.atomic
def cluster_account_set(*, actor: Actor, cluster: Cluster, user: User, username: str) -> ClusterAccount:
    """The POSIX user `user`'s jobs run as on `cluster`, audited; the Slurm associations of their projects follow
    after commit. Nothing changes (and nothing is audited) when it is already so."""
    account = ClusterAccount.objects.select_for_update(of=("self",)).filter(cluster=cluster, user=user).first()
    before = _cluster_account_state(account) if account is not None else None
    if account is not None and account.username == username:
        return account
    if account is None:
        account = ClusterAccount.objects.create(cluster=cluster, user=user, username=username)
    else:
        account.username = username
        account.save(update_fields=["username"])
    audit_record(
        actor=actor,
        action="cluster_account.set",
        target=account,
        tenant=None,
        before=before,
        after=_cluster_account_state(account),
    )
    project_ids = ProjectMembership.objects.filter(user=user, role__in=SUBMITTING_PROJECT_ROLES).values_list(
        "project_id", flat=True
    )
    for project_id in project_ids:
        task_enqueue_on_commit(
            "clusters.tasks.project_slurm_sync",
            project_id,
            fallback="the periodic reconcile brings the project's Slurm associations in line",
        )
    return account


def _cluster_account_state(account: ClusterAccount) -> dict[str, str]:
    return {"cluster": account.cluster.name, "user": account.user.get_username(), "username": account.username}
