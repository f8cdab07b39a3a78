"""Single sign-on in a real browser (Debian's Chromium) against the real demo OpenID provider: a newcomer signs
in through it, gets a portal account and lands on the dashboard; logging out signs them out there too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tenants.models import AuditEvent
from tests.frontend.conftest import Screenshots
from tests.oidc_provider import PASSWORD, DemoProvider

pytestmark = pytest.mark.django_db(transaction=True)

BUTTON = "Sign in with Demo identity provider"


def sign_in_at_the_provider(page: Any, provider: DemoProvider, username: str) -> None:
    page.wait_for_url(f"{provider.issuer}/interaction/**")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def test_a_newcomer_signs_in_through_the_provider_and_lands_on_the_dashboard(
    open_oidc_page: Callable[..., Any], oidc_portal: str, oidc_provider: DemoProvider, screenshot: Screenshots
) -> None:
    page = open_oidc_page(viewport="phone")
    page.goto("/jobs/")
    page.wait_for_url(f"{oidc_portal}/login/?next=/jobs/")
    screenshot(page, "login-page")

    page.get_by_role("button", name=BUTTON).click()
    screenshot(page, "provider-sign-in")
    sign_in_at_the_provider(page, oidc_provider, "dana")

    page.wait_for_url(f"{oidc_portal}/jobs/")
    page.goto("/")
    assert page.get_by_role("heading", name="Dashboard", level=1).is_visible()
    assert page.get_by_text("You are not in any project yet; ask your tenant admin to add you.").is_visible()
    screenshot(page, "dashboard")
    dana = get_user_model().objects.get(username="dana")
    assert (dana.email, dana.get_full_name()) == ("dana@example.org", "Dana Diaz")
    assert AuditEvent.objects.filter(action="user.created_by_sign_in", target_id=str(dana.pk)).count() == 1

    # Logging out goes on to the provider, which asks, signs her out there too and sends her back.
    page.set_viewport_size({"width": 1366, "height": 900})
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{oidc_provider.issuer}/session/end**")
    screenshot(page, "provider-sign-out")
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(f"{oidc_portal}/login/**")

    # Signed out at the provider as well: the next sign-in asks for her password again.
    page.get_by_role("button", name=BUTTON).click()
    page.wait_for_url(f"{oidc_provider.issuer}/interaction/**")
    screenshot(page, "provider-asks-again")


def test_an_answer_the_portal_did_not_ask_for_ends_on_the_refusal_page(
    open_oidc_page: Callable[..., Any], screenshot: Screenshots
) -> None:
    page = open_oidc_page()

    response = page.goto("/oidc/demo/login/callback/?code=made-up&state=made-up")

    assert response.status == 401
    assert page.get_by_role("heading", name="Sign-in refused", level=1).is_visible()
    assert (
        page.get_by_role("alert")
        .inner_text()
        .startswith("This answer from Demo identity provider does not belong to a sign-in started in this browser")
    )
    screenshot(page, "refused")
    page.get_by_role("link", name="Back to the login page").click()
    assert page.get_by_role("button", name=BUTTON).is_visible()
    assert not get_user_model().objects.exists()
