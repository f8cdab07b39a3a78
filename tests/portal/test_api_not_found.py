"""Unknown `/api/` paths answer the API's error shape with DEBUG on and off (portal.api_errors.api_not_found_as_json):
Django's debug 404 page, which lists the URL patterns, never answers one; known routes keep APPEND_SLASH."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client, override_settings

from tests.factories import make_user

pytestmark = pytest.mark.django_db

MODES = [pytest.param(False, id="production"), pytest.param(True, id="debug")]


@pytest.mark.parametrize("debug", MODES)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_an_unknown_api_path_answers_the_error_shape(client: Client, debug: bool, method: str) -> None:
    with override_settings(DEBUG=debug):
        response = getattr(client, method)("/api/v1/no-such-thing/")

    assert (response.status_code, response["Content-Type"]) == (404, "application/json")
    assert response.json() == {
        "code": "not_found",
        "message": "There is no API route /api/v1/no-such-thing/; see /api/docs/.",
        "fields": {},
    }


@pytest.mark.parametrize("debug", MODES)
def test_unknown_paths_deeper_and_outside_v1_too(client: Client, debug: bool) -> None:
    client.force_login(make_user())
    with override_settings(DEBUG=debug):
        paths = ["/api/", "/api/v2/jobs/", "/api/v1/jobs/not-a-uuid/log/x/", "/api/docs/nothing/"]
        answers = {path: client.get(path) for path in paths}

    for path, response in answers.items():
        assert (response.status_code, response.json()["message"]) == (
            404,
            f"There is no API route {path}; see /api/docs/.",
        ), path
        assert b"URLconf" not in response.content


@pytest.mark.parametrize("debug", MODES)
def test_a_known_route_without_its_slash_is_still_redirected(client: Client, debug: bool) -> None:
    with override_settings(DEBUG=debug):
        response = client.get("/api/v1/jobs")

    assert (response.status_code, response["Location"]) == (301, "/api/v1/jobs/")


@pytest.mark.parametrize("debug", MODES)
def test_a_known_routes_own_404_keeps_its_message(client: Client, debug: bool) -> None:
    client.force_login(make_user())
    job_id = uuid.uuid4()
    with override_settings(DEBUG=debug):
        response = client.get(f"/api/v1/jobs/{job_id}/")

    assert response.status_code == 404
    assert response.json()["message"] == (
        f"No job '{job_id}' exists among the ones you can see; check the id or ask for access."
    )


def test_pages_keep_the_portals_own_404_page(client: Client) -> None:
    response = client.get("/no-such-page/")

    assert (response.status_code, response["Content-Type"]) == (404, "text/html; charset=utf-8")
