"""The cluster page's node board: every node under its switch, each GPU in use (only the viewer's own projects
named), idle, drained or down; the queue by partition and GPU type; a bounded number of queries; and, on the live
local cluster, a running job's GPU under the right node and switch in a real browser."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect

from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount, ClusterUsageSample, Node
from clusters.services import cluster_sync_inventory
from jobs.models import Job, JobArrayTask, JobState
from tenants.models import Project
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user
from tests.jobs.conftest import LiveProject, live_project  # noqa: F401  (the fixture, shared with tests/jobs)
from tests.live_clusters import live_clusters

# Everything that names tenant B's job: none of it may reach A's page.
B_NAMES = ("betacorp", "Beta Corporation", "secretproj", "Secret Project Name", "bobby-b", "bobposix", "hidden-run")


def make_node(
    cluster: Cluster, name: str, *, switch: str, state: str, total: int, used: int = 0, **fields: Any
) -> Node:
    return Node.objects.create(
        cluster=cluster,
        name=name,
        state=state,
        switch=switch,
        partition_names=["gpu"],
        cpus=16,
        gpu_type="h100" if total else "",
        gpus_total=total,
        gpus_used=used,
        synced_at=timezone.now(),
        **fields,
    )


def running_job(project: Project, user: User, cluster: Cluster, name: str, **fields: Any) -> Job:
    username = ClusterAccount.objects.get(cluster=cluster, user=user).username
    defaults: dict[str, Any] = {
        "partition": "gpu",
        "gpu_type": "h100",
        "gpus": 1,
        "time_limit_minutes": 60,
        "state": JobState.RUNNING,
    }
    return Job.objects.create(
        project=project, cluster=cluster, user=user, cluster_username=username, name=name, **{**defaults, **fields}
    )


class Board:
    """Tenants A (acme/vision, viewer alice) and B (betacorp/secretproj, bobby-b) sharing cluster `board`:
    gpu01 (leaf1, mixed): GPU 1 A's job (Slurm named the index), GPU 0 B's job (index not said), GPU 2 a job of
    no portal project, GPU 3 idle; gpu02 (leaf1) drained; gpu03 (leaf2) down; gpu04 (leaf2) both GPUs A's array
    task; cpu01 no switch, no GPUs."""

    def __init__(self) -> None:
        self.cluster = Cluster.objects.create(
            name="board",
            slurmrestd_url="http://127.0.0.1:9",
            jwt_key_file="/nonexistent",
            log_root="/tmp/board-logs",
            inventory_synced_at=timezone.now(),
            last_ping_at=timezone.now(),
            last_ping_ok=True,
        )
        self.alice = make_user("alice")
        self.bob = make_user("bobby-b")
        ClusterAccount.objects.create(cluster=self.cluster, user=self.alice, username="alice")
        ClusterAccount.objects.create(cluster=self.cluster, user=self.bob, username="bobposix")
        self.vision = make_project(make_tenant("acme"), "vision")
        add_project_member(self.vision, self.alice)
        beta = make_tenant("betacorp")
        beta.name = "Beta Corporation"
        beta.save(update_fields=["name"])
        self.secret = make_project(beta, "secretproj")
        self.secret.name = "Secret Project Name"
        self.secret.save(update_fields=["name"])
        add_project_member(self.secret, self.bob)
        make_node(self.cluster, "gpu01", switch="leaf1", state="mixed", total=4, used=3)
        make_node(self.cluster, "gpu02", switch="leaf1", state="drained", total=4, reason="bad fan")
        make_node(self.cluster, "gpu03", switch="leaf2", state="down", total=2, reason="not responding")
        make_node(self.cluster, "gpu04", switch="leaf2", state="allocated", total=2, used=2)
        make_node(self.cluster, "cpu01", switch="", state="idle", total=0)
        self.a_job = running_job(
            self.vision, self.alice, self.cluster, "a-train", nodes="gpu01", gpu_indices={"gpu01": [1]}
        )
        running_job(self.secret, self.bob, self.cluster, "hidden-run", nodes="gpu01")
        array = running_job(self.vision, self.alice, self.cluster, "a-sweep", gpus=2, array="0-3", nodes="")
        JobArrayTask.objects.create(job=array, index=0, state=JobState.RUNNING, nodes="gpu04")
        JobArrayTask.objects.create(job=array, index=1, state=JobState.PENDING)
        # Ended: holds nothing any more.
        running_job(self.secret, self.bob, self.cluster, "hidden-run", nodes="gpu03", state=JobState.COMPLETED)


@pytest.fixture
def board(db: None) -> Board:
    return Board()


def html_of(client: Client, user: User, **headers: str) -> str:
    client.force_login(user)
    response = client.get("/clusters/board/", headers=headers)
    assert response.status_code == 200
    return " ".join(response.content.decode().split())


def node_html(page: str, name: str) -> str:
    found = re.search(
        rf'<article class="node-card [^"]*" aria-labelledby="node-{name}" data-node="{name}">.*?</article>', page
    )
    assert found, f"no card for {name}"
    return found.group(0)


def gpu_cells(card: str) -> list[str]:
    """Each GPU cell's class and words, tags stripped."""
    return [
        f"{status}: {re.sub(r'<[^>]+>', '', words).strip()}"
        for status, words in re.findall(r'<li class="gpu gpu-(\w+)" data-gpu="\d+">(.*?)</li>', card)
    ]


