"""The cluster page's node board at scale: 500 nodes of 8 GPUs under 25 leaf switches, 1,500 running jobs of 2 GPUs
of 100 projects (20 tenants x 5) holding 3,000 of the 4,000 GPUs, some nodes drained or down.

A member of one project opens /clusters/bench/ (the whole page) and its live partial (what htmx fetches every 10 s)
through Django's test client, in this process: the SQL queries of each are counted (they must not grow with the
nodes: the bench also reads the partial of a 50-node cluster and compares), their time taken (median and 95th
percentile of 20 requests each) and the HTML's size. Needs no Slurm, no Redis and no web server.

Runs on its own database (gpuportal_bench_clusterpage unless BENCH_DATABASE_URL says otherwise).
Usage: flock -w 900 /tmp/gpuportal-live.lock python bench/cluster_page.py [--nodes 500] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from typing import Any

os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench_clusterpage")

import portal_stack as stack  # sets up Django on the benchmark's database first
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from clusters.models import Cluster, ClusterAccount, Node
from jobs.models import Job, JobState
from tenants import services
from tenants.models import Project, ProjectMembership

GPUS_PER_NODE, NODES_PER_SWITCH, TENANTS, PROJECTS_PER_TENANT = 8, 20, 20, 5


def cluster_create(*, name: str, node_count: int, projects: list[Project], viewer: User) -> Cluster:
    """`node_count` nodes; each of three in four has three jobs of 2 GPUs (indices said), one in forty is drained
    and one in a hundred down."""
    now = timezone.now()
    cluster = Cluster.objects.create(
        name=name,
        slurmrestd_url="http://127.0.0.1:9",
        jwt_key_file="/nonexistent",
        log_root="/tmp",
        inventory_synced_at=now,
        last_ping_at=now,
        last_ping_ok=True,
    )
    ClusterAccount.objects.create(cluster=cluster, user=viewer, username="viewer")
    nodes, jobs = [], []
    for number in range(node_count):
        name_of_node = f"gpu{number:04d}"
        busy = number % 4 != 3
        state = "down" if number % 100 == 99 else "drained" if number % 40 == 39 else "mixed" if busy else "idle"
        nodes.append(
            Node(
                cluster=cluster,
                name=name_of_node,
                state=state,
                partition_names=["gpu"],
                cpus=64,
                gpu_type="h100",
                gpus_total=GPUS_PER_NODE,
                gpus_used=6 if busy else 0,
                switch=f"leaf{number // NODES_PER_SWITCH:02d}",
                synced_at=now,
            )
        )
        for slot in range(3 if busy else 0):
            project = projects[(number * 3 + slot) % len(projects)]
            jobs.append(
                Job(
                    project=project,
                    cluster=cluster,
                    cluster_username=f"user{project.pk}",
                    name=f"train-{number}-{slot}",
                    partition="gpu",
                    gpu_type="h100",
                    gpus=2,
                    time_limit_minutes=600,
                    state=JobState.RUNNING,
                    nodes=name_of_node,
                    gpu_indices={name_of_node: [2 * slot, 2 * slot + 1]},
                    started_at=now - timedelta(hours=1),
                )
            )
    Node.objects.bulk_create(nodes)
    Job.objects.bulk_create(jobs, batch_size=1000)
    return cluster


def measure(client: Client, url: str, *, requests: int, partial: bool) -> tuple[int, list[float], int]:
    headers = {"HX-Request": "true"} if partial else {}
    client.get(url, headers=headers)  # warm: the session's first request reads what later ones find cached
    statements: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    # Counted by a wrapper: the request's start resets the connection's query log that CaptureQueriesContext reads.
    with connection.execute_wrapper(count):
        response = client.get(url, headers=headers)
    assert response.status_code == 200
    seconds = []
    for _ in range(requests):
        started = time.perf_counter()
        client.get(url, headers=headers)
        seconds.append(time.perf_counter() - started)
    return len(statements), seconds, len(response.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--requests", type=int, default=20)
    arguments = parser.parse_args()
    print(f"Cluster page, {arguments.nodes} nodes of {GPUS_PER_NODE} GPUs ({stack.machine_note()})")
    print(f"  database recreated and migrated in {stack.database_recreate():.1f} s")
    viewer = User.objects.create_user("viewer")
    projects = []
    for tenant_number in range(TENANTS):
        tenant = services.tenant_create(actor=None, slug=f"tenant{tenant_number:02d}", name="Bench tenant")
        for project_number in range(PROJECTS_PER_TENANT):
            projects.append(
                services.project_create(actor=None, tenant=tenant, slug=f"p{project_number}", name="Bench project")
            )
    ProjectMembership.objects.create(project=projects[0], user=viewer, role="member")
    cluster_create(name="bench", node_count=arguments.nodes, projects=projects, viewer=viewer)
    cluster_create(name="small", node_count=50, projects=projects, viewer=viewer)
    connection.cursor().execute("ANALYZE")
    client = Client()
    client.force_login(viewer)

    small_queries, _, _ = measure(client, "/clusters/small/", requests=1, partial=True)
    for label, partial in (("live partial", True), ("whole page", False)):
        queries, seconds, size = measure(client, "/clusters/bench/", requests=arguments.requests, partial=partial)
        print(
            f"  {label}: {queries} queries, median {1000 * statistics.median(seconds):.0f} ms, "
            f"p95 {1000 * stack.percentile(seconds, 0.95):.0f} ms, {size / 1024:.0f} KiB of HTML"
        )
        if partial:
            print(f"  the same partial of a 50-node cluster: {small_queries} queries")
            assert queries == small_queries, "the node board's queries grow with the nodes"


if __name__ == "__main__":
    main()
