"""Django's Redis cache, with one redis-py client per connection pool instead of one per operation.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` for every cache operation, and redis-py 8 fills
a table of some 170 response callbacks each time: about 150 µs of CPU, more than the round trip to Redis itself.
A submission makes three cache operations (the token-guessing check, the rates, the delivery wake), so that was
a twentieth of its CPU. A `redis.Redis` is safe to share: each command takes a connection from the pool. (Django
makes one cache object per thread anyway.)
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient


class SharedClientRedisCacheClient(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)  # type: ignore[attr-defined]
        return client


class SharedClientRedisCache(RedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedClientRedisCacheClient
