"""The jobs REST API without running jobs: validation, discovery, templates, lists and who may cancel."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, ClusterAccount
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobState, JobTemplate
from tenants.models import Project
from tenants.services import token_create
from tests.factories import (
    add_project_member,
    add_tenant_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.jobs.conftest import local_cluster
from tests.portal.openapi import assert_matches_schema

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\necho hi\n"


@pytest.fixture
def cluster() -> Cluster:
    return local_cluster()


@pytest.fixture
def project(cluster: Cluster) -> Project:
    project = make_project(make_tenant())
    grant_allocation(project, cluster)
    return project


def _api(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def _member(project: Project, cluster: Cluster, role: str = "member", username: str | None = "alice") -> Any:
    user = make_user()
    add_project_member(project, user, role)
    if username:
        ClusterAccount.objects.create(cluster=cluster, user=user, username=username)
    return user


def _submit(api: APIClient, project: Project, **fields: Any) -> Any:
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": "local", "script": SCRIPT, **fields}
    return api.post("/api/v1/jobs/", body, format="json")


# Submitting --------------------------------------------------------------------------------------------


def test_a_valid_submission_is_accepted_as_queued_with_defaults(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)

    response = _submit(_api(member), project, partition="h100")

    assert response.status_code == 202, response.json()
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert response["Location"] == f"/api/v1/jobs/{job.pk}/"
    assert (body["state"], body["gpus"], body["gpu_type"], body["name"]) == ("queued", 1, "", "job")
    assert body["time_limit_minutes"] == 60  # the partition's default
    assert body["cluster_username"] == "alice"
    assert job.stdout_path == f"{cluster.log_root}/{project.tenant.slug}/{project.slug}/{job.pk}/stdout.log"
    assert job.working_directory == f"{cluster.log_root}/{project.tenant.slug}/{project.slug}/{job.pk}"
    assert [t.to_state for t in job.transitions.all()] == ["queued"]


def test_the_default_partition_is_used_when_none_is_given(project: Project, cluster: Cluster) -> None:
    response = _submit(_api(_member(project, cluster)), project)

    assert response.status_code == 202
    assert response.json()["partition"] == cluster.partitions.get(is_default=True).name


def test_every_problem_is_reported_at_once_with_what_to_change(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)

    response = _submit(
        _api(member),
        project,
        partition="h100",
        gpus=5,
        time_limit_minutes=5000,
        name="bad\nname",
        script="echo no shebang",
        environment={"SLURM_JOB_ID": "1", "9lives": "x", "OK": "fine"},
    )

    assert response.status_code == 400
    fields = response.json()["fields"]
    assert fields == {
        "gpus": [
            "`gpus` counts the GPUs on each node, and the nodes of partition 'h100' have at most 4 GPUs; ask "
            "for 4 or fewer per node, and for more nodes (`nodes`) if you need more GPUs."
        ],
        "time_limit_minutes": [
            "Partition 'h100' allows at most 2880 minutes (2 d); ask for less or use another partition."
        ],
        "name": ["Remove control characters (such as new lines or tabs) from the name."],
        "script": ["Start the script with an interpreter line such as '#!/bin/bash': Slurm requires one."],
        "environment": [
            "'SLURM_JOB_ID' is set by Slurm itself; choose another name.",
            "'9lives' is not a valid variable name: use letters, digits and '_', not starting with a digit.",
        ],
    }
    assert response.json()["code"] == "invalid"
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"cluster": "mars"}, "cluster", "There is no active cluster 'mars'; choose one of: local."),
        (
            {"partition": "gpu-xl"},
            "partition",
            "Cluster 'local' has no partition 'gpu-xl'; choose one of: a100, debug, h100.",
        ),
        (
            {"partition": "h100", "gpu_type": "a100"},
            "gpu_type",
            "Partition 'h100' has no GPUs of type 'a100'; it offers: h100.",
        ),
        (
            {"partition": "a100", "gpu_type": "a100", "gpus": 9},
            "gpus",
            "`gpus` counts the GPUs on each node, and the nodes of partition 'a100' have at most 8 a100 GPUs; ask "
            "for 8 or fewer per node, and for more nodes (`nodes`) if you need more GPUs.",
        ),
        ({"partition": "h100", "gpus": 0}, "gpus", "Ask for at least 1 GPU."),
        ({"script": ""}, "script", "Give the batch script to run, starting with a line such as '#!/bin/bash'."),
        ({"template": "no-such-template"}, "template", None),
    ],
)
def test_a_rejection_names_the_field_and_what_to_do(
    project: Project, cluster: Cluster, fields: dict[str, Any], field: str, message: str | None
) -> None:
    response = _submit(_api(_member(project, cluster)), project, **fields)

    assert response.status_code == 400, response.json()
    problems = response.json()["fields"][field]
    if message is not None:
        assert problems == [message]
    else:
        assert problems[0].startswith("No template 'no-such-template' exists for project")


def test_a_field_the_submit_does_not_know_is_refused_and_no_job_is_stored(project: Project, cluster: Cluster) -> None:
    # A field the portal does not know must not be dropped: run silently without it, the job would not be the one
    # asked for (job arrays were such a field until they were built).
    response = _submit(_api(_member(project, cluster)), project, priority="high")

    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["priority"]
    assert response.json()["fields"]["priority"][0].startswith("This operation has no field 'priority'; it takes: ")
    assert not Job.objects.filter(project=project).exists()


def test_a_script_over_the_size_cap_is_refused(project: Project, cluster: Cluster, settings: Any) -> None:
    settings.JOB_SCRIPT_MAX_BYTES = 100
    response = _submit(_api(_member(project, cluster)), project, script="#!/bin/bash\n" + "#" * 200)

    assert response.status_code == 400
    assert response.json()["fields"]["script"] == [
        "The script is 212 bytes; the limit is 100. Keep large code in files the script runs."
    ]


def test_a_member_without_a_cluster_username_is_told_whom_to_ask(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster, username=None)

    response = _submit(_api(member), project, partition="h100")

    assert response.status_code == 400
    assert response.json()["fields"]["cluster"] == [
        "You have no username on cluster 'local', so your jobs cannot run there; "
        "ask a portal admin to add your cluster account."
    ]


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), (None, 404)])
def test_viewers_and_outsiders_cannot_submit(project: Project, cluster: Cluster, role: str | None, status: int) -> None:
    if role:
        user = _member(project, cluster, role=role)
    else:
        user = make_user()
        ClusterAccount.objects.create(cluster=cluster, user=user, username="alice")

    response = _submit(_api(user), project, partition="h100")

    assert response.status_code == status
    assert not Job.objects.exists()


def test_values_are_kept_verbatim_as_data(project: Project, cluster: Cluster) -> None:
    hostile = "$(rm -rf /); `id` && echo 'x' | cat > /etc/passwd; \"quoted\" \\ ${HOME}"
    response = _submit(
        _api(_member(project, cluster)),
        project,
        partition="h100",
        name=hostile,
        script=f"#!/bin/bash\necho {hostile}\n",
        environment={"PAYLOAD": hostile},
    )

    assert response.status_code == 202
    job = Job.objects.get(pk=response.json()["id"])
    assert job.name == hostile
    assert job.environment == {"PAYLOAD": hostile}
    assert job.script == f"#!/bin/bash\necho {hostile}\n"


def test_a_repeated_idempotency_key_returns_the_first_job(project: Project, cluster: Cluster) -> None:
    api = _api(_member(project, cluster))
    api.credentials(HTTP_IDEMPOTENCY_KEY="ci-run-42")

    first = _submit(api, project, partition="h100")
    second = _submit(api, project, partition="h100")

    assert (first.status_code, second.status_code) == (202, 200)
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.count() == 1


def test_a_submission_with_a_token_takes_at_most_8_queries_and_no_slurm(
    django_assert_max_num_queries: Any,
) -> None:
    """The whole request through the real view: token, project and roles, cluster, job, transition, audit,
    reservation. The cluster's slurmrestd is a closed port: nothing in the request may need it."""
    cluster = make_matrix_cluster("unreachable")
    project = make_project(make_tenant())
    grant_allocation(project, cluster)
    member = _member(project, cluster)
    _, secret = token_create(user=member, name="sweep")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": cluster.name, "script": SCRIPT}
    assert api.post("/api/v1/jobs/", body, format="json").status_code == 202  # marks the token used (once a minute)

    with django_assert_max_num_queries(8):
        response = api.post("/api/v1/jobs/", {**body, "gpus": 2, "cpus": 4}, format="json")

    assert response.status_code == 202, response.json()
    assert Job.objects.get(pk=response.json()["id"]).gpus == 2


