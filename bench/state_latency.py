"""Job state latency: from a change made in Slurm to its arrival at a WebSocket client of `/ws/jobs/{id}/`.

Each round submits a job through the API (one GPU, `sleep`), waits until the portal shows it running, opens a
WebSocket to the job with a bearer token, then cancels the job in Slurm directly (as an admin would with
scancel, not through the portal) and times until the client receives `state: cancelled`. The portal runs as
deployed (web tier, a Celery worker and beat with the default sync pace, see jobs/sync_schedule.py).
Usage: python bench/state_latency.py [--rounds N] [--port P]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import portal_stack as stack  # sets up Django on the benchmark's database first
from django.conf import settings
from websockets.asyncio.client import connect

from clusters.slurm import SlurmClient
from jobs.models import Job, JobState


def submit(portal: stack.Portal, world: stack.World, number: int) -> str:
    body = {
        "project": world.project_label,
        "cluster": stack.CLUSTER,
        "partition": stack.PARTITION,
        "gpu_type": stack.GPU_TYPE,
        "gpus": 1,
        "time_limit_minutes": 10,
        "name": f"state-{number}",
        "script": "#!/bin/bash\nsleep 600\n",
    }
    headers = {"Authorization": f"Bearer {world.token}"}
    response = httpx.post(f"{portal.base_url}/api/v1/jobs/", json=body, headers=headers, timeout=30)
    response.raise_for_status()
    job_id: str = response.json()["id"]
    return job_id


def wait_running(job_id: str, *, timeout_seconds: float = 120) -> Job:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if job.state == JobState.RUNNING and job.slurm_job_id is not None:
            return job
        if job.is_final:
            raise SystemExit(f"job {job_id} ended as {job.state} before running: {job.last_error}")
        time.sleep(0.1)
    raise SystemExit(f"job {job_id} was not running within {timeout_seconds:.0f}s")


async def cancel_and_time(portal: stack.Portal, world: stack.World, job: Job, slurm: SlurmClient) -> float:
    url = portal.base_url.replace("http://", "ws://") + f"/ws/jobs/{job.pk}/"
    async with connect(url, additional_headers={"Authorization": f"Bearer {world.token}"}, open_timeout=30) as socket:
        first = json.loads(await socket.recv())
        assert first["job"]["state"] == JobState.RUNNING, first
        started = time.perf_counter()
        await asyncio.to_thread(slurm.cancel_job, user=stack.TARGET.admin_user, job_id=job.slurm_job_id or 0)
        while True:
            message = json.loads(await asyncio.wait_for(socket.recv(), timeout=60))
            if message["job"]["state"] == JobState.CANCELLED:
                return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()

    stack.database_recreate()
    world = stack.world_create(project_slug="state")
    slurm = stack.bare_client()
    print(
        f"slurmrestd {slurm.ping().slurm_release}, API v{slurm.api_version}; sync pace "
        f"{settings.JOB_SYNC_ACTIVE_SECONDS:g}s with active jobs, {settings.JOB_SYNC_INTERVAL_SECONDS}s idle; "
        f"{stack.machine_note()}"
    )
    latencies: list[float] = []
    portal = stack.Portal(port=args.port, with_beat=True)
    try:
        with portal:
            for number in range(1, args.rounds + 1):
                job = wait_running(submit(portal, world, number))
                latencies.append(asyncio.run(cancel_and_time(portal, world, job, slurm)))
    finally:
        portal.stop()
        stack.slurm_jobs_cancel(slurm, account=world.project.slurm_account)
        slurm.close()
        stack.job_directories_remove()
    p50, p95 = stack.percentile(latencies, 0.50), stack.percentile(latencies, 0.95)
    print(
        f"state change in Slurm (scancel) -> WebSocket client, {len(latencies)} jobs: p50 {p50 * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
