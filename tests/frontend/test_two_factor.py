"""Two-factor sign-in for local accounts (tenants/two_factor.py, frontend/two_factor_views.py): turning it on with
an authenticator app's code, the code step after a right password, and staff who must have it
(PORTAL_MFA_REQUIRED_FOR_STAFF). Codes are made from the secret with allauth.mfa's own TOTP helpers, as an app
would make them."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import format_hotp_value, hotp_value
from django.test import Client
from playwright.sync_api import expect

from tenants.models import AuditEvent
from tenants.oidc import SESSION_KEY as PROVIDER_SIGN_IN_KEY
from tenants.two_factor import TWO_FACTOR_TOKENS
from tests.factories import PASSWORD, make_user
from tests.frontend.conftest import Screenshots

pytestmark = pytest.mark.django_db

WRONG_CODE = "That code is not right. Type the six digits your authenticator app shows now."


def code_for(secret: str, *, periods_from_now: int = 0) -> str:
    """The code an authenticator app with `secret` shows now (or that many 30-second periods later)."""
    return str(format_hotp_value(hotp_value(secret, int(time.time()) // 30 + periods_from_now)))


def wrong_code_for(secret: str) -> str:
    # Far outside the accepted window (one period either side), so never right by chance.
    return code_for(secret, periods_from_now=100)


def signed_in(client: Client) -> str | None:
    return client.session.get("_auth_user_id")


def enrol(client: Client) -> str:
    """Turn two-factor sign-in on for the signed-in user, as they would on /account/two-factor/; its secret."""
    page = client.get("/account/two-factor/").content.decode()
    secret = re.search(r'<code id="two-factor-secret">([A-Z2-7]+)</code>', page)
    assert secret is not None
    response = client.post("/account/two-factor/", {"code": code_for(secret.group(1))})
    assert (response.status_code, response["Location"]) == (302, "/account/two-factor/")
    return str(secret.group(1))


def password_sign_in(client: Client, username: str, next_url: str = "") -> Any:
    address = f"/login/?next={next_url}" if next_url else "/login/"
    return client.post(address, {"username": username, "password": PASSWORD})


def test_turning_it_on_needs_a_right_code_from_the_app() -> None:
    alice = make_user("alice")
    client = Client()
    client.force_login(alice)
    page = client.get("/account/two-factor/").content.decode()
    assert "Two-factor sign-in is <strong>off</strong>" in page
    assert 'src="data:image/svg+xml;base64,' in page
    secret = re.search(r'<code id="two-factor-secret">([A-Z2-7]+)</code>', page).group(1)  # type: ignore[union-attr]

    wrong = client.post("/account/two-factor/", {"code": wrong_code_for(secret)})

    assert wrong.status_code == 400
    assert "That code does not match" in wrong.content.decode()
    assert not Authenticator.objects.filter(user=alice).exists()

    # The same secret is kept in the session until a right code proves the app has it.
    right = client.post("/account/two-factor/", {"code": code_for(secret)})

    assert right.status_code == 302
    assert "Two-factor sign-in is <strong>on</strong>" in client.get("/account/two-factor/").content.decode()
    assert Authenticator.objects.get(user=alice).type == Authenticator.Type.TOTP
    assert list(AuditEvent.objects.filter(action="user.two_factor_enabled").values_list("actor_username", "after")) == [
        ("alice", {"type": "totp"})
    ]


def test_a_password_sign_in_asks_for_the_code_and_refuses_a_wrong_one() -> None:
    make_user("alice")
    # alice turns it on after signing in with her password (no code needed before she has an authenticator).
    client = Client()
    assert password_sign_in(client, "alice")["Location"] == "/"
    secret = enrol(client)
    client.post("/logout/")

    after_password = password_sign_in(client, "alice", next_url="/jobs/")

    assert (after_password.status_code, after_password["Location"]) == (302, "/login/code/")
    assert signed_in(client) is None
    assert client.get("/jobs/")["Location"] == "/login/?next=/jobs/"
    assert "Now type the code your authenticator app shows" in client.get("/login/code/").content.decode()

    wrong = client.post("/login/code/", {"code": wrong_code_for(secret)})

    assert wrong.status_code == 400
    assert WRONG_CODE in wrong.content.decode()
    assert signed_in(client) is None

    # The code that turned it on was used then; the app's next one is accepted (a period either side counts).
    right = client.post("/login/code/", {"code": code_for(secret, periods_from_now=1)})

    assert (right.status_code, right["Location"]) == (302, "/jobs/")
    assert signed_in(client) is not None
    assert client.get("/jobs/").status_code == 200

    # A code works once: someone who saw it cannot sign in with it again.
    other = Client()
    password_sign_in(other, "alice")
    assert other.post("/login/code/", {"code": code_for(secret, periods_from_now=1)}).status_code == 400
    assert signed_in(other) is None


def test_guessing_codes_is_slowed_like_guessing_passwords(settings: Any) -> None:
    settings.LOGIN_ACCOUNT_FREE_FAILURES = 5  # production's (tests/settings.py relaxes it)
    alice = make_user()
    enrolled = Client()
    enrolled.force_login(alice)
    secret = enrol(enrolled)
    # An address no other test has used: the cache outlives tests.
    client = Client(REMOTE_ADDR=f"2001:db8::{uuid.uuid4().hex[:4]}")
    password_sign_in(client, alice.username)

    wrong = [client.post("/login/code/", {"code": wrong_code_for(secret)}).status_code for _ in range(6)]
    held_back = client.post("/login/code/", {"code": code_for(secret, periods_from_now=1)})

    assert wrong == [400] * 5 + [429]
    assert (held_back.status_code, held_back["Retry-After"]) == (429, "30")
    assert signed_in(client) is None


def test_the_code_step_needs_a_right_password_first() -> None:
    client = Client()

    response = client.post("/login/code/", {"code": "123456"})

    assert (response.status_code, response["Location"]) == (302, "/login/")
    assert signed_in(client) is None


def test_a_password_alone_cannot_get_past_the_second_factor_elsewhere() -> None:
    alice = make_user("alice", is_staff=True)
    enrolled = Client()
    enrolled.force_login(alice)
    enrol(enrolled)
    client = Client()

    # The Django admin's own form checks the password only: the session it makes is ended at once.
    client.post("/admin/login/", {"username": "alice", "password": PASSWORD, "next": "/admin/"})
    admin = client.get("/admin/")
    tokens = client.post(
        "/api/v1/tokens/", {"name": "ci", "username": "alice", "password": PASSWORD}, content_type="application/json"
    )

    assert (admin.status_code, admin["Location"]) == (302, "/login/?next=%2Fadmin%2F")
    assert signed_in(client) is None
    assert (tokens.status_code, tokens.json()["message"]) == (403, TWO_FACTOR_TOKENS)
    assert not alice.api_tokens.exists()


@pytest.fixture
def required_for_staff(settings: Any) -> None:
    settings.PORTAL_MFA_REQUIRED_FOR_STAFF = True


def test_staff_who_must_have_it_are_sent_to_set_it_up_first(required_for_staff: None) -> None:
    make_user("sam", is_staff=True)
    make_user("mia")
    client = Client()

    assert password_sign_in(client, "sam")["Location"] == "/"
    home, api = client.get("/"), client.get("/api/v1/me/")
    setup = client.get("/account/two-factor/")

    assert (home.status_code, home["Location"]) == (302, "/account/two-factor/")
    assert api.status_code == 403
    assert api.json() == {
        "code": "two_factor_required",
        "message": "This portal requires two-factor sign-in for staff: set it up to go on.",
        "fields": {},
    }
    assert setup.status_code == 200
    assert "This portal requires two-factor sign-in for staff: set it up to go on." in setup.content.decode()

    enrol(client)

    assert client.get("/").status_code == 200
    refused = client.post("/account/two-factor/", {"action": "disable"})
    assert "it cannot be turned off" in refused.content.decode()
    assert Authenticator.objects.filter(user__username="sam").exists()

    # Others are not asked to.
    others = Client()
    password_sign_in(others, "mia")
    assert others.get("/").status_code == 200


def test_staff_signed_in_through_a_provider_are_left_to_the_providers_second_factor(required_for_staff: None) -> None:
    client = Client()
    client.force_login(make_user("sam", is_staff=True))
    session = client.session
    session[PROVIDER_SIGN_IN_KEY] = {"provider": "university"}
    session.save()

    assert client.get("/").status_code == 200


def test_it_can_be_turned_off_where_not_required() -> None:
    client = Client()
    client.force_login(make_user("alice"))
    enrol(client)

    client.post("/account/two-factor/", {"action": "disable"})

    assert not Authenticator.objects.exists()
    assert AuditEvent.objects.filter(action="user.two_factor_disabled").count() == 1
    client.post("/logout/")
    assert password_sign_in(client, "alice")["Location"] == "/"


@pytest.mark.django_db(transaction=True)
def test_in_the_browser_turning_it_on_and_signing_in_with_a_code(open_page: Any, screenshot: Screenshots) -> None:
    alice = make_user("alice")
    page = open_page(alice)
    page.goto("/")
    page.get_by_role("link", name="Two-factor").click()
    expect(page.get_by_role("heading", name="Two-factor sign-in", level=1)).to_be_visible()
    assert page.get_by_role("img", name="QR code for your authenticator app").is_visible()
    screenshot(page, "set-up")
    secret = page.locator("#two-factor-secret").inner_text()
    page.get_by_role("textbox", name="Code").fill(code_for(secret))
    page.get_by_role("button", name="Turn two-factor sign-in on").click()
    expect(page.get_by_text("Two-factor sign-in is on: you will be asked for a code")).to_be_visible()

    page.get_by_role("button", name="Log out").click()
    page.goto("/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/login/code/")
    page.get_by_role("textbox", name="Code").fill(wrong_code_for(secret))
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text(WRONG_CODE)
    screenshot(page, "wrong-code")
    # The code that turned it on counts as used; the app's next one is accepted (a period either side counts).
    page.get_by_role("textbox", name="Code").fill(code_for(secret, periods_from_now=1))
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Dashboard", level=1)).to_be_visible()
