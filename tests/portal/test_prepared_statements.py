"""The hot path's prepared statements (portal/db.py): prepared once per connection, seen by Django's query log,
written exactly as the ORM would write them, and off with DATABASE_PREPARED_STATEMENTS=false."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.db import insert_prepared, prepared_cursor
from portal.env import database_from_url
from tenants.models import AuditEvent
from tests.factories import make_tenant, make_user

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


def _values(event: AuditEvent) -> dict[str, object]:
    return {field.attname: getattr(event, field.attname) for field in AuditEvent._meta.concrete_fields}


def test_prepared_statements_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, no_prepared_statements: None) -> None:
    tenant = make_tenant("plain")

    assert run(STATEMENT, tenant.pk) == "plain"
    assert prepared_statements() == []
    assert database_from_url("postgres://portal@db/portal")["OPTIONS"] == {"prepare_threshold": 0}
    monkeypatch.setenv("DATABASE_PREPARED_STATEMENTS", "false")
    assert database_from_url("postgres://portal@db/portal")["OPTIONS"] == {"prepare_threshold": None}
