"""Every browser form shows all its errors at once, each beside its field and tied to it for screen readers:
a field the form cannot read (a date, a number) no longer hides what the service would say of the others."""

from __future__ import annotations

import html
import re

import pytest

from quotas.models import QuotaRequest
from tenants.models import ApiToken, ProjectMembership, TenantMembership
from tests.frontend.test_project_pages import PROJECT_URL, Acme, acme, client_for, no_broker  # noqa: F401

pytestmark = pytest.mark.django_db


def _error_beside(page: str, input_id: str, error_id: str) -> str:
    """The error `error_id` shown for the input `input_id`, checking the input is marked invalid and described
    by it."""
    tag = re.search(rf'<(?:input|select|textarea)[^>]*id="{input_id}"[^>]*>', page, re.S)
    assert tag, f"no #{input_id}"
    assert 'aria-invalid="true"' in tag.group(0), f"#{input_id} is not marked invalid"
    described = re.search(r'aria-describedby="([^"]*)"', tag.group(0))
    assert described, f"#{input_id} is described by nothing"
    assert error_id in described.group(1).split(), f"#{input_id} does not point at #{error_id}"
    message = re.search(rf'<p class="field-error" id="{error_id}">(.*?)</p>', page, re.S)
    assert message, f"no #{error_id}"
    return html.unescape(message.group(1).strip())


def test_the_quota_request_form_names_a_bad_number_and_a_missing_justification_at_once(acme: Acme) -> None:  # noqa: F811
    url = f"{PROJECT_URL}allocations/{acme.allocation.pk}/requests/"

    response = client_for(acme.member).post(url, {"gpu_hours": "lots", "justification": "  "})

    assert response.status_code == 400
    page = response.content.decode()
    assert _error_beside(page, "request-gpu-hours", "request-gpu-hours-error") == (
        "Give a number of GPU-hours, e.g. 20 or 12.5."
    )
    assert _error_beside(page, "request-justification", "request-justification-error") == (
        "Say what the hours are for, so that an admin can decide."
    )
    assert not QuotaRequest.objects.exists()


def test_the_token_form_names_a_bad_date_and_a_missing_name_at_once(acme: Acme) -> None:  # noqa: F811
    response = client_for(acme.member).post("/tokens/", {"name": " ", "expires_at": "next week"})

    assert response.status_code == 400
    page = response.content.decode()
    assert _error_beside(page, "token-name", "token-name-error") == (
        "Give the token a name that says where it is used, e.g. 'ci-pipeline'."
    )
    assert _error_beside(page, "token-expires", "token-expires-error") == (
        "Give the last day the token works as YYYY-MM-DD, or none."
    )
    assert not ApiToken.objects.exists()


def test_the_token_form_names_a_past_expiry_and_a_missing_name_at_once(acme: Acme) -> None:  # noqa: F811
    page = client_for(acme.member).post("/tokens/", {"name": "", "expires_at": "2020-01-01"}).content.decode()

    assert _error_beside(page, "token-name", "token-name-error").startswith("Give the token a name")
    assert _error_beside(page, "token-expires", "token-expires-error") == (
        "The expiry is in the past; give a future date, or none."
    )
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("url", "memberships", "roles"),
    [
        (PROJECT_URL + "members/", ProjectMembership, "'manager', 'member', 'viewer'"),
        ("/tenants/acme/members/", TenantMembership, "'admin', 'member'"),
    ],
    ids=["project", "tenant"],
)
def test_the_member_forms_name_an_unknown_user_and_a_bad_role_at_once(
    acme: Acme,  # noqa: F811
    url: str,
    memberships: type[ProjectMembership] | type[TenantMembership],
    roles: str,
) -> None:
    before = memberships.objects.count()

    response = client_for(acme.admin).post(url, {"username": "nobody", "role": "owner"})

    assert response.status_code == 400
    page = response.content.decode()
    assert _error_beside(page, "add-username", "add-username-error") == (
        "There is no active user 'nobody'; check the spelling, or ask a portal admin to create it."
    )
    assert _error_beside(page, "add-role", "add-role-error") == f"'owner' is not a role here; use one of {roles}."
    assert memberships.objects.count() == before
