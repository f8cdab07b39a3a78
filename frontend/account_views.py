"""The person's own profile page (/account/profile/): the time zone the portal shows times in. Beside it in the
header's account area: API tokens (project_views) and two-factor sign-in (two_factor_views)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from frontend.time_zones import COOKIE_NAME, moment_text
from tenants.profiles import time_zone_is_known, time_zone_names, user_time_zone, user_time_zone_set


def _profile_page(
    request: HttpRequest, *, chosen: str, errors: dict[str, list[str]] | None = None, status: int = 200
) -> HttpResponse:
    reported = request.COOKIES.get(COOKIE_NAME, "")
    context: dict[str, Any] = {
        "chosen": chosen,
        "browser_zone": reported if time_zone_is_known(reported) else "",
        "zones": time_zone_names(),
        "now_text": moment_text(timezone.now()),
        "errors": errors or {},
    }
    return render(request, "frontend/account/profile.html", context, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def profile_page(request: HttpRequest) -> HttpResponse:
    """GET shows the person's settings; POST saves the zone chosen ("" for the browser's)."""
    user: User = request.user  # type: ignore[assignment]
    if request.method != "POST":
        return _profile_page(request, chosen=user_time_zone(user=user))
    wanted = request.POST.get("time_zone", "")
    try:
        user_time_zone_set(user=user, time_zone=wanted)
    except ValidationError as error:
        return _profile_page(request, chosen=wanted, errors=error.message_dict, status=400)
    if wanted.strip():
        messages.success(request, f"Times are now shown in {wanted.strip()}.")
    else:
        messages.success(request, "Times are now shown in your browser's time zone.")
    return redirect("account-profile")


urlpatterns: list[URLPattern] = [
    path("account/profile/", profile_page, name="account-profile"),
]
