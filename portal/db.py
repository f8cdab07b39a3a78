"""Prepared statements for the few hand-written queries that every submission runs.

Django binds parameters on the client (psycopg's `ClientCursor`): PostgreSQL parses and plans every query anew,
and psycopg quotes each value into the query's text. For the statements of the hot path (the API token, the
submission's project and cluster, the quota reservation, and through `insert_prepared` the job's, its first
transition's and every audit event's insert) `prepared_cursor` binds on the server, and psycopg
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
    `auto_now_add`, JSON); an auto primary key is always the database's, read back. No signals are sent: these
    models have no receivers.

    A nullable column whose value is None is left out (it is NULL without being sent): a new job leaves most of
    its columns empty, and a statement of fewer than 50 parameters is one whose parsing psycopg caches."""
    model = type(instance)
    fields, returning = _insert_fields(model)
    row = [(field, field.get_db_prep_save(field.pre_save(instance, True), connection)) for field in fields]
    row = [(field, value) for field, value in row if value is not None or not field.null]
    sql = _insert_statement(model, tuple(str(field.column) for field, _ in row))
    with prepared_cursor() as cursor:
        cursor.execute(sql, [value for _, value in row])
        if returning is not None:
            setattr(instance, returning.attname, cursor.fetchone()[0])
    instance._state.adding, instance._state.db = False, connection.alias


@functools.cache
def _insert_fields(model: type[Model]) -> tuple[list[Field[Any, Any]], Field[Any, Any] | None]:
    """The fields an insert of `model` may write, and the one it reads back (an auto primary key)."""
    meta = model._meta
    assert not any(field.has_db_default() for field in meta.local_concrete_fields), f"{model}: db_default unsupported"
    returning = meta.auto_field
    return [field for field in meta.local_concrete_fields if field is not returning], returning


@functools.lru_cache(maxsize=256)
def _insert_statement(model: type[Model], columns: tuple[str, ...]) -> str:
    meta, quote = model._meta, connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(column) for column in columns)}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    if meta.auto_field is not None:
        sql += f" RETURNING {quote(str(meta.auto_field.column))}"
    return sql
