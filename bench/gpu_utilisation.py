"""GPU utilisation collection at scale, and how late an idle job is flagged.

1. Cost: 1,000 running jobs of 2 GPUs each on 250 nodes of 8 GPUs, whose DCGM series scripts/dcgm_replay.py serves
   (2,000 GPUs, real H100 readings) and a real Prometheus scrapes every 5 s. One collection cycle
   (`cluster_gpu_utilisation_collect`) runs in this process against that Prometheus and PostgreSQL: the first
   (every aggregate row created), then steady ones (every row updated). It counts the queries to Prometheus and to
   PostgreSQL and times the cycle.
2. Latency: one job whose GPU replays the busy trace for 20 s, then the idle one; the collector runs every
   `--interval` seconds (its real pace is GPU_UTILISATION_INTERVAL_SECONDS, 30 s by default) with an idle limit
   of `--limit` seconds. The figure is how long after (went idle + limit) the job was flagged.

Runs on its own database (gpuportal_bench_efficiency unless BENCH_DATABASE_URL says otherwise), needs no Slurm.
Usage: flock -w 900 /tmp/gpuportal-live.lock python bench/gpu_utilisation.py [--jobs 1000] [--interval 10] [--limit 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench_efficiency")

import portal_stack as stack  # sets up Django on the benchmark's database first
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster
from clusters.prometheus import gpu_readings
from jobs.gpu_utilisation import cluster_gpu_utilisation_collect
from jobs.models import Job, JobEfficiency, JobState
from tenants import services
from tests.processes import dcgm_replay_running, prometheus_running

NODES = 250
GPUS_PER_NODE = 8
IDLE_AFTER_SECONDS = 20  # the switching GPU's busy spell


def _wait_for(url: str, gpus: int) -> None:
    deadline = time.monotonic() + 120
    while len(gpu_readings(url=url, window_seconds=2)) < gpus:
        if time.monotonic() > deadline:
            raise SystemExit(f"Prometheus at {url} did not get {gpus} GPUs in 2 minutes")
        time.sleep(1)


def _jobs(cluster: Cluster, count: int) -> None:
    tenant = services.tenant_create(actor=None, slug="benchgpu", name="GPU benchmark")
    project = services.project_create(actor=None, tenant=tenant, slug="util", name="Utilisation")
    started = timezone.now() - timedelta(hours=1)
    Job.objects.bulk_create(
        [
            Job(
                project=project,
                cluster=cluster,
                cluster_username="alice",
                name=f"job{number}",
                partition="gpu",
                gpu_type="h100",
                gpus=2,
                time_limit_minutes=600,
                state=JobState.RUNNING,
                started_at=started,
                gpu_indices={f"bench{number // 4:04d}": [2 * (number % 4), 2 * (number % 4) + 1]},
            )
            for number in range(count)
        ],
        batch_size=1000,
    )


def cost(*, jobs: int, cycles: int, directory: Path) -> None:
    nodes = [f"--node=bench{node:04d}:{GPUS_PER_NODE}:h100" for node in range(NODES)]
    with (
        dcgm_replay_running(*nodes, log=directory / "exporter.log") as exporter,
        prometheus_running(exporter, directory=directory, scrape_seconds=5) as url,
    ):
        _wait_for(url, NODES * GPUS_PER_NODE)
        cluster = Cluster.objects.create(
            name="benchgpu",
            slurmrestd_url="http://127.0.0.1:9",
            jwt_key_file="/none",
            log_root="/tmp",
            dcgm_prometheus_url=url,
        )
        _jobs(cluster, jobs)
        timings: list[float] = []
        for cycle in range(cycles):
            with CaptureQueriesContext(connection) as queries:
                result = cluster_gpu_utilisation_collect(cluster=cluster)
            timings.append(result.seconds)
            what = "first (creates the rows)" if cycle == 0 else "steady"
            print(
                f"cycle {cycle + 1} {what}: {result.seconds * 1000:.0f} ms, {result.queries} Prometheus queries for "
                f"{result.gpus_read} GPUs, {len(queries)} PostgreSQL queries, {result.jobs} jobs"
            )
            time.sleep(1)
        steady = timings[1:]
        print(
            f"steady cycles: median {statistics.median(steady) * 1000:.0f} ms, max {max(steady) * 1000:.0f} ms "
            f"for {jobs} jobs on {2 * jobs} GPUs"
        )


def latency(*, interval: int, limit: int, trials: int, directory: Path) -> None:
    settings.GPU_UTILISATION_INTERVAL_SECONDS = interval
    tenant = services.tenant_create(actor=None, slug="benchlate", name="GPU latency")
    project = services.project_create(actor=None, tenant=tenant, slug="late", name="Latency")
    for trial in range(trials):
        spec = f"--assign=late01:0=busy@{IDLE_AFTER_SECONDS}>idle"
        with (
            dcgm_replay_running("--node=late01:1:h100", spec, log=directory / f"late{trial}.log") as exporter,
            prometheus_running(exporter, directory=Path(tempfile.mkdtemp(dir=directory))) as url,
        ):
            went_idle = time.monotonic() + IDLE_AFTER_SECONDS  # the exporter answered just now: its clock began
            cluster = Cluster.objects.create(
                name=f"late{trial}",
                slurmrestd_url="http://127.0.0.1:9",
                jwt_key_file="/none",
                log_root="/tmp",
                dcgm_prometheus_url=url,
                idle_gpu_after_seconds=limit,
            )
            job = Job.objects.create(
                project=project,
                cluster=cluster,
                cluster_username="alice",
                name="late",
                partition="gpu",
                gpus=1,
                time_limit_minutes=60,
                state=JobState.RUNNING,
                started_at=timezone.now(),
                gpu_indices={"late01": [0]},
            )
            # Beat's ticks do not line up with the moment a job goes idle: start at a different phase each trial.
            time.sleep((trial * interval / trials) % interval)
            while True:
                cluster_gpu_utilisation_collect(cluster=cluster)
                if JobEfficiency.objects.filter(job=job, flagged_at__isnull=False).exists():
                    late = time.monotonic() - (went_idle + limit)
                    break
                time.sleep(interval)
            print(f"trial {trial + 1}: flagged {late:+.1f} s after it had been idle for the {limit} s limit")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--interval", type=int, default=10, help="seconds between collections (the window too)")
    parser.add_argument("--limit", type=int, default=60, help="the cluster's idle limit, seconds")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    stack.database_recreate()
    print(stack.machine_note())
    with tempfile.TemporaryDirectory() as directory:
        print(
            f"== collection cost: {args.jobs} running jobs x 2 GPUs, "
            f"window {settings.GPU_UTILISATION_INTERVAL_SECONDS} s"
        )
        cost(jobs=args.jobs, cycles=args.cycles, directory=Path(directory))
        print(f"== idle flag latency: collection every {args.interval} s, idle limit {args.limit} s")
        latency(interval=args.interval, limit=args.limit, trials=args.trials, directory=Path(directory))


if __name__ == "__main__":
    main()
