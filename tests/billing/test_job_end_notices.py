"""Told when a job ends: who may ask, and the notification (in the portal and by e-mail) with the outcome and
the cost, sent once the cost is known. No Slurm but in the last test: jobs are as the sync and the accounting
import leave them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing import tasks as billing_tasks
from billing.job_end_notices import job_end_notices_send, pipeline_end_notices_send
from billing.models import UsageRecord
from billing.rates import rate_create
from billing.selectors import usage_record_amount
from billing.usage import usage_import
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount
from jobs.job_services import JobRequest, job_cancel, job_submit
from jobs.models import Job, JobDependency, JobEndWatch, PipelineEndWatch
from jobs.quota_usage import quota_usage_collect
from quotas.units import gpu_seconds_to_hours
from tenants.models import Notification, Project
from tests.billing.usage_factories import charged_job
from tests.conftest import wait_until
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.jobs.conftest import LiveProject, live_project  # noqa: F401  (the fixture, shared with tests/jobs)

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    cluster = make_matrix_cluster("notecluster")
    cluster.log_root = str(tmp_path)
    cluster.save(update_fields=["log_root"])
    return cluster


@pytest.fixture
def project(cluster: Cluster) -> Project:
    project = make_project(make_tenant("acme"), "vision")
    grant_allocation(project, cluster, 100)
    return project


def _user(project: Project, role: str, email: str = "") -> Any:
    user = make_user()
    user.email = email
    user.save(update_fields=["email"])
    add_project_member(project, user, role)
    return user


def _api(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_watchers_are_told_the_outcome_and_the_cost_once_it_is_priced(
    cluster: Cluster, project: Project, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("2.50"),
        currency="EUR",
        valid_from=timezone.now() - timedelta(days=1),
    )
    member, viewer = _user(project, "member", "bob@example.org"), _user(project, "viewer", "vic@example.org")
    end = timezone.now() - timedelta(minutes=5)
    job = charged_job(project, cluster, start=end - timedelta(hours=1), end=end, gpus=2, user=member)
    Job.objects.filter(pk=job.pk).update(name="train", exit_code=0)
    for user in (member, viewer):
        JobEndWatch.objects.create(job=job, user=user)

    assert job_end_notices_send() == 0  # charged, not priced yet: the next usage import prices it
    assert Notification.objects.count() == 0
    usage_import()
    with django_capture_on_commit_callbacks(execute=True):
        assert job_end_notices_send() == 2

    body = (
        "Your job “train” in acme/vision on cluster notecluster completed with exit code 0. It used 2.00 GPU-hours, "
        "which cost 5.00 EUR."
    )
    assert sorted(
        (notice.user.email, notice.kind, notice.title, notice.body, notice.link)
        for notice in Notification.objects.all()
    ) == [
        (email, "job.ended", "Job “train” completed with exit code 0", body, f"/jobs/{job.pk}/")
        for email in ("bob@example.org", "vic@example.org")
    ]
    assert sorted((message.to[0], message.subject) for message in mail.outbox) == [
        ("bob@example.org", "[GPU portal] Job “train” completed with exit code 0"),
        ("vic@example.org", "[GPU portal] Job “train” completed with exit code 0"),
    ]
    assert mail.outbox[0].body.startswith(body)
    assert job_end_notices_send() == 0  # told once
    assert Notification.objects.count() == 2


def test_a_job_that_never_ran_costs_nothing_and_unpriced_usage_says_so(cluster: Cluster, project: Project) -> None:
    member = _user(project, "member")
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    queued, _ = job_submit(
        user=member, project=project, request=JobRequest(cluster="notecluster", name="queued", script="#!/bin/bash\n")
    )
    assert _api(member).post(f"/api/v1/jobs/{queued.pk}/watch/").json() == {"watching": True}
    assert job_end_notices_send() == 0  # still queued
    job_cancel(user=member, job=queued)
    end = timezone.now() - timedelta(minutes=5)
    ran = charged_job(project, cluster, start=end - timedelta(minutes=30), end=end, user=member)  # no price set
    Job.objects.filter(pk=ran.pk).update(name="unpriced", exit_code=3, state="failed")
    JobEndWatch.objects.create(job=ran, user=member)

    assert job_end_notices_send() == 2
    assert sorted((notice.title, notice.body) for notice in Notification.objects.all()) == [
        (
            "Job “queued” cancelled",
            "Your job “queued” in acme/vision on cluster notecluster cancelled. It never ran, so it costs nothing.",
        ),
        (
            "Job “unpriced” failed with exit code 3",
            "Your job “unpriced” in acme/vision on cluster notecluster failed with exit code 3. It used 0.50 "
            "GPU-hours; no price is set for them on this cluster.",
        ),
    ]


def test_whoever_sees_a_job_may_ask_to_be_told_when_it_ends(cluster: Cluster, project: Project) -> None:
    member, viewer = _user(project, "member"), _user(project, "viewer")
    outsider = make_user()
    make_tenant("othercorp", admin=outsider)
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    job, _ = job_submit(
        user=member, project=project, request=JobRequest(cluster="notecluster", name="train", script="#!/bin/bash\n")
    )
    url = f"/api/v1/jobs/{job.pk}/watch/"

    assert _api(outsider).post(url).status_code == 404
    assert JobEndWatch.objects.count() == 0
    assert _api(viewer).post(url).json() == {"watching": True}
    assert _api(viewer).post(url).json() == {"watching": True}  # asking twice changes nothing
    assert list(JobEndWatch.objects.values_list("user", flat=True)) == [viewer.pk]
    assert _api(viewer).delete(url).json() == {"watching": False}
    assert JobEndWatch.objects.count() == 0

    client = Client()
    client.force_login(viewer)
    assert "Tell me when it ends" in client.get(f"/jobs/{job.pk}/").content.decode()
    assert client.post(f"/jobs/{job.pk}/watch/", {"watch": "1"})["Location"] == f"/jobs/{job.pk}/"
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "You will be told when the job ends, with its outcome and cost, here and by e-mail." in page
    assert "Stop telling me" in page

    job_cancel(user=member, job=job)
    ended = _api(member).post(url)
    assert ended.status_code == 409
    assert ended.json()["message"] == "The job has already ended (cancelled); its page says how."


@pytest.mark.django_db(transaction=True)
def test_a_watched_job_on_slurm_tells_its_watcher_how_it_ended_and_what_it_cost(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
) -> None:
    """The real flow: the worker delivers the job, the sync follows it, accounting charges it, the usage import
    (billing's periodic task) prices it and tells the watcher."""
    rate_create(
        actor=None,
        cluster=live_project.cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("3.60"),
        currency="EUR",
        valid_from=timezone.now() - timedelta(days=1),
    )
    member = live_project.member
    member.email = "alice@example.org"
    member.save(update_fields=["email"])
    reply = live_project.submit(name="watched", script="#!/bin/bash\necho watched\nexit 3\n")
    assert live_project.api.post(f"/api/v1/jobs/{reply['id']}/watch/").json() == {"watching": True}
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)
    assert (job.state, job.exit_code) == ("failed", 3)
    cluster = live_project.cluster
    client = slurm_client_for(cluster)

    def told() -> bool:
        quota_usage_collect(cluster=cluster, client=client)  # accounting may lag the job's end by a moment
        billing_tasks.usage_import()
        return Notification.objects.filter(user=member, kind="job.ended").exists()

    wait_until(told, timeout_seconds=60, what="the watcher to be told")
    record = UsageRecord.objects.get(job=job)
    notice = Notification.objects.get(user=member, kind="job.ended")
    hours = gpu_seconds_to_hours(record.gpu_seconds)
    assert notice.title == "Job “watched” failed with exit code 3"
    assert notice.body == (
        f"Your job “watched” in {live_project.label} on cluster {cluster.name} failed with exit code 3. It used "
        f"{hours} GPU-hours, which cost {usage_record_amount(record=record)} EUR."
    )
    assert [(message.to, message.subject) for message in mail.outbox] == [
        (["alice@example.org"], "[GPU portal] Job “watched” failed with exit code 3")
    ]
    assert JobEndWatch.objects.get(job=job, user=member).notified_at is not None


# A whole pipeline ---------------------------------------------------------------------------------------


def _step(project: Project, cluster: Cluster, name: str, **fields: Any) -> Job:
    """A pipeline step as the sync leaves it: by default ran for an hour on 1 GPU and was charged."""
    end = timezone.now() - timedelta(minutes=5)
    job = charged_job(project, cluster, start=end - timedelta(hours=1), end=end)
    Job.objects.filter(pk=job.pk).update(**{"name": name, "exit_code": 0, **fields})
    job.refresh_from_db()
    return job


def _waiting_step(project: Project, cluster: Cluster, name: str, state_reason: str) -> Job:
    """A step still pending in Slurm (it never started, so nothing was charged)."""
    return Job.objects.create(
        project=project,
        cluster=cluster,
        cluster_username="alice",
        name=name,
        partition="gpu",
        gpus=1,
        time_limit_minutes=10,
        state="pending",
        state_reason=state_reason,
        slurm_job_id=99000 + len(name),
    )


def test_a_pipelines_watchers_are_told_once_when_every_step_ended_or_never_will_run(
    cluster: Cluster, project: Project, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("2.50"),
        currency="EUR",
        valid_from=timezone.now() - timedelta(days=1),
    )
    member, viewer = _user(project, "member", "bob@example.org"), _user(project, "viewer", "vic@example.org")
    prepare = _step(project, cluster, "prepare")
    train = _step(project, cluster, "train", state="running", exit_code=None)
    evaluate = _waiting_step(project, cluster, "evaluate", "Dependency")
    report = _waiting_step(project, cluster, "report", "Dependency")
    JobDependency.objects.bulk_create(
        [
            JobDependency(child=train, parent=prepare, condition="afterok"),
            JobDependency(child=evaluate, parent=train, condition="afterok"),
            JobDependency(child=report, parent=evaluate, condition="afterany"),
        ]
    )
    # Asked from three steps, by two users: each is told once.
    assert _api(member).post(f"/api/v1/jobs/{report.pk}/pipeline/watch/").json() == {"watching": True}
    assert _api(member).post(f"/api/v1/jobs/{train.pk}/pipeline/watch/").json() == {"watching": True}
    assert PipelineEndWatch.objects.filter(user=member).count() == 1  # already watching it, from "report"
    assert _api(viewer).post(f"/api/v1/jobs/{prepare.pk}/pipeline/watch/").json() == {"watching": True}
    PipelineEndWatch.objects.create(job=evaluate, user=member)  # as if asked before "report" joined it
    assert pipeline_end_notices_send() == 0  # "train" runs
    # It fails: Slurm keeps "evaluate" pending, marked as never satisfiable; "report" waits for "evaluate", so
    # it never runs either.
    Job.objects.filter(pk=train.pk).update(state="failed", exit_code=1)
    Job.objects.filter(pk=evaluate.pk).update(state_reason="DependencyNeverSatisfied")

    assert pipeline_end_notices_send() == 0  # both ran and are charged, not priced yet
    usage_import()
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline_end_notices_send() == 2

    title = "Pipeline of “prepare” ended: 1 completed, 1 failed, 2 will never run"
    body = (
        "Your pipeline of 4 jobs in acme/vision on cluster notecluster ended: “prepare” completed with exit code 0 "
        "(1.00 GPU-hours, 2.50 EUR); “train” failed with exit code 1 (1.00 GPU-hours, 2.50 EUR); “evaluate” will "
        f"never run: job “train” ({train.pk}) ended failed, and this job was to run only after it succeeds; "
        "“report” will never run: it waits for “evaluate”, which will never run. In all it used 2.00 GPU-hours, "
        "which cost 5.00 EUR. Cancel the jobs that will never run to give their reserved GPU-hours back to the "
        "project."
    )
    notices = sorted(
        (notice.user.email, notice.kind, notice.title, notice.body) for notice in Notification.objects.all()
    )
    assert notices == [
        ("bob@example.org", "pipeline.ended", title, body),
        ("vic@example.org", "pipeline.ended", title, body),
    ]
    assert sorted(message.to[0] for message in mail.outbox) == ["bob@example.org", "vic@example.org"]
    assert not PipelineEndWatch.objects.filter(notified_at__isnull=True).exists()
    assert pipeline_end_notices_send() == 0  # told once
    ended = _api(member).post(f"/api/v1/jobs/{train.pk}/pipeline/watch/")
    assert ended.status_code == 409
    assert ended.json()["message"] == (
        "Every job of this pipeline has already ended or will never run; their pages say how."
    )


