"""WebSocket authentication by API token, for clients that are not browsers.

Browsers authenticate WebSockets with their session cookie (Channels' AuthMiddlewareStack). Scripts send
`Authorization: Bearer <token>` in the handshake, as they do for the REST API; a revoked or expired
token leaves the connection anonymous, and consumers refuse anonymous users.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware

from tenants.services import token_authenticate


@database_sync_to_async  # type: ignore[untyped-decorator]
def _user_for(secret: str) -> Any:
    token = token_authenticate(secret=secret)
    return token.user if token is not None else None


class BearerTokenWebsocketMiddleware(BaseMiddleware):  # type: ignore[misc]
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        keyword, _, secret = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if keyword.lower() == "bearer" and secret.strip():
            user = await _user_for(secret.strip())
            if user is not None:
                scope = dict(scope, user=user)
        return await super().__call__(scope, receive, send)
