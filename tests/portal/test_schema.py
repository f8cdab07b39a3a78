"""The OpenAPI schema is generated without a single warning, so client generators get clean names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from tests.factories import make_user
from tests.portal.openapi import assert_matches_schema


def test_the_schema_validates_without_warnings(tmp_path: Path) -> None:
    schema = tmp_path / "schema.yaml"

    # --fail-on-warn raises on any warning (an unresolved enum name, a view without a serializer, ...).
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(schema))

    text = schema.read_text()
    assert "JobStateEnum" in text
    assert "/api/v1/jobs/{job_id}/cancel/" in text


@pytest.mark.django_db
def test_me_matches_the_schema_for_a_user_without_an_email_address(client: Client) -> None:
    user = make_user()
    assert user.email == ""
    client.force_login(user)

    response = client.get("/api/v1/me/")

    assert response.status_code == 200
    assert_matches_schema(response, method="GET", path_template="/api/v1/me/")


@pytest.mark.django_db
def test_a_page_past_the_end_of_a_list_is_a_documented_error(client: Client) -> None:
    client.force_login(make_user())

    response = client.get("/api/v1/tokens/", {"page": 99})

    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert_matches_schema(response, method="GET", path_template="/api/v1/tokens/")


@pytest.mark.django_db
def test_an_address_held_back_for_guessing_tokens_gets_a_documented_429(client: Client, settings: Any) -> None:
    # A cache of this test's own: the guessing counter must not hold back other test runs on this machine.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "token_guess": "1/min"},
    }
    wrong = {"Authorization": "Bearer gpp_wrong"}
    assert client.get("/api/v1/jobs/", headers=wrong).status_code == 401

    response = client.get("/api/v1/jobs/", headers=wrong)

    assert (response.status_code, response.json()["code"]) == (429, "throttled")
    assert_matches_schema(response, method="GET", path_template="/api/v1/jobs/")
