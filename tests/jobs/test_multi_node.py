"""Multi-node jobs without running them: nodes and GPUs per node, switches, validation against the partition's nodes,
and what they reserve and cost (nodes x GPUs per node x time). The live run is in test_cluster_contract.py."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from clusters.models import Cluster, ClusterAccount, Partition
from jobs.models import Job
from quotas.models import LedgerEntry
from tenants.models import Project
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.jobs.conftest import local_cluster

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\necho hi\n"


@pytest.fixture
def cluster() -> Cluster:
    return local_cluster()


@pytest.fixture
def topology(cluster: Cluster) -> None:
    """The local cluster as `make cluster` describes its network; one started by older scripts has no switches."""
    if not Partition.objects.get(cluster=cluster, name="h100").nodes_by_switch:
        pytest.skip("the local cluster's nodes carry no switch-<leaf> features: restart it with `make cluster`")


@pytest.fixture
def project(cluster: Cluster) -> Project:
    project = make_project(make_tenant())
    grant_allocation(project, cluster)
    return project


def _member_api(project: Project, *clusters: Cluster) -> APIClient:
    user = make_user()
    add_project_member(project, user, "member")
    for cluster in clusters:
        ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")
    api = APIClient()
    api.force_authenticate(user)
    return api


def _submit(api: APIClient, project: Project, cluster: str = "local", **fields: Any) -> Any:
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": cluster, "script": SCRIPT, **fields}
    return api.post("/api/v1/jobs/", body, format="json")


def test_the_local_cluster_describes_its_switches_per_partition(cluster: Cluster, topology: None) -> None:
    partitions = {partition.name: partition for partition in Partition.objects.filter(cluster=cluster)}

    assert partitions["h100"].nodes_by_switch == {"leaf1": 2}
    assert partitions["a100"].nodes_by_switch == {"leaf2": 2}
    assert partitions["debug"].nodes_by_switch == {"leaf1": 2, "leaf2": 2}
    assert partitions["debug"].gpu_nodes_by_type == {"a100": 2, "h100": 2}
    assert dict(cluster.nodes.values_list("name", "switch")) == {
        "gpu01": "leaf1",
        "gpu02": "leaf1",
        "gpu03": "leaf2",
        "gpu04": "leaf2",
    }


def test_a_two_node_job_reserves_and_costs_nodes_x_gpus_per_node_x_time(
    project: Project, cluster: Cluster, topology: None
) -> None:
    response = _submit(
        _member_api(project, cluster), project, partition="h100", gpus=2, nodes=2, switches=1, time_limit_minutes=30
    )

    assert response.status_code == 202, response.json()
    reply = response.json()
    assert (reply["gpus"], reply["node_count"], reply["total_gpus"], reply["max_switches"]) == (2, 2, 4, 1)
    assert (reply["switch_wait_minutes"], reply["nodes"], reply["switches"]) == (None, "", [])
    assert (reply["estimate"]["nodes"], reply["estimate"]["total_gpus"], reply["estimate"]["gpu_hours"]) == (
        2,
        4,
        "2.00",
    )
    job = Job.objects.get(pk=reply["id"])
    assert (job.node_count, job.total_gpus, job.max_switches) == (2, 4, 1)
    reservation = LedgerEntry.objects.get(job=job, kind="reserve")
    assert reservation.gpu_seconds == 4 * 30 * 60


def test_the_estimate_counts_every_node(project: Project, cluster: Cluster) -> None:
    api = _member_api(project, cluster)
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": "local", "partition": "h100"}

    response = api.post("/api/v1/estimates/", {**body, "gpus": 4, "nodes": 2, "time_limit_minutes": 60}, format="json")

    assert response.status_code == 200, response.json()
    estimate = response.json()
    assert (estimate["gpus"], estimate["nodes"], estimate["total_gpus"], estimate["gpu_hours"]) == (4, 2, 8, "8.00")
    assert estimate["message"].startswith("At most 8.00 GPU-hours (2 nodes x 4 GPUs) on h100")


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"partition": "h100", "gpu_type": "h100", "nodes": 3},
            "nodes",
            "Partition 'h100' has 2 nodes with h100 GPUs; ask for 2 or fewer nodes, or choose a partition with more.",
        ),
        (
            {"partition": "debug", "nodes": 5},
            "nodes",
            "Partition 'debug' has 4 nodes with GPUs; ask for 4 or fewer nodes, or choose a partition with more.",
        ),
        ({"nodes": 0}, "nodes", "Ensure this value is greater than or equal to 1."),
        (
            {"partition": "debug", "nodes": 3, "switches": 1},
            "switches",
            "No switch of partition 'debug' has 3 nodes under it (at most 2): ask for 2 or fewer nodes, or for more "
            "switches, or leave `switches` out.",
        ),
        (
            {"partition": "debug", "nodes": 4, "switches": 2},
            "switches",
            "Cluster 'local' runs Slurm 22.05, whose REST API can ask only for nodes under one switch; ask for 1 "
            "switch, or leave `switches` out.",
        ),
        (
            {"partition": "h100", "nodes": 2, "switches": 1, "switch_wait_minutes": 5},
            "switch_wait_minutes",
            "Cluster 'local' runs Slurm 22.05, whose REST API cannot limit the wait for a switch: leave "
            "`switch_wait_minutes` out, and the job waits until nodes under one switch are free.",
        ),
        (
            {"partition": "h100", "nodes": 2, "switch_wait_minutes": 5},
            "switch_wait_minutes",
            "Give `switches` too: the wait is how long to wait for that many switches.",
        ),
    ],
)
def test_a_shape_the_partition_cannot_hold_is_refused_naming_the_limit_and_the_fix(
    project: Project, cluster: Cluster, topology: None, fields: dict[str, Any], field: str, message: str
) -> None:
    response = _submit(_member_api(project, cluster), project, **fields)

    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["fields"] == {field: [message]}
    assert body["code"] == "invalid"
    assert not Job.objects.filter(project=project).exists()


def test_an_unknown_multi_node_field_is_refused_by_name(project: Project, cluster: Cluster) -> None:
    response = _submit(_member_api(project, cluster), project, gpus_per_node=2)

    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["gpus_per_node"]
    assert "it takes: " in response.json()["fields"]["gpus_per_node"][0]
    assert "nodes, switches, switch_wait_minutes" in response.json()["fields"]["gpus_per_node"][0]


def _topology_cluster(*, api_version: str, nodes_by_switch: dict[str, int]) -> Cluster:
    cluster = make_matrix_cluster(f"topo{api_version.replace('.', '')}")
    cluster.api_version = api_version
    cluster.save(update_fields=["api_version"])
    Partition.objects.filter(cluster=cluster).update(
        node_names=["n1", "n2"], gpu_nodes_by_type={"h100": 2}, nodes_by_switch=nodes_by_switch
    )
    return cluster


def test_a_newer_slurm_takes_switches_with_a_longest_wait_and_refuses_what_no_switch_holds() -> None:
    cluster = _topology_cluster(api_version="0.0.45", nodes_by_switch={"leaf1": 1, "leaf2": 1})
    project = make_project(make_tenant())
    grant_allocation(project, cluster)
    api = _member_api(project, cluster)

    spans = _submit(api, project, cluster.name, nodes=2, gpus=4, switches=2, switch_wait_minutes=3)
    under_one = _submit(api, project, cluster.name, nodes=2, gpus=4, switches=1, switch_wait_minutes=3)

    assert spans.status_code == 202, spans.json()
    job = Job.objects.get(pk=spans.json()["id"])
    assert (job.node_count, job.max_switches, job.switch_wait_minutes, job.total_gpus) == (2, 2, 3, 8)
    assert under_one.status_code == 400
    assert under_one.json()["fields"] == {
        "switches": [
            "No switch of partition 'gpu' has 2 nodes under it (at most 1): ask for 1 or fewer nodes, or for more "
            "switches, or leave `switches` out."
        ]
    }


def test_switches_are_refused_where_the_cluster_describes_none() -> None:
    cluster = _topology_cluster(api_version="0.0.45", nodes_by_switch={})
    project = make_project(make_tenant())
    grant_allocation(project, cluster)

    response = _submit(_member_api(project, cluster), project, cluster.name, nodes=2, switches=1)

    assert response.status_code == 400
    assert response.json()["fields"] == {
        "switches": [
            f"Cluster '{cluster.name}' describes no network switches for partition 'gpu', so the portal cannot ask "
            "for them; leave `switches` out."
        ]
    }


def test_the_multi_node_template_is_offered_with_its_nodes(project: Project, cluster: Cluster) -> None:
    api = _member_api(project, cluster)

    template = api.get("/api/v1/job-templates/pytorch-multi-node-training/").json()
    saved = api.post(
        "/api/v1/job-templates/",
        {"project": f"{project.tenant.slug}/{project.slug}", "name": "two nodes", "script": SCRIPT, "nodes": 2},
        format="json",
    )

    assert (template["nodes"], template["gpus"]) == (2, 4)
    assert "srun" in template["script"]
    assert "MASTER_ADDR" in template["script"]
    assert saved.status_code == 201, saved.json()
    assert saved.json()["nodes"] == 2
    job = _submit(api, project, partition="h100", template=saved.json()["id"], gpus=1)
    assert job.status_code == 202, job.json()
    assert job.json()["node_count"] == 2


def test_run_again_keeps_the_nodes_and_switches(project: Project, cluster: Cluster, topology: None) -> None:
    api = _member_api(project, cluster)
    first = _submit(api, project, partition="h100", gpus=1, nodes=2, switches=1).json()

    again = api.post(f"/api/v1/jobs/{first['id']}/rerun/", {"nodes": 1}, format="json")

    assert again.status_code == 202, again.json()
    assert (again.json()["node_count"], again.json()["max_switches"], again.json()["rerun_of"]) == (1, 1, first["id"])
