"""Run again: a finished job submitted anew through the API and the pages, with changes validated as a
submission's, linked to the original (`rerun_of`), for those who may submit to its project only. No Slurm here
(the jobs stay queued: their delivery is scheduled on commit, which a test's transaction never reaches), except
in the live test at the end."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, ClusterAccount
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobDependency, JobState
from tenants.models import Project
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.jobs.conftest import LiveProject

SCRIPT = "#!/bin/bash\necho again\n"


class Team:
    def __init__(self, tmp_path: Path) -> None:
        self.cluster: Cluster = make_matrix_cluster("reruncluster")
        self.cluster.log_root = str(tmp_path)
        self.cluster.save(update_fields=["log_root"])
        self.users: dict[str, User] = {role: make_user(f"r-{role}") for role in ("tenant_admin", "outsider")}
        tenant = make_tenant("acme", admin=self.users["tenant_admin"])
        self.project: Project = make_project(tenant, "vision")
        for index, role in enumerate(("owner", "member", "manager", "viewer")):
            self.users[role] = make_user(f"r-{role}")
            add_project_member(
                self.project, self.users[role], "viewer" if role == "viewer" else role.replace("owner", "member")
            )
            ClusterAccount.objects.create(cluster=self.cluster, user=self.users[role], username=f"rerun{index}")
        make_tenant("othercorp", admin=self.users["outsider"])
        grant_allocation(self.project, self.cluster, 10)
        self.job, _ = job_submit(
            user=self.users["owner"],
            project=self.project,
            request=JobRequest(
                cluster="reruncluster",
                name="train",
                gpus=2,
                time_limit_minutes=30,
                script=SCRIPT,
                environment={"EPOCHS": "3"},
                cpus=4,
            ),
        )
        Job.objects.filter(pk=self.job.pk).update(state=JobState.FAILED, ended_at=timezone.now(), exit_code=1)
        self.job.refresh_from_db()

    def api(self, role: str) -> APIClient:
        api = APIClient()
        api.force_authenticate(self.users[role])
        return api

    def client(self, role: str) -> Client:
        client = Client()
        client.force_login(self.users[role])
        return client


@pytest.fixture
def team(db: None, tmp_path: Path) -> Team:
    return Team(tmp_path)


def _rerun(team: Team, role: str = "member", **body: Any) -> Any:
    return team.api(role).post(f"/api/v1/jobs/{team.job.pk}/rerun/", body, format="json")


def test_a_rerun_submits_the_same_job_again_and_links_both_ways(team: Team) -> None:
    reply = _rerun(team)
    assert reply.status_code == 202, reply.json()
    body = reply.json()
    rerun = Job.objects.get(pk=body["id"])
    assert body["rerun_of"] == str(team.job.pk)
    assert (body["state"], body["user"], body["cluster_username"]) == ("queued", "r-member", "rerun1")
    assert (rerun.name, rerun.partition, rerun.gpu_type, rerun.gpus, rerun.time_limit_minutes) == (
        "train",
        "gpu",
        "",
        2,
        30,
    )
    assert (rerun.script, rerun.environment, rerun.cpus, rerun.rerun_of_id) == (SCRIPT, {"EPOCHS": "3"}, 4, team.job.pk)
    assert rerun.stdout_path != team.job.stdout_path
    assert body["estimate"]["gpu_hours"] == "1.00"

    original = team.api("viewer").get(f"/api/v1/jobs/{team.job.pk}/").json()
    assert (original["rerun_of"], original["reruns"]) == (None, [body["id"]])
    assert original["links"]["rerun"] == f"/api/v1/jobs/{team.job.pk}/rerun/"
    listed = team.api("viewer").get("/api/v1/jobs/").json()["results"]
    assert {row["id"]: row["rerun_of"] for row in listed} == {body["id"]: str(team.job.pk), str(team.job.pk): None}


def test_changes_are_validated_like_a_submission_and_unknown_fields_refused_by_name(team: Team) -> None:
    changed = _rerun(team, gpus=1, time_limit_minutes=10, name="train (short)", environment={"EPOCHS": "1"})
    assert changed.status_code == 202
    rerun = Job.objects.get(pk=changed.json()["id"])
    assert (rerun.gpus, rerun.time_limit_minutes, rerun.name, rerun.environment) == (
        1,
        10,
        "train (short)",
        {"EPOCHS": "1"},
    )

    before = Job.objects.count()
    unknown = _rerun(team, priority="high", project="acme/other")
    assert unknown.status_code == 400
    assert sorted(unknown.json()["fields"]) == ["priority", "project"]
    assert unknown.json()["fields"]["priority"][0].startswith(
        "This operation has no field 'priority'; it takes: cluster,"
    )
    too_many = _rerun(team, gpus=9)
    assert too_many.status_code == 400
    assert too_many.json()["fields"]["gpus"] == [
        "`gpus` counts the GPUs on each node, and the nodes of partition 'gpu' have at most 4 GPUs; ask "
        "for 4 or fewer per node, and for more nodes (`nodes`) if you need more GPUs."
    ]
    no_such = _rerun(team, partition="nope")
    assert no_such.json()["fields"]["partition"] == [
        "Cluster 'reruncluster' has no partition 'nope'; choose one of: gpu."
    ]
    assert Job.objects.count() == before


def test_a_rerun_is_refused_for_want_of_gpu_hours_in_the_submissions_words(team: Team) -> None:
    before = Job.objects.count()
    refused = _rerun(team, gpus=4, time_limit_minutes=600)
    assert refused.status_code == 409
    assert refused.json()["code"] == "quota_exceeded"
    assert refused.json()["message"].startswith("This job needs 40.0 GPU-hours (4 GPUs x 600 min); vision has ")
    assert Job.objects.count() == before


@pytest.mark.parametrize(
    ("role", "status"),
    [
        ("owner", 202),
        ("member", 202),
        ("manager", 202),
        ("viewer", 403),
        ("tenant_admin", 403),
        ("outsider", 404),
    ],
)
def test_who_may_run_a_job_again(team: Team, role: str, status: int) -> None:
    before = set(Job.objects.values_list("pk", flat=True))
    reply = _rerun(team, role)
    assert reply.status_code == status, reply.json()
    created = set(Job.objects.values_list("pk", flat=True)) - before
    if status == 202:
        assert created == {uuid.UUID(reply.json()["id"])}
    else:
        assert created == set()
        page = team.client(role).post(f"/jobs/{team.job.pk}/rerun/")
        assert page.status_code == status
        assert team.client(role).get(f"/jobs/new/?rerun={team.job.pk}").status_code == status
        assert set(Job.objects.values_list("pk", flat=True)) - before == set()


def test_a_job_submitted_outside_the_portal_cannot_be_run_again(team: Team) -> None:
    Job.objects.filter(pk=team.job.pk).update(is_external=True, script="")
    refused = _rerun(team)
    assert refused.status_code == 409
    assert refused.json()["message"].startswith("This job was submitted outside the portal")


def test_the_job_page_runs_it_again_and_shows_the_link(team: Team) -> None:
    client = team.client("member")
    page = client.get(f"/jobs/{team.job.pk}/").content.decode()
    assert f'<form method="post" action="/jobs/{team.job.pk}/rerun/">' in page
    assert f'href="/jobs/new/?rerun={team.job.pk}">Edit and run again</a>' in page
    viewer_page = team.client("viewer").get(f"/jobs/{team.job.pk}/").content.decode()
    assert "Run again" not in viewer_page

    response = client.post(f"/jobs/{team.job.pk}/rerun/")
    rerun = Job.objects.get(rerun_of=team.job)
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{rerun.pk}/"
    new_page = client.get(response["Location"]).content.decode()
    assert "“train” runs again as this job; a worker is handing it to Slurm." in new_page
    assert f'<dd id="rerun-of"><a href="/jobs/{team.job.pk}/">train</a></dd>' in new_page
    assert "Edit and run again" not in new_page  # still queued
    original_page = client.get(f"/jobs/{team.job.pk}/").content.decode()
    assert re.search(rf'<dd id="reruns"><a href="/jobs/{rerun.pk}/">train</a> \(queued, ', original_page)


def test_edit_and_run_again_opens_the_form_prefilled_and_keeps_the_link(team: Team) -> None:
    client = team.client("manager")
    form = client.get(f"/jobs/new/?rerun={team.job.pk}").content.decode()
    assert f'<input type="hidden" name="rerun_of" value="{team.job.pk}">' in form
    assert 'name="gpus" type="number" inputmode="numeric" min="1" step="1" value="2"' in form
    assert 'value="30"' in form
    assert ">EPOCHS=3</textarea>" in form
    assert 'value="train"' in form
    assert re.search(r'id="id_cpus" name="cpus"[^>]*value="4"', form)

    fields = {
        "rerun_of": str(team.job.pk),
        "project": "acme/vision",
        "cluster": "reruncluster",
        "partition": "gpu",
        "gpu_type": "",
        "gpus": "1",
        "time_limit_minutes": "15",
        "cpus": "4",  # as the form prefilled it
        "name": "train again",
        "script": "#!/bin/bash\r\necho edited\r\n",
        "environment": "EPOCHS=5\r\n",
    }
    invalid = client.post("/jobs/new/", {**fields, "gpus": "9"}).content.decode()
    assert f'<input type="hidden" name="rerun_of" value="{team.job.pk}">' in invalid
    assert Job.objects.filter(rerun_of=team.job).count() == 0

    response = client.post("/jobs/new/", fields)
    rerun = Job.objects.get(rerun_of=team.job)
    assert response["Location"] == f"/jobs/{rerun.pk}/"
    assert (rerun.name, rerun.gpus, rerun.time_limit_minutes, rerun.script, rerun.environment, rerun.cpus) == (
        "train again",
        1,
        15,
        "#!/bin/bash\necho edited\n",
        {"EPOCHS": "5"},
        4,
    )
    assert rerun.user == team.users["manager"]


@pytest.mark.django_db(transaction=True)
def test_a_rerun_of_a_finished_job_reaches_slurm_and_keeps_the_link(
    live_project: LiveProject, celery_worker: str
) -> None:
    first = live_project.submit(name="first run", script="#!/bin/bash\necho first\n")
    original = live_project.wait_for(first["id"], lambda job: job.is_final)
    assert original.state == JobState.COMPLETED

    reply = live_project.api.post(f"/api/v1/jobs/{original.pk}/rerun/", {"name": "second run"}, format="json")
    assert reply.status_code == 202, reply.json()
    rerun = live_project.wait_for(reply.json()["id"], lambda job: job.is_final)

    assert (rerun.state, rerun.exit_code, rerun.name) == (JobState.COMPLETED, 0, "second run")
    assert rerun.slurm_job_id is not None
    assert rerun.slurm_job_id != original.slurm_job_id
    assert rerun.rerun_of_id == original.pk
    assert Path(rerun.stdout_path).read_text() == "first\n"
    detail = live_project.api.get(f"/api/v1/jobs/{original.pk}/").json()
    assert detail["reruns"] == [str(rerun.pk)]


def test_a_rerun_of_an_array_runs_the_same_tasks_unless_told_otherwise(team: Team) -> None:
    Job.objects.filter(pk=team.job.pk).update(array="0-9%2", array_task_count=10, array_max_running=2)
    same = _rerun(team, gpus=1, time_limit_minutes=10)
    assert same.status_code == 202, same.json()
    assert (same.json()["array"], same.json()["array_tasks"], same.json()["array_max_running"]) == ("0-9%2", 10, 2)
    fewer = _rerun(team, gpus=1, time_limit_minutes=10, array="0-3")
    assert fewer.status_code == 202, fewer.json()
    assert (fewer.json()["array"], fewer.json()["array_tasks"], fewer.json()["rerun_of"]) == (
        "0-3",
        4,
        str(team.job.pk),
    )
    bad = _rerun(team, array="5-2")
    assert bad.status_code == 400
    assert list(bad.json()["fields"]) == ["array"]


def test_a_rerun_keeps_its_parents_only_when_asked_and_only_while_they_can_still_be_met(team: Team) -> None:
    prepare, _ = job_submit(
        user=team.users["owner"],
        project=team.project,
        request=JobRequest(cluster="reruncluster", name="prepare", script=SCRIPT),
    )
    JobDependency.objects.create(child=team.job, parent=prepare, condition="afterok")

    alone = _rerun(team)
    assert alone.status_code == 202, alone.json()
    assert not JobDependency.objects.filter(child_id=alone.json()["id"]).exists()
    kept = _rerun(team, keep_dependencies=True)
    assert kept.status_code == 202, kept.json()
    assert list(JobDependency.objects.filter(child_id=kept.json()["id"]).values_list("parent_id", "condition")) == [
        (prepare.pk, "afterok")
    ]

    Job.objects.filter(pk=prepare.pk).update(state=JobState.FAILED)
    refused = _rerun(team, keep_dependencies=True)
    assert refused.status_code == 400
    assert refused.json()["fields"] == {
        "depends_on": [
            f"It could never run: job “prepare” ({prepare.pk}) ended failed, and this job was to run only after it "
            "succeeds."
        ]
    }
