"""Utilisation history: one sample of a cluster's GPUs and queue per minute, recorded by the inventory sync."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from clusters.models import Cluster, ClusterUsageSample
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import JobState, NodeInfo, NodeState, SlurmJob

logger = logging.getLogger(__name__)

# A month of minutes per cluster (43,200 small rows) is enough for the 24-hour and 7-day charts.
USAGE_SAMPLE_RETENTION = timedelta(days=30)
# Nodes in these states take no jobs: their free GPUs are not "idle while jobs wait".
UNAVAILABLE_NODE_STATES = frozenset({NodeState.DRAINED, NodeState.DRAINING, NodeState.DOWN, NodeState.UNKNOWN})


def sample_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def cluster_usage_sample_record(
    *, cluster: Cluster, client: SlurmClient, nodes: Sequence[NodeInfo], now: datetime
) -> ClusterUsageSample | None:
    """Record this minute's sample unless one exists; asks Slurm for its job listing only when a sample is due."""
    if ClusterUsageSample.objects.filter(cluster=cluster, at=sample_minute(now)).exists():
        return None
    jobs: Sequence[SlurmJob] | None
    try:
        listing = client.list_jobs()
        jobs = listing.jobs if listing is not None else None
    except SlurmError as exc:
        logger.warning("cluster %s: no job listing for the usage sample: %s", cluster.name, exc)
        jobs = None
    return cluster_usage_sample_store(cluster=cluster, now=now, nodes=nodes, jobs=jobs)


def cluster_usage_sample_store(
    *, cluster: Cluster, now: datetime, nodes: Sequence[NodeInfo], jobs: Sequence[SlurmJob] | None
) -> ClusterUsageSample | None:
    """Store the sample of `now`'s minute (None when that minute has one already) and prune old samples.

    `jobs` is Slurm's listing of every job it knows (None: unknown, e.g. the listing failed)."""
    gpu_types: dict[str, dict[str, int]] = defaultdict(lambda: {"total": 0, "used": 0, "idle": 0})
    for node in nodes:
        if not (node.gpu_type and node.gpus_total):
            continue
        used = min(node.gpus_used, node.gpus_total)
        entry = gpu_types[node.gpu_type]
        entry["total"] += node.gpus_total
        entry["used"] += used
        if node.state not in UNAVAILABLE_NODE_STATES:
            entry["idle"] += node.gpus_total - used
    # get_or_create on the unique (cluster, minute) keeps concurrent syncs to one sample a minute.
    sample, created = ClusterUsageSample.objects.get_or_create(
        cluster=cluster,
        at=sample_minute(now),
        defaults={
            "gpus_total": sum(entry["total"] for entry in gpu_types.values()),
            "gpus_used": sum(entry["used"] for entry in gpu_types.values()),
            "gpu_types": dict(sorted(gpu_types.items())),
            "partitions": None if jobs is None else _queue_by_partition(jobs),
            "nodes_by_state": dict(sorted(Counter(node.state.value for node in nodes).items())),
        },
    )
    ClusterUsageSample.objects.filter(cluster=cluster, at__lt=now - USAGE_SAMPLE_RETENTION).delete()
    return sample if created else None


def _queue_by_partition(jobs: Sequence[SlurmJob]) -> dict[str, dict[str, Any]]:
    queue: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            continue
        # A job submitted to several partitions ("a,b") waits in each of them.
        for partition in [name for name in job.partition.split(",") if name] or [""]:
            entry = queue.setdefault(
                partition,
                {
                    "pending": 0,
                    "running": 0,
                    "pending_gpus": 0,
                    "running_gpus": 0,
                    "pending_by_gpu_type": {},
                    "running_by_gpu_type": {},
                    "pending_reasons": {},
                },
            )
            if job.state is JobState.RUNNING:
                entry["running"] += 1
                entry["running_gpus"] += job.gpus
                running = entry["running_by_gpu_type"].setdefault(job.gpu_type or "", {"jobs": 0, "gpus": 0})
                running["jobs"] += 1
                running["gpus"] += job.gpus
                continue
            entry["pending"] += 1
            entry["pending_gpus"] += job.gpus
            by_type = entry["pending_by_gpu_type"].setdefault(job.gpu_type or "", {"jobs": 0, "gpus": 0})
            by_type["jobs"] += 1
            by_type["gpus"] += job.gpus
            reason = job.state_reason or "None"
            entry["pending_reasons"][reason] = entry["pending_reasons"].get(reason, 0) + 1
    return dict(sorted(queue.items()))
