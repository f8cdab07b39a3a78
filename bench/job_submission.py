"""Sustained job submission through the portal (REST API -> Celery worker -> slurmrestd) versus bare
slurmrestd submissions, in one run.

Bare: `SlurmClient.submit_job` called sequentially over one keep-alive connection, held jobs. Portal: a few
concurrent HTTP clients send `POST /api/v1/jobs/` (bearer token), one job each; then the same clients send the
same number of jobs as `POST /api/v1/jobs/batch/` (--batch-size jobs each, as a sweep script would); each 202
queues a task, and a Celery worker delivers the cluster's queued jobs in batches to the same slurmrestd. A portal
job counts as known in Slurm when its row has its `slurm_job_id`. So that the portal's jobs never run, the
project's Slurm account gets a GPU-minute limit of 0 (they wait with reason AssocGrpGRESMinutes, as over-quota
jobs do); every job is cancelled at the end.
Usage: python bench/job_submission.py [--jobs N] [--clients C] [--batch-size B] [--worker-concurrency W] [--port P]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import httpx
import portal_stack as stack  # sets up Django on the benchmark's database first
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import accounts
from clusters.slurm import SlurmClient, SlurmRetryableError
from clusters.slurm.types import JobSubmission
from jobs import job_services
from jobs.job_services import JobRequest
from jobs.job_sync import job_deliver, jobs_deliver_queued
from jobs.models import Job, JobState
from tenants.models import Project

SCRIPT = "#!/bin/bash\necho bench\n"
# A delivery that died (see the 'deadlock detected' count) leaves its job queued until the sweep, which needs
# beat; a retry after a slurmrestd outage comes within 5-20 s. Waiting stops after this long without progress.
STALL_SECONDS = 30


def job_body(world: stack.World, number: int) -> dict[str, object]:
    return {
        "project": world.project_label,
        "cluster": stack.CLUSTER,
        "partition": stack.PARTITION,
        "gpus": 1,
        "gpu_type": stack.GPU_TYPE,
        "time_limit_minutes": 1,
        "name": f"bench-{number}",
        "script": SCRIPT,
    }


def account_limit_zero(slurm: SlurmClient, world: stack.World) -> None:
    """GPU-minute limit 0 on the project's account: Slurm accepts the portal's jobs, and they wait
    (AssocGrpGRESMinutes) instead of running."""
    for attempt in range(3):
        try:
            # Also puts the account back under its parent, where an interrupted limit change leaves it under root.
            accounts.project_slurm_sync(project_id=world.project.pk)
            slurm.set_account_gpu_minutes_limit(account=world.project.slurm_account, cluster=stack.CLUSTER, minutes=0)
            return
        except SlurmRetryableError:
            if attempt == 2:
                raise
            stack.slurmrestd_wait(slurm)


def bare_submissions(client: SlurmClient, world: stack.World, count: int) -> tuple[float, list[float]]:
    """`count` held jobs of the portal jobs' shape, one after another; returns the rate and the latencies."""
    latencies = []
    started = time.perf_counter()
    for number in range(count):
        submission = JobSubmission(
            name=f"bench-{number}",
            account=world.project.slurm_account,
            partition=stack.PARTITION,
            script=SCRIPT,
            time_limit_minutes=1,
            working_directory="/tmp",
            standard_output="/dev/null",
            standard_error="/dev/null",
            gpus=1,
            gpu_type=stack.GPU_TYPE,
            comment=f"bench-bare-{number}",
            hold=True,
        )
        call_started = time.perf_counter()
        client.submit_job(user=stack.JOB_USER, submission=submission)
        latencies.append(time.perf_counter() - call_started)
    return count / (time.perf_counter() - started), latencies


# The batch whose queries per delivered job are counted: as a worker's run meets it, in one batch.
QUERIED_BATCH = 20


