"""Job shapes a project's open allocations cover: where the submit form and its templates start, so that a
member is not offered, by default, a partition or GPU type their project has no GPU-hours for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from clusters.models import Cluster, Node, Partition
from jobs.models import Job
from quotas.models import Allocation
from quotas.services import allocation_for
from tenants.models import Project


@dataclass(frozen=True)
class CoveredShape:
    """A cluster, partition and GPU type ("" for any type) that one of the project's open allocations covers."""

    cluster: Cluster
    partition: str
    gpu_type: str
    allocation: Allocation


def covered_shape_choose(
    *, project: Project, clusters: Sequence[Cluster], now: datetime | None = None
) -> CoveredShape | None:
    """The first shape, in the order of `clusters`, that an allocation of `project` open today covers; None when
    no allocation covers any partition of them.

    On each cluster, allocations with GPU-hours left come first, and among those one for any GPU type (which
    keeps the cluster's default partition) before those for one type. An allocation for one type is matched
    to a partition offering that type: the cluster's default partition if it does, else a partition that
    offers only that type, else any other that offers it.
    """
    if not clusters:
        return None
    today = (now or timezone.now()).date()
    allocations = list(
        Allocation.objects.filter(
            project=project, cluster__in=[cluster.pk for cluster in clusters], starts_on__lte=today, ends_on__gte=today
        )
    )
    partitions: dict[int, list[Partition]] = {}
    for partition in Partition.objects.filter(cluster__in=[cluster.pk for cluster in clusters]).order_by("name"):
        partitions.setdefault(partition.cluster_id, []).append(partition)
    for cluster in clusters:
        mine = sorted(
            (allocation for allocation in allocations if allocation.cluster_id == cluster.pk),
            key=lambda allocation: (
                allocation.remaining_gpu_seconds <= 0,
                allocation.gpu_type != "",
                allocation.gpu_type,
            ),
        )
        for allocation in mine:
            chosen = _partition_for(partitions.get(cluster.pk, []), gpu_type=allocation.gpu_type)
            if chosen is not None:
                return CoveredShape(
                    cluster=cluster, partition=chosen.name, gpu_type=allocation.gpu_type, allocation=allocation
                )
    return None


def _partition_for(partitions: list[Partition], *, gpu_type: str) -> Partition | None:
    offering = [partition for partition in partitions if not gpu_type or gpu_type in partition.gpu_types]
    if not offering:
        return None
    return min(
        offering,
        key=lambda partition: (not partition.is_default, list(partition.gpu_types) != [gpu_type], partition.name),
    )


@dataclass(frozen=True)
class FreeAlternative:
    """A partition and GPU type where a waiting job could start now: one node there has `free_gpus` of that type
    free (as last synced), and an open allocation of the job's project covers it with room for the job."""

    partition: str
    gpu_type: str
    free_gpus: int


_USABLE_NODE_STATES = ("idle", "mixed")


def free_alternatives(*, job: Job, now: datetime | None = None) -> list[FreeAlternative]:
    """Other shapes on the job's cluster where it could start now instead of waiting, best first (most free GPUs).

    Only single-node shapes are offered, as the portal's jobs run on one node: a node of the partition, up and
    not drained, must have the job's GPUs free of one type, and its CPUs if the job names them; the partition
    must allow the job's time limit; and the allocation the job would draw on there must have its GPU-hours left.
    """
    today = (now or timezone.now()).date()
    allocations = list(
        Allocation.objects.filter(
            project_id=job.project_id, cluster_id=job.cluster_id, starts_on__lte=today, ends_on__gte=today
        )
    )
    if job.node_count > 1:
        return []  # a multi-node job needs several nodes free at once: not a shape this offers
    needed = job.gpus * job.time_limit_minutes * 60
    nodes = list(Node.objects.filter(cluster_id=job.cluster_id, state__in=_USABLE_NODE_STATES))
    found: list[FreeAlternative] = []
    for partition in Partition.objects.filter(cluster_id=job.cluster_id, state__iexact="up").order_by("name"):
        if partition.max_time_minutes is not None and job.time_limit_minutes > partition.max_time_minutes:
            continue
        for gpu_type in partition.gpu_types:
            if partition.name == job.partition and (not job.gpu_type or gpu_type == job.gpu_type):
                continue  # where it waits already
            allocation = allocation_for(candidates=allocations, gpu_type=gpu_type)
            if allocation is None or allocation.remaining_gpu_seconds < needed:
                continue
            free = max(
                (
                    node.gpus_total - node.gpus_used
                    for node in nodes
                    if node.name in partition.node_names
                    and node.gpu_type == gpu_type
                    and (job.cpus is None or node.cpus - node.cpus_allocated >= job.cpus)
                ),
                default=0,
            )
            if free >= job.gpus:
                found.append(FreeAlternative(partition=partition.name, gpu_type=gpu_type, free_gpus=free))
    return sorted(found, key=lambda alternative: -alternative.free_gpus)
