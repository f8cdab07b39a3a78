"""GPU utilisation per job and GPU: collected from DCGM series in a cluster's Prometheus (one query per metric and
cycle for the whole cluster), or taken from Slurm's accounting at the end; idle GPUs flagged while they idle.

What is kept is running aggregates per job and GPU (JobGpuUsage) and per job (JobEfficiency), never a row per
reading: observed seconds, utilisation x seconds, peak memory, idle seconds, and since when a GPU is idle.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from fast_update.query import FastUpdateQuerySet

from clusters.models import Cluster
from clusters.prometheus import GpuKey, GpuReading, PrometheusError, gpu_readings
from clusters.slurm.types import AccountingRecord
from jobs.idle_jobs import idle_jobs_act
from jobs.models import Job, JobEfficiency, JobGpuUsage, JobState, UtilisationSource
from portal import metrics

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass
class CollectionResult:
    queries: int = 0
    jobs: int = 0
    gpus_read: int = 0
    flagged: list[uuid.UUID] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


def collection_interval_seconds() -> int:
    return int(settings.GPU_UTILISATION_INTERVAL_SECONDS)


def cluster_gpu_utilisation_collect(*, cluster: Cluster, now: datetime | None = None) -> CollectionResult:
    """Read the cluster's GPUs from its Prometheus (two queries) and fold the readings into its running jobs'
    aggregates; then act on the jobs idle too long (jobs/idle_jobs.py)."""
    started = time.monotonic()
    result = CollectionResult()
    if not cluster.dcgm_prometheus_url:
        return result
    window = collection_interval_seconds()
    result.queries = 2
    try:
        readings = gpu_readings(url=cluster.dcgm_prometheus_url, window_seconds=window)
    except PrometheusError as exc:
        logger.warning("cluster %s: no GPU readings this cycle: %s", cluster.name, exc)
        result.error = str(exc)[:2000]
        return result
    result.gpus_read = len(readings)
    moment = now or timezone.now()
    result.jobs, result.flagged = gpu_readings_apply(
        cluster=cluster, readings=readings, now=moment, window_seconds=window
    )
    idle_jobs_act(cluster=cluster, flagged=result.flagged, now=moment)
    result.seconds = time.monotonic() - started
    metrics.GPU_UTILISATION_CYCLE_SECONDS.labels(cluster=cluster.name).observe(result.seconds)
    return result


def gpu_readings_apply(
    *, cluster: Cluster, readings: dict[GpuKey, GpuReading], now: datetime, window_seconds: int
) -> tuple[int, list[uuid.UUID]]:
    """Fold one cycle's readings into the running jobs' aggregates: how many running jobs hold GPUs, and the ids
    of those flagged idle just now."""
    jobs = list(
        Job.objects.filter(cluster=cluster, state=JobState.RUNNING)
        .exclude(gpu_indices={})
        .only("id", "started_at", "gpu_indices")
    )
    if not jobs:
        return 0, []
    job_ids = [job.pk for job in jobs]
    threshold = float(cluster.idle_gpu_threshold_percent)
    # A gap longer than this (the collector stopped, Prometheus was down) is not counted: nothing was observed.
    longest_gap = timedelta(seconds=2 * window_seconds)
    flagged: list[uuid.UUID] = []
    with transaction.atomic():
        usages = {
            (usage.job_id, usage.node, usage.gpu_index): usage
            for usage in JobGpuUsage.objects.select_for_update(of=("self",)).filter(job_id__in=job_ids)
        }
        efficiencies = {
            efficiency.job_id: efficiency
            for efficiency in JobEfficiency.objects.select_for_update(of=("self",)).filter(job_id__in=job_ids)
        }
        new_usages: list[JobGpuUsage] = []
        changed_usages: list[JobGpuUsage] = []
        new_efficiencies: list[JobEfficiency] = []
        changed_efficiencies: list[JobEfficiency] = []
        for job in jobs:
            efficiency = efficiencies.get(job.pk)
            if efficiency is None:
                efficiency = JobEfficiency(job_id=job.pk, source=UtilisationSource.DCGM)
                fresh_efficiency = True
            else:
                fresh_efficiency = False
            idle_starts: list[datetime] = []
            gpus_read = 0
            for node, indices in job.gpu_indices.items():
                for index in indices:
                    reading = readings.get((node, int(index)))
                    if reading is None:
                        continue
                    gpus_read += 1
                    usage = usages.get((job.pk, node, int(index)))
                    if usage is None:
                        first_from = max(job.started_at or now, now - timedelta(seconds=window_seconds))
                        usage = JobGpuUsage(job_id=job.pk, node=node, gpu_index=int(index), counted_until=first_from)
                        new_usages.append(usage)
                    else:
                        changed_usages.append(usage)
                    counted = _count(usage, reading, now=now, threshold=threshold, longest_gap=longest_gap)
                    efficiency.observed_gpu_seconds += counted
                    efficiency.utilisation_percent_seconds += reading.utilisation_percent * counted
                    if usage.idle_since is not None:
                        efficiency.idle_gpu_seconds += counted
                        idle_starts.append(usage.idle_since)
                    efficiency.peak_memory_mib = max(efficiency.peak_memory_mib or 0, reading.memory_mib)
            if not gpus_read:
                continue
            efficiency.source = UtilisationSource.DCGM
            efficiency.idle_gpus = len(idle_starts)
            efficiency.idle_since = min(idle_starts) if idle_starts else None
            all_idle = len(idle_starts) == gpus_read == sum(len(indices) for indices in job.gpu_indices.values())
            efficiency.all_gpus_idle_since = max(idle_starts) if all_idle else None
            efficiency.updated_at = now
            if efficiency.all_gpus_idle_since is None:  # a GPU works: a warning to end it no longer stands
                efficiency.warned_at = None
            if efficiency.idle_since is None:  # working again: a later idle spell is flagged anew
                efficiency.flagged_at = None
            elif efficiency.flagged_at is None and now - efficiency.idle_since >= timedelta(
                seconds=cluster.idle_gpu_after_seconds
            ):
                efficiency.flagged_at = now
                flagged.append(job.pk)
            (new_efficiencies if fresh_efficiency else changed_efficiencies).append(efficiency)
        JobGpuUsage.objects.bulk_create(new_usages, batch_size=1000)
        # UPDATE ... FROM (VALUES ...): bulk_update's CASE expressions took 27 s for 2,000 GPUs here (bench/).
        if changed_usages:
            FastUpdateQuerySet(model=JobGpuUsage).fast_update(changed_usages, _USAGE_FIELDS, unfiltered=True)
        JobEfficiency.objects.bulk_create(new_efficiencies, batch_size=1000)
        if changed_efficiencies:
            FastUpdateQuerySet(model=JobEfficiency).fast_update(
                changed_efficiencies, _EFFICIENCY_FIELDS, unfiltered=True
            )
    return len(jobs), flagged


_USAGE_FIELDS = [
    "gpu_uuid",
    "observed_seconds",
    "utilisation_percent_seconds",
    "peak_memory_mib",
    "idle_seconds",
    "idle_since",
    "last_utilisation_percent",
    "last_memory_mib",
    "counted_until",
]
_EFFICIENCY_FIELDS = [
    "source",
    "observed_gpu_seconds",
    "utilisation_percent_seconds",
    "peak_memory_mib",
    "idle_gpu_seconds",
    "idle_gpus",
    "idle_since",
    "all_gpus_idle_since",
    "flagged_at",
    "warned_at",
    "updated_at",
]


def _count(usage: JobGpuUsage, reading: GpuReading, *, now: datetime, threshold: float, longest_gap: timedelta) -> int:
    """Fold one reading into one GPU's aggregates; the whole seconds it stands for."""
    if now - usage.counted_until > longest_gap:
        usage.counted_until = now - longest_gap
    seconds = max(int((now - usage.counted_until).total_seconds()), 0)
    period_start = usage.counted_until
    usage.counted_until += timedelta(seconds=seconds)
    usage.observed_seconds += seconds
    usage.utilisation_percent_seconds += reading.utilisation_percent * seconds
    usage.peak_memory_mib = max(usage.peak_memory_mib, reading.memory_mib)
    usage.last_utilisation_percent = reading.utilisation_percent
    usage.last_memory_mib = reading.memory_mib
    usage.gpu_uuid = reading.uuid[:64]
    if reading.utilisation_percent < threshold:
        usage.idle_since = usage.idle_since or period_start
        usage.idle_seconds += seconds
    else:
        usage.idle_since = None
    return seconds


