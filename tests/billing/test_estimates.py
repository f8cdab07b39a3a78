"""Cost estimates through the API: the most a job can cost at the rate in force, what it leaves of the
allocation, and the same estimate on the submit reply. No Slurm: the cluster is as a sync left it, and a
submitted job stays queued (its delivery is scheduled on commit, which a test's transaction never reaches)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import Rate
from billing.rates import rate_create
from clusters.models import Cluster, ClusterAccount, GpuType, Node, Partition
from jobs.models import Job
from quotas.models import Allocation, LedgerEntry
from tenants.models import Project
from tests.factories import (
    add_project_member,
    add_tenant_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\necho hi\n"


@pytest.fixture
def cluster() -> Cluster:
    """Partition 'gpu' has only h100s (priced on their own), 'a100s' only a100s, 'mixed' both."""
    cluster = make_matrix_cluster("estcluster")
    now = timezone.now()
    Node.objects.create(
        cluster=cluster, name="n2", state="idle", cpus=8, memory_mb=16384, gpu_type="a100", gpus_total=4, synced_at=now
    )
    GpuType.objects.create(cluster=cluster, name="a100", gpus_total=4, max_gpus_per_node=4, synced_at=now)
    for name, nodes, types in (("a100s", ["n2"], ["a100"]), ("mixed", ["n1", "n2"], ["a100", "h100"])):
        Partition.objects.create(
            cluster=cluster,
            name=name,
            state="UP",
            max_time_minutes=600,
            node_names=nodes,
            gpu_types=types,
            max_gpus_per_node=4,
            max_cpus_per_node=8,
            max_memory_mb_per_node=16384,
            gpus_per_node_by_type=dict.fromkeys(types, 4),
            synced_at=now,
        )
    return cluster


@pytest.fixture
def project() -> Project:
    return make_project(make_tenant("acme"), "vision")


def _rates(cluster: Cluster) -> tuple[Rate, Rate]:
    start = timezone.now() - timedelta(days=2)
    typed = rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2.5"),
        currency="EUR",
        valid_from=start,
    )
    anytype = rate_create(
        actor=None, cluster=cluster, gpu_type="", price_per_gpu_hour=Decimal("1.2345"), currency="EUR", valid_from=start
    )
    # A later price that is not in force yet must not be used.
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("9"),
        currency="EUR",
        valid_from=timezone.now() + timedelta(days=1),
    )
    return typed, anytype


def _api(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def _member(project: Project, role: str = "member") -> Any:
    user = make_user()
    add_project_member(project, user, role)
    return user


def _estimate(api: APIClient, **fields: Any) -> Any:
    return api.post("/api/v1/estimates/", {"project": "acme/vision", "cluster": "estcluster", **fields}, format="json")


def _rate_data(rate: Rate) -> dict[str, Any]:
    return {
        "id": rate.pk,
        "gpu_type": rate.gpu_type,
        "price_per_gpu_hour": f"{rate.price_per_gpu_hour:.4f}",
        "currency": "EUR",
        "valid_from": rate.valid_from.isoformat().replace("+00:00", "Z"),
    }


@pytest.mark.parametrize(
    ("fields", "gpus", "minutes", "gpu_hours", "max_cost", "left"),
    [
        ({}, 1, 60, "1.00", "2.50", "499.00"),  # defaults: the default partition, 1 GPU, 60 minutes
        ({"gpus": 2, "gpu_type": "h100"}, 2, 60, "2.00", "5.00", "498.00"),
        ({"gpus": 4, "time_limit_minutes": 90}, 4, 90, "6.00", "15.00", "494.00"),
        # The template asks for 16 CPUs and 64 GB, more than these nodes have (checked as a submission would be).
        ({"template": "pytorch-multi-gpu-training", "cpus": 8, "memory_gb": 16}, 4, 240, "16.00", "40.00", "484.00"),
    ],
)
def test_a_typed_rate_prices_the_gpus_for_their_whole_time_limit(
    cluster: Cluster,
    project: Project,
    fields: dict[str, Any],
    gpus: int,
    minutes: int,
    gpu_hours: str,
    max_cost: str,
    left: str,
) -> None:
    typed, _ = _rates(cluster)
    allocation = grant_allocation(project, cluster, 500)

    response = _estimate(_api(_member(project)), **fields)

    assert response.status_code == 200, response.json()
    until = allocation.ends_on.isoformat()
    assert response.json() == {
        "project": "acme/vision",
        "cluster": "estcluster",
        "partition": "gpu",
        "gpu_type": "h100",  # not asked for: the partition has no other
        "gpus": gpus,
        "nodes": 1,
        "total_gpus": gpus,
        "time_limit_minutes": minutes,
        "array_tasks": 0,
        "array_tasks_that_fit": None,
        "gpu_hours": gpu_hours,
        "rate": _rate_data(typed),
        "max_cost": max_cost,
        "currency": "EUR",
        "allocation": {
            "id": allocation.pk,
            "gpu_type": "",
            "ends_on": until,
            "remaining_gpu_hours": "500.00",
            "remaining_after_gpu_hours": left,
        },
        "fits": True,
        "message": (
            f"At most {gpu_hours} GPU-hours on h100 at 2.5000 EUR/GPU-hour: up to {max_cost} EUR; "
            f"leaves {left} of 500.00 GPU-hours until {until}."
        ),
    }
    assert not Job.objects.exists()
    assert Allocation.objects.get().reserved_gpu_seconds == 0  # an estimate reserves nothing


@pytest.mark.parametrize(
    ("fields", "gpu_type", "gpu_hours", "max_cost"),
    [
        ({"partition": "a100s"}, "a100", "1.00", "1.23"),  # 1.2345 rounds down
        ({"partition": "a100s", "gpus": 2}, "a100", "2.00", "2.47"),  # 2.469 rounds up
        ({"partition": "a100s", "gpus": 4, "time_limit_minutes": 45}, "a100", "3.00", "3.70"),  # 3.7035
        ({"partition": "mixed", "gpus": 4}, "", "4.00", "4.94"),  # any type may come: 4.938
    ],
)
def test_a_gpu_type_without_its_own_rate_is_priced_by_the_any_type_rate(
    cluster: Cluster, project: Project, fields: dict[str, Any], gpu_type: str, gpu_hours: str, max_cost: str
) -> None:
    _, anytype = _rates(cluster)
    grant_allocation(project, cluster, 100)

    body = _estimate(_api(_member(project)), **fields).json()

    assert (body["gpu_type"], body["gpu_hours"], body["max_cost"], body["rate"]) == (
        gpu_type,
        gpu_hours,
        max_cost,
        _rate_data(anytype),
    )
    kind = gpu_type or "any GPU type"
    assert body["message"].startswith(
        f"At most {gpu_hours} GPU-hours on {kind} at 1.2345 EUR/GPU-hour: up to {max_cost} EUR; leaves "
    )


def test_without_a_rate_in_force_there_is_no_cost_but_the_allocation_is_still_shown(
    cluster: Cluster, project: Project
) -> None:
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("3"),
        currency="EUR",
        valid_from=timezone.now() + timedelta(hours=1),
    )
    allocation = grant_allocation(project, cluster, 10)

    body = _estimate(_api(_member(project, "viewer")), gpus=2).json()

    assert (body["rate"], body["max_cost"], body["currency"], body["fits"]) == (None, None, None, True)
    assert body["allocation"]["remaining_after_gpu_hours"] == "8.00"
    assert body["message"] == (
        "At most 2.00 GPU-hours on h100, with no cost estimate: prices are not set for h100 GPUs on cluster "
        f"estcluster (a portal admin sets them); leaves 8.00 of 10.00 GPU-hours until {allocation.ends_on}."
    )


def test_without_an_allocation_the_estimate_says_it_would_be_refused(cluster: Cluster, project: Project) -> None:
    _rates(cluster)
    grant_allocation(project, cluster, 10, gpu_type="a100")  # an allocation for another GPU type only

    body = _estimate(_api(_member(project)), gpus=2).json()

    assert (body["max_cost"], body["allocation"], body["fits"]) == ("5.00", None, False)
    assert body["message"] == (
        "At most 2.00 GPU-hours on h100 at 2.5000 EUR/GPU-hour: up to 5.00 EUR; but it would be refused: vision "
        "has no GPU-hour allocation open today on cluster estcluster for h100 GPUs (it has some for a100); ask "
        "your tenant admin or a portal admin for one."
    )


def test_a_job_larger_than_what_is_left_does_not_fit(cluster: Cluster, project: Project) -> None:
    _rates(cluster)
    allocation = grant_allocation(project, cluster, "1.5")

    body = _estimate(_api(_member(project)), gpus=2, time_limit_minutes=60).json()

    assert body["fits"] is False
    assert body["allocation"]["remaining_gpu_hours"] == "1.50"
    assert body["allocation"]["remaining_after_gpu_hours"] == "-0.50"
    assert body["message"] == (
        "At most 2.00 GPU-hours on h100 at 2.5000 EUR/GPU-hour: up to 5.00 EUR; but it would be refused: This job "
        "needs 2.0 GPU-hours (2 GPUs x 60 min); vision has 1.5 GPU-hours left on cluster estcluster until "
        f"{allocation.ends_on}; request more at /api/v1/allocations/{allocation.pk}/requests/, or ask for fewer "
        "GPUs or a shorter time limit."
    )


def test_the_submit_reply_carries_the_same_estimate(cluster: Cluster, project: Project) -> None:
    _rates(cluster)
    grant_allocation(project, cluster, 20)
    member = _member(project)
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    api = _api(member)
    shape = {"gpus": 2, "time_limit_minutes": 120}
    before = _estimate(api, **shape).json()

    submitted = api.post(
        "/api/v1/jobs/",
        {"project": "acme/vision", "cluster": "estcluster", "script": SCRIPT, **shape},
        format="json",
    )

    assert submitted.status_code == 202, submitted.json()
    assert submitted.json()["state"] == "queued"
    assert submitted.json()["estimate"] == before
    assert before["message"] == (
        "At most 4.00 GPU-hours on h100 at 2.5000 EUR/GPU-hour: up to 10.00 EUR; leaves 16.00 of 20.00 GPU-hours "
        f"until {before['allocation']['ends_on']}."
    )
    # The reservation is taken now: the next estimate starts from what the job left.
    after = _estimate(api, **shape).json()
    assert (after["allocation"]["remaining_gpu_hours"], after["allocation"]["remaining_after_gpu_hours"]) == (
        "16.00",
        "12.00",
    )
    assert LedgerEntry.objects.get(job=Job.objects.get(), kind="reserve").gpu_seconds == 4 * 3600


def test_a_shape_a_submission_would_refuse_is_refused_with_the_same_words(cluster: Cluster, project: Project) -> None:
    _rates(cluster)

    response = _estimate(_api(_member(project)), gpus=5, time_limit_minutes=601, partition="gpu")

    assert response.status_code == 400
    assert response.json()["fields"] == {
        "gpus": [
            "`gpus` counts the GPUs on each node, and the nodes of partition 'gpu' have at most 4 GPUs; ask "
            "for 4 or fewer per node, and for more nodes (`nodes`) if you need more GPUs."
        ],
        "time_limit_minutes": [
            "Partition 'gpu' allows at most 600 minutes (10 h); ask for less or use another partition."
        ],
    }


@pytest.mark.parametrize(("role", "status"), [("viewer", 200), ("member", 200), ("manager", 200), (None, 404)])
def test_anyone_who_sees_the_project_may_estimate(
    cluster: Cluster, project: Project, role: str | None, status: int
) -> None:
    _rates(cluster)
    grant_allocation(project, cluster, 10)
    user = _member(project, role) if role else make_user()

    response = _estimate(_api(user))

    assert response.status_code == status
    if status == 404:
        assert response.json() == {
            "code": "not_found",
            "message": "No project 'acme/vision' exists among the ones you can see; check the name or ask for access.",
            "fields": {},
        }


def test_a_tenant_admin_may_estimate_and_an_anonymous_caller_may_not(cluster: Cluster, project: Project) -> None:
    _rates(cluster)
    admin = make_user()
    add_tenant_member(project.tenant, admin, "admin")

    assert _estimate(_api(admin)).status_code == 200
    assert APIClient().post("/api/v1/estimates/", {"project": "acme/vision"}, format="json").status_code in {401, 403}
