"""Browser pages: the clusters' status from their last sync (nodes, GPUs, queue, utilisation over time)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path
from django.utils import timezone
from django.views.decorators.http import require_safe

from clusters.models import Cluster, ClusterUsageSample
from clusters.selectors import (
    GpuTypeQueue,
    GpuTypeUsage,
    IdleWhileWaiting,
    PartitionQueue,
    UsagePoint,
    cluster_get_for_user,
    cluster_gpu_type_usage,
    cluster_idle_while_waiting,
    cluster_list_for_user,
    cluster_node_state_counts,
    cluster_queue_by_gpu_type,
    cluster_queue_by_partition,
    cluster_usage_latest,
    cluster_usage_series,
)
from jobs.node_board import GPU_STATUS_LEGEND, cluster_node_board
from jobs.reasons import pending_reason_text

# Workers sync every 30 s (CLUSTER_SYNC_INTERVAL_SECONDS): five minutes without one means they are not syncing.
STALE_AFTER = timedelta(minutes=5)
RANGES = {"24h": ("Last 24 hours", timedelta(hours=24)), "7d": ("Last 7 days", timedelta(days=7))}
POLL_SECONDS = 10
NODE_STATE_ORDER = ("idle", "mixed", "allocated", "draining", "drained", "down", "unknown")


@dataclass(frozen=True)
class Health:
    """What the page says about how fresh its figures are."""

    synced_at: datetime | None
    checked_at: datetime | None
    unreachable: bool
    stale: bool
    error: str

    @property
    def never_synced(self) -> bool:
        return self.synced_at is None


@dataclass(frozen=True)
class Callout:
    """One "GPUs idle while jobs wait" finding, with Slurm's reasons in words."""

    finding: IdleWhileWaiting
    reasons: list[tuple[int, str]]


@dataclass(frozen=True)
class ClusterSummary:
    cluster: Cluster
    health: Health
    gpus: list[GpuTypeUsage]
    gpus_total: int
    gpus_used: int
    gpus_idle: int
    queue: list[PartitionQueue] | None
    queue_by_gpu_type: list[GpuTypeQueue] | None
    pending: int
    running: int
    callouts: list[Callout]
    sample: ClusterUsageSample | None


def _health(cluster: Cluster, now: datetime) -> Health:
    synced_at = cluster.inventory_synced_at
    return Health(
        synced_at=synced_at,
        checked_at=cluster.last_ping_at,
        unreachable=cluster.last_ping_at is not None and not cluster.last_ping_ok,
        stale=synced_at is not None and now - synced_at > STALE_AFTER,
        error=cluster.last_ping_error,
    )


def _summary(cluster: Cluster, now: datetime) -> ClusterSummary:
    sample = cluster_usage_latest(cluster=cluster)
    gpus = cluster_gpu_type_usage(cluster=cluster)
    queue = cluster_queue_by_partition(cluster=cluster, sample=sample)
    callouts = [
        Callout(
            finding=finding,
            reasons=sorted(
                (
                    (count, pending_reason_text(reason) or "no reason given")
                    for reason, count in finding.pending_reasons.items()
                ),
                reverse=True,
            ),
        )
        for finding in cluster_idle_while_waiting(cluster=cluster, sample=sample)
    ]
    return ClusterSummary(
        cluster=cluster,
        health=_health(cluster, now),
        gpus=gpus,
        gpus_total=sum(gpu.total for gpu in gpus),
        gpus_used=sum(gpu.used for gpu in gpus),
        gpus_idle=sum(gpu.idle for gpu in gpus),
        queue=queue,
        queue_by_gpu_type=cluster_queue_by_gpu_type(sample=sample),
        pending=sum(row.pending for row in queue or []),
        running=sum(row.running for row in queue or []),
        callouts=callouts,
        sample=sample,
    )


@require_safe
@login_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    """Every active cluster the user may submit to, with its GPUs, queue and health at a glance."""
    now = timezone.now()
    summaries = [_summary(cluster, now) for cluster in cluster_list_for_user(user=request.user)]
    context = {"summaries": summaries, "now": now, "poll_seconds": POLL_SECONDS}
    if request.headers.get("HX-Request"):
        return render(request, "frontend/cluster/list_live.html", context)
    return render(request, "frontend/cluster/list.html", context)


@require_safe
@login_required
def cluster_detail(request: HttpRequest, cluster: str) -> HttpResponse:
    """One cluster: health, GPUs per type, the queue per partition and GPU type, idle GPUs while jobs wait, every
    node with its GPUs grouped by switch (who holds each: the viewer's own projects named, any other "another
    project"), utilisation over time. htmx polls the figures and the node board (the part above the chart)."""
    found = cluster_get_for_user(user=request.user, name=cluster)
    now = timezone.now()
    summary = _summary(found, now)
    counts = cluster_node_state_counts(cluster=found)
    context: dict[str, Any] = {
        "summary": summary,
        "cluster": found,
        "switches": cluster_node_board(cluster=found, user=request.user),
        "gpu_legend": GPU_STATUS_LEGEND,
        "node_states": [(state, counts[state]) for state in NODE_STATE_ORDER if counts.get(state)],
        "now": now,
        "poll_seconds": POLL_SECONDS,
    }
    if request.headers.get("HX-Request"):
        return render(request, "frontend/cluster/detail_live.html", context)
    range_key = request.GET.get("range", "24h")
    if range_key not in RANGES:
        range_key = "24h"
    label, span = RANGES[range_key]
    series = cluster_usage_series(cluster=found, since=now - span)
    context.update(
        {
            "range_key": range_key,
            "range_label": label,
            "ranges": [(key, name) for key, (name, _) in RANGES.items()],
            "series": series,
            "chart": _chart(series),
            "usage": _usage_figures(series),
        }
    )
    return render(request, "frontend/cluster/detail.html", context)


def _chart(series: list[UsagePoint]) -> dict[str, object]:
    return {
        "kind": "area",
        "unit": "GPUs",
        "x": [int(point.at.timestamp()) for point in series],
        "series": [
            {"label": "GPUs in use", "values": [point.gpus_used for point in series], "color": "#0b5cad"},
            {
                "label": "GPUs in total",
                "values": [point.gpus_total for point in series],
                "color": "#3d4752",
                "dash": True,
            },
        ],
    }


def _usage_figures(series: list[UsagePoint]) -> dict[str, object] | None:
    """The chart's numbers in words: average and peak use over the range."""
    if not series:
        return None
    used = [point.gpus_used for point in series]
    total = [point.gpus_total for point in series]
    average_used = sum(used) / len(used)
    average_total = sum(total) / len(total)
    return {
        "since": series[0].at,
        "average_used": round(average_used, 1),
        "average_total": round(average_total, 1),
        "average_percent": round(100 * average_used / average_total) if average_total else 0,
        "peak_used": max(used),
        "samples": len(series),
    }


urlpatterns: list[URLPattern] = [
    path("clusters/", cluster_list, name="cluster-list"),
    path("clusters/<str:cluster>/", cluster_detail, name="cluster-detail"),
]
