"""Pipelines: a job waits for other jobs of its project (`depends_on`), checked at submission, held in the portal
until its parents are in Slurm, sent with Slurm's dependency, shown as a graph, and told apart when it can never
run. Most tests need no Slurm (the jobs stay queued: their delivery is scheduled on commit, which a test's
transaction never reaches); the live journey at the end runs a real pipeline on the live clusters."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing.job_end_notices import job_end_notices_send
from clusters.models import Cluster, ClusterAccount
from clusters.slurm.codecs import codec_for
from clusters.slurm.types import JobSubmission
from jobs.job_services import JobRequest, job_submit
from jobs.job_sync import job_deliver
from jobs.models import DependencyCondition, Job, JobDependency, JobEndWatch, JobState
from jobs.pipelines import (
    NEVER_SATISFIED_REASON,
    DependencyRequest,
    condition_outcome,
    dependencies_resolve,
    dependents_wake,
)
from tenants.models import Notification, Project
from tests.conftest import SentTask
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.jobs.conftest import LiveProject
from tests.live_clusters import LiveCluster

SCRIPT = "#!/bin/bash\necho step\n"


class Team:
    """acme/vision on a cluster known to the portal only (its slurmrestd is a closed port), with a member who
    submits, and othercorp/secret with a job of its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.cluster: Cluster = make_matrix_cluster("pipecluster")
        self.cluster.log_root = str(tmp_path)
        self.cluster.save(update_fields=["log_root"])
        self.other_cluster: Cluster = make_matrix_cluster("pipeother")
        self.member: User = make_user("p-member")
        self.project: Project = make_project(make_tenant("acme"), "vision")
        add_project_member(self.project, self.member)
        for cluster in (self.cluster, self.other_cluster):
            ClusterAccount.objects.create(cluster=cluster, user=self.member, username="alice")
            grant_allocation(self.project, cluster, 100)
        self.outsider: User = make_user("p-outsider")
        self.secret_project: Project = make_project(make_tenant("othercorp", admin=self.outsider), "secret")
        ClusterAccount.objects.create(cluster=self.cluster, user=self.outsider, username="bob")
        grant_allocation(self.secret_project, self.cluster, 100)
        self.secret_job = self.submit(user=self.outsider, project=self.secret_project, name="secret")

    def submit(
        self,
        *,
        name: str,
        user: User | None = None,
        project: Project | None = None,
        cluster: str = "pipecluster",
        depends_on: tuple[DependencyRequest, ...] = (),
    ) -> Job:
        job, _ = job_submit(
            user=user or self.member,
            project=project or self.project,
            request=JobRequest(cluster=cluster, name=name, script=SCRIPT, depends_on=depends_on),
        )
        return job

    def api(self, user: User | None = None) -> APIClient:
        api = APIClient()
        api.force_authenticate(user or self.member)
        return api

    def post(self, **body: Any) -> Any:
        return self.api().post(
            "/api/v1/jobs/",
            {"project": "acme/vision", "cluster": "pipecluster", "script": SCRIPT, **body},
            format="json",
        )


@pytest.fixture
def team(db: None, tmp_path: Path) -> Team:
    return Team(tmp_path)


def _ended(job: Job, state: JobState, *, slurm_job_id: int | None = 100) -> Job:
    Job.objects.filter(pk=job.pk).update(state=state, ended_at=timezone.now(), slurm_job_id=slurm_job_id)
    job.refresh_from_db()
    return job


# Submission --------------------------------------------------------------------------------------------


def test_a_job_waits_for_jobs_of_its_project_and_the_api_shows_both_ends(team: Team) -> None:
    prepare = team.submit(name="prepare")
    train = team.post(name="train", depends_on=[{"job": str(prepare.pk), "condition": "afterok"}])
    assert train.status_code == 202, train.json()
    reply = train.json()
    assert [
        (edge["job"], edge["name"], edge["condition"], edge["condition_words"]) for edge in reply["depends_on"]
    ] == [(str(prepare.pk), "prepare", "afterok", "after it succeeds")]
    assert (reply["dependents"], reply["never_runs"]) == ([], "")
    evaluate = team.post(name="evaluate", depends_on=[{"job": reply["id"], "condition": "afterany"}])
    assert evaluate.status_code == 202, evaluate.json()

    middle = team.api().get(f"/api/v1/jobs/{reply['id']}/").json()
    assert [(edge["name"], edge["condition"], edge["outcome"]) for edge in middle["depends_on"]] == [
        ("prepare", "afterok", "waiting")
    ]
    assert [(edge["name"], edge["condition"], edge["state"]) for edge in middle["dependents"]] == [
        ("evaluate", "afterany", "queued")
    ]
    assert list(JobDependency.objects.order_by("id").values_list("child__name", "parent__name", "condition")) == [
        ("train", "prepare", "afterok"),
        ("evaluate", "train", "afterany"),
    ]


