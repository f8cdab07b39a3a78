"""Test settings: the portal's own, with Celery, Channels and the cache on Redis databases of their own,
so a demo running on the same machine never receives test tasks or pushes (and vice versa)."""

from portal.settings import *  # noqa: F403
from portal.settings import REDIS_URL, channel_layer_host

_REDIS_BASE = REDIS_URL.rsplit("/", 1)[0]

CELERY_BROKER_URL = f"{_REDIS_BASE}/13"
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [channel_layer_host(f"{_REDIS_BASE}/14")]},
    }
}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": f"{_REDIS_BASE}/15"}}

# Tests create many users; a fast hasher keeps fixtures cheap (never used outside tests).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Every test client comes from 127.0.0.1 and the cache outlives a test: at the real rates, the failed logins
# and wrong tokens of earlier tests would throttle later ones. Throttling tests set the rates they test.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_THROTTLE_RATES": {"login": "100000/min", "token_guess": "100000/min"},
}