def test_a_pipeline_with_a_step_still_to_run_is_not_over_and_the_page_offers_to_watch_it(
    cluster: Cluster, project: Project
) -> None:
    member = _user(project, "member")
    prepare = _step(project, cluster, "prepare")  # no price set: told with its GPU-hours
    train = _waiting_step(project, cluster, "train", "Dependency")
    JobDependency.objects.create(child=train, parent=prepare, condition="afterany")
    client = Client()
    client.force_login(member)
    page = client.get(f"/jobs/{prepare.pk}/").content.decode()
    assert "Tell me when this pipeline ends" in page
    assert client.post(f"/jobs/{prepare.pk}/watch/", {"watch": "1", "scope": "pipeline"}).status_code == 302
    page = client.get(f"/jobs/{train.pk}/").content.decode()
    assert "You will be told when its pipeline ends, with each job's outcome and the total cost." in page

    assert pipeline_end_notices_send() == 0  # "train" may still run
    Job.objects.filter(pk=train.pk).update(state="cancelled", state_reason="")
    assert pipeline_end_notices_send() == 1
    notice = Notification.objects.get(user=member)
    assert notice.title == "Pipeline of “prepare” ended: 1 completed, 1 cancelled"
    assert notice.body == (
        "Your pipeline of 2 jobs in acme/vision on cluster notecluster ended: “prepare” completed with exit code 0 "
        "(1.00 GPU-hours, no price set); “train” cancelled (never ran, nothing to pay). In all it used 1.00 "
        "GPU-hours (1 of its jobs ran where no price is set)."
    )
    assert notice.link == f"/jobs/{prepare.pk}/"
    # Stopping, from any step, stops it.
    PipelineEndWatch.objects.update(notified_at=None)
    assert _api(member).delete(f"/api/v1/jobs/{train.pk}/pipeline/watch/").json() == {"watching": False}
    assert PipelineEndWatch.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_pipeline_whose_watch_another_sender_holds_is_left_to_it(cluster: Cluster, project: Project) -> None:
    """Two senders at once: the one that cannot lock every waiting watch of a pipeline leaves it alone, so a
    user asked from two steps is still told once."""
    member = _user(project, "member")
    prepare, train = _step(project, cluster, "prepare"), _step(project, cluster, "train")
    JobDependency.objects.create(child=train, parent=prepare, condition="afterok")
    first = PipelineEndWatch.objects.create(job=prepare, user=member)
    PipelineEndWatch.objects.create(job=train, user=member)
    locked, release = threading.Event(), threading.Event()

    def other_sender() -> None:
        try:
            with transaction.atomic():
                PipelineEndWatch.objects.select_for_update(of=("self",)).filter(pk=first.pk).get()
                locked.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=other_sender)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        assert pipeline_end_notices_send() == 0
    finally:
        release.set()
        holder.join()
    assert pipeline_end_notices_send() == 1
    assert Notification.objects.filter(user=member, kind="pipeline.ended").count() == 1
