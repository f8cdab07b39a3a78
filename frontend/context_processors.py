"""What every page's layout needs: the navigation the signed-in user may use."""

from __future__ import annotations

from django.http import HttpRequest

from quotas.requests import quota_request_pending_to_decide_for_user
from tenants.selectors import user_reach_with_unread

# (label, path, who sees it). Paths, not URL names: the layout must render even where an area's page is down.
NAVIGATION = (
    ("Dashboard", "/", "everyone"),
    ("Jobs", "/jobs/", "everyone"),
    ("Submit", "/jobs/new/", "everyone"),
    ("Clusters", "/clusters/", "everyone"),
    ("Projects", "/projects/", "everyone"),
    ("Requests", "/requests/", "decide"),
    ("Billing", "/billing/", "spend"),
    ("Admin", "/staff/", "portal_admin"),
)


def navigation(request: HttpRequest) -> dict[str, object]:
    if not request.user.is_authenticated:
        return {}
    reach, unread = user_reach_with_unread(user=request.user)
    allowed = {
        "everyone": True,
        "decide": reach.decides_requests,
        "spend": reach.sees_spend,
        "portal_admin": reach.is_portal_admin,
    }
    items = []
    for label, path, audience in NAVIGATION:
        if not allowed[audience]:
            continue
        current = request.path == path if path == "/" else request.path.startswith(path)
        if path == "/jobs/" and request.path.startswith("/jobs/new/"):
            current = False
        item: dict[str, object] = {"label": label, "path": path, "current": current}
        if audience == "decide":
            # Only the requests this user may decide: another tenant's never count.
            item["pending"] = quota_request_pending_to_decide_for_user(user=request.user).count()
        items.append(item)
    return {"navigation": items, "reach": reach, "unread_notifications": unread}
