"""Isolation matrix entries for the browser pages of the projects area (see tests/frontend/page_matrix.py).

The world's `username` is the project's member (also a member of the tenant); the quota request was made by
the member; the token belongs to the member."""

from __future__ import annotations

from tests.isolation_rules import (
    INSIDERS,
    PROJECT_MANAGERS,
    PROJECT_VIEWERS,
    SUBMITTERS,
    TENANT_ADMINS,
    Case,
    page_everyone,
    page_only,
)

PROJECT = "projects/<str:tenant>/<str:project>/"
ALLOCATION = PROJECT + "allocations/<int:allocation_id>/"

PAGES: dict[str, dict[str, Case]] = {
    "projects/": {"GET": Case(page_everyone(200))},
    PROJECT: {"GET": Case(page_only(200, PROJECT_VIEWERS))},
    PROJECT + "efficiency-policy/": {
        "POST": Case(
            page_only(302, PROJECT_MANAGERS),
            body=lambda w: {"notify_managers": "on", "end_after_idle_minutes": "60", "warning_minutes": "10"},
            form=True,
        )
    },
    PROJECT + "members/": {
        "GET": Case(page_only(200, PROJECT_VIEWERS)),
        "POST": Case(
            page_only(302, PROJECT_MANAGERS),
            body=lambda w: {"username": w.users["tenant_member"].username, "role": "viewer"},
            form=True,
        ),
    },
    PROJECT + "members/<str:username>/": {
        "POST": Case(page_only(302, PROJECT_MANAGERS), body=lambda w: {"role": "viewer"}, form=True)
    },
    PROJECT + "members/<str:username>/remove/": {"POST": Case(page_only(302, PROJECT_MANAGERS), form=True)},
    # The world's invitation is the project's (a tenant admin invited an address into it).
    PROJECT + "invitations/<int:invitation_id>/withdraw/": {"POST": Case(page_only(302, PROJECT_MANAGERS), form=True)},
    ALLOCATION: {"GET": Case(page_only(200, PROJECT_VIEWERS))},
    ALLOCATION + "requests/": {
        "POST": Case(
            page_only(302, SUBMITTERS), body=lambda w: {"gpu_hours": "5", "justification": "matrix"}, form=True
        )
    },
    # The requester is the member: only they may withdraw; those who see the project are told why not.
    ALLOCATION + "requests/<int:request_id>/withdraw/": {"POST": Case(page_only(302, ("member",)), form=True)},
    "tenants/<str:tenant>/": {"GET": Case(page_only(200, INSIDERS))},
    "tenants/<str:tenant>/members/": {
        "POST": Case(
            page_only(302, TENANT_ADMINS), body=lambda w: {"username": w.newcomer.username, "role": "member"}, form=True
        )
    },
    "tenants/<str:tenant>/members/<str:username>/": {
        "POST": Case(page_only(302, TENANT_ADMINS), body=lambda w: {"role": "admin"}, form=True)
    },
    "tenants/<str:tenant>/members/<str:username>/remove/": {"POST": Case(page_only(302, TENANT_ADMINS), form=True)},
    "tenants/<str:tenant>/invitations/<int:invitation_id>/withdraw/": {
        "POST": Case(page_only(302, TENANT_ADMINS), form=True)
    },
    # Tokens are private to their owner (the world's token is the member's), portal admins included.
    "tokens/": {
        "GET": Case(page_everyone(200)),
        "POST": Case(page_everyone(200), body=lambda w: {"name": "matrix-browser"}, form=True),
    },
    "tokens/<int:token_id>/revoke/": {"POST": Case(page_everyone(404) | {"member": 302}, form=True)},
}
