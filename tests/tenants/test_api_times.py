"""Every time the REST API writes is ISO 8601 with its offset, in UTC, whatever zone the reader chose for the
pages: walked over every JSON GET endpoint of the isolation matrix's world, as a portal admin and as a member."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from frontend.time_zones import COOKIE_NAME
from tenants.profiles import user_time_zone_set
from tests.tenants.test_isolation_matrix import MATRIX, World, _client, _url, world  # noqa: F401  (the fixture)

ISO_WITH_OFFSET = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$")
LOOKS_LIKE_A_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
# Keys that hold a moment, whatever their value looks like.
TIME_KEY = re.compile(r"(_at|_from|_until|_start|_end|^at|^since)$")


def _times(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(where, value) for every value in a JSON document that is, or ought to be, a moment."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if TIME_KEY.search(key) and isinstance(item, str):
                found.append((where, item))
            else:
                found += _times(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _times(item, f"{path}[{index}]")
    elif isinstance(value, str) and LOOKS_LIKE_A_TIME.match(value):
        found.append((path, value))
    return found


def test_every_time_the_api_writes_is_iso_8601_in_utc_with_its_offset(world: World) -> None:  # noqa: F811
    routes = [route for route, methods in MATRIX.items() if route.startswith("api/v1/") and "GET" in methods]
    checked: dict[str, int] = {}
    problems = []
    for role in ("staff", "member", "tenant_admin"):
        user_time_zone_set(user=world.users[role], time_zone="Asia/Tokyo")
        client = _client(world, role)
        client.cookies[COOKIE_NAME] = "America/New_York"
        for route in routes:
            response = client.get(_url(route, world))
            if response.status_code != 200 or not response.get("Content-Type", "").startswith("application/json"):
                continue
            for where, value in _times(response.json()):
                checked[route] = checked.get(route, 0) + 1
                if not ISO_WITH_OFFSET.match(value):
                    problems.append(f"/{route} {where}: {value!r}")
                    continue
                moment = datetime.fromisoformat(value)
                if moment.utcoffset() != timedelta(0):
                    problems.append(f"/{route} {where}: {value!r} is not in UTC")
    assert problems == []
    # The walk saw the times of the main resources, so it cannot pass by finding none.
    for route in (
        "api/v1/jobs/",
        "api/v1/jobs/<uuid:job_id>/",
        "api/v1/projects/",
        "api/v1/tokens/",
        "api/v1/notifications/",
        "api/v1/audit-events/",
        "api/v1/allocations/<int:allocation_id>/ledger/",
        "api/v1/quota-requests/",
        "api/v1/invoices/<int:invoice_id>/",
    ):
        assert checked.get(route, 0) > 0, f"no time seen at /{route}"