def test_the_submit_reply_says_what_a_read_of_the_job_says(project: Project, cluster: Cluster) -> None:
    """The reply is built from what the submission wrote, not read back: it must not differ from a read."""
    api = _api(_member(project, cluster))

    reply = _submit(api, project, partition="h100", gpus=2, environment={"A": "1"}).json()
    read = api.get(f"/api/v1/jobs/{reply['id']}/").json()

    estimate = reply.pop("estimate")
    assert reply == read
    assert (estimate["gpu_hours"], estimate["fits"], estimate["gpu_type"]) == ("2.00", True, "h100")
    assert estimate["allocation"]["remaining_after_gpu_hours"] == "998.00"


def test_the_submit_reply_of_an_array_and_a_rerun_says_what_a_read_says(project: Project, cluster: Cluster) -> None:
    """The reply is rendered without the serializer (jobs/job_apis.py): every field of an array and of a rerun."""
    api = _api(_member(project, cluster))
    first = _submit(api, project, partition="h100", array="0-3%2", environment={"B": "2"}, name="sweep").json()
    first_read = api.get(f"/api/v1/jobs/{first['id']}/").json()  # before its rerun exists
    rerun = api.post(f"/api/v1/jobs/{first['id']}/rerun/", {"name": "again"}, format="json").json()
    rerun_read = api.get(f"/api/v1/jobs/{rerun['id']}/").json()

    for reply, read in ((first, first_read), (rerun, rerun_read)):
        reply.pop("estimate")
        assert reply == read
    assert (first["array_progress"]["pending"], rerun["rerun_of"]) == (4, first["id"])
    assert first["links"]["tasks"] == f"/api/v1/jobs/{first['id']}/tasks/"


