"""Signing in through an OpenID provider, at the HTTP level, against the real demo provider (no mock of it).

The portal's side runs in the test process (Django's test client); the provider is scripts/oidc/provider.mjs.
Refused ID tokens are real ones the provider issued, altered on the way back from its token endpoint by a relay
(tests/oidc_provider.py), so the portal's own checks (allauth's, with the portal's nonce and signature rules)
are what refuse them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.models import AuditEvent
from tenants.oidc import SESSION_KEY
from tests.factories import make_user
from tests.oidc_provider import (
    OTHER_CLIENT_ID,
    OTHER_REDIRECT,
    SHORT_CLIENT_ID,
    DemoProvider,
    TokenRelay,
    come_back,
    id_token_for,
    refusal,
    sign_in,
    sign_in_at_provider,
    signed_in_username,
    start,
)

pytestmark = pytest.mark.django_db

# Signing in ---------------------------------------------------------------------------------------------


def test_the_sign_in_asks_for_a_code_with_pkce_a_state_and_a_nonce(
    configure: Callable[..., Any], oidc_provider: DemoProvider
) -> None:
    authorize = urlsplit(start(Client()))
    query = {key: values[0] for key, values in parse_qs(authorize.query).items()}

    assert f"{authorize.scheme}://{authorize.netloc}{authorize.path}" == f"{oidc_provider.issuer}/auth"
    assert query["response_type"] == "code"
    assert query["client_id"] == "gpuportal"
    assert query["redirect_uri"] == "http://testserver/oidc/demo/login/callback/"
    assert sorted(query["scope"].split()) == ["email", "groups", "openid", "profile"]
    assert query["code_challenge_method"] == "S256"
    assert len(query["code_challenge"]) == 43
    assert len(query["state"]) >= 16
    assert len(query["nonce"]) >= 32


def test_a_newcomers_first_sign_in_makes_their_account_and_audits_it(configure: Callable[..., Any]) -> None:
    browser = Client()

    response = sign_in(browser, "dana")

    assert (response.status_code, response["Location"]) == (302, "/")
    dana = get_user_model().objects.get(username="dana")
    assert (dana.email, dana.first_name, dana.last_name, dana.has_usable_password()) == (
        "dana@example.org",
        "Dana",
        "Diaz",
        False,
    )
    assert signed_in_username(browser) == "dana"
    assert browser.session[SESSION_KEY]["provider"] == "demo"
    event = AuditEvent.objects.get(action="user.created_by_sign_in")
    assert (event.actor, event.target_type, event.target_id) == (dana, "User", str(dana.pk))
    assert event.after == {
        "username": "dana",
        "email": "dana@example.org",
        "provider": "demo",
        "provider_name": "Demo identity provider",
        "subject": "dana",
    }
    account = SocialAccount.objects.get(user=dana)
    assert (account.provider, account.uid) == ("demo", "dana")
    assert account.extra_data["id_token"]["groups"] == ["acme-vision-members"]

    # The next sign-in finds the same account and makes nothing.
    again = Client()
    assert sign_in(again, "dana")["Location"] == "/"
    assert signed_in_username(again) == "dana"
    assert get_user_model().objects.filter(username="dana").count() == 1
    assert AuditEvent.objects.filter(action="user.created_by_sign_in").count() == 1


def test_the_sign_in_returns_to_the_page_asked_for(configure: Callable[..., Any]) -> None:
    browser = Client()

    back = sign_in_at_provider(start(browser, next="/jobs/"), username="dana")

    assert come_back(browser, back)["Location"] == "/jobs/"


def test_an_existing_username_is_connected_only_where_the_provider_is_trusted_for_it(
    configure: Callable[..., Any],
) -> None:
    alice = make_user("alice")
    configure({"connect_existing_users": False})

    refused = sign_in(Client(), "alice")

    assert refused.status_code == 403
    assert refusal(refused) == (
        "The username 'alice' already belongs to another portal account, which is not connected to your identity "
        "at Demo identity provider. Nobody was signed in; ask your portal admin to connect the two."
    )
    assert not SocialAccount.objects.exists()

    configure({"connect_existing_users": True})
    browser = Client()
    assert sign_in(browser, "alice")["Location"] == "/"
    assert signed_in_username(browser) == "alice"
    assert SocialAccount.objects.get(uid="alice").user == alice
    assert get_user_model().objects.filter(username="alice").count() == 1
    event = AuditEvent.objects.get(action="user.sign_in_connected")
    assert event.actor == alice
    assert event.after is not None
    assert (event.after["provider"], event.after["subject"]) == ("demo", "alice")


def test_a_deactivated_account_is_not_signed_in(configure: Callable[..., Any]) -> None:
    sign_in(Client(), "dana")
    get_user_model().objects.filter(username="dana").update(is_active=False)

    browser = Client()
    refused = sign_in(browser, "dana")

    assert refused.status_code == 403
    assert refusal(refused) == "Your portal account is deactivated. Nobody was signed in; ask your portal admin."
    assert signed_in_username(browser) is None


def test_opening_the_sign_in_address_only_offers_a_button(configure: Callable[..., Any]) -> None:
    browser = Client()

    response = browser.get("/oidc/demo/login/?next=/jobs/")

    assert response.status_code == 200
    page = " ".join(response.content.decode().split())
    assert '<form method="post"> <input type="hidden" name="csrfmiddlewaretoken"' in page
    assert '<button type="submit" class="button">Continue to Demo identity provider</button>' in page
    assert "socialaccount_states" not in browser.session  # nothing started until the button is pressed


def test_an_unknown_provider_is_not_found(configure: Callable[..., Any]) -> None:
    assert Client().post("/oidc/nobody/login/").status_code == 404
    assert Client().get("/oidc/nobody/login/callback/?code=x&state=y").status_code == 404


# Refusals -----------------------------------------------------------------------------------------------


@pytest.fixture
def relay(configure: Callable[..., Any], oidc_provider: DemoProvider) -> Any:
    """The portal's provider 'relayed': the demo provider, its token answers passing through a TokenRelay."""
    with TokenRelay(oidc_provider.configuration()["token_endpoint"]) as token_relay:
        apps = configure({"id": "relayed"})
        apps[0]["settings"]["openid_configuration_overrides"] = {"token_endpoint": token_relay.url}
        yield token_relay


