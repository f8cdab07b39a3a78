"""Cluster status pages and the utilisation samples behind them: nodes, GPUs, queue, idle GPUs while jobs wait,
staleness, access, the sampling hook (one sample a minute, pruning) and one look in a real browser."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from clusters.models import Cluster, ClusterAccount, ClusterUsageSample, Node
from clusters.slurm.types import JobState, NodeInfo, NodeState, SlurmJob
from clusters.usage_samples import cluster_usage_sample_store
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

NOW = datetime(2026, 11, 21, 14, 5, 30, tzinfo=timezone.get_current_timezone())


def node(name: str, state: NodeState, *, gpu_type: str = "h100", total: int = 4, used: int = 0) -> NodeInfo:
    return NodeInfo(
        name=name,
        state=state,
        state_flags=(state.value.upper(),),
        reason="",
        partitions=("gpu",),
        cpus=8,
        cpus_allocated=0,
        real_memory_mb=1024,
        gpu_type=gpu_type,
        gpus_total=total,
        gpus_used=used,
    )


def slurm_job(job_id: int, state: JobState, *, partition: str = "gpu", gpus: int = 1, reason: str = "") -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        name="train",
        account="other",
        partition=partition,
        user_name="someone",
        state=state,
        state_reason=reason,
        comment="",
        submit_time=None,
        start_time=None,
        end_time=None,
        time_limit_minutes=60,
        gpus=gpus,
        gpu_type="h100",
        nodes="",
        exit_code=None,
        standard_output="",
        standard_error="",
    )


# The samples -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_sample_records_gpus_per_type_nodes_per_state_and_the_queue_per_partition() -> None:
    cluster = make_matrix_cluster()
    nodes = [
        node("a", NodeState.MIXED, used=3),
        node("b", NodeState.DRAINED, used=0),
        node("c", NodeState.IDLE, gpu_type="a100", total=2),
    ]
    jobs = [
        slurm_job(1, JobState.RUNNING, gpus=3),
        slurm_job(2, JobState.PENDING, gpus=2, reason="Priority"),
        slurm_job(3, JobState.PENDING, gpus=1, reason="Priority", partition="gpu,debug"),
        slurm_job(4, JobState.COMPLETED),
    ]

    sample = cluster_usage_sample_store(cluster=cluster, now=NOW, nodes=nodes, jobs=jobs)

    assert sample is not None
    sample.refresh_from_db()
    assert sample.at == NOW.replace(second=0)
    assert (sample.gpus_total, sample.gpus_used) == (10, 3)
    # Idle counts only nodes that take jobs: the drained node's four free GPUs are not idle.
    assert sample.gpu_types == {"a100": {"total": 2, "used": 0, "idle": 2}, "h100": {"total": 8, "used": 3, "idle": 1}}
    assert sample.nodes_by_state == {"drained": 1, "idle": 1, "mixed": 1}
    assert sample.partitions == {
        "debug": {
            "pending": 1,
            "running": 0,
            "pending_gpus": 1,
            "running_gpus": 0,
            "pending_by_gpu_type": {"h100": {"jobs": 1, "gpus": 1}},
            "running_by_gpu_type": {},
            "pending_reasons": {"Priority": 1},
        },
        "gpu": {
            "pending": 2,
            "running": 1,
            "pending_gpus": 3,
            "running_gpus": 3,
            "pending_by_gpu_type": {"h100": {"jobs": 2, "gpus": 3}},
            "running_by_gpu_type": {"h100": {"jobs": 1, "gpus": 3}},
            "pending_reasons": {"Priority": 2},
        },
    }


@pytest.mark.django_db
def test_one_sample_a_minute_and_old_samples_are_pruned() -> None:
    cluster = make_matrix_cluster()
    other = make_matrix_cluster("othercluster")
    nodes = [node("a", NodeState.IDLE)]
    old = ClusterUsageSample.objects.create(cluster=cluster, at=NOW - timedelta(days=30, minutes=1))
    kept = ClusterUsageSample.objects.create(cluster=cluster, at=NOW - timedelta(days=29))
    elsewhere = ClusterUsageSample.objects.create(cluster=other, at=NOW - timedelta(days=40))

    first = cluster_usage_sample_store(cluster=cluster, now=NOW, nodes=nodes, jobs=[])
    same_minute = cluster_usage_sample_store(cluster=cluster, now=NOW + timedelta(seconds=25), nodes=nodes, jobs=[])
    next_minute = cluster_usage_sample_store(cluster=cluster, now=NOW + timedelta(seconds=40), nodes=nodes, jobs=None)

    assert first is not None
    assert same_minute is None
    assert next_minute is not None
    assert next_minute.partitions is None  # the listing failed: the queue is unknown, not empty
    assert list(ClusterUsageSample.objects.filter(cluster=cluster).order_by("at").values_list("pk", flat=True)) == [
        kept.pk,
        first.pk,
        next_minute.pk,
    ]
    assert not ClusterUsageSample.objects.filter(pk=old.pk).exists()
    assert ClusterUsageSample.objects.filter(pk=elsewhere.pk).exists()  # pruned with its own cluster's samples


# The pages ---------------------------------------------------------------------------------------------


@pytest.fixture
def member(db: None) -> User:
    """A user with a username on `matrixcluster`, the cluster's status pages open to them."""
    cluster = make_matrix_cluster()
    Cluster.objects.filter(pk=cluster.pk).update(
        inventory_synced_at=timezone.now(), last_ping_at=timezone.now(), last_ping_ok=True, slurm_release="24.05.1"
    )
    user = make_user("alice")
    ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")
    return user


