"""The state of the world as gauges, read from the database when `/metrics` is scraped: what waits, how fresh each
cluster's view is, and what the last reconciliations found.

Read at scrape time rather than pushed by the processes that change it: the database is the one place that knows
it whichever process (or host) made the change, and a process that died cannot leave a stale value behind. Two
queries per scrape, both on indexed columns, whatever the number of jobs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.models import Count, Min, OuterRef, Subquery
from django.utils import timezone
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from billing.models import ReconciliationKind, ReconciliationReport, ReconciliationState
from clusters.models import Cluster, SlurmDriftReport
from jobs.models import ACTIVE_JOB_STATES, Job, JobState

logger = logging.getLogger(__name__)

# In this order in every scrape, each with 0 where the cluster has none: an alert can compare without gaps.
WAITING_STATES = (JobState.QUEUED, JobState.PENDING, JobState.RUNNING)


def _age_seconds(moment: datetime | None, now: datetime) -> float:
    """Seconds since `moment`; +Inf for never, which every "too long ago" alert then catches."""
    return math.inf if moment is None else max((now - moment).total_seconds(), 0.0)


class PortalStateCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        ok = GaugeMetricFamily(
            "portal_metrics_state_ok", "Whether the database answered the scrape's state queries (1) or not (0)"
        )
        try:
            clusters, jobs = _clusters(), _jobs()
        except DatabaseError:
            logger.warning("/metrics: the database did not answer; the state gauges are left out", exc_info=True)
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        yield from _gauges(clusters, jobs, now=timezone.now())


def _clusters() -> list[dict[str, Any]]:
    """Each active cluster with its health, its last job sync, its latest finished reconciliation report's summary
    and its latest Slurm account reconcile's findings: one query."""
    reconciliation = ReconciliationReport.objects.filter(
        cluster=OuterRef("pk"), state=ReconciliationState.DONE
    ).order_by("-finished_at", "-id")
    drift = SlurmDriftReport.objects.filter(cluster=OuterRef("pk"), finished_at__isnull=False).order_by(
        "-started_at", "-id"
    )
    rows = (
        Cluster.objects.filter(is_active=True)
        .annotate(
            reconciliation_summary=Subquery(reconciliation.values("summary")[:1]),
            reconciliation_finished_at=Subquery(reconciliation.values("finished_at")[:1]),
            drift_findings=Subquery(drift.values("findings")[:1]),
        )
        .order_by("name")
        .values(
            "pk",
            "name",
            "last_ping_ok",
            "last_ping_at",
            "jobs_synced_at",
            "jobs_sync_error",
            "reconciliation_summary",
            "reconciliation_finished_at",
            "drift_findings",
        )
    )
    return [dict(row) for row in rows]


def _jobs() -> dict[tuple[int, str], tuple[int, datetime]]:
    """(cluster id, state) -> (jobs, the oldest one's acceptance) over the jobs not finished: one query."""
    rows = (
        Job.objects.filter(state__in=ACTIVE_JOB_STATES)
        .values("cluster_id", "state")
        .annotate(count=Count("pk"), oldest=Min("created_at"))
        .order_by()
    )
    return {(row["cluster_id"], row["state"]): (row["count"], row["oldest"]) for row in rows}


def _gauges(
    clusters: list[dict[str, Any]], jobs: dict[tuple[int, str], tuple[int, datetime]], *, now: datetime
) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "portal_cluster_up",
        "Whether the cluster's slurmrestd answered the workers' last check (1) or not (0)",
        labels=["cluster"],
    )
    check_age = GaugeMetricFamily(
        "portal_cluster_check_age_seconds",
        "Seconds since a worker last checked the cluster (+Inf: never)",
        labels=["cluster"],
    )
    sync_age = GaugeMetricFamily(
        "portal_job_sync_age_seconds",
        "Seconds since the cluster's jobs were last synced from Slurm: the sync's lag (+Inf: never)",
        labels=["cluster"],
    )
    sync_failing = GaugeMetricFamily(
        "portal_job_sync_failing", "Whether the cluster's last job sync failed (1) or not (0)", labels=["cluster"]
    )
    waiting = GaugeMetricFamily(
        "portal_jobs",
        "Jobs not finished, by cluster and state (queued: accepted, not yet in Slurm: the delivery queue)",
        labels=["cluster", "state"],
    )
    oldest_queued = GaugeMetricFamily(
        "portal_jobs_queued_oldest_age_seconds",
        "Seconds since the oldest job still queued for the cluster was accepted (0: none queued)",
        labels=["cluster"],
    )
    differences = GaugeMetricFamily(
        "portal_reconciliation_differences",
        "Differences between the portal and Slurm's accounting in the cluster's latest reconciliation report, by kind",
        labels=["cluster", "kind"],
    )
    difference_gpu_seconds = GaugeMetricFamily(
        "portal_reconciliation_difference_gpu_seconds",
        "GPU-seconds the portal counts minus those Slurm's accounting counts, in the latest reconciliation report",
        labels=["cluster"],
    )
    reconciled_at = GaugeMetricFamily(
        "portal_reconciliation_report_timestamp_seconds",
        "When the cluster's latest reconciliation report finished (Unix time)",
        labels=["cluster"],
    )
    drift = GaugeMetricFamily(
        "portal_slurm_drift_findings",
        "What the cluster's latest Slurm account reconcile found, by whether it repaired it",
        labels=["cluster", "repaired"],
    )
    for cluster in clusters:
        name = cluster["name"]
        up.add_metric([name], 1 if cluster["last_ping_ok"] else 0)
        check_age.add_metric([name], _age_seconds(cluster["last_ping_at"], now))
        sync_age.add_metric([name], _age_seconds(cluster["jobs_synced_at"], now))
        sync_failing.add_metric([name], 1 if cluster["jobs_sync_error"] else 0)
        for state in WAITING_STATES:
            count, _ = jobs.get((cluster["pk"], state), (0, now))
            waiting.add_metric([name, state.value], count)
        queued = jobs.get((cluster["pk"], JobState.QUEUED))
        oldest_queued.add_metric([name], _age_seconds(queued[1], now) if queued else 0)
        summary = cluster["reconciliation_summary"]
        if isinstance(summary, dict) and cluster["reconciliation_finished_at"] is not None:
            counts = summary.get("counts") or {}
            for kind in ReconciliationKind.values:
                differences.add_metric([name, kind], int(counts.get(kind, 0)))
            difference_gpu_seconds.add_metric([name], int(summary.get("difference_gpu_seconds", 0)))
            reconciled_at.add_metric([name], cluster["reconciliation_finished_at"].timestamp())
        findings = cluster["drift_findings"]
        if isinstance(findings, list):
            repaired = sum(1 for finding in findings if isinstance(finding, dict) and finding.get("repaired"))
            drift.add_metric([name, "true"], repaired)
            drift.add_metric([name, "false"], len(findings) - repaired)
    yield from (up, check_age, sync_age, sync_failing, waiting, oldest_queued)
    yield from (differences, difference_gpu_seconds, reconciled_at, drift)