def queries_per_job(world: stack.World) -> tuple[int, str, str]:
    """Database queries of one `POST /api/v1/jobs/` (in-process, same view and services), of the delivery of one
    job alone (`job_deliver`), and per delivered job of a worker's run over a backlog (`jobs_deliver_queued`)."""
    client = Client()
    # Warm: the first request of a token marks it used (at most once a minute) and fills the rates cache.
    client.post(
        "/api/v1/jobs/",
        data=json.dumps(job_body(world, -1)),
        content_type="application/json",
        headers={"Authorization": f"Bearer {world.token}"},
    )
    with CaptureQueriesContext(connection) as post_queries:
        response = client.post(
            "/api/v1/jobs/",
            data=json.dumps(job_body(world, 0)),
            content_type="application/json",
            headers={"Authorization": f"Bearer {world.token}"},
        )
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    with CaptureQueriesContext(connection) as delivery_queries:
        outcome = job_deliver(job_id=job_id)
    alone = str(len(delivery_queries)) if outcome.outcome == "submitted" else f"n/a ({outcome.outcome})"
    backlog = queued_backlog(world, QUERIED_BATCH)
    with CaptureQueriesContext(connection) as batch_queries:
        run = jobs_deliver_queued(job_id=uuid.UUID(backlog[0]))
    delivered = sum(delivery.outcome == "submitted" for delivery in run.deliveries.values())
    batched = f"{len(batch_queries) / delivered:.2f}" if delivered else "n/a (none delivered)"
    # Their messages would reach the worker first and find nothing to do: they must not open the drain below.
    stack.redis_flush()
    return len(post_queries), alone, batched


@dataclass
class Posted:
    ids: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # of accepted (202) requests
    failures: Counter[str] = field(default_factory=Counter)  # status and error code -> count


def post_jobs(portal: stack.Portal, world: stack.World, *, count: int, clients: int) -> Posted:
    """POST `count` jobs from `clients` concurrent keep-alive HTTP clients; refusals are counted, not retried."""
    numbers = itertools.count(1)
    lock = threading.Lock()
    posted = Posted()

    def client_loop() -> None:
        headers = {"Authorization": f"Bearer {world.token}"}
        with httpx.Client(base_url=portal.base_url, headers=headers, timeout=30) as http:
            while True:
                with lock:
                    number = next(numbers)
                if number > count:
                    return
                started = time.perf_counter()
                response = http.post("/api/v1/jobs/", json=job_body(world, number))
                elapsed = time.perf_counter() - started
                with lock:
                    if response.status_code == 202:
                        posted.ids.append(response.json()["id"])
                        posted.latencies.append(elapsed)
                    else:
                        code = response.json().get("code", "") if response.content else ""
                        posted.failures[f"HTTP {response.status_code} {code}".strip()] += 1

    with ThreadPoolExecutor(max_workers=clients) as pool:
        for future in [pool.submit(client_loop) for _ in range(clients)]:
            future.result()
    return posted


def post_batches(portal: stack.Portal, world: stack.World, *, count: int, clients: int, batch_size: int) -> Posted:
    """POST `count` jobs as `POST /api/v1/jobs/batch/` of `batch_size` jobs from `clients` concurrent keep-alive
    HTTP clients; `latencies` are per batch."""
    numbers = iter(range(1, count + 1, batch_size))
    lock = threading.Lock()
    posted = Posted()

    def client_loop() -> None:
        headers = {"Authorization": f"Bearer {world.token}"}
        with httpx.Client(base_url=portal.base_url, headers=headers, timeout=60) as http:
            while True:
                with lock:
                    first = next(numbers, None)
                if first is None:
                    return
                jobs = [job_body(world, number) for number in range(first, min(first + batch_size, count + 1))]
                started = time.perf_counter()
                response = http.post("/api/v1/jobs/batch/", json={"jobs": jobs})
                elapsed = time.perf_counter() - started
                with lock:
                    if response.status_code == 202:
                        posted.ids += [job["id"] for job in response.json()["jobs"]]
                        posted.latencies.append(elapsed)
                    else:
                        code = response.json().get("code", "") if response.content else ""
                        posted.failures[f"HTTP {response.status_code} {code}".strip()] += len(jobs)

    with ThreadPoolExecutor(max_workers=clients) as pool:
        for future in [pool.submit(client_loop) for _ in range(clients)]:
            future.result()
    return posted


