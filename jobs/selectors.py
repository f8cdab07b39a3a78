"""Reads for clusters and their inventory."""

from __future__ import annotations

from django.db.models import QuerySet

from jobs.models import Cluster


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