def test_a_viewer_sees_their_own_projects_named_and_every_other_holder_as_another_project(
    client: Client, board: Board
) -> None:
    page = html_of(client, board.alice)

    assert gpu_cells(node_html(page, "gpu01")) == [
        "other: GPU 0 another project",
        "own: GPU 1 acme/vision: job a-train of alice",
        "other: GPU 2 another project",
        "idle: GPU 3 idle",
    ]
    assert f'<a href="/jobs/{board.a_job.pk}/" title="a-train (alice)">acme/<wbr>vision' in node_html(page, "gpu01")
    assert gpu_cells(node_html(page, "gpu04")) == [
        "own: GPU 0 acme/vision: job a-sweep of alice",
        "own: GPU 1 acme/vision: job a-sweep of alice",
    ]
    assert 'aria-label="GPUs of gpu01: 3 of 4 in use"' in page


@pytest.mark.parametrize("live", [False, True], ids=["page", "live-partial"])
def test_no_name_of_another_tenant_reaches_the_page_or_its_live_partial(
    client: Client, board: Board, live: bool
) -> None:
    page = html_of(client, board.alice, **({"HX-Request": "true"} if live else {}))

    assert page.startswith('<div id="cluster-live"') == live
    assert "acme/<wbr>vision" in page
    leaked = [name for name in B_NAMES if name.lower() in page.lower()]
    assert leaked == []
    assert str(Job.objects.get(name="hidden-run", state=JobState.RUNNING).pk) not in page


def test_the_other_tenant_sees_its_own_names_and_not_the_first_ones(client: Client, board: Board) -> None:
    page = html_of(client, board.bob)

    assert gpu_cells(node_html(page, "gpu01"))[:2] == [
        "own: GPU 0 betacorp/secretproj: job hidden-run of bobposix",
        "other: GPU 1 another project",
    ]
    assert "acme" not in page
    assert "a-train" not in page


def test_a_tenant_admin_sees_their_tenants_projects_named_and_a_portal_admin_every_one(
    client: Client, board: Board
) -> None:
    admin = make_user("beta-admin")
    add_tenant_member(board.secret.tenant, admin, "admin")
    ClusterAccount.objects.create(cluster=board.cluster, user=admin, username="betaadmin")
    staff = make_user("root", is_staff=True)

    tenant_admin = gpu_cells(node_html(html_of(client, admin), "gpu01"))
    portal_admin = gpu_cells(node_html(html_of(client, staff), "gpu01"))

    assert tenant_admin[:2] == [
        "own: GPU 0 betacorp/secretproj: job hidden-run of bobposix",
        "other: GPU 1 another project",
    ]
    assert portal_admin[:3] == [
        "own: GPU 0 betacorp/secretproj: job hidden-run of bobposix",
        "own: GPU 1 acme/vision: job a-train of alice",
        "other: GPU 2 another project",  # a job of no portal project: Slurm counts it, the portal knows no name
    ]


def test_drained_and_down_nodes_and_grouping_by_switch(client: Client, board: Board) -> None:
    page = html_of(client, board.alice)

    switches = re.findall(r'<section class="switch-group" aria-labelledby="switch-\d+" data-switch="(\w*)">', page)
    assert switches == ["leaf1", "leaf2", ""]
    groups = {
        name: re.findall(r'data-node="([\w-]+)"', body)
        for name, body in re.findall(r'data-switch="(\w*)">(.*?)</section>', page)
    }
    assert groups == {"leaf1": ["gpu01", "gpu02"], "leaf2": ["gpu03", "gpu04"], "": ["cpu01"]}
    assert 'Switch leaf1 <span class="hint">2 nodes, 3 of 8 GPUs in use</span>' in page
    assert 'No switch known <span class="hint">1 node, 0 of 0 GPUs in use</span>' in page
    drained = node_html(page, "gpu02")
    assert '<span class="badge badge-drained">drained</span>' in drained
    assert '<p class="node-reason">bad fan</p>' in drained
    assert gpu_cells(drained) == [f"drained: GPU {index} drained" for index in range(4)]
    assert gpu_cells(node_html(page, "gpu03")) == ["down: GPU 0 down", "down: GPU 1 down"]
    assert gpu_cells(node_html(page, "cpu01")) == []
    # The legend says in words what each colour means.
    assert '<li><span class="gpu-swatch gpu-other" aria-hidden="true"></span> In use by another project</li>' in page


