"""The API while the cache (Redis) is unreachable: the guessing limits are not enforced, nothing fails with 500.

Found by the Redis fault drill (scripts/drills/drill_redis.py): every bearer request read the token-guessing
window from the cache first, so each API call answered 500 for as long as Redis was away.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from tenants.models import ApiToken
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: every cache call fails to connect, as during a Redis restart.
UNREACHABLE_CACHE = {"default": {"BACKEND": "portal.cache.SharedClientRedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
STRICT_RATES = {"login": "2/min", "token_guess": "2/min"}


@pytest.fixture
def cache_down(settings: Any) -> None:
    settings.CACHES = UNREACHABLE_CACHE
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": STRICT_RATES}
    with pytest.raises(Exception, match=r"Connection refused|Error 111"):
        cache.get("anything")


def post_token(body: dict[str, str]) -> Any:
    return Client().post("/api/v1/tokens/", data=json.dumps(body), content_type="application/json")


def test_a_valid_token_works_and_a_wrong_one_is_refused_while_the_cache_is_down(cache_down: None) -> None:
    user = make_user("carol")
    created = post_token({"name": "ci", "username": "carol", "password": PASSWORD})
    assert created.status_code == 201, created.content
    secret = created.json()["token"]
    statuses = [
        Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code
        for token in ["wrong-1", "wrong-2", "wrong-3", secret]
    ]
    # Over the strict limit, but the limit cannot be counted: wrong tokens get 401, the right one works.
    assert statuses == [401, 401, 401, 200]
    assert ApiToken.objects.filter(user=user).count() == 1


def test_password_guesses_are_refused_not_crashed_while_the_cache_is_down(cache_down: None) -> None:
    make_user("dave")
    statuses = [post_token({"name": "x", "username": "dave", "password": f"guess{i}"}).status_code for i in range(3)]
    assert statuses == [401, 401, 401]
    assert post_token({"name": "x", "username": "dave", "password": PASSWORD}).status_code == 201


def test_failed_browser_logins_do_not_crash_while_the_cache_is_down(cache_down: None) -> None:
    make_user("erin")
    response = Client().post("/login/", {"username": "erin", "password": "wrong"})
    assert response.status_code == 200
    assert Client().post("/login/", {"username": "erin", "password": PASSWORD}).status_code == 302
