"""Requests refused before any view runs: a NUL character anywhere in the address or the cookies, too many
parameters, a body too large, a foreign Host. Each is a 400 that says why (in the error shape under /api/)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db

MESSAGE = "The request contains a NUL character (%00) in its {where}; remove it and send the request again."


@pytest.fixture
def admin_client(client: Client) -> Client:
    admin = make_user()
    make_tenant("acme", admin=admin)
    client.force_login(admin)
    return client


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ("/api/v1/tenants/ac%00me/", "address"),
        ("/api/v1/tenants/acme/members/a%00b/", "address"),
        ("/api/v1/audit-events/?actor=a%00b", "query string"),
        ("/api/v1/tenants/?a%00=b", "query string"),
    ],
)
def test_an_api_request_with_a_nul_character_is_refused_in_the_error_shape(
    admin_client: Client, path: str, where: str
) -> None:
    response = admin_client.get(path)

    assert response.status_code == 400
    assert response.json() == {"code": "invalid", "message": MESSAGE.format(where=where), "fields": {}}


def test_a_session_cookie_with_a_nul_character_is_refused(client: Client) -> None:
    client.cookies["sessionid"] = "abcdefgh\x00ijkl"

    response = client.get("/api/v1/me/")

    assert response.status_code == 400
    assert response.json()["message"] == MESSAGE.format(where="cookies")


def test_a_page_address_with_a_nul_character_is_a_plain_400(admin_client: Client) -> None:
    response = admin_client.get("/tenants/ac%00me/")

    assert response.status_code == 400
    assert response.content.decode() == MESSAGE.format(where="address")
    assert admin_client.get("/api/v1/tenants/acme/").status_code == 200


def test_requests_django_refuses_before_the_api_are_answered_in_the_error_shape(admin_client: Client) -> None:
    too_many = "&".join(f"a{index}=1" for index in range(1001))
    refused = {
        "parameters": admin_client.get(f"/api/v1/jobs/?{too_many}"),
        "body": admin_client.post("/api/v1/jobs/", "x" * (3 * 1024 * 1024), content_type="application/json"),
        "host": admin_client.get("/api/v1/me/", headers={"Host": "evil.example"}),
    }

    assert {name: (response.status_code, response.json()["code"]) for name, response in refused.items()} == {
        name: (400, "bad_request") for name in refused
    }
    assert refused["parameters"].json()["message"] == (
        "The request has more than 1000 parameters; send fewer query parameters or form fields."
    )
    assert refused["body"].json()["message"] == (
        "The request body is larger than the 2.5 MB the portal accepts; send less."
    )
    assert refused["host"].json()["message"] == (
        "The request's Host header names a host this portal does not serve; use the portal's own address."
    )
    # Pages keep Django's own answer.
    assert admin_client.get(f"/?{too_many}").status_code == 400
