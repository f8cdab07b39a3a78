"""Where the submit form starts: a cluster, partition and GPU type the project's open allocations cover
(jobs/fitting.py), and the form's live verdict in the submission's own words. No Slurm: the clusters are as a
sync left them."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, ClusterAccount, GpuType, Node, Partition
from jobs.fitting import covered_shape_choose, free_alternatives
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobState
from tenants.models import Project
from tests.factories import add_project_member, grant_allocation, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\necho hi\n"


def _cluster(name: str) -> Cluster:
    """Like the demo's 22.05 cluster: 'debug' (default) has h100 and a100 nodes, 'h100' and 'a100' one type each,
    and 'l40s' (not default) the only l40s."""
    now = timezone.now()
    cluster = Cluster.objects.create(
        name=name, slurmrestd_url="http://127.0.0.1:9", jwt_key_file="/nonexistent", log_root="/tmp/shape-logs"
    )
    nodes = {"h1": "h100", "a1": "a100", "l1": "l40s"}
    for node, gpu_type in nodes.items():
        Node.objects.create(
            cluster=cluster,
            name=node,
            state="idle",
            cpus=8,
            memory_mb=16384,
            gpu_type=gpu_type,
            gpus_total=4,
            synced_at=now,
        )
        GpuType.objects.create(cluster=cluster, name=gpu_type, gpus_total=4, max_gpus_per_node=4, synced_at=now)
    for partition, members, default in (
        ("debug", ["h1", "a1"], True),
        ("h100", ["h1"], False),
        ("a100", ["a1"], False),
        ("l40s", ["l1"], False),
    ):
        types = sorted(nodes[node] for node in members)
        Partition.objects.create(
            cluster=cluster,
            name=partition,
            state="UP",
            is_default=default,
            max_time_minutes=30 if default else 2880,
            default_time_minutes=10 if default else 60,
            node_names=members,
            gpu_types=types,
            max_gpus_per_node=4,
            max_cpus_per_node=8,
            max_memory_mb_per_node=16384,
            gpus_per_node_by_type=dict.fromkeys(types, 4),
            synced_at=now,
        )
    return cluster


@pytest.fixture
def local() -> Cluster:
    return _cluster("shapelocal")


@pytest.fixture
def project() -> Project:
    return make_project(make_tenant("acme"), "vision")


def _shape(project: Project, *clusters: Cluster) -> tuple[str, str, str] | None:
    shape = covered_shape_choose(project=project, clusters=list(clusters))
    return None if shape is None else (shape.cluster.name, shape.partition, shape.gpu_type)


# The choice ---------------------------------------------------------------------------------------------


def test_an_allocation_for_one_type_starts_on_the_default_partition_with_that_type(
    local: Cluster, project: Project
) -> None:
    grant_allocation(project, local, 500, gpu_type="h100")
    assert _shape(project, local) == ("shapelocal", "debug", "h100")


def test_a_type_the_default_partition_lacks_starts_on_a_partition_of_that_type(
    local: Cluster, project: Project
) -> None:
    grant_allocation(project, local, 200, gpu_type="l40s")
    assert _shape(project, local) == ("shapelocal", "l40s", "l40s")


def test_an_allocation_for_any_type_keeps_the_cluster_defaults(local: Cluster, project: Project) -> None:
    grant_allocation(project, local, 50, gpu_type="a100")
    grant_allocation(project, local, 50)
    assert _shape(project, local) == ("shapelocal", "debug", "")


def test_an_allocation_with_hours_left_comes_before_a_used_up_one(local: Cluster, project: Project) -> None:
    grant_allocation(project, local, 0, gpu_type="a100")
    grant_allocation(project, local, 10, gpu_type="l40s")
    assert _shape(project, local) == ("shapelocal", "l40s", "l40s")


def test_the_first_cluster_with_an_allocation_is_chosen(local: Cluster, project: Project) -> None:
    other = _cluster("shapenorth")
    grant_allocation(project, other, 100, gpu_type="a100")
    assert _shape(project, local, other) == ("shapenorth", "debug", "a100")


def test_no_shape_without_an_open_allocation_or_a_partition_for_its_type(local: Cluster, project: Project) -> None:
    today = timezone.now().date()
    grant_allocation(project, local, 100, starts_on=today - timedelta(days=40), ends_on=today - timedelta(days=10))
    grant_allocation(project, local, 100, gpu_type="mi300")  # no partition offers it
    assert _shape(project, local) is None
    assert _shape(project) is None


# The form ------------------------------------------------------------------------------------------------


@pytest.fixture
def bob(local: Cluster, project: Project) -> Any:
    """As in the demo: a member of acme/vision, whose GPU-hours on the cluster are for h100 only."""
    grant_allocation(project, local, 500, gpu_type="h100")
    user = make_user("bob")
    add_project_member(project, user, "member")
    ClusterAccount.objects.create(cluster=local, user=user, username="bob")
    return user


def _selected(html: str, field: str) -> str:
    select = re.search(rf'<select id="id_{field}".*?</select>', html, re.S)
    assert select, f"no {field} select"
    chosen = re.findall(r'<option value="([^"]*)" selected>', select.group(0))
    assert len(chosen) <= 1
    return chosen[0] if chosen else ""


def test_the_form_starts_from_a_shape_the_allocation_covers(bob: Any, local: Cluster) -> None:
    empty_cluster = _cluster("shapeempty")  # listed first, but vision has no GPU-hours there
    ClusterAccount.objects.create(cluster=empty_cluster, user=bob, username="bob")
    client = Client()
    client.force_login(bob)
    html = client.get("/jobs/new/").content.decode()
    assert (_selected(html, "cluster"), _selected(html, "partition"), _selected(html, "gpu_type")) == (
        "shapelocal",
        "debug",
        "h100",
    )
    assert 'name="time_limit_minutes" type="number" inputmode="numeric" min="1" step="1" value="10"' in html

    # A template that names no partition or type starts there too; one that names its partition keeps it.
    smoke = client.get("/jobs/new/?template=gpu-smoke-test").content.decode()
    assert (_selected(smoke, "partition"), _selected(smoke, "gpu_type")) == ("debug", "h100")

    # A cluster chosen by hand where nothing is covered keeps that cluster's defaults.
    empty = client.get("/jobs/new/?project=acme/vision&cluster=shapeempty").content.decode()
    assert (_selected(empty, "cluster"), _selected(empty, "gpu_type")) == ("shapeempty", "")


def _verdicts(user: Any, **shape: str) -> tuple[str, str]:
    """The API's refusal of a submission of `shape`, and the form's live verdict on the same fields."""
    api = APIClient()
    api.force_authenticate(user)
    body = {"project": "acme/vision", "cluster": "shapelocal", "script": SCRIPT, **shape}
    refused = api.post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 409, refused.json()
    client = Client()
    client.force_login(user)
    html = client.post("/jobs/new/estimates/", body).content.decode()
    verdict = re.search(r'<p class="notice notice-warning estimate-message" data-fits="false">(.*?)</p>', html, re.S)
    assert verdict, html
    return refused.json()["message"], verdict.group(1).replace("&#x27;", "'")


def test_every_refusal_of_the_form_is_the_apis_own_words(bob: Any, project: Project) -> None:
    api_message, verdict = _verdicts(bob, partition="debug")  # any type: what bob got before
    assert api_message == (
        "vision's GPU-hours on cluster shapelocal are for h100 GPUs only; choose gpu_type h100, or a partition "
        "that has only those GPUs."
    )
    assert verdict.startswith("At most 0.17 GPU-hours on any GPU type, with no cost estimate")
    assert verdict.endswith(f"; but it would be refused: {api_message}")

    api_message, verdict = _verdicts(bob, partition="a100", gpu_type="a100")
    assert api_message == (
        "vision has no GPU-hour allocation open today on cluster shapelocal for a100 GPUs (it has some for h100); "
        "ask your tenant admin or a portal admin for one."
    )
    assert verdict.endswith(f"; but it would be refused: {api_message}")

    allocation = project.allocations.get()
    allocation.granted_gpu_seconds = 3600
    allocation.save(update_fields=["granted_gpu_seconds"])
    api_message, verdict = _verdicts(bob, partition="h100", gpu_type="h100", gpus="2", time_limit_minutes="60")
    assert api_message == (
        "This job needs 2.0 GPU-hours (2 GPUs x 60 min); vision has 1.0 GPU-hours left on cluster shapelocal "
        f"(h100 GPUs) until {allocation.ends_on}; request more at /api/v1/allocations/{allocation.pk}/requests/, "
        "or ask for fewer GPUs or a shorter time limit."
    )
    assert verdict.endswith(f"; but it would be refused: {api_message}")
    assert Job.objects.count() == 0


# Where a waiting job could start now -------------------------------------------------------------------


def _waiting_job(project: Project, cluster: Cluster, **fields: Any) -> Job:
    """bob's job, pending in Slurm for want of free h100s (both h100 nodes' GPUs are in use)."""
    user = make_user()
    add_project_member(project, user, "member")
    ClusterAccount.objects.create(cluster=cluster, user=user, username=f"bob{user.pk}")
    Node.objects.filter(cluster=cluster, name="h1").update(gpus_used=4)
    values: dict[str, Any] = {"partition": "h100", "gpu_type": "h100", "gpus": 2, "time_limit_minutes": 60, **fields}
    job, _ = job_submit(
        user=user,
        project=project,
        request=JobRequest(cluster=cluster.name, name="train", script=SCRIPT, environment={"EPOCHS": "2"}, **values),
    )
    Job.objects.filter(pk=job.pk).update(
        state=JobState.PENDING,
        slurm_job_id=4242,
        state_reason="Resources",
        expected_start_at=timezone.now() + timedelta(hours=2),
    )
    job.refresh_from_db()
    return job


def _alternatives(job: Job) -> list[tuple[str, str, int]]:
    return [(found.partition, found.gpu_type, found.free_gpus) for found in free_alternatives(job=job)]


def test_a_waiting_job_is_offered_the_covered_partitions_with_free_gpus(local: Cluster, project: Project) -> None:
    grant_allocation(project, local, 100)  # any type
    Node.objects.filter(cluster=local, name="a1").update(gpus_used=1)
    job = _waiting_job(project, local)
    # 'debug' allows 30 minutes only; the job asks for 60.
    assert _alternatives(job) == [("l40s", "l40s", 4), ("a100", "a100", 3)]

    short = _waiting_job(project, local, time_limit_minutes=30)
    assert _alternatives(short) == [("l40s", "l40s", 4), ("a100", "a100", 3), ("debug", "a100", 3)]


def test_only_shapes_the_allocation_covers_with_room_on_usable_nodes_are_offered(
    local: Cluster, project: Project
) -> None:
    grant_allocation(project, local, 100, gpu_type="h100")
    grant_allocation(project, local, 1, gpu_type="a100")  # 1 GPU-hour: not enough for 2 GPUs x 60 min
    grant_allocation(project, local, 100, gpu_type="l40s")
    Node.objects.filter(cluster=local, name="l1").update(state="drained")
    job = _waiting_job(project, local)
    assert _alternatives(job) == []
    Node.objects.filter(cluster=local, name="l1").update(state="mixed", gpus_used=3)
    assert _alternatives(job) == []  # one l40s free, the job needs 2
    Node.objects.filter(cluster=local, name="l1").update(gpus_used=2)
    assert _alternatives(job) == [("l40s", "l40s", 2)]


def test_the_page_says_when_it_will_start_and_runs_it_there_instead(local: Cluster, project: Project) -> None:
    grant_allocation(project, local, 100)
    job = _waiting_job(project, local)
    assert job.user is not None
    client = Client()
    client.force_login(job.user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Waiting: waiting for GPUs or other resources to become free (Slurm: <code>Resources</code>)." in page
    expected = job.expected_start_at
    assert expected is not None
    assert f'Slurm expects it to start by <time id="job-expected-start" datetime="{expected.isoformat()}">' in page
    forms = re.findall(r'<form method="post" action="/jobs/[^"]+/rerun/" class="move-job">(.*?)</form>', page, re.S)
    assert [re.findall(r'name="(partition|gpu_type)" value="([^"]*)"', form) for form in forms] == [
        [("partition", "a100"), ("gpu_type", "a100")],
        [("partition", "l40s"), ("gpu_type", "l40s")],
    ]
    assert "Partition <strong>l40s</strong> has 4 l40s GPUs free on one node now" in page

    viewer = make_user()
    add_project_member(project, viewer, "viewer")
    client_of_viewer = Client()
    client_of_viewer.force_login(viewer)
    assert "Run it there instead" not in client_of_viewer.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        client_of_viewer.post(
            f"/jobs/{job.pk}/rerun/", {"partition": "a100", "gpu_type": "a100", "replace": "1"}
        ).status_code
        == 403
    )

    response = client.post(f"/jobs/{job.pk}/rerun/", {"partition": "a100", "gpu_type": "a100", "replace": "1"})
    moved = Job.objects.get(rerun_of=job)
    assert response["Location"] == f"/jobs/{moved.pk}/"
    assert (moved.partition, moved.gpu_type, moved.gpus, moved.script, moved.environment, moved.state) == (
        "a100",
        "a100",
        2,
        SCRIPT,
        {"EPOCHS": "2"},
        JobState.QUEUED,
    )
    job.refresh_from_db()
    assert job.cancel_requested_at is not None  # in Slurm: a worker cancels it there
    assert "“train” runs again on partition a100 as this job" in client.get(response["Location"]).content.decode()

    # A second click finds it no longer waiting to start: nothing more is created.
    again = client.post(f"/jobs/{job.pk}/rerun/", {"partition": "a100", "gpu_type": "a100", "replace": "1"})
    assert again["Location"] == f"/jobs/{job.pk}/"
    assert Job.objects.filter(rerun_of=job).count() == 1
