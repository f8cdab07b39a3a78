"""Prepared statements for the few hand-written queries that every submission runs.

Django binds parameters on the client (psycopg's `ClientCursor`): PostgreSQL parses and plans every query anew,
and psycopg quotes each value into the query's text. For the statements of the hot path (the API token, the
submission's project and cluster, the quota reservation) `prepared_cursor` binds on the server, and psycopg
prepares each statement at its first run on a connection (`prepare_threshold` 0, set by `portal.env.
database_from_url`; at most `prepared_max`, 100, kept per connection): PostgreSQL plans it once, and psycopg
sends only the values. Measured on `POST /api/v1/jobs/` (bench/job_submission.py, README "How fast, measured").

The cursor is Django's own wrapper (its query log, `connection.execute_wrapper` and `CaptureQueriesContext` see
these statements as any other) on the connection Django manages, inside whatever transaction is open. A
prepared statement outlives a migration: PostgreSQL plans it again when a table it reads changes, but refuses
one whose result columns change, so these statements name their columns (no `*`).

`DATABASE_PREPARED_STATEMENTS=false` still binds on the server but prepares nothing: for a pooler that cannot
follow prepared statements (PgBouncer in transaction mode before 1.21, or without `max_prepared_statements`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.db.models import Field, Model


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """A cursor for a statement run on every request of a hot path: bound on the server and prepared once per
    connection. Placeholders are psycopg's, `%s` or `%(name)s`; a parameter's type must follow from where it
    stands (`= %s` does; a bare `%s` in a select list needs a cast)."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        # Django's own wrapping of a cursor it creates: the query log, execute_wrapper, the thread check.
        cursor = connection._prepare_cursor(psycopg.Cursor(connection.connection))  # type: ignore[attr-defined]
    with cursor:
        yield cursor


def insert_prepared(instance: Model) -> None:
    """`instance.save(force_insert=True)` as a prepared statement (`prepared_cursor`): for the rows every
    submission writes. The row's values are prepared for the database by its fields as `save` does (defaults,
    `auto_now_add`, JSON); a primary key the database assigns is read back. No signals are sent: these models
    have no receivers."""
    model = type(instance)
    fields, returning, sql = _insert_statement(model)
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    with prepared_cursor() as cursor:
        cursor.execute(sql, values)
        if returning is not None:
            setattr(instance, returning.attname, cursor.fetchone()[0])
    instance._state.adding, instance._state.db = False, connection.alias


@functools.cache
def _insert_statement(model: type[Model]) -> tuple[list[Field[Any, Any]], Field[Any, Any] | None, str]:
    """The fields an insert of `model` writes, the one it reads back (an auto primary key), and its SQL."""
    meta = model._meta
    assert not any(field.has_db_default() for field in meta.local_concrete_fields), f"{model}: db_default unsupported"
    returning = meta.auto_field
    fields = [field for field in meta.local_concrete_fields if field is not returning]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(str(field.column)) for field in fields)}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if returning is not None:
        sql += f" RETURNING {quote(str(returning.column))}"
    return fields, returning, sql
