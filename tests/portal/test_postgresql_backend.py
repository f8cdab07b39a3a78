"""portal/postgresql: Django's backend reading `timestamptz` through psycopg's C loader. Each value reads as
Django's own loader reads it (same instant, Django's zone object, naive without USE_TZ), on the connection and on
a cursor whose zone differs from it."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from django.test import override_settings
from psycopg import pq

from portal.postgresql.base import TIMESTAMPTZ_OID

pytestmark = pytest.mark.django_db

# Written as PostgreSQL reads them: offsets, microseconds, the far past and future, a leap day.
TIMES = [
    "2026-11-27 15:30:00+00",
    "2026-07-01 13:05:00.123456+02",
    "2026-03-29 01:59:59.999999-05:30",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    "2024-02-29 12:00:00+14",
]
EXPECTED = [
    datetime(2026, 11, 27, 15, 30, tzinfo=UTC),
    datetime(2026, 7, 1, 11, 5, 0, 123456, tzinfo=UTC),
    datetime(2026, 3, 29, 7, 29, 59, 999999, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2024, 2, 28, 22, 0, tzinfo=UTC),
]


def _read(values: list[str]) -> tuple[list[datetime], type]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT unnest(%s::timestamptz[])", [values])
        read = [row[0] for row in cursor.fetchall()]
        loader = cursor.cursor.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)
    return read, loader


def _c_extension() -> bool:
    return psycopg.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT).__module__.startswith("psycopg_")


def test_timestamps_read_through_the_c_loader_as_django_reads_them() -> None:
    read, loader = _read(TIMES)

    assert read == EXPECTED
    assert all(value.tzinfo is connection.timezone for value in read), "Django's zone object, as its loader sets"
    assert issubclass(loader, BaseTzLoader), "Django's loader class, its zone kept"
    assert loader.__name__.startswith("Fast") == _c_extension()


def test_a_cursor_in_another_zone_reads_as_django_reads_it() -> None:
    # Without USE_TZ Django registers a loader of its own on each cursor (naive values in the connection's zone).
    with override_settings(USE_TZ=False):
        read, loader = _read(TIMES[:1])
        assert read == [datetime(2026, 11, 27, 15, 30)]
        assert issubclass(loader, BaseTzLoader)
        assert loader.timezone is None  # type: ignore[attr-defined]
        assert loader.__name__.startswith("Fast") == _c_extension()
    read, _ = _read(TIMES[:1])
    assert read == EXPECTED[:1]