def job_efficiency_from_accounting(*, job: Job, cluster: Cluster, record: AccountingRecord, gpu_seconds: int) -> bool:
    """A finished job's figure from Slurm's accounting (gres/gpuutil, gres/gpumem), for a cluster that records
    them and a job DCGM did not observe; True when one was written.

    Slurm gives one figure for the job, not one per GPU, and on a real GPU it was the step's peak reading
    rather than a mean over its life (README, "Fake GPUs, and what was checked on a real one"): a job whose
    figure is under the threshold (one that never used its GPUs) counts all its GPU-seconds as idle, any other
    none."""
    if not cluster.slurm_gpu_accounting or record.gpu_utilisation_percent is None or not gpu_seconds:
        return False
    utilisation = record.gpu_utilisation_percent
    idle = gpu_seconds if utilisation < cluster.idle_gpu_threshold_percent else 0
    peak = None if record.gpu_memory_peak_bytes is None else record.gpu_memory_peak_bytes // MIB
    with transaction.atomic():
        if JobEfficiency.objects.filter(job=job, source=UtilisationSource.DCGM).exists():
            return False
        JobEfficiency.objects.update_or_create(
            job=job,
            defaults={
                "source": UtilisationSource.SLURM,
                "observed_gpu_seconds": gpu_seconds,
                "utilisation_percent_seconds": utilisation * gpu_seconds,
                "peak_memory_mib": peak,
                "idle_gpu_seconds": idle,
                "idle_gpus": 0,
                "idle_since": None,
                "updated_at": timezone.now(),
            },
        )
    return True
