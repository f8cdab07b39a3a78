"""POST /api/v1/jobs/batch/: many jobs at once, all or none, in a constant few queries, without Slurm."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from clusters.models import Cluster, ClusterAccount
from jobs.models import Job, JobArrayTask, JobState, JobTransition
from quotas.models import Allocation, LedgerEntry, LedgerKind
from tenants.models import AuditEvent, Project
from tenants.services import token_create
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.portal.openapi import assert_matches_schema

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\necho sweep\n"


@pytest.fixture
def cluster() -> Cluster:
    return make_matrix_cluster("sweepcluster")


@pytest.fixture
def project(cluster: Cluster) -> Project:
    project = make_project(make_tenant())
    grant_allocation(project, cluster, 1000)
    return project


def _member(project: Project, cluster: Cluster, role: str = "member") -> Any:
    user = make_user()
    add_project_member(project, user, role)
    ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")
    return user


def _bearer(user: Any) -> APIClient:
    _, secret = token_create(user=user, name="sweep")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return api


def _job(project: Project, number: int, **fields: Any) -> dict[str, Any]:
    return {
        "project": f"{project.tenant.slug}/{project.slug}",
        "cluster": "sweepcluster",
        "name": f"lr-{number}",
        "script": SCRIPT,
        "time_limit_minutes": 60,
        **fields,
    }


def _batch(api: APIClient, jobs: list[dict[str, Any]], **headers: str) -> Any:
    return api.post("/api/v1/jobs/batch/", {"jobs": jobs}, format="json", headers=headers)


def test_a_batch_is_accepted_queued_with_one_reservation_transition_and_audit_event_per_job(
    project: Project, cluster: Cluster
) -> None:
    member = _member(project, cluster)
    api = _bearer(member)
    sent = [
        _job(project, 0),
        _job(project, 1, gpus=2, environment={"LR": "0.1"}),
        _job(project, 2, array="0-3%2", gpus=1, time_limit_minutes=30),
    ]

    response = _batch(api, sent)

    assert response.status_code == 202, response.json()
    assert_matches_schema(response, method="POST", path_template="/api/v1/jobs/batch/")
    replied = response.json()["jobs"]
    assert [job["name"] for job in replied] == ["lr-0", "lr-1", "lr-2"]
    jobs = {job.name: job for job in Job.objects.filter(project=project)}
    assert {name: (job.state, job.gpus, job.user) for name, job in jobs.items()} == {
        "lr-0": (JobState.QUEUED, 1, member),
        "lr-1": (JobState.QUEUED, 2, member),
        "lr-2": (JobState.QUEUED, 1, member),
    }
    assert jobs["lr-1"].environment == {"LR": "0.1"}
    assert sorted(JobArrayTask.objects.filter(job=jobs["lr-2"]).values_list("index", flat=True)) == [0, 1, 2, 3]
    assert JobTransition.objects.filter(job__project=project, to_state=JobState.QUEUED).count() == 3
    assert AuditEvent.objects.filter(action="job.submit", actor=member).count() == 3
    # 1 GPU x 60 min, 2 GPUs x 60 min, and 4 tasks x 1 GPU x 30 min: one reservation per job (an array's per task).
    reserves = LedgerEntry.objects.filter(kind=LedgerKind.RESERVE, project=project)
    assert sorted(reserves.values_list("gpu_seconds", flat=True)) == [1800, 1800, 1800, 1800, 3600, 7200]
    assert Allocation.objects.get(project=project).reserved_gpu_seconds == 3600 + 7200 + 4 * 1800
    # Each job as a read of it says (the reply is built from what was stored, not read back).
    for job in replied:
        read = api.get(f"/api/v1/jobs/{job['id']}/").json()
        assert job == {key: read[key] for key in job}


def test_a_batch_costs_the_same_few_queries_for_2_or_50_jobs_and_no_slurm(project: Project, cluster: Cluster) -> None:
    """Through the real view with a token; the cluster's slurmrestd is a closed port."""
    api = _bearer(_member(project, cluster))
    assert _batch(api, [_job(project, 0)]).status_code == 202  # marks the token used (once a minute)

    with CaptureQueriesContext(connection) as small:
        assert _batch(api, [_job(project, number) for number in range(2)]).status_code == 202
    with CaptureQueriesContext(connection) as large:
        assert _batch(api, [_job(project, number, gpus=1 + number % 2) for number in range(50)]).status_code == 202

    assert len(large.captured_queries) == len(small.captured_queries) <= 12
    assert Job.objects.filter(project=project).count() == 53


def test_every_problem_of_every_job_is_named_by_its_index_and_nothing_is_stored(
    project: Project, cluster: Cluster
) -> None:
    api = _bearer(_member(project, cluster))
    sent = [
        _job(project, 0),
        _job(project, 1, gpus=9),
        _job(project, 2),
        _job(project, 3, time_limit_minutes=601),
    ]

    response = _batch(api, sent)
    unknown = _batch(api, [_job(project, 0), _job(project, 1, gpu=1)])

    assert (response.status_code, unknown.status_code) == (400, 400)
    body = response.json()
    assert body["code"] == "invalid"
    assert sorted(body["fields"]) == ["jobs.1.gpus", "jobs.3.time_limit_minutes"]
    assert "at most 4" in body["fields"]["jobs.1.gpus"][0]
    assert "at most 600 minutes" in body["fields"]["jobs.3.time_limit_minutes"][0]
    assert list(unknown.json()["fields"]) == ["jobs.1.gpu"]
    assert "no field 'gpu'" in unknown.json()["fields"]["jobs.1.gpu"][0]
    assert Job.objects.count() == 0
    assert Allocation.objects.get(project=project).reserved_gpu_seconds == 0


