"""Prepared statements for the few hand-written queries of the hot paths.

Django binds parameters on the client (psycopg's `ClientCursor`): PostgreSQL parses and plans every query anew,
and psycopg quotes each value into the query's text. For the statements of the hot paths (a submission's API
token, project and cluster, quota reservation, and through `insert_prepared` its job's, first transition's and
audit event's inserts; a worker's claim, lease and record of a delivery batch, through `RelatedRows` and
`update_prepared`; the project access check of a job's API, page and streams) `prepared_cursor` binds on the
server, and psycopg
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Field, ForeignKey, Model


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """A cursor for a statement run on every request of a hot path: bound on the server and prepared once per
    connection. Placeholders are psycopg's, `%s` or `%(name)s`; a parameter's type must follow from where it
    stands (`= %s` does; a bare `%s` in a select list needs a cast)."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        # Django's own wrapping of a cursor it creates: the query log, execute_wrapper, the thread check.
        raw = psycopg.Cursor(connection.connection)
        connection.validate_thread_sharing()
        wrapper = _ServerBoundDebugWrapper if connection.queries_logged else CursorWrapper  # as make_cursor does
        cursor = wrapper(raw, connection)
    with cursor:
        yield cursor


class _ServerBoundDebugWrapper(CursorDebugWrapper):
    """Django's debug cursor (DEBUG, `CaptureQueriesContext`) logging a server-bound statement with its values:
    Django reads the text of what ran from psycopg, which keeps none for a server-bound statement."""

    @contextmanager
    def debug_sql(
        self, sql: Any = None, params: Any = None, use_last_executed_query: bool = False, many: bool = False
    ) -> Iterator[None]:
        if use_last_executed_query and not many:
            sql = connection.ops.compose_sql(sql, params)  # type: ignore[attr-defined]
        with super().debug_sql(sql, params, use_last_executed_query=False, many=many):
            yield


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


def update_prepared(instance: Model, *, fields: list[str]) -> None:
    """`instance.save(update_fields=fields)` as a prepared statement (`prepared_cursor`), for a row that exists:
    the values prepared by the fields as `save` prepares them (`auto_now` included). No signals are sent."""
    chosen = _update_fields(type(instance), tuple(fields))
    values = [field.get_db_prep_save(field.pre_save(instance, False), connection) for field in chosen]
    with prepared_cursor() as cursor:
        cursor.execute(_update_statement(type(instance), tuple(fields)), [*values, instance.pk])


@functools.lru_cache(maxsize=256)
def _update_fields(model: type[Model], names: tuple[str, ...]) -> list[Field[Any, Any]]:
    fields = [model._meta.get_field(name) for name in names]
    assert all(isinstance(field, Field) and field.concrete for field in fields), f"{model}: {names} not all columns"
    return fields  # type: ignore[return-value]


@functools.lru_cache(maxsize=256)
def _update_statement(model: type[Model], names: tuple[str, ...]) -> str:
    meta, quote = model._meta, connection.ops.quote_name
    columns = ", ".join(f"{quote(str(field.column))} = %s" for field in _update_fields(model, names))
    return f"UPDATE {quote(meta.db_table)} SET {columns} WHERE {quote(str(meta.pk.column))} = %s"  # noqa: S608


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