@pytest.mark.parametrize(
    ("entry", "field_errors"),
    [
        (
            {"job": "J", "condition": "after"},
            {
                "condition": [
                    "'after' is not a condition; use afterok (after it succeeds; for an array, every task), afterany "
                    "(after it ends, however it ends) or afternotok (after it fails)."
                ]
            },
        ),
        (
            {"job": "J", "condition": "afterok", "when": "now"},
            {"when": ["This operation has no field 'when'; it takes: job, condition (see /api/docs/)."]},
        ),
        ({"job": "not-a-uuid", "condition": "afterok"}, {"job": ["Must be a valid UUID."]}),
    ],
)
def test_an_unknown_condition_or_field_is_refused_by_name(
    team: Team, entry: dict[str, str], field_errors: dict[str, list[str]]
) -> None:
    parent = team.submit(name="prepare")
    entry = {key: str(parent.pk) if value == "J" else value for key, value in entry.items()}
    reply = team.post(name="train", depends_on=[entry])
    assert reply.status_code == 400
    body = reply.json()
    assert body["code"] == "invalid"
    assert body["fields"] == {f"depends_on.0.{name}": words for name, words in field_errors.items()}
    assert not Job.objects.filter(name="train").exists()


def test_a_job_of_another_tenant_is_refused_exactly_as_one_that_does_not_exist(team: Team) -> None:
    theirs = team.post(name="spy", depends_on=[{"job": str(team.secret_job.pk), "condition": "afterany"}])
    nobody = uuid.uuid4()
    missing = team.post(name="spy", depends_on=[{"job": str(nobody), "condition": "afterany"}])
    assert (theirs.status_code, missing.status_code) == (400, 400)
    words = (
        "exists in project 'acme/vision' among the jobs you can see; a job can only wait for jobs of its own project."
    )
    assert theirs.json()["fields"] == {"depends_on": [f"No job '{team.secret_job.pk}' {words}"]}
    assert missing.json()["fields"] == {"depends_on": [f"No job '{nobody}' {words}"]}
    assert "secret" not in str(theirs.json())
    assert "othercorp" not in str(theirs.json())
    assert not Job.objects.filter(name="spy").exists()


def test_a_parent_on_another_cluster_is_refused_with_the_reason(team: Team) -> None:
    elsewhere = team.submit(name="prepare", cluster="pipeother")
    reply = team.post(name="train", depends_on=[{"job": str(elsewhere.pk), "condition": "afterok"}])
    assert reply.status_code == 400
    assert reply.json()["fields"] == {
        "depends_on": [
            f"Job “prepare” ({elsewhere.pk}) runs on cluster 'pipeother', not 'pipecluster': Slurm dependencies do "
            "not cross clusters; run the whole pipeline on one cluster."
        ]
    }


def test_a_parent_that_already_ended_the_wrong_way_is_refused_and_a_met_one_accepted(team: Team) -> None:
    failed = _ended(team.submit(name="prepare"), JobState.FAILED)
    refused = team.post(name="train", depends_on=[{"job": str(failed.pk), "condition": "afterok"}])
    assert refused.status_code == 400
    assert refused.json()["fields"] == {
        "depends_on": [
            f"It could never run: job “prepare” ({failed.pk}) ended failed, and this job was to run only after it "
            "succeeds."
        ]
    }
    twice = team.post(
        name="train",
        depends_on=[{"job": str(failed.pk), "condition": "afterany"}, {"job": str(failed.pk), "condition": "afterany"}],
    )
    assert twice.json()["fields"] == {
        "depends_on": [f"Job {failed.pk} is named twice; name each job once, with one condition."]
    }
    cleanup = team.post(name="clean up", depends_on=[{"job": str(failed.pk), "condition": "afternotok"}])
    assert cleanup.status_code == 202, cleanup.json()


