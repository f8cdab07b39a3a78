"""The REST API and WebSockets with the provider's own access tokens (JWT), issued by the real demo provider
(tenants/provider_tokens.py): a machine identity's (client credentials) and a person's (authorization code with a
resource indicator). Refused tokens are real ones too: for another API, expired, or altered after issue.
"""

from __future__ import annotations

import json
import time
from base64 import urlsafe_b64decode, urlsafe_b64encode
from collections.abc import Callable
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.factories import make_user
from tests.oidc_provider import (
    API_AUDIENCE,
    CI_CLIENT_ID,
    CI_SHORT_CLIENT_ID,
    CLIENT_ID,
    OTHER_API_AUDIENCE,
    DemoProvider,
    sign_in,
    tokens_for,
)
from tests.websockets import handshake

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_provider(configure: Callable[..., Any]) -> Callable[..., Any]:
    """The demo provider, whose access tokens for API_AUDIENCE the portal accepts; `api_provider(**more)` sets
    more of its PORTAL_OIDC_PROVIDERS entry."""

    def apply(**more: Any) -> Any:
        return configure({"connect_existing_users": True, "api_audience": API_AUDIENCE, **more})

    apply()
    return apply


@pytest.fixture
def ci_user() -> Any:
    """A portal account for the CI pipeline, connected by an admin to its identity at the provider."""
    user = make_user("ci-bot")
    SocialAccount.objects.create(user=user, provider="demo", uid=CI_CLIENT_ID)
    SocialAccount.objects.create(user=user, provider="demo", uid=CI_SHORT_CLIENT_ID)
    return user


def me(token: str) -> Any:
    return Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {token}")


def refused_with(response: Any) -> str:
    assert response.status_code == 401, response.content
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert body["code"] == "authentication_failed"
    message, hint = str(body["message"]).split(" Log in, ", 1)
    assert hint == "or send 'Authorization: Bearer <token>' with a token from POST /api/v1/tokens/."
    return message


def test_a_machine_identitys_access_token_calls_the_api_as_its_portal_account(
    api_provider: Any, ci_user: Any, oidc_provider: DemoProvider
) -> None:
    response = me(oidc_provider.access_token())

    assert response.status_code == 200, response.content
    assert response.json()["username"] == "ci-bot"


def test_a_persons_access_token_calls_the_api_as_them(api_provider: Any, oidc_provider: DemoProvider) -> None:
    sign_in(Client(), "dana")  # connects her identity at the provider to her portal account
    answer = tokens_for(
        oidc_provider,
        client_id=CLIENT_ID,
        redirect_uri="http://testserver/oidc/demo/login/callback/",
        username="dana",
        resource=API_AUDIENCE,
    )

    response = me(answer["access_token"])

    assert response.status_code == 200, response.content
    assert response.json()["username"] == "dana"


def test_the_user_may_be_named_by_another_claim(api_provider: Any, oidc_provider: DemoProvider) -> None:
    api_provider(api_user_claim="preferred_username")
    make_user(CI_CLIENT_ID)

    assert me(oidc_provider.access_token()).json()["username"] == CI_CLIENT_ID


def test_a_token_for_another_api_is_refused(api_provider: Any, ci_user: Any, oidc_provider: DemoProvider) -> None:
    token = oidc_provider.access_token(resource=OTHER_API_AUDIENCE)

    assert refused_with(me(token)) == (
        f"This access token was refused: it was issued for another API, not for this portal (audience {API_AUDIENCE})."
    )


def test_an_expired_token_is_refused(api_provider: Any, ci_user: Any, oidc_provider: DemoProvider) -> None:
    token = oidc_provider.access_token(client_id=CI_SHORT_CLIENT_ID)  # lives one second
    time.sleep(2.1)

    assert refused_with(me(token)) == (
        "This access token was refused: it has expired; get a new one from Demo identity provider."
    )


def test_a_tampered_token_is_refused(api_provider: Any, ci_user: Any, oidc_provider: DemoProvider) -> None:
    header, payload, signature = oidc_provider.access_token().split(".")
    claims = json.loads(urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged = urlsafe_b64encode(json.dumps(claims | {"sub": "dana"}).encode()).rstrip(b"=").decode()
    flipped = ("A" if signature[10] != "A" else "B").join((signature[:10], signature[11:]))

    for token in (f"{header}.{forged}.{signature}", f"{header}.{payload}.{flipped}"):
        assert refused_with(me(token)) == (
            "This access token was refused: its signature does not match the keys Demo identity provider publishes."
        )


def test_tokens_of_a_provider_without_an_api_audience_are_refused(
    configure: Callable[..., Any], ci_user: Any, oidc_provider: DemoProvider
) -> None:
    assert refused_with(me(oidc_provider.access_token())) == (
        "This access token was refused: it was not issued by a provider this portal accepts access tokens from."
    )


def test_a_token_whose_subject_has_no_portal_account_is_refused(api_provider: Any, oidc_provider: DemoProvider) -> None:
    assert refused_with(me(oidc_provider.access_token())) == (
        "This access token was refused: its subject 'ci-pipeline' is not connected to a portal account (sign in to "
        "the portal once)."
    )


async def _connects(authorization: str) -> bool:
    from portal.asgi import application

    communicator = WebsocketCommunicator(
        application, "/ws/clusters/", headers=[(b"host", b"127.0.0.1:8000"), (b"authorization", authorization.encode())]
    )
    connected, _ = await handshake(communicator, timeout=5)
    await communicator.disconnect()
    return bool(connected)


@pytest.mark.django_db(transaction=True)
def test_a_websocket_opens_with_a_providers_access_token(
    api_provider: Any, ci_user: Any, oidc_provider: DemoProvider
) -> None:
    token = oidc_provider.access_token()

    assert async_to_sync(_connects)(f"Bearer {token}") is True
    assert async_to_sync(_connects)(f"Bearer {oidc_provider.access_token(resource=OTHER_API_AUDIENCE)}") is False