def test_a_pipeline_step_is_refused_in_a_batch_saying_where_to_send_it(project: Project, cluster: Cluster) -> None:
    api = _bearer(_member(project, cluster))
    first = _batch(api, [_job(project, 0)]).json()["jobs"][0]["id"]

    response = _batch(api, [_job(project, 1), _job(project, 2, depends_on=[{"job": first, "condition": "afterok"}])])

    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["jobs.1.depends_on"]
    assert "POST /api/v1/jobs/" in response.json()["fields"]["jobs.1.depends_on"][0]
    assert Job.objects.count() == 1


def test_a_batch_goes_to_one_project_and_cluster(project: Project, cluster: Cluster) -> None:
    api = _bearer(_member(project, cluster))
    other = make_project(project.tenant)

    response = _batch(api, [_job(project, 0), _job(other, 1), _job(project, 2, cluster="elsewhere")])

    assert response.status_code == 400
    assert sorted(response.json()["fields"]) == ["jobs.1.project", "jobs.2.cluster"]
    assert Job.objects.count() == 0


def test_an_unknown_cluster_or_template_is_named_for_each_job(project: Project, cluster: Cluster) -> None:
    api = _bearer(_member(project, cluster))

    unknown_cluster = _batch(api, [_job(project, 0, cluster="nowhere"), _job(project, 1, cluster="nowhere")])
    unknown_template = _batch(api, [_job(project, 0, template="nope"), _job(project, 1)])

    assert sorted(unknown_cluster.json()["fields"]) == ["jobs.0.cluster", "jobs.1.cluster"]
    assert "There is no active cluster 'nowhere'" in unknown_cluster.json()["fields"]["jobs.1.cluster"][0]
    assert list(unknown_template.json()["fields"]) == ["jobs.0.template"]
    assert Job.objects.count() == 0


def test_a_batch_over_the_cap_or_empty_is_refused_saying_the_cap(
    project: Project, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = _bearer(_member(project, cluster))

    too_many = _batch(api, [_job(project, number) for number in range(1001)])
    empty = _batch(api, [])

    assert (too_many.status_code, empty.status_code) == (400, 400)
    assert too_many.json()["fields"]["jobs"] == [
        "A batch carries at most 1000 jobs; send the others in further batches."
    ]
    assert empty.json()["fields"]["jobs"] == ["Send at least one job."]
    assert Job.objects.count() == 0


def test_a_batch_beyond_the_quota_is_refused_whole_saying_how_many_fit(cluster: Cluster) -> None:
    project = make_project(make_tenant())
    allocation = grant_allocation(project, cluster, 5)  # 5 GPU-hours: two jobs of 2 GPUs x 60 min
    api = _bearer(_member(project, cluster))

    response = _batch(api, [_job(project, number, gpus=2) for number in range(4)])

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "quota_exceeded"
    assert "batch of 4 jobs needs 8.0 GPU-hours; " in body["message"]
    assert "5.0 GPU-hours left on cluster sweepcluster, enough for the first 2 of its jobs" in body["message"]
    assert Job.objects.count() == 0
    allocation.refresh_from_db()
    assert allocation.reserved_gpu_seconds == 0
    assert not LedgerEntry.objects.filter(kind=LedgerKind.RESERVE).exists()


def test_a_repeated_idempotency_key_returns_the_first_batch(project: Project, cluster: Cluster) -> None:
    api = _bearer(_member(project, cluster))
    sent = [_job(project, number) for number in range(3)]

    first = _batch(api, sent, **{"Idempotency-Key": "sweep-7"})
    again = _batch(api, sent, **{"Idempotency-Key": "sweep-7"})
    single = api.post("/api/v1/jobs/", sent[0], format="json", headers={"Idempotency-Key": "sweep-7"})

    assert (first.status_code, again.status_code, single.status_code) == (202, 200, 202)
    assert [job["id"] for job in again.json()["jobs"]] == [job["id"] for job in first.json()["jobs"]]
    assert single.json()["id"] not in {job["id"] for job in first.json()["jobs"]}
    assert Job.objects.count() == 4
    assert Allocation.objects.get(project=project).reserved_gpu_seconds == 4 * 3600


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), (None, 404)])
def test_viewers_and_outsiders_cannot_submit_a_batch(
    project: Project, cluster: Cluster, role: str | None, status: int
) -> None:
    user = make_user()
    if role:
        add_project_member(project, user, role)
    ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")

    response = _batch(_bearer(user), [_job(project, 0), _job(project, 1)])

    assert response.status_code == status
    assert Job.objects.count() == 0