def test_a_template_fills_what_the_submission_leaves_out(project: Project, cluster: Cluster) -> None:
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": "local", "template": "parameter-sweep"}

    response = _api(_member(project, cluster)).post("/api/v1/jobs/", {**body, "partition": "h100"}, format="json")

    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.name, job.gpus, job.time_limit_minutes, job.template_id) == (
        "Parameter sweep",
        1,
        60,
        "parameter-sweep",
    )
    assert job.environment == {"LEARNING_RATES": "0.1 0.01 0.001"}
    assert job.script.startswith("#!/bin/bash\n# One run per learning rate")


# Discovering clusters ----------------------------------------------------------------------------------


def test_clusters_list_partitions_gpu_types_limits_and_free_gpus(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)

    body = _api(member).get("/api/v1/clusters/").json()

    assert body["count"] == 1
    local = body["results"][0]
    assert (local["name"], local["my_username"], local["api_version"]) == ("local", "alice", "0.0.38")
    h100 = next(p for p in local["partitions"] if p["name"] == "h100")
    assert (h100["gpu_types"], h100["max_gpus_per_node"], h100["max_time_minutes"]) == (["h100"], 4, 2880)
    assert h100["nodes"] == ["gpu01", "gpu02"]
    assert h100["gpus_total"] == 8
    assert 0 <= h100["gpus_free"] <= 8
    assert {gpu["name"]: gpu["total"] for gpu in local["gpu_types"]} == {"a100": 16, "h100": 8}
    assert _api(member).get("/api/v1/clusters/local/").json()["name"] == "local"


def test_a_user_without_a_cluster_account_sees_no_clusters(cluster: Cluster) -> None:
    stranger = make_user()

    assert _api(stranger).get("/api/v1/clusters/").json()["count"] == 0
    assert _api(stranger).get("/api/v1/clusters/local/").status_code == 404