# Delivery ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "state", "outcome"),
    [
        ("afterok", JobState.COMPLETED, "met"),
        ("afterok", JobState.FAILED, "never"),
        ("afterok", JobState.CANCELLED, "never"),
        ("afterany", JobState.FAILED, "met"),
        ("afterany", JobState.REJECTED, "met"),
        ("afternotok", JobState.COMPLETED, "never"),
        ("afternotok", JobState.TIMEOUT, "met"),
        ("afterok", JobState.RUNNING, "waiting"),
    ],
)
def test_what_a_parents_state_says_of_each_condition(condition: str, state: JobState, outcome: str) -> None:
    assert condition_outcome(condition, Job(state=state)) == outcome


def test_a_child_waits_for_its_parents_slurm_ids_then_goes_with_slurms_dependency(team: Team) -> None:
    first = team.submit(name="a")
    second = team.submit(name="b")
    child = team.submit(
        name="c",
        depends_on=(
            DependencyRequest(job=first.pk, condition="afterok"),
            DependencyRequest(job=second.pk, condition="afterany"),
        ),
    )
    resolution = dependencies_resolve([child])[child.pk]
    assert ([parent.name for parent in resolution.waiting_for], resolution.never) == (["a", "b"], "")

    Job.objects.filter(pk=first.pk).update(slurm_job_id=41, state=JobState.PENDING)
    _ended(second, JobState.FAILED, slurm_job_id=42)  # afterany: met, so not sent
    resolution = dependencies_resolve([child])[child.pk]
    assert (resolution.waiting_for, resolution.slurm_dependency) == ([], "afterok:41")
    submission = JobSubmission(
        name="c", account="a", partition="p", script=SCRIPT, time_limit_minutes=1, working_directory="/w",
        standard_output="/o", standard_error="/e", dependency="afterok:41,afterany:43:44",
    )  # fmt: skip
    for version in ("0.0.38", "0.0.41", "0.0.44"):
        assert codec_for(version).encode_submit(submission)["job"]["dependency"] == "afterok:41,afterany:43:44"


def test_a_waiting_child_is_not_attempted_and_one_that_can_never_run_ends_before_slurm(team: Team) -> None:
    parent = team.submit(name="prepare")
    child = team.submit(name="train", depends_on=(DependencyRequest(job=parent.pk, condition="afterok"),))

    delivery = job_deliver(job_id=child.pk)  # the cluster is a closed port: nothing may try it

    child.refresh_from_db()
    assert delivery.outcome == "waiting for its parents"
    assert (child.state, child.submit_attempts, child.slurm_job_id) == (JobState.QUEUED, 0, None)
    assert (
        child.last_error
        == "Waiting for “prepare” to reach Slurm: this job is sent with its dependency once it is there."
    )
    assert child.next_attempt_at is not None
    assert child.next_attempt_at > timezone.now()

    _ended(parent, JobState.FAILED)
    assert job_deliver(job_id=child.pk).outcome == "never able to run"
    child.refresh_from_db()
    assert (child.state, child.state_reason, child.submit_attempts) == (JobState.CANCELLED, NEVER_SATISFIED_REASON, 0)
    words = f"job “prepare” ({parent.pk}) ended failed, and this job was to run only after it succeeds"
    assert child.last_error == f"Never able to run: {words}."
    detail = team.api().get(f"/api/v1/jobs/{child.pk}/").json()
    assert detail["never_runs"] == words[0].upper() + words[1:]
    # No user asked: the portal cancelled it, and says why.
    assert (detail["cancelled_by"], detail["cancel_reason"]) == ("the portal", f"Never able to run: {words}.")
    assert [(edge["name"], edge["outcome"]) for edge in detail["depends_on"]] == [("prepare", "never")]


