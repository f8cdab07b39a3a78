"""Old job transitions move to the archive in batches, exactly once, and stay readable: in a job's timeline (page and
API) and in its tenant's export, which only the tenant's admins and portal admins may read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs import tasks
from jobs.history_archive import archive_cutoff, job_transitions_archive
from jobs.models import Job, JobState, JobTransition, JobTransitionArchive
from tenants.models import Project
from tests.factories import (
    add_project_member,
    add_tenant_member,
    make_job,
    make_project,
    make_tenant,
    make_user,
)
from tests.tenants.test_api import assert_error, logged_in

pytestmark = pytest.mark.django_db

NOW = timezone.now()
OLD = NOW - timedelta(days=400)
CUTOFF = NOW - timedelta(days=180)
STEPS = [("", JobState.QUEUED), (JobState.QUEUED, JobState.PENDING), (JobState.PENDING, JobState.RUNNING)]


def _timeline(job: Job, *, start: datetime) -> list[int]:
    """Four transitions an hour apart from `start`, the last one `completed`; their ids."""
    steps = [*STEPS, (JobState.RUNNING, JobState.COMPLETED)]
    made = [
        JobTransition.objects.create(
            job=job, from_state=before, to_state=after, at=start + timedelta(hours=hour), detail=f"step {hour}"
        )
        for hour, (before, after) in enumerate(steps)
    ]
    return [transition.pk for transition in made]


def _finished_jobs(count: int, *, projects: tuple[Project, ...] = ()) -> list[Job]:
    """`count` finished jobs of one user: in one new project, or one in each of `projects`."""
    first = make_job(state=JobState.COMPLETED)
    jobs = [first]
    for _index in range(1, count):
        jobs.append(
            Job.objects.create(
                project=first.project,
                cluster=first.cluster,
                user=first.user,
                cluster_username="alice",
                name="job",
                partition="gpu",
                gpus=1,
                time_limit_minutes=5,
                state=JobState.COMPLETED,
            )
        )
    for job, project in zip(jobs, projects, strict=False):
        Job.objects.filter(pk=job.pk).update(project=project, name=f"train-{project.slug}")
        job.refresh_from_db()
    return jobs


def _hot() -> list[int]:
    return list(JobTransition.objects.order_by("id").values_list("id", flat=True))


def _archived() -> list[int]:
    return list(JobTransitionArchive.objects.order_by("id").values_list("id", flat=True))


def _rows(model: type[JobTransition] | type[JobTransitionArchive], ids: list[int]) -> list[tuple[Any, ...]]:
    columns = ("id", "job_id", "from_state", "to_state", "at", "detail")
    return list(model.objects.filter(id__in=ids).order_by("id").values_list(*columns))


def test_only_the_transitions_before_the_cutoff_move_in_batches_with_their_ids_and_fields() -> None:
    old_job, new_job = _finished_jobs(2)
    old_ids = _timeline(old_job, start=OLD)
    # Straddling the cutoff: two transitions before it, two after.
    straddling = _timeline(new_job, start=CUTOFF - timedelta(hours=2) + timedelta(minutes=30))
    before = _rows(JobTransition, old_ids + straddling[:2])

    run = job_transitions_archive(before=CUTOFF, batch_size=4)

    assert (run.moved, run.batches, run.before) == (6, 2, CUTOFF)
    assert _archived() == old_ids + straddling[:2]
    assert _hot() == straddling[2:]
    assert _rows(JobTransitionArchive, old_ids + straddling[:2]) == before


def test_a_second_run_moves_nothing() -> None:
    (job,) = _finished_jobs(1)
    ids = _timeline(job, start=OLD)
    job_transitions_archive(before=CUTOFF, batch_size=3)

    again = job_transitions_archive(before=CUTOFF, batch_size=3)

    assert (again.moved, again.batches) == (0, 0)
    assert (_archived(), _hot()) == (ids, [])


def test_a_run_stopped_between_batches_loses_and_duplicates_nothing_and_the_next_run_finishes() -> None:
    jobs = _finished_jobs(3)
    ids = sorted(id_ for job in jobs for id_ in _timeline(job, start=OLD))
    everything = _rows(JobTransition, ids)

    stopped = job_transitions_archive(before=CUTOFF, batch_size=5, max_batches=1)

    assert (stopped.moved, stopped.batches) == (5, 1)
    assert len(_archived()) == 5
    assert len(_hot()) == 7
    assert sorted(_archived() + _hot()) == ids  # each transition in exactly one table
    finished = job_transitions_archive(before=CUTOFF, batch_size=5)
    assert (finished.moved, finished.batches) == (7, 2)
    assert (_archived(), _hot()) == (ids, [])
    assert _rows(JobTransitionArchive, ids) == everything


def test_the_cutoff_is_calendar_months_back() -> None:
    assert archive_cutoff(now=datetime(2026, 8, 31, 9, 30, tzinfo=UTC), months=6) == datetime(
        2026, 2, 28, 9, 30, tzinfo=UTC
    )
    assert archive_cutoff(now=datetime(2026, 1, 15, tzinfo=UTC), months=13) == datetime(2024, 12, 15, tzinfo=UTC)


def test_beat_task_archives_after_the_setting_and_does_nothing_when_it_is_zero(settings: Any) -> None:
    (job,) = _finished_jobs(1)
    old_ids = _timeline(job, start=OLD)
    recent_ids = _timeline(job, start=NOW - timedelta(days=20))
    settings.HISTORY_ARCHIVE_AFTER_MONTHS = 0
    tasks.job_history_archive()
    assert _archived() == []

    settings.HISTORY_ARCHIVE_AFTER_MONTHS = 6
    tasks.job_history_archive()

    assert (_archived(), _hot()) == (old_ids, recent_ids)


def test_the_command_archives_and_says_how_long_the_longest_batch_held_its_locks() -> None:
    (job,) = _finished_jobs(1)
    ids = _timeline(job, start=OLD)
    written = StringIO()
    call_command("job_history_archive", "--months", "6", "--batch-size", "3", stdout=written)

    assert _archived() == ids
    assert written.getvalue().startswith("Moved 4 transitions recorded before ")
    assert " to the archive in 2 batches, " in written.getvalue()


# Reading archived history -------------------------------------------------------------------------------


def test_a_jobs_timeline_in_the_api_and_its_page_shows_archived_transitions_in_order() -> None:
    (job,) = _finished_jobs(1)
    _timeline(job, start=CUTOFF - timedelta(hours=2) + timedelta(minutes=30))
    job_transitions_archive(before=CUTOFF)
    assert (len(_archived()), len(_hot())) == (2, 2)
    client = logged_in(job.user)

    answer = client.get(f"/api/v1/jobs/{job.pk}/")

    assert answer.status_code == 200, answer.content
    timeline = [(step["from_state"], step["to_state"], step["detail"]) for step in answer.json()["transitions"]]
    assert timeline == [
        ("", "queued", "step 0"),
        ("queued", "pending", "step 1"),
        ("pending", "running", "step 2"),
        ("running", "completed", "step 3"),
    ]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert page.index("step 0") < page.index("step 1") < page.index("step 2") < page.index("step 3")


def _export(client: Client, tenant: str, query: str = "") -> Any:
    return client.get(f"/api/v1/tenants/{tenant}/archived-transitions/{query}")


def _lines(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response
    assert response["Content-Type"] == "application/x-ndjson"
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


def _export_world() -> dict[str, Any]:
    admin, other_admin = make_user("histadmin"), make_user("otheradmin")
    tenant = make_tenant("histco", admin=admin)
    vision, audio = make_project(tenant, "vision"), make_project(tenant, "audio")
    other_project = make_project(make_tenant("otherco", admin=other_admin), "secret")
    projects = (vision, audio, other_project)
    jobs = {job.project.slug: job for job in _finished_jobs(3, projects=projects)}
    for hour, slug in enumerate(("vision", "audio", "secret")):
        _timeline(jobs[slug], start=OLD + timedelta(days=hour))
        _timeline(jobs[slug], start=NOW - timedelta(days=1, hours=hour))  # recent: stays hot, not exported
    job_transitions_archive(before=CUTOFF)
    return {"admin": admin, "other_admin": other_admin, "tenant": tenant, "jobs": jobs}


def test_the_tenant_admin_exports_exactly_the_tenants_archived_transitions_oldest_first() -> None:
    world = _export_world()
    client = logged_in(world["admin"])

    lines = _lines(_export(client, "histco"))

    vision, audio = world["jobs"]["vision"], world["jobs"]["audio"]
    expected = [
        (str(job.pk), f"histco/{job.project.slug}", job.name, job.user.username, to_state)
        for job in (vision, audio)
        for to_state in ("queued", "pending", "running", "completed")
    ]
    assert [(line["job"], line["project"], line["job_name"], line["user"], line["to_state"]) for line in lines] == (
        expected
    )
    first = JobTransitionArchive.objects.get(pk=lines[0]["id"])
    assert lines[0] == {
        "id": first.pk,
        "job": str(vision.pk),
        "project": "histco/vision",
        "job_name": "train-vision",
        "user": vision.user.username,
        "from_state": "",
        "to_state": "queued",
        "at": OLD.isoformat(),
        "detail": "step 0",
    }
    audio_only = _lines(_export(client, "histco", "?project=audio"))
    assert [line["job"] for line in audio_only] == [str(audio.pk)] * 4


def test_the_export_pages_through_more_than_one_page(monkeypatch: pytest.MonkeyPatch) -> None:
    world = _export_world()
    monkeypatch.setattr("jobs.history_archive.EXPORT_PAGE_SIZE", 3)

    lines = _lines(_export(logged_in(world["admin"]), "histco"))

    ids = list(
        JobTransitionArchive.objects.filter(job__project__tenant=world["tenant"])
        .order_by("at", "id")
        .values_list("id", flat=True)
    )
    assert [line["id"] for line in lines] == ids
    assert len(ids) == 8


def test_the_export_refuses_the_other_tenants_admin_its_members_and_unknown_parameters() -> None:
    world = _export_world()
    member, tenant_member = make_user("histmember"), make_user("histtenantmember")
    add_project_member(world["jobs"]["vision"].project, member)
    add_tenant_member(world["tenant"], tenant_member)

    assert_error(_export(logged_in(world["other_admin"]), "histco"), 404)
    assert_error(_export(logged_in(world["other_admin"]), "nosuchtenant"), 404)
    assert_error(_export(logged_in(member), "histco"), 403)
    assert_error(_export(logged_in(tenant_member), "histco"), 403)
    assert_error(_export(Client(), "histco"), 401)
    assert_error(_export(logged_in(world["admin"]), "histco", "?since=2020-01-01"), 400, "since", "no field 'since'")
    assert_error(_export(logged_in(world["admin"]), "histco", "?project=secret"), 404)
    # The other tenant's admin reads their own archive, which holds nothing of histco's.
    theirs = _lines(_export(logged_in(world["other_admin"]), "otherco"))
    assert {line["project"] for line in theirs} == {"otherco/secret"}
    assert len(theirs) == 4


def test_a_portal_admin_exports_any_tenant() -> None:
    _export_world()
    lines = _lines(_export(logged_in(make_user("portaladmin", is_staff=True)), "histco"))
    assert len(lines) == 8
    assert {line["project"] for line in lines} == {"histco/vision", "histco/audio"}


@pytest.mark.django_db(transaction=True)
def test_a_transition_another_transaction_holds_is_skipped_without_waiting_and_moved_by_the_next_run() -> None:
    (job,) = _finished_jobs(1)
    ids = _timeline(job, start=OLD)
    database = connection.settings_dict
    with psycopg.connect(
        dbname=database["NAME"], host=database["HOST"], port=database["PORT"], user=database["USER"]
    ) as other:
        other.execute("SELECT 1 FROM jobs_jobtransition WHERE id = %s FOR UPDATE", (ids[1],))  # held, uncommitted

        with connection.cursor() as cursor:  # without SKIP LOCKED the run would wait: make it fail instead
            cursor.execute("SET lock_timeout = '10s'")
        held = job_transitions_archive(before=CUTOFF, batch_size=10)

        assert (held.moved, _hot()) == (3, [ids[1]])
        other.rollback()
    finished = job_transitions_archive(before=CUTOFF, batch_size=10)
    assert (finished.moved, _archived(), _hot()) == (1, ids, [])
