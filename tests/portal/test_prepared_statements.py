"""The hot path's prepared statements (portal/db.py): prepared once per connection, seen by Django's query log,
written and read exactly as the ORM would write and read them, and off with DATABASE_PREPARED_STATEMENTS=false."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Job, JobState
from portal.db import RelatedRows, insert_prepared, prepared_cursor, update_prepared
from portal.env import database_from_url
from tenants.models import AuditEvent
from tests.factories import make_job, make_tenant, make_user

pytestmark = pytest.mark.django_db

STATEMENT = "SELECT slug FROM tenants_tenant WHERE id = %s"


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def run(statement: str, *parameters: int) -> object:
    with prepared_cursor() as cursor:
        cursor.execute(statement, list(parameters))
        row = cursor.fetchone()
    return row[0] if row else None


@pytest.fixture
def no_prepared_statements() -> Iterator[None]:
    """The test's connection as with DATABASE_PREPARED_STATEMENTS=false."""
    connection.ensure_connection()
    raw = connection.connection
    threshold = raw.prepare_threshold
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    raw._prepared.clear()  # psycopg's own record of them, emptied as DEALLOCATE ALL does
    raw.prepare_threshold = None
    yield
    raw.prepare_threshold = threshold


def test_a_statement_is_prepared_once_and_the_orm_s_are_not() -> None:
    first, second = make_tenant("first"), make_tenant("second")

    with CaptureQueriesContext(connection) as queries:
        answers = [run(STATEMENT, first.pk), run(STATEMENT, second.pk), run(STATEMENT, first.pk)]
    list(AuditEvent.objects.filter(action="anything"))

    assert answers == ["first", "second", "first"]
    assert len(queries) == 3  # the query log, and so the tests' query bounds, see every run
    assert queries.captured_queries[1]["sql"] == f"SELECT slug FROM tenants_tenant WHERE id = {second.pk}"
    statements = prepared_statements()
    assert statements.count(STATEMENT.replace("%s", "$1")) == 1
    assert not [statement for statement in statements if statement.startswith('SELECT "tenants_auditevent"')]


def test_insert_prepared_writes_the_row_save_would() -> None:
    user, tenant = make_user(), make_tenant()
    event = AuditEvent(
        actor=user,
        actor_username=user.username,
        tenant=tenant,
        action="job.submit",
        target_type="Job",
        target_id="42",
        target_label="a job",
        before=None,
        after={"gpus": 2, "nodes": ["gpu01"]},
    )

    insert_prepared(event)
    insert_prepared(event.__class__(**{**_values(event), "id": None, "target_id": "43"}))

    assert event.pk is not None
    assert not event._state.adding
    stored = AuditEvent.objects.get(pk=event.pk)
    assert _values(stored) == _values(event)
    assert stored.after == {"gpus": 2, "nodes": ["gpu01"]}
    assert stored.before is None
    assert AuditEvent.objects.filter(target_id="43").get().pk > event.pk


def test_related_rows_read_what_select_related_reads() -> None:
    job = make_job(
        environment={"SEED": "7"}, array_progress={"running": 2}, switches=["s1"], state=JobState.QUEUED, array="0-3"
    )
    orphan = _another(job)
    Job.objects.filter(pk=orphan.pk).update(user=None)
    rows = RelatedRows(Job, "project__tenant", "cluster", "user", alias="job")

    found = rows.fetch(f"{rows.select} WHERE job.id = ANY(%s) ORDER BY job.created_at", [[job.pk, orphan.pk]])

    expected = list(Job.objects.select_related("project__tenant", "cluster", "user").filter(pk__in=[job.pk, orphan.pk]))
    assert [each.pk for each in found] == [job.pk, orphan.pk]
    for read, ormed in zip(found, sorted(expected, key=lambda each: each.created_at), strict=True):
        assert _row(read) == _row(ormed)
        assert _row(read.project) == _row(ormed.project)
        assert _row(read.project.tenant) == _row(ormed.project.tenant)
        assert _row(read.cluster) == _row(ormed.cluster)
        assert (read.user and _row(read.user)) == (ormed.user and _row(ormed.user))
    assert found[0].environment == {"SEED": "7"}
    assert found[0].switches == ["s1"]
    assert found[1].user is None
    with CaptureQueriesContext(connection) as queries:
        assert found[0].project.tenant.slug == job.project.tenant.slug  # no query: read with the job
    assert len(queries) == 0


def test_related_rows_read_only_some_fields_and_defer_the_rest() -> None:
    job = make_job(name="glanced", state=JobState.QUEUED)
    rows = RelatedRows(Job, "project", alias="job", only=("state", "cluster", "project", "project__slug"))

    [glance] = rows.fetch(f"{rows.select} WHERE job.id = %s", [job.pk])

    assert rows.select.startswith('SELECT job."id", job."project_id", job."cluster_id", job."state", job_1."id", ')
    assert (glance.pk, glance.state, glance.cluster_id) == (job.pk, JobState.QUEUED, job.cluster_id)
    assert glance.get_deferred_fields() >= {"name", "script", "environment"}
    assert glance.project.slug == job.project.slug
    assert glance.project.get_deferred_fields() >= {"name", "tenant_id"}
    assert glance.name == "glanced"  # a deferred field is read on first use, as after .only()


def test_update_prepared_writes_what_save_would() -> None:
    job = make_job(state=JobState.QUEUED)
    other = _another(job)
    job.state, job.slurm_job_id, job.last_error, job.array_progress = JobState.PENDING, 41, "", {"pending": 4}
    job.name = "not written"

    update_prepared(job, fields=["state", "slurm_job_id", "last_error", "array_progress"])

    stored = Job.objects.get(pk=job.pk)
    assert (stored.state, stored.slurm_job_id, stored.array_progress) == (JobState.PENDING, 41, {"pending": 4})
    assert stored.name != "not written"
    assert Job.objects.get(pk=other.pk).state == JobState.QUEUED


def _another(job: Job) -> Job:
    """Another queued job of the same project, cluster and user."""
    fields = ("project", "cluster", "user", "cluster_username", "partition", "gpus", "time_limit_minutes")
    return Job.objects.create(name="another", state=JobState.QUEUED, **{name: getattr(job, name) for name in fields})


def _row(instance: object) -> dict[str, object]:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}  # type: ignore[attr-defined]


def _values(event: AuditEvent) -> dict[str, object]:
    return {field.attname: getattr(event, field.attname) for field in AuditEvent._meta.concrete_fields}


def test_prepared_statements_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, no_prepared_statements: None) -> None:
    tenant = make_tenant("plain")

    assert run(STATEMENT, tenant.pk) == "plain"
    assert prepared_statements() == []
    assert database_from_url("postgres://portal@db/portal")["OPTIONS"] == {"prepare_threshold": 0}
    monkeypatch.setenv("DATABASE_PREPARED_STATEMENTS", "false")
    assert database_from_url("postgres://portal@db/portal")["OPTIONS"] == {"prepare_threshold": None}
