"""A request body field the operation does not know is refused by name, never silently dropped."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tenants.models import ApiToken
from tests.factories import add_tenant_member, make_tenant, make_user


@pytest.mark.django_db
def test_an_unknown_field_is_named_with_the_fields_the_operation_takes(client: Client) -> None:
    tenant = make_tenant()
    admin = make_user()
    add_tenant_member(tenant, admin, "admin")
    client.force_login(admin)

    response = client.post("/api/v1/tokens/", {"name": "ci", "scope": "read"}, content_type="application/json")

    assert response.status_code == 400
    body: dict[str, Any] = response.json()
    assert body["code"] == "invalid"
    assert list(body["fields"]) == ["scope"]
    assert body["fields"]["scope"][0].startswith("This operation has no field 'scope'; it takes: name, ")
    assert not ApiToken.objects.filter(user=admin).exists()


def test_the_schema_declares_request_bodies_closed(client: Client) -> None:
    served = client.get("/api/schema/", {"format": "json"})
    components = served.json()["components"]["schemas"]

    assert components["JobSubmitInputRequest"]["additionalProperties"] is False
    assert components["TokenCreateInputRequest"]["additionalProperties"] is False
