"""The cache backend (portal/cache.py): Django's Redis cache, one redis-py client per pool instead of per operation."""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache


def test_cache_operations_share_one_client_and_still_work() -> None:
    client = cache._cache.get_client(write=True)  # type: ignore[attr-defined]

    cache.set("shared-client", 1, 30)
    added = cache.add("shared-client", 2, 30)
    value = cache.get("shared-client")
    cache.delete("shared-client")

    assert (added, value, cache.get("shared-client")) == (False, 1, None)
    assert cache._cache.get_client(write=True) is client  # type: ignore[attr-defined]
    assert cache._cache.get_client() is client  # type: ignore[attr-defined]  # one server: reads use its pool too


def test_the_portal_uses_it() -> None:
    from portal import settings as portal_settings

    assert portal_settings.CACHES["default"]["BACKEND"] == settings.CACHES["default"]["BACKEND"]
    assert settings.CACHES["default"]["BACKEND"] == "portal.cache.SharedClientRedisCache"
