"""Database connections under ASGI: a request's connection is closed when the request ends.

Under ASGI each request runs its database work in a thread of its own; a connection kept for reuse
(CONN_MAX_AGE > 0) outlived that thread, and the load test's 50 users ran PostgreSQL out of client slots
("too many clients already") within a minute.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import HttpCommunicator
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import connection

from portal.env import database_from_url
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)  # the requests' threads open connections of their own

CONCURRENT_REQUESTS = 12


def other_backends() -> int:
    """PostgreSQL backends on the test database other than the test's own connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


async def get(path: str) -> int:
    communicator = HttpCommunicator(ASGIHandler(), "GET", path, headers=[(b"host", b"testserver")])
    response = await communicator.get_response(timeout=30)
    await communicator.wait(timeout=30)  # until Django has closed the response, and with it the connection
    return int(response["status"])


async def get_concurrently(path: str, count: int) -> list[int]:
    return list(await asyncio.gather(*(get(path) for _ in range(count))))


def test_connections_are_not_kept_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)

    assert database_from_url("postgres://portal@db/portal")["CONN_MAX_AGE"] == 0
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] == 0


def test_a_deployment_behind_a_wsgi_server_may_keep_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_CONN_MAX_AGE", "60")

    assert database_from_url("postgres://portal@db/portal")["CONN_MAX_AGE"] == 60


def test_concurrent_asgi_requests_leave_no_connection_open() -> None:
    before = other_backends()

    statuses = asyncio.run(get_concurrently("/healthz", CONCURRENT_REQUESTS))

    assert statuses == [200] * CONCURRENT_REQUESTS
    # A closed connection's backend leaves pg_stat_activity a moment after the client hangs up; a kept one never.
    wait_until(lambda: other_backends() <= before, timeout_seconds=10, what="the requests' connections closing")