def assert_refused_and_nobody_signed_in(browser: Client, response: Any) -> str:
    assert response.status_code == 401
    assert signed_in_username(browser) is None
    assert SESSION_KEY not in browser.session
    assert not get_user_model().objects.filter(username="dana").exists()
    return refusal(response)


def with_id_token(id_token: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda answer: answer | {"id_token": id_token}


def test_an_id_token_whose_signature_was_tampered_with_is_refused(relay: TokenRelay) -> None:
    def tamper(answer: dict[str, Any]) -> dict[str, Any]:
        header, payload, signature = answer["id_token"].split(".")
        flipped = ("A" if signature[10] != "A" else "B").join((signature[:10], signature[11:]))
        return answer | {"id_token": f"{header}.{payload}.{flipped}"}

    relay.alter = tamper
    browser = Client()

    message = assert_refused_and_nobody_signed_in(browser, sign_in(browser, "dana", "relayed"))

    assert message.startswith(
        "The identity token from Demo identity provider was refused: its signature does not match the keys Demo "
        "identity provider publishes: it was altered. Nobody was signed in;"
    )
    assert len(relay.answers) == 1  # the provider did issue a token; the portal refused the altered one


def test_an_id_token_issued_for_another_application_is_refused(relay: TokenRelay, oidc_provider: DemoProvider) -> None:
    foreign = id_token_for(oidc_provider, client_id=OTHER_CLIENT_ID, redirect_uri=OTHER_REDIRECT, username="dana")
    relay.alter = with_id_token(foreign)
    browser = Client()

    message = assert_refused_and_nobody_signed_in(browser, sign_in(browser, "dana", "relayed"))

    assert "was refused: it was issued for another application, not for this portal." in message


def test_an_expired_id_token_is_refused(configure: Callable[..., Any], oidc_provider: DemoProvider) -> None:
    # The provider's ID tokens for this client live one second; the relay hands this one on two seconds late.
    with TokenRelay(oidc_provider.configuration()["token_endpoint"]) as slow:
        apps = configure({"id": "short", "client_id": SHORT_CLIENT_ID})
        apps[0]["settings"]["openid_configuration_overrides"] = {"token_endpoint": slow.url}
        slow.delay_seconds = 2.2
        browser = Client()

        message = assert_refused_and_nobody_signed_in(browser, sign_in(browser, "dana", "short"))

    assert "was refused: it has expired (the sign-in took too long, or a clock is wrong)." in message


def test_an_id_token_of_another_sign_in_is_refused_by_its_nonce(relay: TokenRelay) -> None:
    # A token of dana's earlier sign-in through the portal itself: signed, for this portal, not expired.
    earlier = Client()
    assert sign_in(earlier, "dana", "relayed").status_code == 302
    earlier_token = relay.answers[-1]["id_token"]
    get_user_model().objects.filter(username="dana").delete()
    relay.alter = with_id_token(earlier_token)
    browser = Client()

    message = assert_refused_and_nobody_signed_in(browser, sign_in(browser, "dana", "relayed"))

    assert "was refused: it belongs to another sign-in than this one (its nonce differs): a replay." in message


STATE_PROBLEM = (
    "This answer from Demo identity provider does not belong to a sign-in started in this browser: it was already "
    "used, is more than 10 minutes old, or was started elsewhere. Nobody was signed in; start again from the login "
    "page."
)


def test_a_replayed_answer_is_refused(configure: Callable[..., Any]) -> None:
    browser = Client()
    callback = sign_in_at_provider(start(browser), username="dana")
    assert come_back(browser, callback)["Location"] == "/"
    browser.logout()

    # The same answer again, in the same browser and in another: its state was used up by the first.
    for replaying in (browser, Client()):
        response = come_back(replaying, callback)
        assert response.status_code == 401
        assert refusal(response) == STATE_PROBLEM
        assert signed_in_username(replaying) is None


def test_an_answer_with_another_state_is_refused(configure: Callable[..., Any]) -> None:
    browser = Client()
    callback = sign_in_at_provider(start(browser), username="dana")
    parts = urlsplit(callback)
    query = {key: values[0] for key, values in parse_qs(parts.query).items()}

    response = browser.get(parts.path, {**query, "state": "not-the-state-the-portal-sent"})

    assert_refused_and_nobody_signed_in(browser, response)
    assert refusal(response) == STATE_PROBLEM
    # The real state still works once: the forged answer did not use it up.
    assert come_back(browser, callback)["Location"] == "/"


def test_an_answer_without_a_code_says_what_the_provider_said(configure: Callable[..., Any]) -> None:
    browser = Client()
    state = parse_qs(urlsplit(start(browser)).query)["state"][0]

    response = browser.get(
        "/oidc/demo/login/callback/", {"state": state, "error": "access_denied", "error_description": "no thanks"}
    )

    assert response.status_code == 401
    assert refusal(response) == "You cancelled the sign-in at Demo identity provider. Nobody was signed in."


# Logging out --------------------------------------------------------------------------------------------


def test_logging_out_after_a_provider_sign_in_signs_out_at_the_provider_too(
    configure: Callable[..., Any], oidc_provider: DemoProvider
) -> None:
    browser = Client()
    sign_in(browser, "dana")
    id_token = browser.session[SESSION_KEY]["id_token"]

    response = browser.post("/logout/")

    assert response.status_code == 302
    end_session = urlsplit(response["Location"])
    assert f"{end_session.scheme}://{end_session.netloc}{end_session.path}" == f"{oidc_provider.issuer}/session/end"
    assert {key: values[0] for key, values in parse_qs(end_session.query).items()} == {
        "client_id": "gpuportal",
        "post_logout_redirect_uri": "http://testserver/login/",
        "id_token_hint": id_token,
    }
    assert signed_in_username(browser) is None
    # The provider accepts it (no error page): this client holds no session there, so it ends at once.
    accepted = httpx.get(response["Location"], timeout=10)
    assert accepted.status_code == 200
    assert f'action="{oidc_provider.issuer}/session/end/confirm"' in accepted.text


def test_logging_out_after_a_password_sign_in_stays_in_the_portal(configure: Callable[..., Any]) -> None:
    browser = Client()
    browser.force_login(make_user("erin"))

    response = browser.post("/logout/")

    assert (response.status_code, response["Location"]) == (302, "/login/")