def test_the_queue_by_partition_and_gpu_type(client: Client, board: Board) -> None:
    ClusterUsageSample.objects.create(
        cluster=board.cluster,
        at=timezone.now().replace(second=0, microsecond=0),
        partitions={
            "gpu": {
                "pending": 3,
                "running": 2,
                "pending_gpus": 7,
                "running_gpus": 3,
                "pending_by_gpu_type": {"h100": {"jobs": 2, "gpus": 6}, "": {"jobs": 1, "gpus": 1}},
                "running_by_gpu_type": {"h100": {"jobs": 2, "gpus": 3}},
                "pending_reasons": {"Resources": 3},
            },
            "debug": {
                "pending": 1,
                "running": 0,
                "pending_gpus": 0,
                "running_gpus": 0,
                "pending_by_gpu_type": {"": {"jobs": 1, "gpus": 0}},
                "pending_reasons": {"Priority": 1},
            },
        },
    )

    page = html_of(client, board.alice)

    table = re.search(r'<table id="queue-by-gpu-type">.*?</table>', page)
    assert table
    rows = re.findall(r"<tr><th scope=\"row\">(.*?)</th>(.*?)</tr>", table.group(0))
    assert [(name, re.findall(r"<td[^>]*>(.*?)</td>", cells)) for name, cells in rows] == [
        ("debug", ["any", "1", "0", "\N{EN DASH}", "\N{EN DASH}"]),  # a sample from before the running figures per type
        ("gpu", ["any", "1", "1", "0", "0"]),
        ("gpu", ["h100", "2", "6", "2", "3"]),
    ]


def test_the_page_reads_a_fixed_number_of_queries_however_many_nodes_and_jobs(client: Client, board: Board) -> None:
    client.force_login(board.alice)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/clusters/board/", headers={"HX-Request": "true"}).status_code == 200
        return len(captured)

    queries()  # the first request of a session also reads what later ones find cached
    few = queries()
    for number in range(40):
        make_node(board.cluster, f"big{number:03d}", switch=f"leaf{number % 4}", state="mixed", total=8, used=2)
        owner, project = (board.alice, board.vision) if number % 2 else (board.bob, board.secret)
        running_job(project, owner, board.cluster, f"run{number}", nodes=f"big{number:03d}", gpus=2)

    assert queries() == few


# On the live local cluster, in a real browser ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_running_job_shows_on_its_node_under_its_switch_in_a_browser(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    open_page: Any,
    screenshot: Any,
) -> None:
    local = next((cluster for cluster in live_clusters() if cluster.name == "local"), None)
    if local is None or not local.switches:
        pytest.skip("the local cluster was started before it described its network: run `make cluster`")
    # Runs until the fixture cancels it: the page is read while it holds its GPU.
    reply = live_project.submit(name="board-run", script="#!/bin/bash\nsleep 300\n", time_limit_minutes=5)
    job = live_project.wait_for(reply["id"], lambda job: job.state == JobState.RUNNING, timeout=180)
    cluster = Cluster.objects.get(pk=live_project.cluster.pk)
    cluster_sync_inventory(cluster=cluster, client=slurm_client_for(cluster))
    switch = local.switch_of(job.nodes)
    assert switch  # h100's nodes, gpu[01-02], hang under leaf1
    label = live_project.label

    for viewport, size in (("desktop", "laptop"), ("phone", "phone")):
        page = open_page(live_project.member, viewport=viewport)
        page.goto("/clusters/local/")
        card = page.locator(f"section[data-switch='{switch}'] article[data-node='{job.nodes}']")
        held = card.locator("li.gpu-own")
        expect(held).to_have_count(1)
        expect(held).to_contain_text(label)
        expect(held.get_by_role("link")).to_have_attribute("href", f"/jobs/{job.pk}/")
        # The other switch's nodes are under it, not under this one.
        other = next(name for name in local.switches if name != switch)
        for name in local.switches[other]:
            expect(page.locator(f"section[data-switch='{other}'] article[data-node='{name}']")).to_have_count(1)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        # htmx swaps the board in again on its own: the held GPU is still there after an update.
        updated = page.locator("#cluster-live .live-line time").inner_text()
        page.wait_for_function(
            "old => document.querySelector('#cluster-live .live-line time').textContent !== old",
            arg=updated,
            timeout=25000,
        )
        expect(page.locator(f"article[data-node='{job.nodes}'] li.gpu-own")).to_contain_text(label)
        card.scroll_into_view_if_needed()
        screenshot(page, f"cluster-nodes-{size}")
