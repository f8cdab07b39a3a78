"""Bearer tokens for the REST API and WebSockets: the portal's own (`gpp_...`) and the OpenID providers' access
tokens (JWT), so that pipelines can use the institution's machine identities.

A provider's access token is accepted only from a provider of PORTAL_OIDC_PROVIDERS with an `api_audience`, and
only when its issuer is that provider, its audience is that API audience, it has not expired, and its signature
matches a key the provider publishes (its JWKS, fetched through PyJWKClient, cached, and fetched again when a
token names a key it has not seen: the provider rotated its keys). It acts as the portal user the provider's
account is connected to (the `sub` of a sign-in through that provider), or, with `api_user_claim`, the user
that claim names (e.g. `preferred_username` for a machine identity an admin made a portal account for).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

import jwt
import requests
from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

from tenants.models import ApiToken
from tenants.services import TOKEN_PREFIX, token_authenticate

# Signature algorithms a provider's access tokens may use (never "none", never a symmetric one: the key is public).
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
DISCOVERY_CACHE_SECONDS = 3600
JWKS_CACHE_SECONDS = 300
HTTP_TIMEOUT_SECONDS = 5


class BearerTokenRefused(Exception):
    """The bearer token is not accepted; the message says why, for the client."""


@dataclass(frozen=True)
class ProviderAccessToken:
    """A provider's access token the portal accepted (DRF's `request.auth` for it)."""

    provider_id: str
    claims: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class _TokenIssuer:
    provider_id: str
    name: str
    issuer: str
    audience: str
    user_claim: str


def _issuers() -> dict[str, _TokenIssuer]:
    providers = cast(dict[str, Any], settings.SOCIALACCOUNT_PROVIDERS)
    apps: list[dict[str, Any]] = providers.get("openid_connect", {}).get("APPS", [])
    issuers = {}
    for app in apps:
        app_settings = app.get("settings", {})
        if app_settings.get("api_audience"):
            issuer = _TokenIssuer(
                provider_id=app["provider_id"],
                name=app["name"],
                issuer=app_settings["server_url"].rstrip("/"),
                audience=app_settings["api_audience"],
                user_claim=app_settings.get("api_user_claim") or "sub",
            )
            issuers[issuer.issuer] = issuer
    return issuers


_lock = threading.Lock()
_jwks_uris: dict[str, tuple[str, float]] = {}
_jwks_clients: dict[str, jwt.PyJWKClient] = {}


def _jwks_client(issuer: str) -> jwt.PyJWKClient:
    """The provider's keys: its discovery document read at most once an hour, its JWKS cached by PyJWKClient."""
    with _lock:
        known = _jwks_uris.get(issuer)
    if known is None or time.monotonic() - known[1] > DISCOVERY_CACHE_SECONDS:
        answer = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=HTTP_TIMEOUT_SECONDS)
        answer.raise_for_status()
        known = (str(answer.json()["jwks_uri"]), time.monotonic())
        with _lock:
            _jwks_uris[issuer] = known
    with _lock:
        client = _jwks_clients.get(known[0])
        if client is None:
            client = _jwks_clients[known[0]] = jwt.PyJWKClient(
                known[0], cache_keys=True, lifespan=JWKS_CACHE_SECONDS, timeout=HTTP_TIMEOUT_SECONDS
            )
    return client


# Why PyJWT refused an access token, for the client that sent it.
_PROBLEMS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "it has expired; get a new one from {provider}"),
    (jwt.InvalidAudienceError, "it was issued for another API, not for this portal (audience {audience})"),
    (jwt.InvalidSignatureError, "its signature does not match the keys {provider} publishes"),
    (jwt.ImmatureSignatureError, "it is not valid yet (a clock is wrong)"),
    (jwt.MissingRequiredClaimError, "it lacks a claim the portal needs: {error}"),
    (jwt.PyJWKClientConnectionError, "{provider}'s keys could not be fetched to check it; try again"),
    (jwt.PyJWKClientError, "it was not signed with a key {provider} publishes"),
    (jwt.InvalidTokenError, "it is not a valid token: {error}"),
)


def _refused(problem: str) -> BearerTokenRefused:
    return BearerTokenRefused(f"This access token was refused: {problem}.")


def provider_token_authenticate(*, token: str) -> tuple[User, ProviderAccessToken]:
    """The portal user a provider's access token acts as, or BearerTokenRefused saying why."""
    try:
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        raise _refused("it is neither a portal token nor a readable JWT") from None
    issuer = _issuers().get(str(unverified.get("iss", "")).rstrip("/"))
    if issuer is None:
        raise _refused("it was not issued by a provider this portal accepts access tokens from")
    try:
        key = _jwks_client(issuer.issuer).get_signing_key_from_jwt(token)
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=ALGORITHMS,
            audience=issuer.audience,
            issuer=unverified["iss"],
            options={"require": ["exp", "iss", "aud", "sub"]},
        )
    except requests.RequestException as error:
        raise _refused(f"{issuer.name} could not be reached to check it ({type(error).__name__}); try again") from None
    except (jwt.InvalidTokenError, jwt.PyJWKClientError) as error:
        problem = next(text for kind, text in _PROBLEMS if isinstance(error, kind))
        raise _refused(problem.format(provider=issuer.name, audience=issuer.audience, error=error)) from None
    user = _user_for(issuer, claims)
    return user, ProviderAccessToken(provider_id=issuer.provider_id, claims=claims)


def _user_for(issuer: _TokenIssuer, claims: dict[str, Any]) -> User:
    if issuer.user_claim == "sub":
        account = (
            SocialAccount.objects.filter(provider=issuer.provider_id, uid=str(claims["sub"]))
            .select_related("user")
            .first()
        )
        user = account.user if account is not None else None
        unknown = f"its subject '{claims['sub']}' is not connected to a portal account (sign in to the portal once)"
    else:
        name = claims.get(issuer.user_claim)
        user = get_user_model().objects.filter(username=str(name)).first() if name else None
        unknown = f"its '{issuer.user_claim}' claim ({name!r}) names no portal account"
    if not isinstance(user, User):
        raise _refused(unknown)
    if not user.is_active:
        raise _refused("its portal account is deactivated")
    return user


def bearer_authenticate(*, secret: str) -> tuple[User, ApiToken | ProviderAccessToken]:
    """Who an `Authorization: Bearer <secret>` is: a portal token's user, or a provider access token's."""
    if secret.count(".") == 2 and not secret.startswith(TOKEN_PREFIX):
        return provider_token_authenticate(token=secret)
    api_token = token_authenticate(secret=secret)
    if api_token is None:
        raise BearerTokenRefused("This token is unknown, expired or revoked; create a new one")
    return api_token.user, api_token