# Listing jobs ------------------------------------------------------------------------------------------


def _jobs(project: Project, user: Any, count: int, **request: Any) -> list[Job]:
    return [
        job_submit(
            user=user, project=project, request=JobRequest(cluster="local", partition="h100", script=SCRIPT, **request)
        )[0]
        for _ in range(count)
    ]


def test_the_job_list_shows_only_jobs_of_projects_one_may_see(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)
    other_project = make_project(make_tenant())
    grant_allocation(other_project, cluster)
    other_member = _member(other_project, cluster, username="bob")
    mine = _jobs(project, member, 2)
    _jobs(other_project, other_member, 3)

    listed = _api(member).get("/api/v1/jobs/").json()

    assert listed["count"] == 2
    assert {row["id"] for row in listed["results"]} == {str(job.pk) for job in mine}
    foreign = Job.objects.filter(project=other_project).values_list("pk", flat=True)[0]
    assert _api(member).get(f"/api/v1/jobs/{foreign}/").status_code == 404


def test_the_job_list_filters_by_project_state_cluster_and_user(project: Project, cluster: Cluster) -> None:
    alice, bob = _member(project, cluster), _member(project, cluster, username="bob")
    _jobs(project, alice, 2, name="train")
    bobs = _jobs(project, bob, 1, name="eval")
    Job.objects.filter(pk=bobs[0].pk).update(state=JobState.RUNNING)
    api = _api(alice)
    label = f"{project.tenant.slug}/{project.slug}"

    def count(**params: Any) -> int:
        response = api.get("/api/v1/jobs/", params)
        assert response.status_code == 200, response.json()
        return int(response.json()["count"])

    assert count(project=label) == 3
    assert count(state="running") == 1
    assert count(state=["running", "queued"]) == 3
    assert count(user=bob.username) == 1
    assert count(cluster="local") == 3
    assert count(cluster="elsewhere") == 0
    assert count(search="trai") == 2
    assert count(active="false") == 0
    assert api.get("/api/v1/jobs/", {"state": "sleeping"}).status_code == 400
    assert api.get("/api/v1/jobs/", {"project": "nope/nope"}).status_code == 404


def test_the_job_list_costs_the_same_queries_for_any_page_size(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)
    api = _api(member)
    _jobs(project, member, 2)
    with CaptureQueriesContext(connection) as small:
        assert api.get("/api/v1/jobs/").status_code == 200
    _jobs(project, member, 30)
    with CaptureQueriesContext(connection) as large:
        assert len(api.get("/api/v1/jobs/", {"page_size": 100}).json()["results"]) == 32

    assert len(large.captured_queries) == len(small.captured_queries)


# Cancelling --------------------------------------------------------------------------------------------


def test_who_may_cancel_a_queued_job(project: Project, cluster: Cluster) -> None:
    owner = _member(project, cluster)
    colleague = _member(project, cluster, username="bob")
    viewer = _member(project, cluster, role="viewer", username=None)
    outsider = make_user()
    job = _jobs(project, owner, 1)[0]

    assert _api(colleague).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert _api(viewer).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert _api(outsider).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 404
    job.refresh_from_db()
    assert (job.state, job.cancel_requested_at) == (JobState.QUEUED, None)

    response = _api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert response.status_code == 202
    assert response.json()["state"] == "cancelled"
    assert [step["to_state"] for step in response.json()["transitions"]] == ["queued", "cancelled"]


def test_a_tenant_admin_may_cancel_any_job_of_the_tenant(project: Project, cluster: Cluster) -> None:
    owner = _member(project, cluster)
    admin = make_user()
    add_tenant_member(project.tenant, admin, "admin")
    job = _jobs(project, owner, 1)[0]

    assert _api(admin).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


# Templates ---------------------------------------------------------------------------------------------


