"""Isolation matrix entries for the browser pages of the staff area (see tests/frontend/page_matrix.py)."""

from __future__ import annotations

from typing import Any

from tests.isolation_rules import TENANT_ADMINS, Case, page_only

# The admin pages answer 403 to every signed-in user but portal admins (the outsider included: there is
# nothing tenant-specific to hide in "this page is for portal admins").
STAFF_PAGE = page_only(200, ("staff",), outsider=403)


def _staff_post(status: int = 302) -> dict[str, int]:
    return page_only(status, ("staff",), outsider=403)


def _rate(world: Any) -> dict[str, str]:
    return {
        "cluster": "matrixcluster",
        "gpu_type": "h100",
        "price_per_gpu_hour": "3",
        "currency": "EUR",
        "valid_from": "2099-01-01",
        "note": "matrix",
    }


PAGES: dict[str, dict[str, Case]] = {
    # The decision queue: tenant admins (their tenants' requests; the outsider's list is empty) and portal admins.
    "requests/": {"GET": Case(page_only(200, TENANT_ADMINS) | {"outsider": 200})},
    "requests/<int:request_id>/": {
        "GET": Case(page_only(200, TENANT_ADMINS)),
        "POST": Case(page_only(302, TENANT_ADMINS), body=lambda w: {"decision": "deny", "reason": "matrix"}, form=True),
    },
    "staff/": {"GET": Case(STAFF_PAGE)},
    "staff/allocations/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(
            _staff_post(),
            body=lambda w: {
                "project": "matrixco/sideproj",
                "cluster": "matrixcluster",
                "gpu_type": "",
                "gpu_hours": "10",
                "starts_on": "2099-01-01",
                "ends_on": "2099-01-31",
            },
            form=True,
        ),
    },
    "staff/allocations/<int:allocation_id>/grant/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(_staff_post(), body=lambda w: {"gpu_hours": "5", "note": "matrix"}, form=True),
    },
    "staff/rates/": {"GET": Case(STAFF_PAGE), "POST": Case(_staff_post(), body=_rate, form=True)},
    # The world's rate has priced usage: it is locked (409) even for portal admins.
    "staff/rates/<int:rate_id>/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(_staff_post(409), body=_rate, form=True),
    },
    "staff/rates/<int:rate_id>/delete/": {"POST": Case(_staff_post(409), form=True)},
    # The console: tenants, projects, clusters and the audit log (portal admins only; POSTs create or change).
    "staff/tenants/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(_staff_post(), body=lambda w: {"slug": "matrixnew", "name": "Matrix new"}, form=True),
    },
    "staff/tenants/<str:tenant>/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(_staff_post(), body=lambda w: {"name": "Matrix renamed", "description": ""}, form=True),
    },
    "staff/tenants/<str:tenant>/projects/": {
        "POST": Case(_staff_post(), body=lambda w: {"slug": "matrixnewproj", "name": "Matrix new"}, form=True),
    },
    "staff/tenants/<str:tenant>/projects/<str:project>/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(_staff_post(), body=lambda w: {"name": "Matrix renamed", "description": ""}, form=True),
    },
    "staff/clusters/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(
            _staff_post(),
            body=lambda w: {
                "name": "matrixnewcluster",
                "slurmrestd_url": "http://127.0.0.1:9",
                "jwt_key_file": "/nonexistent",
                "admin_user": "root",
                "log_root": "/tmp/matrix-logs",
            },
            form=True,
        ),
    },
    "staff/clusters/<str:cluster>/": {"GET": Case(STAFF_PAGE)},
    "staff/clusters/<str:cluster>/check/": {"POST": Case(_staff_post(), form=True)},
    "staff/audit/": {"GET": Case(STAFF_PAGE)},
    # Every tenant's spend (the world's usage is last month's: this month's page compares against it).
    "staff/spend/": {"GET": Case(STAFF_PAGE)},
    "staff/drift/": {"GET": Case(STAFF_PAGE)},
    # The period ends before the world's usage; the report only gets queued (the worker runs on commit).
    "staff/reconciliation/": {
        "GET": Case(STAFF_PAGE),
        "POST": Case(
            _staff_post(),
            body=lambda w: {"cluster": "matrixcluster", "start": "2026-01-01", "end": "2026-01-02"},
            form=True,
        ),
    },
    "staff/reconciliation/<int:report_id>/": {"GET": Case(STAFF_PAGE)},
}
