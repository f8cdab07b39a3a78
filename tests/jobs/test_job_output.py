"""JobOutput renders a job as DRF's own field-by-field rendering does (jobs/job_apis.py reads the fields directly
for the job list's speed): every field, for jobs of every kind, and the list API answers with it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.test import APIClient

from jobs.job_apis import JOB_OUTPUT_COLUMNS, JobDetailOutput, JobOutput
from jobs.models import Job, JobEfficiency, JobState
from tenants.services import token_create
from tests.factories import make_job

pytestmark = pytest.mark.django_db

MOMENT = datetime(2026, 7, 1, 13, 5, 7, 123456, tzinfo=UTC)


def _drf(job: Job) -> dict[str, Any]:
    # DRF's generic rendering: each declared field looked up, checked for None and converted.
    return dict(serializers.Serializer.to_representation(JobOutput(), job))


def _jobs() -> list[Job]:
    plain = make_job(name="plain")

    def another(**fields: Any) -> Job:
        defaults = {"partition": "gpu", "gpus": 1, "time_limit_minutes": 5, "state": JobState.PENDING}
        people = {"user": plain.user, "cluster_username": "alice"}
        return Job.objects.create(project=plain.project, cluster=plain.cluster, **{**defaults, **people, **fields})

    running = another(
        name="running idle",
        state=JobState.RUNNING,
        slurm_job_id=41,
        slurm_state="RUNNING",
        nodes="gpu[01-02]",
        switches=["leaf1", "leaf2"],
        node_count=2,
        gpus=4,
        gpu_type="h100",
        max_switches=1,
        switch_wait_minutes=10,
        cpus=8,
        memory_gb=64,
        submitted_at=MOMENT,
        started_at=MOMENT + timedelta(seconds=3),
    )
    JobEfficiency.objects.create(job=running, source="dcgm", idle_gpus=1, flagged_at=MOMENT)
    pending = another(name="waits", state_reason="Priority", expected_start_at=MOMENT, submit_attempts=2)
    array = another(
        name="sweep",
        array="0-9%2",
        array_task_count=10,
        array_max_running=2,
        array_progress={"running": 2, "completed": 3},
    )
    ended = another(
        name="done",
        state=JobState.FAILED,
        exit_code=3,
        last_error="",
        ended_at=MOMENT + timedelta(hours=1),
        cancel_requested_at=MOMENT,
        rerun_of=plain,
    )
    external = another(name="outside", is_external=True, user=None, cluster_username="carol")
    return [plain, running, pending, array, ended, external]


def test_every_field_of_every_kind_of_job_renders_as_drf_renders_it() -> None:
    for job in Job.objects.select_related("project__tenant", "cluster", "user", "efficiency").filter(
        pk__in=[job.pk for job in _jobs()]
    ):
        assert JobOutput(job).data == _drf(job), job.name
        assert list(JobOutput(job).data) == list(JobOutput().fields), "the fields in the declared order"


def test_the_generic_rendering_sees_what_matters() -> None:
    # The comparison above would hold trivially if both sides dropped the same fields: they must differ here.
    running = _jobs()[1]
    data = JobOutput(running).data
    assert data["gpu_idle"] is True
    assert data["switches"] == ["leaf1", "leaf2"]
    assert data["started_at"] == "2026-07-01T13:05:10.123456Z"
    assert data["links"]["self"] == f"/api/v1/jobs/{running.pk}/"


def test_a_subclass_renders_its_own_fields_too() -> None:
    job = _jobs()[0]
    data = JobDetailOutput(job).data
    assert data["script"] == job.script
    assert data["transitions"] == []


def test_the_job_list_answers_with_that_rendering() -> None:
    jobs = _jobs()
    user = jobs[0].user
    assert user is not None
    _, token = token_create(user=user, name=f"t{uuid.uuid4().hex[:6]}")
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {token}")

    listed = api.get("/api/v1/jobs/").json()["results"]

    stored = Job.objects.select_related("project__tenant", "cluster", "user", "efficiency").order_by(
        "-created_at", "-id"
    )
    assert len(listed) == len(jobs)
    assert listed == [_drf(job) for job in stored]


def test_the_columns_a_list_reads_are_all_the_rendering_needs(django_assert_num_queries: Any) -> None:
    """The list API reads `JOB_OUTPUT_COLUMNS` only: rendering each kind of job from those must not load a
    deferred column (a query per row), and must render as the fully read job does."""
    ids = [job.pk for job in _jobs()]
    full = Job.objects.select_related("project__tenant", "cluster", "user", "efficiency").filter(pk__in=ids)
    narrow = list(full.only(*JOB_OUTPUT_COLUMNS).order_by("pk"))

    with django_assert_num_queries(0):
        rendered = [JobOutput(job).data for job in narrow]

    assert rendered == [_drf(job) for job in full.order_by("pk")]
    assert narrow[0].get_deferred_fields() >= {"script", "environment"}, "the script is not read for a list"
