"""Template helpers shared by the portal's pages: the quota gauge, GPU-hours and times."""

from __future__ import annotations

from datetime import datetime

from django import template

from frontend.time_zones import clock_text, moment_text
from quotas.models import Allocation
from quotas.units import format_gpu_hours

register = template.Library()

WARNING_PERCENT = 80
CRITICAL_PERCENT = 95


@register.inclusion_tag("frontend/partials/gauge.html")
def quota_gauge(allocation: Allocation, label: str = "") -> dict[str, object]:
    """Used, reserved and remaining GPU-hours of an allocation as one bar, with the figures in words.

    The bar is SVG: its widths are attributes, so no inline style is needed under the content security policy."""
    granted = max(allocation.granted_gpu_seconds, 0)
    used = allocation.charged_gpu_seconds
    reserved = allocation.reserved_gpu_seconds
    remaining = allocation.remaining_gpu_seconds
    scale = max(granted, used + reserved, 1)
    used_percent = round(100 * used / scale, 2)
    reserved_percent = round(100 * reserved / scale, 2)
    taken = used_percent + reserved_percent
    level = "critical" if taken >= CRITICAL_PERCENT else "warning" if taken >= WARNING_PERCENT else "ok"
    return {
        "label": label or str(allocation),
        "used_percent": used_percent,
        "reserved_percent": reserved_percent,
        "reserved_x": used_percent,
        "taken_percent": round(taken),
        "level": level,
        "granted": format_gpu_hours(granted),
        "used": format_gpu_hours(used),
        "reserved": format_gpu_hours(reserved),
        "remaining": format_gpu_hours(remaining),
        "over": remaining < 0,
    }


@register.filter
def gpu_hours(gpu_seconds: int | None) -> str:
    """GPU-seconds written as GPU-hours, as messages write them: "16.0", "3.5", "0.25"."""
    return format_gpu_hours(gpu_seconds or 0)


@register.filter
def local_time(moment: datetime | None) -> str:
    """A moment in the page's time zone, 24-hour with its offset: "2026-11-21 15:05 UTC+01:00" (frontend.time_zones)."""
    if moment is None:
        return ""
    return moment_text(moment)


# The filter's first name, from when the portal showed every time in UTC; templates still use it.
register.filter("utc", local_time)


@register.filter
def clock_time(moment: datetime | None) -> str:
    """The time of day of a moment in the page's time zone: "15:05:09 UTC+01:00"."""
    if moment is None:
        return ""
    return clock_text(moment)
