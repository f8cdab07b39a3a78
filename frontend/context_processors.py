"""What every page's layout needs: the navigation the signed-in user may use."""

from __future__ import annotations

from django.http import HttpRequest

from tenants.notification_apis import notification_list_for_user
from tenants.selectors import user_reach

# (label, path, who sees it). Paths, not URL names: the layout must render even where an area's page is down.
NAVIGATION = (
    ("Dashboard", "/", "everyone"),
    ("Jobs", "/jobs/", "everyone"),
    ("Submit", "/jobs/new/", "everyone"),
    ("Clusters", "/clusters/", "everyone"),
    ("Projects", "/projects/", "everyone"),
    ("Billing", "/billing/", "spend"),
    ("Admin", "/staff/", "portal_admin"),
)


def navigation(request: HttpRequest) -> dict[str, object]:
    if not request.user.is_authenticated:
        return {}
    reach = user_reach(user=request.user)
    allowed = {"everyone": True, "spend": reach.sees_spend, "portal_admin": reach.is_portal_admin}
    items = []
    for label, path, audience in NAVIGATION:
        if not allowed[audience]:
            continue
        current = request.path == path if path == "/" else request.path.startswith(path)
        if path == "/jobs/" and request.path.startswith("/jobs/new/"):
            current = False
        items.append({"label": label, "path": path, "current": current})
    unread = notification_list_for_user(user=request.user).filter(read_at__isnull=True).count()
    return {"navigation": items, "reach": reach, "unread_notifications": unread}