def test_members_save_templates_and_see_them_with_the_built_ins(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)
    viewer = _member(project, cluster, role="viewer", username=None)
    label = f"{project.tenant.slug}/{project.slug}"
    body = {"project": label, "name": "nightly eval", "script": SCRIPT, "gpus": 2, "environment": {"A": "1"}}

    created = _api(member).post("/api/v1/job-templates/", body, format="json")
    refused = _api(viewer).post("/api/v1/job-templates/", {**body, "name": "other"}, format="json")
    duplicate = _api(member).post("/api/v1/job-templates/", body, format="json")

    assert created.status_code == 201, created.json()
    assert refused.status_code == 403
    assert duplicate.status_code == 400
    assert duplicate.json()["fields"]["name"] == [f"Project '{label}' already has a template named 'nightly eval'."]
    listed = _api(viewer).get("/api/v1/job-templates/", {"project": label}).json()["results"]
    builtins = [
        "gpu-smoke-test",
        "pytorch-multi-gpu-training",
        "pytorch-multi-node-training",
        "parameter-sweep",
        "array-sweep",
    ]
    assert [t["id"] for t in listed] == [*builtins, created.json()["id"]]
    assert listed[-1]["kind"] == "project"
    assert listed[-1]["created_by"] == member.username
    outsider_view = _api(make_user()).get("/api/v1/job-templates/").json()["results"]
    assert [t["kind"] for t in outsider_view] == ["builtin"] * 5


def test_only_the_author_or_a_manager_changes_a_template(project: Project, cluster: Cluster) -> None:
    author, colleague = _member(project, cluster), _member(project, cluster, username="bob")
    manager = _member(project, cluster, role="manager", username=None)
    template = JobTemplate.objects.create(project=project, name="t", script=SCRIPT, created_by=author)
    path = f"/api/v1/job-templates/{template.pk}/"

    assert _api(colleague).patch(path, {"gpus": 3}, format="json").status_code == 403
    assert _api(author).patch(path, {"gpus": 3}, format="json").json()["gpus"] == 3
    assert _api(make_user()).get(path).status_code == 404
    assert _api(author).patch("/api/v1/job-templates/gpu-smoke-test/", {"gpus": 3}, format="json").status_code == 409
    assert _api(manager).delete(path).status_code == 204
    assert not JobTemplate.objects.exists()


def test_a_saved_template_can_be_submitted(project: Project, cluster: Cluster) -> None:
    member = _member(project, cluster)
    template = JobTemplate.objects.create(
        project=project, name="eval", script=SCRIPT, partition="a100", gpu_type="a100", gpus=2, time_limit_minutes=30
    )

    response = _submit(_api(member), project, template=str(template.pk))

    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["partition"], body["gpu_type"], body["gpus"], body["time_limit_minutes"]) == ("a100", "a100", 2, 30)


def test_the_job_list_pages_by_cursor_through_equal_times_and_counts_up_to_a_limit(
    project: Project, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    member = _member(project, cluster)
    jobs = _jobs(project, member, 5)
    same_moment = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk__in=[job.pk for job in jobs[1:4]]).update(created_at=same_moment)  # ties, broken by id
    expected = [str(job.pk) for job in Job.objects.order_by("-created_at", "-id")]
    api = _api(member)

    response = api.get("/api/v1/jobs/", {"page_size": 2})
    assert_matches_schema(response, method="GET", path_template="/api/v1/jobs/")
    first = response.json()
    assert (first["count"], first["count_exact"], first["previous"]) == (5, True, None)
    second = api.get(first["next"]).json()
    third = api.get(second["next"]).json()
    assert third["next"] is None
    listed = [row["id"] for page in (first, second, third) for row in page["results"]]
    assert listed == expected
    back = api.get(third["previous"]).json()
    assert [row["id"] for row in back["results"]] == expected[2:4]

    monkeypatch.setattr("portal.keyset.COUNT_LIMIT", 3)
    bounded = api.get("/api/v1/jobs/", {"page_size": 2}).json()
    assert (bounded["count"], bounded["count_exact"]) == (3, False)

    refused = api.get("/api/v1/jobs/", {"page": 2})
    assert refused.status_code == 400
    assert "page" in refused.json()["fields"]
    assert api.get("/api/v1/jobs/", {"cursor": "x"}).status_code == 400