def test_a_parent_reaching_slurm_wakes_its_waiting_children(
    team: Team, sent_tasks: list[SentTask], django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    parent = team.submit(name="prepare")
    child = team.submit(name="train", depends_on=(DependencyRequest(job=parent.pk, condition="afterok"),))
    assert job_deliver(job_id=child.pk).outcome == "waiting for its parents"
    Job.objects.filter(pk=parent.pk).update(slurm_job_id=41, state=JobState.PENDING)
    sent_tasks.clear()

    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        assert dependents_wake(parent_ids=[parent.pk], now=now) == 1

    child.refresh_from_db()
    assert child.next_attempt_at == now
    assert sent_tasks == [("jobs.tasks.job_submit", (str(child.pk),))]
    assert dependencies_resolve([child])[child.pk].slurm_dependency == "afterok:41"


def test_cancelling_a_queued_parent_says_what_becomes_of_its_children_and_they_follow(team: Team) -> None:
    parent = team.submit(name="prepare")
    strict = team.submit(name="train", depends_on=(DependencyRequest(job=parent.pk, condition="afterok"),))
    lenient = team.submit(name="report", depends_on=(DependencyRequest(job=parent.pk, condition="afterany"),))

    reply = team.api().post(f"/api/v1/jobs/{parent.pk}/cancel/")

    assert reply.status_code == 202
    assert reply.json()["children_after_cancel"] == [
        {
            "job": str(strict.pk),
            "name": "train",
            "condition": "afterok",
            "will_run": False,
            "words": "“train” will never run: it waits for this job to succeed",
        },
        {
            "job": str(lenient.pk),
            "name": "report",
            "condition": "afterany",
            "will_run": True,
            "words": "“report” will still run: it waits for this job to end, however it ends",
        },
    ]
    # The children's delivery judges them now: one never runs, the other goes to Slurm without the dependency.
    assert job_deliver(job_id=strict.pk).outcome == "never able to run"
    lenient_resolution = dependencies_resolve([lenient])[lenient.pk]
    assert (lenient_resolution.never, lenient_resolution.waiting_for, lenient_resolution.slurm_dependency) == (
        "",
        [],
        "",
    )


def test_the_end_notice_of_a_pipeline_step_says_where_it_stands_in_its_pipeline(team: Team) -> None:
    parent = _ended(team.submit(name="prepare"), JobState.FAILED)
    child = team.submit(name="train", depends_on=(DependencyRequest(job=parent.pk, condition="afterany"),))
    JobDependency.objects.filter(child=child).update(condition=DependencyCondition.AFTER_OK)  # as if it failed since
    for job in (parent, child):
        JobEndWatch.objects.create(job=job, user=team.member)
    assert job_deliver(job_id=child.pk).outcome == "never able to run"

    assert job_end_notices_send() == 2

    bodies = dict(Notification.objects.values_list("title", "body"))
    never = f"job “prepare” ({parent.pk}) ended failed, and this job was to run only after it succeeds"
    assert bodies == {
        "Job “prepare” failed": "Your job “prepare” in acme/vision on cluster pipecluster failed. It never ran, so it "
        "costs nothing. In its pipeline, “train” waits for it.",
        f"Job “train” was cancelled: never able to run: {never}": "Your job “train” in acme/vision on cluster "
        f"pipecluster was cancelled: never able to run: {never}. It never ran, so it costs nothing. In its pipeline, "
        "it waited for “prepare”.",
    }


# Pages -------------------------------------------------------------------------------------------------


def test_the_form_offers_the_projects_recent_jobs_and_submits_a_pipeline_step(team: Team) -> None:
    parent = team.submit(name="prepare")
    browser = Client()
    browser.force_login(team.member)
    form = browser.get("/jobs/new/?project=acme/vision&cluster=pipecluster").content.decode()
    assert f'name="depends_on" value="{parent.pk}"' in form
    assert "secret" not in form

    reply = browser.post(
        "/jobs/new/",
        {
            "project": "acme/vision",
            "cluster": "pipecluster",
            "name": "train",
            "script": SCRIPT,
            "depends_on": [str(parent.pk)],
            f"condition_{parent.pk}": "afterany",
        },
    )
    assert reply.status_code == 302, reply.content.decode()[:2000]
    child = Job.objects.get(name="train")
    assert list(child.dependencies.values_list("parent_id", "condition")) == [(parent.pk, "afterany")]

    page = browser.get(f"/jobs/{child.pk}/").content.decode()
    assert 'id="pipeline"' in page
    assert "<svg" in page
    assert "runs after it ends, however it ends (<code>afterany</code>)" in page
    parent_page = browser.get(f"/jobs/{parent.pk}/").content.decode()
    assert 'id="cancel-effects"' in parent_page
    assert "“train” will still run: it waits for this job to end, however it ends." in parent_page

    refused = browser.post(
        "/jobs/new/",
        {
            "project": "acme/vision",
            "cluster": "pipecluster",
            "name": "spy",
            "script": SCRIPT,
            "depends_on": [str(team.secret_job.pk)],
        },
    )
    assert refused.status_code == 200
    assert f"No job &#x27;{team.secret_job.pk}&#x27; exists in project" in refused.content.decode()


def test_a_job_that_can_never_run_says_so_on_its_page(team: Team) -> None:
    parent = _ended(team.submit(name="prepare"), JobState.FAILED)
    child = team.submit(name="train")
    JobDependency.objects.create(child=child, parent=parent, condition=DependencyCondition.AFTER_OK)
    Job.objects.filter(pk=child.pk).update(state=JobState.PENDING, slurm_job_id=77, state_reason=NEVER_SATISFIED_REASON)
    browser = Client()
    browser.force_login(team.member)
    page = browser.get(f"/jobs/{child.pk}/").content.decode()
    assert "This job will never run:</strong> Job “prepare”" in page
    assert "ended failed, and this job was to run only after it succeeds." in page


# Live: a real pipeline on the live clusters ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_three_step_pipeline_runs_in_order_a_failing_first_step_stops_the_second_and_a_cancel_is_followed(
    live: LiveCluster, contract_project: LiveProject, celery_worker: str
) -> None:
    if live.name not in ("local", "north"):
        pytest.skip("dependencies are one string in every API version: local (22.05) and north (24.11) cover it")
    project = contract_project
    # All five at once: the children reach the portal before their parents reach Slurm, and wait for them there.
    prepare = project.submit(name="prepare", script="#!/bin/bash\necho prepare\n")
    train = project.submit(
        name="train", script="#!/bin/bash\necho train\n", depends_on=[{"job": prepare["id"], "condition": "afterok"}]
    )
    evaluate = project.submit(
        name="evaluate",
        script="#!/bin/bash\necho evaluate\n",
        depends_on=[{"job": train["id"], "condition": "afterok"}],
    )
    broken = project.submit(name="broken", script="#!/bin/bash\nexit 3\n")
    holder = project.submit(name="holder", script="#!/bin/bash\nsleep 120\n")
    strict = project.submit(name="strict", depends_on=[{"job": holder["id"], "condition": "afterok"}])
    lenient = project.submit(name="lenient", depends_on=[{"job": holder["id"], "condition": "afterany"}])
    blocked = project.submit(
        name="blocked", script="#!/bin/bash\necho never\n", depends_on=[{"job": broken["id"], "condition": "afterok"}]
    )

    last = project.wait_for(evaluate["id"], lambda job: job.is_final, timeout=90)
    steps = [Job.objects.get(pk=str(job["id"])) for job in (prepare, train)] + [last]
    assert [(step.state, step.exit_code) for step in steps] == [(JobState.COMPLETED, 0)] * 3
    for earlier, later in itertools.pairwise(steps):
        assert earlier.ended_at is not None
        assert later.started_at is not None
        assert later.started_at >= earlier.ended_at.replace(microsecond=0)
    assert steps[1].slurm_dependency == f"afterok:{steps[0].slurm_job_id}"

    stopped = project.wait_for(blocked["id"], lambda job: job.state_reason == NEVER_SATISFIED_REASON, timeout=60)
    assert Job.objects.get(pk=str(broken["id"])).state == JobState.FAILED
    # 22.05 to 26.05 without kill_invalid_depend: Slurm keeps it pending, and the portal says it will never run.
    assert (stopped.state, stopped.started_at) == (JobState.PENDING, None)
    detail = project.api.get(f"/api/v1/jobs/{stopped.pk}/").json()
    assert detail["never_runs"].startswith("Job “broken”")
    assert detail["pending_reason"] == "the jobs it depends on can never satisfy the dependency; cancel it"

    # Cancelling a parent the children wait for in Slurm: told what becomes of them, and their states follow.
    project.wait_for(strict["id"], lambda job: job.slurm_job_id is not None)
    project.wait_for(lenient["id"], lambda job: job.slurm_job_id is not None)
    cancel = project.api.post(f"/api/v1/jobs/{holder['id']}/cancel/").json()
    assert [(child["name"], child["will_run"]) for child in cancel["children_after_cancel"]] == [
        ("strict", False),
        ("lenient", True),
    ]
    assert project.wait_for(lenient["id"], lambda job: job.is_final).state == JobState.COMPLETED
    never = project.wait_for(strict["id"], lambda job: job.state_reason == NEVER_SATISFIED_REASON)
    assert (never.state, Job.objects.get(pk=str(holder["id"])).state) == (JobState.PENDING, JobState.CANCELLED)
    for waiting in (stopped, never):
        project.api.post(f"/api/v1/jobs/{waiting.pk}/cancel/")
        project.wait_for(waiting.pk, lambda job: job.is_final)
