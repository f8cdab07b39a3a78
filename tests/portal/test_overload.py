"""Overload answers 503 with Retry-After in the error shape, never 500: a request that waited in line too long
behind the proxy is refused before it does anything, and one the database cannot serve is told to come back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tenants.models import ApiToken
from tests.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)  # the database fault closes the test's connection

PASSWORD = "a long enough password"


@pytest.fixture
def behind_proxy(settings: Any) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    settings.PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS = 5
    settings.PORTAL_RETRY_AFTER_SECONDS = 7


def token_request(*, queued_for: float | None) -> Any:
    user = make_user("queued")
    user.set_password(PASSWORD)
    user.save()
    headers = {} if queued_for is None else {"X-Request-Start": f"t={time.time() - queued_for:.3f}"}
    body = {"name": "ci", "username": "queued", "password": PASSWORD}
    return Client().post("/api/v1/tokens/", body, content_type="application/json", headers=headers)


def test_a_request_that_waited_in_line_too_long_is_refused_with_503_before_doing_anything(behind_proxy: None) -> None:
    response = token_request(queued_for=6)

    assert response.status_code == 503
    assert response["Retry-After"] == "7"
    assert response.json() == {
        "code": "overloaded",
        "message": "The portal is busier than it can serve right now; send the request again after 7 seconds.",
        "fields": {},
    }
    assert not ApiToken.objects.exists()


def test_a_request_that_waited_briefly_is_served(behind_proxy: None) -> None:
    assert token_request(queued_for=1).status_code == 201


def test_without_a_proxy_the_stamp_is_the_clients_own_and_is_ignored(settings: Any) -> None:
    settings.PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS = 5  # NUM_PROXIES stays 0, as with no proxy in front

    assert token_request(queued_for=60).status_code == 201


@pytest.fixture
def database_unreachable(settings: Any) -> Iterator[None]:
    """The web process's connection to PostgreSQL points at a port where nothing listens: every query fails to
    connect, as when PostgreSQL is restarting or refuses more clients."""
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = "9"
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = port


def test_an_api_request_the_database_cannot_serve_gets_503_in_the_error_shape(
    database_unreachable: None, settings: Any
) -> None:
    settings.PORTAL_RETRY_AFTER_SECONDS = 7
    response = Client(raise_request_exception=False).get(
        "/api/v1/jobs/", HTTP_AUTHORIZATION="Bearer gpp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    )

    assert response.status_code == 503
    assert response["Retry-After"] == "7"
    assert response.json() == {
        "code": "database_unavailable",
        "message": "The portal's database cannot take this request right now; send it again after 7 seconds.",
        "fields": {},
    }


def test_a_page_the_database_cannot_serve_gets_503_with_retry_after(database_unreachable: None) -> None:
    response = Client(raise_request_exception=False).get("/login/")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.content.decode().startswith("The portal's database cannot take this request right now")


def test_a_failure_that_is_the_portals_own_still_answers_500(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from portal import apis

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(apis.MeApi, "get", broken)
    user = make_user("broken")
    client = Client(raise_request_exception=False)
    client.force_login(user)

    response = client.get("/api/v1/me/")

    assert response.status_code == 500
    assert response.json()["code"] == "server_error"
    assert "Retry-After" not in response