@dataclass
class Measured:
    """One way of submitting, measured from the first POST to the last Slurm job id recorded."""

    posted: Posted
    api_seconds: float
    rate: float  # accepted -> in Slurm, jobs/s
    to_slurm: list[float]  # Job.created_at -> Job.submitted_at, seconds
    stuck: int
    rejected: int
    cpu: stack.CpuMeter


def measure(portal: stack.Portal, post: Callable[[], Posted]) -> Measured:
    started_at = timezone.now()
    started = time.perf_counter()
    with stack.CpuMeter(portal) as cpu:
        posted = post()
        api_seconds = time.perf_counter() - started
        jobs = wait_until_known(posted.ids, stall_seconds=STALL_SECONDS)
    rejected = sum(job.state == JobState.REJECTED for job in jobs)
    known = [job for job in jobs if job.submitted_at is not None]
    last_known = max(job.submitted_at for job in known if job.submitted_at)
    return Measured(
        posted=posted,
        api_seconds=api_seconds,
        rate=len(known) / seconds_between(started_at, last_known),
        to_slurm=[seconds_between(job.created_at, job.submitted_at) for job in known if job.submitted_at],
        stuck=len(jobs) - len(known) - rejected,
        rejected=rejected,
        cpu=cpu,
    )


def wait_until_known(ids: list[str], *, stall_seconds: float) -> list[Job]:
    """Wait until every job has its Slurm job id (or was rejected), or until none has got one for
    `stall_seconds` (a delivery task that died leaves its job queued until the sweep); the jobs as stored then."""
    waiting_before, progress_at = len(ids) + 1, time.monotonic()
    while True:
        waiting = Job.objects.filter(pk__in=ids, slurm_job_id=None).exclude(state=JobState.REJECTED).count()
        if waiting < waiting_before:
            waiting_before, progress_at = waiting, time.monotonic()
        if not waiting or time.monotonic() - progress_at > stall_seconds:
            return list(Job.objects.filter(pk__in=ids))
        time.sleep(0.05)


def queued_backlog(world: stack.World, count: int) -> list[str]:
    """`count` jobs accepted through the submission service while no worker runs: their tasks wait in Redis."""
    project = Project.objects.select_related("tenant").get(pk=world.project.pk)
    ids = []
    for number in range(count):
        body = job_body(world, number)
        request = JobRequest(**{key: value for key, value in body.items() if key != "project"})  # type: ignore[arg-type]
        job, _ = job_services.job_submit(user=world.user, project=project, request=request)
        ids.append(str(job.pk))
    return ids


