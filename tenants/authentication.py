"""`Authorization: Bearer <token>` for the REST API, with tokens from `POST /api/v1/tokens/` or an OpenID
provider's access tokens (JWT; tenants/provider_tokens.py).

Unknown, expired and revoked tokens count towards the client address's token-guessing limit
(tenants/throttles.py); over it, every bearer request of that address gets 429 until the window has room.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants.provider_tokens import BearerTokenRefused, bearer_authenticate
from tenants.throttles import TokenGuessingThrottled, TokenGuessThrottle, request_address


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, secret = header.partition(" ")
        if keyword.lower() != self.keyword.lower():
            return None
        secret = secret.strip()
        if not secret or " " in secret:
            raise exceptions.AuthenticationFailed("Malformed Authorization header; send 'Bearer <token>'")
        throttle, address = TokenGuessThrottle(), request_address(request)
        wait = throttle.blocked_for(address)
        if wait is not None:
            raise TokenGuessingThrottled(wait)
        try:
            return bearer_authenticate(secret=secret)
        except BearerTokenRefused as refused:
            throttle.record_failure(address)
            raise exceptions.AuthenticationFailed(str(refused)) from None

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) to requests without credentials.
        return f'{self.keyword} realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Documents the bearer scheme in the OpenAPI schema (and the docs' Authorize button)."""

    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from POST /api/v1/tokens/, or an access token (JWT) of a configured OpenID "
            "provider for the portal's API audience.",
        }
