"""A NUL character anywhere in the address or the cookies is a 400 that says so, never a database error."""

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
