"""WebSocket handshakes: who may open one (the origin rule) and who they are (session or API token).

A bearer token is the portal's own or an OpenID provider's access token (tenants/provider_tokens.py).
Browsers authenticate WebSockets with their session cookie (Channels' AuthMiddlewareStack). A browser sends
that cookie whatever page opens the socket, so a cookie is trusted only with an `Origin` of the portal's own
hosts (ALLOWED_HOSTS): a page on another site is refused before any consumer runs (cross-site WebSocket
hijacking). Browsers always send `Origin` on a WebSocket handshake and cannot be made to send
`Authorization`; scripts are the other way round. So a handshake without `Origin` is accepted only when it
carries `Authorization: Bearer <token>`, and then the token alone says who it is: the session cookie is
ignored, and a revoked, expired or unknown token leaves the connection anonymous (consumers refuse
anonymous users with 4401). A foreign `Origin` is refused even with a token.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.middleware import BaseMiddleware
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser

from tenants.provider_tokens import BearerTokenRefused, bearer_authenticate
from tenants.throttles import TokenGuessThrottle, client_address


def bearer_secret(headers: dict[bytes, bytes]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None without one."""
    keyword, _, secret = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if keyword.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


@database_sync_to_async  # type: ignore[untyped-decorator]
def _user_for(secret: str, address: str | None) -> Any:
    """The token's user, or an anonymous one; failures count towards the address's token-guessing limit."""
    throttle = TokenGuessThrottle()
    if throttle.blocked_for(address) is not None:
        return AnonymousUser()
    try:
        user, _token = bearer_authenticate(secret=secret)
    except BearerTokenRefused:
        throttle.record_failure(address)
        return AnonymousUser()
    return user


def _websocket_address(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str | None:
    remote = scope.get("client") or (None,)
    forwarded = headers.get(b"x-forwarded-for")
    return client_address(remote_addr=remote[0], forwarded_for=forwarded.decode("latin-1") if forwarded else None)


class BearerTokenWebsocketMiddleware(BaseMiddleware):  # type: ignore[misc]
    """With a bearer token the scope's user is the token's, or anonymous: never the session's."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        secret = bearer_secret(headers)
        if secret is not None:
            scope = dict(scope, user=await _user_for(secret, _websocket_address(scope, headers)))
        return await super().__call__(scope, receive, send)


class SameOriginOrBearerValidator:
    """Browsers from the portal's own hosts, and scripts with a bearer token and no `Origin`; nobody else."""

    def __init__(self, application: Any) -> None:
        self.application = application
        self.browsers = AllowedHostsOriginValidator(application)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        if b"origin" not in headers and bearer_secret(headers) is not None:
            return await self.application(scope, receive, send)
        return await self.browsers(scope, receive, send)


async def websocket_refuse(consumer: AsyncWebsocketConsumer, code: int) -> None:
    """Refuse a WebSocket with a close code the client can read (4400, 4401, 4403, 4404): accepted, then closed
    at once. Closing before accepting would make the server answer the handshake with a bare HTTP 403, which
    browsers report without any code."""
    await consumer.accept()
    await consumer.close(code=code)


class UnknownWebsocketRoute(AsyncWebsocketConsumer):  # type: ignore[misc]
    """Refuses a handshake for an address no route matches (`../` and the like) with 4404.

    Without it the router raises, and the server logs a crash for what is only a wrong address.
    """

    async def connect(self) -> None:
        await websocket_refuse(self, 4404)
