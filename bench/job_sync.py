"""One job sync cycle (`cluster_jobs_sync`) with 1,000 jobs in Slurm: everything new, nothing changed, and a
full listing in which nothing needs changing.

The jobs are held (they never run), submitted straight to slurmrestd into a portal project's account: half
carry the portal's tag and have Job rows (as a delivery leaves them: pending, Slurm id known), the other
half are external (no tag, no row). The sync runs in this process against the real slurmrestd and
PostgreSQL, with its pushes going to Redis; a counting transport under the Slurm client counts its requests.
Every job is cancelled at the end, and the run waits until slurmctld lists none of them as pending.
Usage: python bench/job_sync.py [--jobs N]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
import portal_stack as stack  # sets up Django on the benchmark's database first
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster
from clusters.slurm import SlurmClient, SlurmRetryableError
from clusters.slurm.types import JobSubmission
from jobs import job_sync
from jobs.job_services import jobs_push
from jobs.models import Job, JobState, job_comment_tag


class CountingTransport(httpx.HTTPTransport):
    """Counts the Slurm client's requests, the bytes of the replies and the time spent on them."""

    def __init__(self) -> None:
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.statuses: list[int] = []
        self.bytes = 0
        self.seconds = 0.0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = super().handle_request(request)
        content = response.read()  # here, so that the transfer counts as the request's time
        self.seconds += time.perf_counter() - started
        self.requests += 1
        self.statuses.append(response.status_code)
        self.bytes += len(content)
        return response


