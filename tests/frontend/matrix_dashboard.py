"""Isolation matrix entries for the browser pages of the dashboard area (see tests/frontend/page_matrix.py):
notifications and cluster status. The dashboard itself ("") and the printable invoice are in the main MATRIX."""

from __future__ import annotations

from tests.isolation_rules import Case, everyone, page_everyone, page_only

# Clusters hold no tenant data; each one's page is for those who may submit to it (a username on it).
CLUSTER_USERS = ("member", "manager", "staff")

PAGES: dict[str, dict[str, Case]] = {
    # Notifications are private to their user (the member holds the world's one), portal admins included.
    "notifications/": {"GET": Case(page_everyone(200), leak_free_for=("outsider", "tenant_member"))},
    "notifications/read-all/": {"POST": Case(page_everyone(302), form=True)},
    "notifications/<int:notification_id>/read/": {
        "POST": Case(everyone(404, anonymous=302) | {"member": 302}, form=True)
    },
    "clusters/": {"GET": Case(page_everyone(200), leak_free_for=("outsider", "tenant_member", "viewer"))},
    "clusters/<str:cluster>/": {"GET": Case(page_only(200, CLUSTER_USERS, denied=404))},
}
