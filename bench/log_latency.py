"""Live log latency: from a line written to a running job's stdout file to its arrival at WebSocket viewers
of `/ws/jobs/{id}/log/`, with 1 and with 100 concurrent viewers of one job.

The job is a Job row (state running, no Slurm job) whose stdout file lies where the portal puts it under
the cluster's log root; this process appends timestamped lines to it at a steady rate (`--interval`)
while its viewers, real WebSocket clients with a bearer token, are connected to uvicorn. A line's latency
is the time from its write to the client's receipt of the `log.chunk` holding it; every viewer must get
every line exactly once. The connect time is that of all viewers' handshakes, started together.
Usage: python bench/log_latency.py [--lines N] [--interval S] [--viewers 1 100] [--port P]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import portal_stack as stack  # sets up Django on the benchmark's database first
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from websockets.asyncio.client import ClientConnection, connect

from clusters.models import Cluster
from jobs.models import Job, JobState
from jobs.paths import job_directory_prepare, job_paths
from tenants import services
from tenants.models import ProjectRole, TenantRole


def world_for_logs() -> stack.World:
    """The benchmark tenant, project, user and token, and the target cluster's row for its log root.

    Streaming a log asks nothing of Slurm, so unlike `stack.world_create` this needs no running cluster.
    """
    cluster, _ = Cluster.objects.update_or_create(
        name=stack.CLUSTER,
        defaults={
            "slurmrestd_url": stack.TARGET.slurmrestd_url,
            "jwt_key_file": stack.TARGET.jwt_key_file,
            "log_root": stack.TARGET.log_root,
            "admin_user": stack.TARGET.admin_user,
            "is_active": True,
        },
    )
    user, _ = get_user_model().objects.get_or_create(username=stack.JOB_USER)
    tenant = services.tenant_create(actor=None, slug=stack.TENANT, name="Benchmarks")
    project = services.project_create(actor=None, tenant=tenant, slug="logs", name="Benchmark logs")
    services.tenant_member_add(actor=None, tenant=tenant, user=user, role=TenantRole.ADMIN)
    services.project_member_add(actor=None, project=project, user=user, role=ProjectRole.MANAGER)
    _, token = services.token_create(user=user, name="bench-logs")
    stack.redis_flush()  # the services scheduled tasks; no worker runs them here
    return stack.World(cluster=cluster, user=user, project=project, token=token)


def running_job(world: stack.World) -> Job:
    """A running job of the project with its (empty) stdout file in place, as a job's first second leaves it."""
    job_id = uuid.uuid4()
    paths = job_paths(
        log_root=world.cluster.log_root, tenant_slug=stack.TENANT, project_slug=world.project.slug, job_id=job_id
    )
    job_directory_prepare(
        log_root=world.cluster.log_root, working_directory=paths.working_directory, username=stack.JOB_USER
    )
    Path(paths.stdout).touch()
    Path(paths.stderr).touch()
    now = timezone.now()
    return Job.objects.create(
        id=job_id,
        project=world.project,
        cluster=world.cluster,
        user=world.user,
        cluster_username=stack.JOB_USER,
        name="bench-log",
        partition=stack.PARTITION,
        gpu_type=stack.GPU_TYPE,
        gpus=1,
        time_limit_minutes=60,
        script="#!/bin/bash\n",
        working_directory=paths.working_directory,
        stdout_path=paths.stdout,
        stderr_path=paths.stderr,
        state=JobState.RUNNING,
        slurm_job_id=1,
        created_at=now,
        submitted_at=now,
        started_at=now,
        updated_at=now,
    )


@dataclass
class Viewer:
    socket: ClientConnection
    next_offset: int
    partial: str = ""  # the start of a line whose end has not arrived yet
    split_lines: int = 0  # chunks that ended inside a line (chunks are bytes as the file had them, not lines)
    latencies: list[float] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # sequence numbers in the order received
    problems: list[str] = field(default_factory=list)


async def view(viewer: Viewer) -> None:
    """Read the viewer's messages until its socket closes, timing each line against the stamp it carries."""
    async for raw in viewer.socket:
        received = time.time()
        message = json.loads(raw)
        if message.get("type") != "log.chunk" or message.get("stream") != "stdout":
            if message.get("type") != "log.chunk":
                viewer.problems.append(f"unexpected {message.get('type')}")
            continue
        if message["offset"] != viewer.next_offset:
            viewer.problems.append(f"chunk at {message['offset']}, expected {viewer.next_offset}")
        viewer.next_offset = message["next_offset"]
        *complete, viewer.partial = (viewer.partial + message["data"]).split("\n")
        viewer.split_lines += bool(viewer.partial)
        for line in complete:
            _, sequence, written = line.split()
            viewer.lines.append(int(sequence))
            viewer.latencies.append(received - float(written))


