"""Test settings: the portal's own, with Celery, Channels and the cache on Redis databases of their own,
so a demo running on the same machine never receives test tasks or pushes (and vice versa)."""

import atexit
import os
import shutil
import tempfile

# The tests' servers speak plain HTTP on loopback (as the demo's), and the tests need no key of the checkout's.
os.environ.setdefault("PORTAL_HTTPS", "false")
os.environ.setdefault("PORTAL_SECRET_KEY", "tests-only-secret-key-" + "x" * 40)

# Metrics in multiprocess mode, as deployed: the test run and the servers and workers it starts (which inherit
# the variable and import these settings too) write to one directory of the run's own, which /metrics sums. Set
# before anything imports prometheus_client, which reads it once; a directory a demo or another run uses (the
# variable left in a shell) is never shared.
if os.environ.get("GPUPORTAL_TEST_METRICS_DIR") != os.environ.get("PROMETHEUS_MULTIPROC_DIR") or not os.environ.get(
    "PROMETHEUS_MULTIPROC_DIR"
):
    _metrics_dir = tempfile.mkdtemp(prefix="gpuportal-test-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.environ["GPUPORTAL_TEST_METRICS_DIR"] = _metrics_dir
    atexit.register(shutil.rmtree, _metrics_dir, ignore_errors=True)

from portal.env import env_str
from portal.settings import *  # noqa: F403
from portal.settings import REDIS_URL, channel_layer_host

_REDIS_BASE = REDIS_URL.rsplit("/", 1)[0]
# Broker, channel layer and cache databases. Two suites can run side by side on one machine when each has its
# own three (TEST_REDIS_DBS=1,2,3) and its own DATABASE_URL (pytest-django prefixes that name with test_).
_BROKER_DB, _CHANNELS_DB, _CACHE_DB = env_str("TEST_REDIS_DBS", "13,14,15").split(",")

CELERY_BROKER_URL = f"{_REDIS_BASE}/{_BROKER_DB}"
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [channel_layer_host(f"{_REDIS_BASE}/{_CHANNELS_DB}")]},
    }
}
CACHES = {"default": {"BACKEND": "portal.cache.SharedClientRedisCache", "LOCATION": f"{_REDIS_BASE}/{_CACHE_DB}"}}

# Tests create many users; a fast hasher keeps fixtures cheap (never used outside tests).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Every test client comes from 127.0.0.1 and the cache outlives a test: at the real rates, the failed logins
# and wrong tokens of earlier tests would throttle later ones. Throttling tests set the rates they test.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_THROTTLE_RATES": {"login": "100000/min", "token_guess": "100000/min"},
}
LOGIN_ACCOUNT_FREE_FAILURES = 100000

# Several test processes run at once (scripts/test.sh): their requests to slurmdbd take turns (tests/slurmdb_lock.py).
from tests.slurmdb_lock import install as _slurmdbd_requests_take_turns  # noqa: E402

_slurmdbd_requests_take_turns()