def page_of(client: Client, user: User, url: str, **headers: str) -> str:
    client.force_login(user)
    response = client.get(url, headers=headers)
    assert response.status_code == 200
    return " ".join(response.content.decode().split())


def sample(*, at: datetime | None = None, used: int = 0, total: int = 4, queue: dict[str, Any] | None = None) -> None:
    ClusterUsageSample.objects.create(
        cluster=Cluster.objects.get(name="matrixcluster"),
        at=(at or timezone.now()).replace(second=0, microsecond=0),
        gpus_total=total,
        gpus_used=used,
        partitions=queue,
    )


def waiting(
    jobs: int, gpus: int, *, running: int = 0, gpu_type: str = "h100", reason: str = "Priority"
) -> dict[str, Any]:
    return {
        "gpu": {
            "pending": jobs,
            "running": running,
            "pending_gpus": gpus,
            "running_gpus": running,
            "pending_by_gpu_type": {gpu_type: {"jobs": jobs, "gpus": gpus}},
            "pending_reasons": {reason: jobs},
        }
    }


def test_idle_gpus_while_jobs_wait_are_called_out_precisely(client: Client, member: User) -> None:
    cluster = Cluster.objects.get(name="matrixcluster")
    # n1 (idle, 4 h100) is free; a drained node's free GPUs take no jobs and do not count.
    Node.objects.create(
        cluster=cluster,
        name="n2",
        state="drained",
        partition_names=["gpu"],
        gpu_type="h100",
        gpus_total=4,
        reason="bad fan",
        synced_at=timezone.now(),
    )
    Node.objects.filter(name="n1").update(partition_names=["gpu"])
    sample(queue=waiting(3, 5, reason="Priority"))

    page = page_of(client, member, "/clusters/matrixcluster/")

    assert '<div class="notice notice-warning idle-callout" role="status">' in page
    assert "<strong>Idle GPUs while jobs wait: idle GPU time is wasted money.</strong>" in page
    assert (
        "4 h100 GPUs idle while 3 jobs wait in partition <strong>gpu</strong> (asking for 5 h100 GPUs). "
        "Slurm's reasons: 3 \N{MULTIPLICATION SIGN} waiting behind jobs with a higher priority." in page
    )
    assert '<h4 id="node-n2">n2 <span class="badge badge-drained">drained</span></h4>' in page
    assert '<p class="node-reason">bad fan</p>' in page
    assert (
        '<li><span class="badge badge-idle">1 idle</span></li>'
        '<li><span class="badge badge-drained">1 drained</span></li>' in page
    )
    # GPUs per type: 4 idle, 4 unavailable (free on the drained node), 8 in all.
    assert (
        '<td class="number">0</td> <td class="number">4</td> <td class="number">4</td> <td class="number">8</td>'
        in page
    )
    # Queue per partition.
    assert '<th scope="row">gpu</th><td class="number">3</td><td class="number">0</td><td class="number">5</td>' in page

    listing = page_of(client, member, "/clusters/")
    assert 'Idle GPUs while jobs wait: <a href="/clusters/matrixcluster/">see where</a>.' in listing
    assert "<dt>Jobs</dt><dd>3 waiting, 0 running</dd>" in listing


def test_no_callout_when_the_waiting_jobs_ask_for_a_type_without_idle_gpus(client: Client, member: User) -> None:
    Node.objects.filter(name="n1").update(partition_names=["gpu"])
    sample(queue=waiting(2, 2, gpu_type="a100"))

    page = page_of(client, member, "/clusters/matrixcluster/")

    assert "idle-callout" not in page
    assert '<th scope="row">gpu</th><td class="number">2</td>' in page


def test_no_callout_when_every_gpu_is_busy(client: Client, member: User) -> None:
    Node.objects.filter(name="n1").update(partition_names=["gpu"], state="allocated", gpus_used=4)
    sample(queue=waiting(2, 2, running=1, reason="Resources"), used=4)

    page = page_of(client, member, "/clusters/matrixcluster/")

    assert "idle-callout" not in page
    assert '<div class="stat">4 / 4</div><div class="stat-label">GPUs in use</div>' in page


def test_the_utilisation_chart_and_its_figures_in_words(client: Client, member: User) -> None:
    now = timezone.now()
    sample(at=now - timedelta(hours=2), used=1)
    sample(at=now - timedelta(hours=1), used=3)
    sample(at=now - timedelta(days=3), used=4)

    day = page_of(client, member, "/clusters/matrixcluster/")
    chart = json.loads(re.search(r'<script id="usage-chart" type="application/json">(.*?)</script>', day).group(1))  # type: ignore[union-attr]
    assert [series["values"] for series in chart["series"]] == [[1, 3], [4, 4]]
    assert "2 samples): on average <strong>2.0</strong> of 4.0 GPUs in use (50%), at most 3." in day
    assert '<a href="?range=24h" aria-current="page">Last 24 hours</a>' in day

    week = page_of(client, member, "/clusters/matrixcluster/?range=7d")
    assert "3 samples): on average <strong>2.7</strong> of 4.0 GPUs in use (67%), at most 4." in week


def test_no_samples_yet_is_explained(client: Client, member: User) -> None:
    page = page_of(client, member, "/clusters/matrixcluster/")

    assert "No utilisation recorded in this range yet." in page
    assert "The queue is unknown: no sample has been recorded yet." in page


def test_a_stale_sync_and_an_unreachable_cluster_are_said(client: Client, member: User) -> None:
    long_ago = timezone.now() - timedelta(minutes=20)
    Cluster.objects.filter(name="matrixcluster").update(inventory_synced_at=long_ago)
    assert '<p class="notice notice-warning" role="alert"><strong>Out of date.</strong>' in page_of(
        client, member, "/clusters/matrixcluster/"
    )

    Cluster.objects.filter(name="matrixcluster").update(last_ping_ok=False, last_ping_error="connection refused")
    page = page_of(client, member, "/clusters/matrixcluster/")
    assert '<p class="notice notice-error" role="alert"><strong>Unreachable.</strong>' in page
    assert "failed: connection refused. The figures are from the last successful sync" in page


def test_a_cluster_never_synced_says_so(client: Client, member: User) -> None:
    Cluster.objects.filter(name="matrixcluster").update(inventory_synced_at=None)

    page = page_of(client, member, "/clusters/")

    assert "<strong>No sync yet.</strong> The portal's workers read the cluster's nodes and queue" in page


def test_htmx_polls_a_partial_with_the_time_it_was_updated(client: Client, member: User) -> None:
    page = page_of(client, member, "/clusters/matrixcluster/")
    assert (
        '<div id="cluster-live" hx-get="/clusters/matrixcluster/" hx-trigger="every 10s" hx-swap="outerHTML">' in page
    )

    partial = page_of(client, member, "/clusters/matrixcluster/", HX_Request="true")

    assert partial.startswith('<div id="cluster-live"')
    assert "<html" not in partial
    assert re.search(r'updated <time datetime="[^"]+">\d\d:\d\d:\d\d UTC</time>', partial)


def test_who_sees_which_cluster(client: Client, member: User) -> None:
    stranger = make_user("stranger")  # no username on any cluster
    project = make_project(make_tenant("acme"), "vision")
    add_project_member(project, stranger, "member")
    grant_allocation(project, Cluster.objects.get(name="matrixcluster"))

    assert "There is no cluster you can submit to yet." in page_of(client, stranger, "/clusters/")
    assert client.get("/clusters/matrixcluster/").status_code == 404
    assert client.get("/clusters/ghost/").status_code == 404
    assert '<h2><a href="/clusters/matrixcluster/">matrixcluster</a></h2>' in page_of(client, member, "/clusters/")
    staff = make_user("root", is_staff=True)
    assert "Slurm 24.05.1" in page_of(client, staff, "/clusters/matrixcluster/")


# In a real browser, on the live cluster ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("viewport", ["phone", "desktop"])
def test_dashboard_and_cluster_status_in_a_browser(open_page: Any, screenshot: Any, viewport: str) -> None:
    from tests.jobs.conftest import local_cluster

    cluster = local_cluster()  # synced from the live Slurm: the sync's hook recorded this minute's sample
    latest = ClusterUsageSample.objects.filter(cluster=cluster).latest("at")
    assert latest.gpus_total == sum(Node.objects.filter(cluster=cluster).values_list("gpus_total", flat=True))
    assert latest.partitions is not None
    # An hour earlier, half the GPUs were busy: the chart has two points to draw a line between.
    ClusterUsageSample.objects.create(
        cluster=cluster,
        at=latest.at - timedelta(hours=1),
        gpus_total=latest.gpus_total,
        gpus_used=latest.gpus_total // 2,
    )
    user = make_user("alice-browser")
    ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")
    project = make_project(make_tenant("acme"), "vision")
    add_project_member(project, user, "member")
    grant_allocation(project, cluster, 100)

    page = open_page(user, viewport=viewport)
    page.goto("/")
    assert page.locator("svg[aria-label^='acme/vision: ']").is_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, f"dashboard-{viewport}")

    page.goto("/clusters/local/")
    assert page.get_by_role("heading", name="Cluster local", level=1).is_visible()
    assert page.get_by_role("heading", name="Nodes", exact=True).is_visible()
    page.locator("[data-chart='usage-chart'] canvas").wait_for()
    # htmx replaces the figures on its own; the time they were updated changes without a reload.
    updated = page.locator("#cluster-live .live-line time").inner_text()
    page.wait_for_function(
        "old => document.querySelector('#cluster-live .live-line time').textContent !== old", arg=updated, timeout=25000
    )
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    screenshot(page, f"cluster-{viewport}")
