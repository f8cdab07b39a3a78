"""Job arrays at size: submitting a 1,000-task array (API latency and queries), listing its tasks, the job list with
100 arrays of 100 tasks, and a sync cycle in which 1,000 array tasks change state.

The API is called in this process (DRF's test client, the full middleware stack) with the queries counted. The
array goes to the real slurmrestd held (it never runs), tagged as the delivery tags it; the sync then sees its
1,000 tasks waiting (queued -> pending), and after the array is cancelled in Slurm, all 1,000 cancelled; the
quota collection then gives back the 1,000 tasks' reservations. Every job is cancelled at the end.
Usage: python bench/job_arrays.py [--tasks N] [--arrays N] [--array-tasks N]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import portal_stack as stack  # sets up Django on the benchmark's database first
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.slurm.types import JobSubmission
from jobs import job_sync
from jobs.models import Job, JobArrayTask, JobState
from jobs.quota_usage import quota_usage_collect


def timed(call: Callable[[], Any], repeat: int = 1) -> tuple[Any, float, int]:
    """The last result, the median seconds and the queries of one call."""
    seconds = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            result = call()
            seconds.append(time.perf_counter() - started)
    return result, statistics.median(seconds), len(queries)


def submit(api: APIClient, world: stack.World, *, array: str, name: str) -> Any:
    body = {
        "project": world.project_label,
        "cluster": world.cluster.name,
        "partition": stack.PARTITION,
        "gpu_type": stack.GPU_TYPE,
        "gpus": 1,
        "time_limit_minutes": 1,
        "name": name,
        "script": "#!/bin/bash\necho task $SLURM_ARRAY_TASK_ID\n",
        "array": array,
    }
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 202, response.json()
    return response


def hold_in_slurm(world: stack.World, job: Job) -> None:
    """Submit the array held, as the delivery would (same tag and shape), and record it as delivered."""
    with stack.bare_client() as slurm:
        result = slurm.submit_job(
            user=stack.JOB_USER,
            submission=JobSubmission(
                name=job.name,
                account=world.project.slurm_account,
                partition=job.partition,
                script=job.script,
                time_limit_minutes=job.time_limit_minutes,
                working_directory="/tmp",
                standard_output="/dev/null",
                standard_error="/dev/null",
                gpus=job.gpus,
                gpu_type=job.gpu_type or None,
                comment=job.slurm_comment,
                array=job.array,
                hold=True,
            ),
        )
    Job.objects.filter(pk=job.pk).update(
        slurm_job_id=result.job_id, state=JobState.PENDING, submitted_at=timezone.now(), next_attempt_at=None
    )


def sync(cluster: Cluster) -> tuple[job_sync.SyncResult, float, int]:
    cluster.refresh_from_db()
    Cluster.objects.filter(pk=cluster.pk).update(jobs_listed_at=None)
    cluster.refresh_from_db()
    result, seconds, queries = timed(
        lambda: job_sync.cluster_jobs_sync(cluster=cluster, client=slurm_client_for(cluster))
    )
    return result, seconds, queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks of the big array")
    parser.add_argument("--arrays", type=int, default=100, help="arrays in the job list")
    parser.add_argument("--array-tasks", type=int, default=100, help="tasks of each array in the job list")
    args = parser.parse_args()

    machine = stack.machine_note()
    stack.database_recreate()
    world = stack.world_create(project_slug=f"arrays-{uuid.uuid4().hex[:6]}")
    api = APIClient()
    api.force_authenticate(world.user)
    cluster = world.cluster
    lines = [f"cluster {cluster.name} (Slurm {cluster.slurm_release}, API v{cluster.api_version}); {machine}"]
    try:
        # Submit: one POST, one Slurm submission later (here: held).
        submit(api, world, array="0-3", name="warm-up")  # the first request of a process pays its imports
        response, seconds, queries = timed(lambda: submit(api, world, array=f"0-{args.tasks - 1}", name="big"))
        job = Job.objects.get(pk=response.json()["id"])
        lines.append(f"POST /api/v1/jobs/ with a {args.tasks}-task array: {seconds * 1000:.0f} ms, {queries} queries")

        # Its tasks, page by page.
        pages = []
        for page in (1, args.tasks // 200):
            url = f"/api/v1/jobs/{job.pk}/tasks/?page_size=200&page={page}"
            listing, seconds, queries = timed(partial(api.get, url), repeat=5)
            assert listing.status_code == 200
            pages.append(f"page {page}: {seconds * 1000:.0f} ms, {queries} queries")
        lines.append("GET .../tasks/ (200 a page, median of 5): " + "; ".join(pages))

        # The sync: all tasks waiting (queued -> pending), then all cancelled.
        hold_in_slurm(world, job)
        job.refresh_from_db()
        result, seconds, queries = sync(cluster)
        pending = JobArrayTask.objects.filter(job=job, state=JobState.PENDING).count()
        lines.append(
            f"sync, {pending} tasks queued -> pending: {seconds * 1000:.0f} ms, {queries} queries, "
            f"{result.requests} Slurm requests, {result.listed} records listed"
        )
        with stack.bare_client() as slurm:
            slurm.cancel_job(user=slurm.admin_user, job_id=job.slurm_job_id or 0)
        time.sleep(1)
        result, seconds, queries = sync(cluster)
        cancelled = JobArrayTask.objects.filter(job=job, state=JobState.CANCELLED).count()
        lines.append(
            f"sync, {cancelled} tasks pending -> cancelled: {seconds * 1000:.0f} ms, {queries} queries, "
            f"{result.requests} Slurm requests"
        )
        collected, seconds, queries = timed(
            lambda: quota_usage_collect(cluster=cluster, client=slurm_client_for(cluster))
        )
        lines.append(
            f"quota collection giving back {collected.released} never-run tasks' reservations: "
            f"{seconds * 1000:.0f} ms, {queries} queries"
        )

        # The job list with many arrays.
        for number in range(args.arrays):
            submit(api, world, array=f"0-{args.array_tasks - 1}", name=f"list-{number}")
        listing, seconds, queries = timed(lambda: api.get("/api/v1/jobs/?page_size=100"), repeat=5)
        assert listing.status_code == 200
        lines.append(
            f"GET /api/v1/jobs/?page_size=100 with {args.arrays} arrays of {args.array_tasks} tasks "
            f"(median of 5): {seconds * 1000:.0f} ms, {queries} queries"
        )
    finally:
        with stack.bare_client() as slurm:
            stack.slurm_jobs_cancel(slurm, account=world.project.slurm_account, timeout_seconds=120)
            stack.slurm_account_delete(slurm, account=world.project.slurm_account)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