def seconds_between(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per side")
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients against the portal")
    parser.add_argument("--batch-size", type=int, default=25, help="jobs per POST /api/v1/jobs/batch/")
    parser.add_argument("--worker-concurrency", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()

    slurmrestd_pid = stack.slurmrestd_pid()
    machine = stack.machine_note()
    setup_seconds = stack.database_recreate()
    world = stack.world_create(project_slug="submit")
    account = world.project.slurm_account
    slurm = stack.bare_client()
    account_limit_zero(slurm, world)
    print(
        f"slurmrestd {slurm.ping().slurm_release}, API v{slurm.api_version}; {args.jobs} jobs per side into account "
        f"{account} (GPU-minute limit 0, so none runs); database recreated in {setup_seconds:.1f}s; {machine}"
    )
    portal = stack.Portal(port=args.port, worker_concurrency=args.worker_concurrency)
    try:
        bare_rate, bare_latencies = bare_submissions(slurm, world, args.jobs)
        stack.slurm_jobs_cancel(slurm, account=account)
        time.sleep(3)  # slurmctld and slurmdbd keep working on the cancellations; the portal must not pay for it
        post_query_count, delivery_query_count, batch_query_count = queries_per_job(world)

        backlog_ids = queued_backlog(world, args.jobs)
        with portal:
            # The worker starts on the backlog at once: its drain rate is the delivery path alone.
            drained = wait_until_known(backlog_ids, stall_seconds=STALL_SECONDS)
            backlog = [job.submitted_at for job in drained if job.submitted_at]
            drain_rate = (len(backlog) - 1) / seconds_between(min(backlog), max(backlog))
            # Enough that every web worker has answered a few: its first request opens its database connection
            # and prepares its statements, which the measured requests must not pay for.
            warm_up = post_jobs(portal, world, count=4 * portal.topology.http_workers, clients=args.clients)
            wait_until_known(warm_up.ids, stall_seconds=STALL_SECONDS)
            single = measure(portal, lambda: post_jobs(portal, world, count=args.jobs, clients=args.clients))
            time.sleep(3)  # the worker's run that drained the last jobs lets its wake lapse
            batched = measure(
                portal,
                lambda: post_batches(portal, world, count=args.jobs, clients=args.clients, batch_size=args.batch_size),
            )
            deadlocks = portal.log_count("deadlock detected")
    finally:
        portal.stop()
        cancelled, cancel_seconds = stack.slurm_jobs_cancel(slurm, account=account)
        slurm.close()
        stack.job_directories_remove()

    print(
        f"portal: {args.clients} HTTP clients -> {portal.topology.describe()} -> Redis -> Celery worker "
        f"({args.worker_concurrency} processes) -> slurmrestd; bare: 1 sequential keep-alive client, held jobs"
    )
    print(f"{'':40}{'jobs/s':>8}{'p50 ms':>9}{'p95 ms':>9}")
    rows = (
        ("bare SlurmClient.submit_job", bare_rate, bare_latencies),
        ("portal, POST /jobs/: accepted -> in Slurm", single.rate, single.to_slurm),
        ("portal, POST /api/v1/jobs/ only", len(single.posted.ids) / single.api_seconds, single.posted.latencies),
        (f"portal, batch/{args.batch_size}: accepted -> Slurm", batched.rate, batched.to_slurm),
        (
            f"portal, POST /jobs/batch/ only (per {args.batch_size})",
            len(batched.posted.ids) / batched.api_seconds,
            batched.posted.latencies,
        ),
    )
    for label, rate, latencies in rows:
        p50, p95 = stack.percentile(latencies, 0.50) * 1000, stack.percentile(latencies, 0.95) * 1000
        print(f"{label:40}{rate:8.1f}{p50:9.1f}{p95:9.1f}")
    print(
        f"ratio portal/bare: POST /api/v1/jobs/ {single.rate / bare_rate:.3f}; POST /api/v1/jobs/batch/ "
        f"({args.batch_size} jobs each) {batched.rate / bare_rate:.3f}  (portal rate: jobs from the first POST sent "
        "to the last Slurm job id recorded; latencies: per submit call / Job.created_at -> Job.submitted_at / per POST)"
    )
    print(
        f"{'portal, worker delivery alone':40}{drain_rate:8.1f}   ({len(backlog)} queued jobs drained by the worker, "
        "first to last Slurm job id)"
    )
    print(
        f"database queries per job: POST {post_query_count}; delivery of one job alone (job_deliver) "
        f"{delivery_query_count}, per delivered job of a batch of {QUERIED_BATCH} (jobs_deliver_queued) "
        f"{batch_query_count}; {cancelled} Slurm jobs cancelled in {cancel_seconds:.1f}s"
    )
    for label, measured in (("POST /api/v1/jobs/", single), ("POST /api/v1/jobs/batch/", batched)):
        print(
            f"CPU with {label}, first POST to last Slurm job id ({measured.cpu.seconds:.1f} s, {os.cpu_count()} cores):"
        )
        print(measured.cpu.table(per=len(measured.posted.ids) or 1, unit="job"))
        failed = ", ".join(f"{count} x {what}" for what, count in measured.posted.failures.items()) or "none"
        print(
            f"failures ({label}): jobs not accepted: {failed}; accepted but never in Slurm: {measured.stuck} "
            f"(no progress for {STALL_SECONDS} s), rejected: {measured.rejected}"
        )
    print("'deadlock detected' in the logs: " + ", ".join(f"{name} {count}" for name, count in deadlocks.items()))
    if note := stack.disturbance_note(slurmrestd_pid):
        print(note)


if __name__ == "__main__":
    main()
