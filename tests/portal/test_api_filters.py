"""Date-time filters of the API: any offset Python parses is answered, and impossible moments are a 400."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Client) -> Client:
    admin = make_user()
    make_tenant("acme", admin=admin)
    client.force_login(admin)
    return client


def test_an_offset_postgresql_does_not_know_is_read_in_utc(admin_client: Client) -> None:
    # +16:00 is a valid offset for Python but out of range for PostgreSQL: it used to be a 500.
    response = admin_client.get("/api/v1/audit-events/", {"since": "2000-01-01T00:00:00+16:00"})

    assert response.status_code == 200, response.json()
    assert [event["action"] for event in response.json()["results"]] == ["tenant_member.added", "tenant.created"]
    later = admin_client.get("/api/v1/audit-events/", {"since": "9999-12-31T00:00:00+16:00"})
    assert later.json()["count"] == 0


def test_a_moment_before_year_one_in_utc_is_refused(admin_client: Client) -> None:
    response = admin_client.get("/api/v1/audit-events/", {"until": "0001-01-01T00:00:00+01:00"})

    assert response.status_code == 400
    message = "This moment is out of range; give a date-time between years 1 and 9999, e.g. 2026-11-01T00:00:00Z."
    assert response.json() == {"code": "invalid", "message": f"until: {message}", "fields": {"until": [message]}}
