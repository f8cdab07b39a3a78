"""A person's own settings (today: the time zone the portal shows times in): the zone check, the read and the
write. Personal preferences touch no tenant data, so they are not audited."""

from __future__ import annotations

import functools
import zoneinfo

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from tenants.models import UserProfile

# Files in the zone database that are no place's zone: the machine's own zone and tzdata's placeholder.
NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@functools.cache
def _known_time_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() - NOT_ZONES)


def time_zone_names() -> list[str]:
    """Every IANA zone this machine knows, sorted: the choices people pick from."""
    return sorted(_known_time_zones())


def time_zone_is_known(name: str) -> bool:
    # Checked against the list, not by loading: ZoneInfo() would also open odd paths ("../", "localtime").
    return name in _known_time_zones()


def user_time_zone(*, user: User) -> str:
    """The zone the person chose, or "" for their browser's."""
    if hasattr(user, "profile_time_zone"):
        chosen = user.profile_time_zone  # read with the signed-in user (tenants/backends.py `get_user`)
    else:
        chosen = UserProfile.objects.filter(user=user).values_list("time_zone", flat=True).first()
    return chosen if chosen and time_zone_is_known(chosen) else ""


def user_time_zone_set(*, user: User, time_zone: str) -> UserProfile:
    """Saves the person's zone ("" for their browser's); an unknown name is refused by field."""
    time_zone = time_zone.strip()
    if time_zone and not time_zone_is_known(time_zone):
        raise ValidationError({"time_zone": f"{time_zone!r} is not a time zone: pick one from the list."})
    profile, _ = UserProfile.objects.update_or_create(user=user, defaults={"time_zone": time_zone})
    if hasattr(user, "profile_time_zone"):
        user.profile_time_zone = time_zone
    return profile