@dataclass
class ListingTimer:
    """Wraps the client's `list_jobs` to time the listing: request, transfer and decoding into typed jobs."""

    wrapped: Callable[..., object]
    seconds: float = 0.0

    def __call__(self, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return self.wrapped(**kwargs)
        finally:
            self.seconds += time.perf_counter() - started


@dataclass
class PushTimer:
    """Wraps `jobs_push` (called after each sync transaction commits) to time the pushes to watchers."""

    wrapped: Callable[[Iterable[uuid.UUID]], None]
    seconds: float = 0.0
    jobs: int = 0

    def __call__(self, job_ids: Iterable[uuid.UUID]) -> None:
        ids = list(job_ids)
        started = time.perf_counter()
        self.wrapped(ids)
        self.seconds += time.perf_counter() - started
        self.jobs += len(ids)


def submit_held(client: SlurmClient, world: stack.World, count: int) -> tuple[list[Job], float]:
    """`count` held jobs: even ones tagged as portal jobs (their rows returned, unsaved), odd ones external."""
    rows: list[Job] = []
    started = time.perf_counter()
    for number in range(count):
        job_id = uuid.uuid4() if number % 2 == 0 else None
        submission = JobSubmission(
            name=f"bench-sync-{number}",
            account=world.project.slurm_account,
            partition=stack.PARTITION,
            script="#!/bin/bash\necho bench\n",
            time_limit_minutes=1,
            working_directory="/tmp",
            standard_output="/dev/null",
            standard_error="/dev/null",
            gpus=1,
            gpu_type=stack.GPU_TYPE,
            comment=job_comment_tag(job_id) if job_id else "",
            hold=True,
        )
        slurm_job_id = client.submit_job(user=stack.JOB_USER, submission=submission).job_id
        if job_id is not None:
            now = timezone.now()
            rows.append(
                Job(
                    id=job_id,
                    project=world.project,
                    cluster=world.cluster,
                    user=world.user,
                    cluster_username=stack.JOB_USER,
                    name=submission.name,
                    partition=stack.PARTITION,
                    gpu_type=stack.GPU_TYPE,
                    gpus=1,
                    time_limit_minutes=1,
                    script=submission.script,
                    state=JobState.PENDING,
                    slurm_job_id=slurm_job_id,
                    created_at=now,
                    submitted_at=now,
                    updated_at=now,
                )
            )
    return rows, time.perf_counter() - started


@dataclass
class Cycle:
    label: str
    seconds: float
    result: job_sync.SyncResult
    http_requests: int
    http_statuses: list[int]
    http_bytes: int
    http_seconds: float
    queries: int
    push_seconds: float
    pushed: int
    listing_seconds: float


def sync_cycle(
    label: str, cluster: Cluster, client: SlurmClient, transport: CountingTransport, push: PushTimer
) -> Cycle:
    cluster.refresh_from_db()
    transport.reset()
    push.seconds, push.jobs = 0.0, 0
    listing = ListingTimer(client.list_jobs)
    client.list_jobs = listing  # type: ignore[method-assign,assignment]
    try:
        for attempt in range(3):
            try:
                with CaptureQueriesContext(connection) as queries:
                    started = time.perf_counter()
                    result = job_sync.cluster_jobs_sync(cluster=cluster, client=client)
                    seconds = time.perf_counter() - started
                break
            except SlurmRetryableError as exc:  # the listing comes first: a failed cycle changed nothing yet
                if attempt == 2:
                    raise
                print(f"  ({label}: {exc}; waiting for slurmrestd and trying again)")
                stack.slurmrestd_wait(client)
                transport.reset()
                listing.seconds = 0.0
    finally:
        client.list_jobs = listing.wrapped  # type: ignore[method-assign,assignment]
    return Cycle(
        label=label,
        seconds=seconds,
        result=result,
        http_requests=transport.requests,
        http_statuses=transport.statuses,
        http_bytes=transport.bytes,
        http_seconds=transport.seconds,
        queries=len(queries),
        push_seconds=push.seconds,
        pushed=push.jobs,
        listing_seconds=listing.seconds,
    )


def unchanged_cycle(
    cluster: Cluster, client: SlurmClient, transport: CountingTransport, push: PushTimer, *, attempts: int = 5
) -> tuple[Cycle, int]:
    """A cycle with nothing changed since the last listing (a 304); other users of the cluster can change
    something meanwhile, so up to `attempts` tries. Returns the last cycle and the tries it took."""
    for attempt in range(1, attempts + 1):
        # The sync asks for changes since a second before its last listing: wait until that second is past.
        time.sleep(2)
        cycle = sync_cycle("nothing changed (304)", cluster, client, transport, push)
        if cycle.result.unchanged_listing:
            return cycle, attempt
    return cycle, attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="held jobs in Slurm, half of them portal jobs")
    args = parser.parse_args()

    slurmrestd_pid = stack.slurmrestd_pid()
    machine = stack.machine_note()
    stack.database_recreate()
    # An account per run: slurmctld lists an earlier run's cancelled jobs for MinJobAge (5 min), and the sync
    # would count those in the project's account as external jobs too.
    world = stack.world_create(project_slug=f"sync-{uuid.uuid4().hex[:6]}")
    account = world.project.slurm_account
    slurm = stack.bare_client()
    transport = CountingTransport()
    cluster = world.cluster
    client = SlurmClient(
        base_url=cluster.slurmrestd_url,
        key_file=cluster.jwt_key_file,
        admin_user=cluster.admin_user,
        api_version=cluster.api_version or None,
        timeout_seconds=60,
        transport=transport,
    )
    push = PushTimer(jobs_push)
    vars(job_sync)["jobs_push"] = push  # the sync calls it by its module-level name, after each commit
    try:
        rows, submit_seconds = submit_held(slurm, world, args.jobs)
        Job.objects.bulk_create(rows)
        Cluster.objects.filter(pk=cluster.pk).update(jobs_listed_at=None)
        print(
            f"slurmrestd {slurm.ping().slurm_release}, API v{slurm.api_version}; {args.jobs} held jobs submitted in "
            f"{submit_seconds:.1f}s into account {account}: {len(rows)} portal jobs (tagged, with rows), "
            f"{args.jobs - len(rows)} external; {machine}"
        )
        cycles = [sync_cycle("everything new/changed", cluster, client, transport, push)]
        unchanged, attempts = unchanged_cycle(cluster, client, transport, push)
        cycles.append(unchanged)
        Cluster.objects.filter(pk=cluster.pk).update(jobs_listed_at=None)
        cycles.append(sync_cycle("full listing, nothing to change", cluster, client, transport, push))
    finally:
        vars(job_sync)["jobs_push"] = jobs_push
        cancelled, cancel_seconds = stack.slurm_jobs_cancel(slurm, account=account, timeout_seconds=300)
        account_deleted = stack.slurm_account_delete(slurm, account=account)
        slurm.close()
        client.close()

    print(
        f"{'cycle':34}{'seconds':>8}{'requests':>9}{'listed':>7}{'changed':>8}{'new ext':>8}{'queries':>8}"
        f"{'HTTP s':>8}{'list s':>8}{'MB':>6}{'push s':>7}"
    )
    for cycle in cycles:
        result = cycle.result
        print(
            f"{cycle.label:34}{cycle.seconds:8.2f}{result.requests:9d}{result.listed:7d}{result.changed:8d}"
            f"{result.external_created:8d}{cycle.queries:8d}{cycle.http_seconds:8.2f}{cycle.listing_seconds:8.2f}"
            f"{cycle.http_bytes / 1e6:6.1f}{cycle.push_seconds:7.2f}"
        )
    print(
        "requests: as SyncResult counts them; the transport saw "
        + ", ".join(f"{c.http_requests} (HTTP {'/'.join(map(str, sorted(set(c.http_statuses))))})" for c in cycles)
        + ". HTTP s: requests and transfers; list s: the listing with its decoding into typed jobs; "
        f"push s: jobs_push after commit ({cycles[0].pushed} jobs in the first cycle)"
    )
    note = "" if unchanged.result.unchanged_listing else " -- never a 304: something on the cluster kept changing"
    print(
        f"the 304 cycle took {attempts} attempt(s){note}; cleanup: {cancelled} jobs cancelled, none pending after "
        f"{cancel_seconds:.1f}s; Slurm account {account} {'deleted' if account_deleted else 'NOT deleted'}"
    )
    if note := stack.disturbance_note(slurmrestd_pid):
        print(note)


if __name__ == "__main__":
    main()
