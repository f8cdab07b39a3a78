"""Django's PostgreSQL backend, reading timestamps with psycopg's C loader.

Django (5.2) reads every `timestamptz` through a loader derived from psycopg's pure-Python one (it replaces the
zone of each value with the connection's), so with psycopg's C extension installed each timestamp is still
parsed in Python, by regular expression: about a tenth of the CPU of a list of jobs (Django ticket #36960,
psycopg issue #1273, neither fixed in the releases the portal runs). This backend keeps Django's loader, with its
zone, and has it parse through the C loader that psycopg registers globally; without the C extension nothing
changes. Everything else is Django's backend, unchanged (`portal.env.database_from_url` names it).
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg import pq
from psycopg.adapt import Loader
from psycopg.postgres import types
from psycopg.types.datetime import TimestamptzLoader

TIMESTAMPTZ_OID = types["timestamptz"].oid
# What psycopg itself reads a timestamptz with: its C loader where the extension is installed.
_PSYCOPG_LOADER: type[Loader] = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)  # type: ignore[assignment]


@functools.cache
def _fast_loader(django_loader: type[Any]) -> type[Any]:
    """Django's loader class (its `timezone` kept) parsing through psycopg's own loader."""

    class FastTzLoader(django_loader):  # type: ignore[misc]
        parses_in_c = True

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._parse = _PSYCOPG_LOADER(oid, context).load

        def load(self, data: Any) -> Any:
            return self._parse(data).replace(tzinfo=self.timezone)

    FastTzLoader.__qualname__ = FastTzLoader.__name__ = f"Fast{django_loader.__name__}"
    return FastTzLoader


def timestamptz_loader_speed_up(context: Any) -> None:
    """Swap the Django loader registered on `context` (a connection or cursor) for its fast twin."""
    if _PSYCOPG_LOADER is TimestamptzLoader:
        return  # no C extension: Django's loader is as fast as psycopg's
    current = context.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)
    if current is None or getattr(current, "parses_in_c", False) or not hasattr(current, "timezone"):
        return
    context.adapters.register_loader(TIMESTAMPTZ_OID, _fast_loader(current))


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        timestamptz_loader_speed_up(connection)
        return connection

    def create_cursor(self, name: Any = None) -> Any:
        # Django registers its loader again on a cursor whose zone differs from the connection's.
        cursor = super().create_cursor(name)
        timestamptz_loader_speed_up(cursor)
        return cursor
