"""The time zone each request's pages are drawn in, and how a moment is written.

A person's profile zone wins; else the zone their browser reported in the `portal_time_zone` cookie
(frontend/static/frontend/js/time-zone.js sets it); else UTC. The REST API always answers in UTC, whoever asks:
its ISO 8601 times carry their offset, and clients convert. Times are written 24-hour with their offset from UTC
("2026-11-26 20:20 UTC+01:00", or "… UTC" in UTC) so that no reader has to guess; time-zone.js writes live
times the same way.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from tenants.profiles import time_zone_is_known, user_time_zone

COOKIE_NAME = "portal_time_zone"
API_PREFIX = "/api/"
REQUEST_ATTRIBUTE = "portal_time_zone"


@dataclass(frozen=True)
class RequestTimeZone:
    name: str
    # "profile", "browser" or "default": whether the person chose it, their browser reported it, or neither.
    source: str


def request_time_zone(request: HttpRequest) -> RequestTimeZone:
    if request.path.startswith(API_PREFIX):
        return RequestTimeZone("UTC", "default")
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        chosen = user_time_zone(user=user)
        if chosen:
            return RequestTimeZone(chosen, "profile")
    reported = request.COOKIES.get(COOKIE_NAME, "")
    if reported and time_zone_is_known(reported):
        return RequestTimeZone(reported, "browser")
    return RequestTimeZone("UTC", "default")


def time_zone_activate(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """Middleware (after authentication): draws the request's pages in its zone (see the module's docstring)."""

    def middleware(request: HttpRequest) -> HttpResponse:
        zone = request_time_zone(request)
        setattr(request, REQUEST_ATTRIBUTE, zone)
        with timezone.override(zoneinfo.ZoneInfo(zone.name)):
            return get_response(request)

    return middleware


def time_zone_context(request: HttpRequest) -> dict[str, object]:
    """For the layout's <body>: the zone the page is drawn in, for the scripts that write live times."""
    zone = getattr(request, REQUEST_ATTRIBUTE, None) or RequestTimeZone("UTC", "default")
    # Whether time-zone.js may draw the page again once it has reported the browser's zone: not over a zone the
    # person chose, and not after a form was sent (drawing again would lose what the answer says).
    redraw = zone.source != "profile" and request.method == "GET"
    return {"time_zone": zone, "time_zone_redraw": redraw}


def offset_label(moment: datetime) -> str:
    """ "UTC", or "UTC+01:00" / "UTC-05:30": a zone's name without the ambiguity of abbreviations (CST, IST)."""
    offset = moment.utcoffset()
    if not offset:
        return "UTC"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{rest:02d}"


def moment_text(moment: datetime, zone: tzinfo | None = None) -> str:
    """ "2026-11-26 20:20 UTC+01:00": a moment in `zone` (the request's zone when not given), 24-hour."""
    local = timezone.localtime(moment, zone) if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
    return f"{local:%Y-%m-%d %H:%M} {offset_label(local)}"


def clock_text(moment: datetime, zone: tzinfo | None = None) -> str:
    """ "20:20:05 UTC+01:00": the time of day of a moment, for "updated at" lines."""
    local = timezone.localtime(moment, zone) if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
    return f"{local:%H:%M:%S} {offset_label(local)}"