async def connect_viewer(url: str, *, token: str, origin: str, offset: int) -> Viewer:
    socket = await connect(
        f"{url}?stdout_offset={offset}",
        additional_headers={"Authorization": f"Bearer {token}"},
        origin=origin,  # type: ignore[arg-type]
        open_timeout=60,
        max_queue=None,
    )
    return Viewer(socket=socket, next_offset=offset)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    viewers: int
    connect_seconds: float
    latencies: list[float]
    lost: int
    split_lines: int
    problems: list[str]
    server_cpu_percent: float
    seconds: float


async def phase(
    portal: stack.Portal, world: stack.World, job: Job, *, viewers: int, lines: int, interval: float
) -> Phase:
    url = f"ws://127.0.0.1:{portal.port}/ws/jobs/{job.pk}/log/"
    offset = Path(job.stdout_path).stat().st_size
    started = time.perf_counter()
    clients = await asyncio.gather(
        *(connect_viewer(url, token=world.token, origin=portal.base_url, offset=offset) for _ in range(viewers))
    )
    connect_seconds = time.perf_counter() - started
    readers = [asyncio.create_task(view(viewer)) for viewer in clients]
    web_pid = portal.pid("web")
    cpu_before, wall_before = cpu_seconds(web_pid), time.perf_counter()
    descriptor = os.open(job.stdout_path, os.O_WRONLY | os.O_APPEND)
    loop = asyncio.get_running_loop()
    try:
        # A steady rate, each write scheduled from the start so that slow writes do not stretch the gaps.
        start = loop.time() + interval
        for sequence in range(lines):
            await asyncio.sleep(max(0.0, start + sequence * interval - loop.time()))
            os.write(descriptor, f"bench {sequence} {time.time():.6f}\n".encode())
        deadline = time.monotonic() + 30
        while any(len(viewer.lines) < lines for viewer in clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        os.close(descriptor)
        cpu_percent = 100 * (cpu_seconds(web_pid) - cpu_before) / (time.perf_counter() - wall_before)
        seconds = time.perf_counter() - wall_before
        await asyncio.gather(*(viewer.socket.close() for viewer in clients), return_exceptions=True)
        for outcome in await asyncio.gather(*readers, return_exceptions=True):
            if isinstance(outcome, Exception):
                clients[0].problems.append(f"a viewer failed: {outcome!r}")
    expected = list(range(lines))
    return Phase(
        viewers=viewers,
        connect_seconds=connect_seconds,
        latencies=[latency for viewer in clients for latency in viewer.latencies],
        lost=sum(viewer.lines != expected for viewer in clients),
        split_lines=sum(viewer.split_lines for viewer in clients),
        problems=[problem for viewer in clients for problem in viewer.problems],
        server_cpu_percent=cpu_percent,
        seconds=seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50, help="lines written per phase")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between two lines")
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 100], help="concurrent viewers, per phase")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()

    machine = stack.machine_note()
    stack.database_recreate()
    world = world_for_logs()
    job = running_job(world)
    portal = stack.Portal(port=args.port, with_worker=False)
    phases: list[Phase] = []
    try:
        with portal:
            for viewers in args.viewers:
                phases.append(
                    asyncio.run(phase(portal, world, job, viewers=viewers, lines=args.lines, interval=args.interval))
                )
    finally:
        portal.stop()
        stack.job_directories_remove()

    print(
        f"one running job, {args.lines} timestamped lines per phase appended to its stdout every "
        f"{args.interval * 1000:.0f} ms; server: uvicorn (1 process), "
        f"JOB_LOG_POLL_SECONDS={getattr(settings, 'JOB_LOG_POLL_SECONDS', '?')}, "
        f"JOB_LOG_FORCE_POLLING={getattr(settings, 'JOB_LOG_FORCE_POLLING', '?')}; {machine}"
    )
    print(
        f"{'viewers':>8}{'connect s':>11}{'samples':>9}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'uvicorn CPU':>13}"
        f"{'incomplete':>12}{'split':>7}"
    )
    for result in phases:
        latencies = result.latencies or [float("nan")]
        p50, p95 = stack.percentile(latencies, 0.5) * 1000, stack.percentile(latencies, 0.95) * 1000
        print(
            f"{result.viewers:8d}{result.connect_seconds:11.2f}{len(result.latencies):9d}{p50:9.0f}{p95:9.0f}"
            f"{max(latencies) * 1000:9.0f}{result.server_cpu_percent:12.0f}%{result.lost:12d}{result.split_lines:7d}"
        )
    print(
        "latency: line written (its stamp) -> log.chunk received by a viewer, one sample per line and viewer; "
        "connect s: all viewers' handshakes, concurrently; incomplete: viewers that missed or reordered a line; "
        "split: chunks that ended inside a line (the server sends bytes as the file has them)"
    )
    problems = [problem for result in phases for problem in result.problems]
    if problems:
        print(f"protocol problems ({len(problems)}): {', '.join(sorted(set(problems))[:5])}")


if __name__ == "__main__":
    main()
