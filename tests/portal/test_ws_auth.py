"""WebSockets authenticated by API token, through the whole ASGI application."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from tenants.services import token_create, token_revoke
from tests.factories import make_user
from tests.websockets import handshake

pytestmark = pytest.mark.django_db(transaction=True)


async def _connects(authorization: str | None) -> bool:
    from portal.asgi import application

    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    communicator = WebsocketCommunicator(application, "/ws/clusters/", headers=headers)
    connected, _ = await handshake(communicator, timeout=5)
    await communicator.disconnect()
    return bool(connected)


def test_a_live_token_opens_a_websocket_and_a_revoked_one_does_not() -> None:
    user = make_user("ws-token-user")
    token, secret = token_create(user=user, name="socket")
    assert async_to_sync(_connects)(f"Bearer {secret}") is True
    assert async_to_sync(_connects)("Bearer gpp_not-a-real-token") is False
    assert async_to_sync(_connects)(None) is False
    token_revoke(actor=user, token=token)
    assert async_to_sync(_connects)(f"Bearer {secret}") is False


def test_a_refusal_is_a_close_code_after_the_handshake_not_an_http_403() -> None:
    """Browsers see no close code when the handshake itself is refused (a bare HTTP 403): the portal accepts
    and then closes with the code."""

    async def answer() -> tuple[bool, dict[str, object]]:
        from portal.asgi import application

        headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
        communicator = WebsocketCommunicator(application, "/ws/clusters/", headers=headers)
        accepted, _ = await communicator.connect(timeout=5)
        closing = await communicator.receive_output(timeout=5)
        await communicator.disconnect()
        return bool(accepted), closing

    assert async_to_sync(answer)() == (True, {"type": "websocket.close", "code": 4401})