class RelatedRows:
    """A model read with the models it refers to, as `select_related` reads them, by a hand-written statement run
    through `prepared_cursor`: for the hot paths whose ORM query cost more to build than PostgreSQL takes to run
    it (a worker claims and records every batch of jobs this way).

    `select` is `SELECT <every column> FROM <table> <alias> JOIN ...` for the relations named as `select_related`
    names them ("cluster", "project__tenant"; a nullable one is an outer join and reads None when absent); the
    caller appends WHERE, ORDER BY, LIMIT and FOR ... OF <alias>, naming the model's columns as `<alias>.column`.
    `fetch` runs such a statement and returns the instances, each field read as the ORM reads it (JSON decoded).
    With `only` ("name", "project__slug"), a model's columns are those fields and its primary key, the others
    deferred, as `only` (a model none of them names is read whole);
    `annotations` are (attribute, SQL expression) pairs read last and set on each instance, as `annotate` does."""

    def __init__(
        self,
        model: type[Model],
        *related: str,
        alias: str,
        only: tuple[str, ...] = (),
        annotations: tuple[tuple[str, str], ...] = (),
    ) -> None:
        quote = connection.ops.quote_name
        only_by_path: dict[str, list[str]] = {}
        for name in only:
            path, _, field_name = name.rpartition("__")
            only_by_path.setdefault(path, []).append(field_name)
        self._base = _Reader(model, alias, only=tuple(only_by_path.get("", ())))
        self._joined: list[tuple[_Reader, int, ForeignKey[Any, Any]]] = []  # (reader, index of its parent's, FK)
        readers = [self._base]
        joins: list[str] = []
        aliases = {"": 0}
        for path in related:
            parent_path = ""
            for name in path.split("__"):
                here = f"{parent_path}__{name}" if parent_path else name
                if here not in aliases:
                    parent = readers[aliases[parent_path]]
                    field = parent.model._meta.get_field(name)
                    assert isinstance(field, ForeignKey), f"{parent.model.__name__}.{name}: not a foreign key"
                    reader = _Reader(
                        field.related_model, f"{alias}_{len(aliases)}", only=tuple(only_by_path.get(here, ()))
                    )
                    kind = "LEFT OUTER JOIN" if field.null else "INNER JOIN"
                    joins.append(
                        f"{kind} {quote(reader.model._meta.db_table)} {reader.alias} "
                        f"ON {reader.alias}.{quote(str(field.target_field.column))} "
                        f"= {parent.alias}.{quote(str(field.column))}"
                    )
                    aliases[here] = len(readers)
                    readers.append(reader)
                    self._joined.append((reader, aliases[parent_path], field))
                parent_path = here
        self._annotations = [name for name, _ in annotations]
        columns = ", ".join([*(reader.columns for reader in readers), *(sql for _, sql in annotations)])
        self.select = f"SELECT {columns} FROM {quote(model._meta.db_table)} {alias} {' '.join(joins)}"  # noqa: S608

    def fetch(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        with prepared_cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        found = []
        for row in rows:
            start = len(self._base.fields)
            instances = [self._base.instance(row, 0)]
            for reader, parent_index, field in self._joined:
                instance = reader.instance(row, start)
                start += len(reader.fields)
                parent = instances[parent_index]
                if parent is not None:
                    field.set_cached_value(parent, instance)
                instances.append(instance)
            for name, value in zip(self._annotations, row[start:], strict=True):
                setattr(instances[0], name, value)
            found.append(instances[0])
        return found


class _Reader:
    """One model's columns in a select list, and its instance built from them as the ORM builds it."""

    def __init__(self, model: type[Model], alias: str, only: tuple[str, ...] = ()) -> None:
        quote = connection.ops.quote_name
        self.model, self.alias = model, alias
        self.fields = list(model._meta.concrete_fields)
        if only:
            chosen = {model._meta.pk, *(model._meta.get_field(name) for name in only)}
            self.fields = [field for field in self.fields if field in chosen]
        self.names = [field.attname for field in self.fields]
        self.columns = ", ".join(f"{alias}.{quote(str(field.column))}" for field in self.fields)
        self.converters = [
            (index, converters, field.get_col(alias))
            for index, field in enumerate(self.fields)
            if (converters := field.get_db_converters(connection))
        ]
        self.pk_index = self.fields.index(model._meta.pk)

    def instance(self, row: tuple[Any, ...], start: int) -> Any:
        values = list(row[start : start + len(self.fields)])
        if values[self.pk_index] is None:
            return None  # an outer join that found nothing
        for index, converters, column in self.converters:
            for converter in converters:
                values[index] = converter(values[index], column, connection)
        return self.model.from_db(connection.alias, self.names, values)
