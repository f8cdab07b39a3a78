"""How the portal answered a WebSocket handshake, as a client sees it.

The portal refuses a WebSocket by accepting it and closing it at once with a code (4400, 4401, 4403, 4404;
portal.ws_auth.websocket_refuse), so that browsers see the code; only a foreign `Origin` is refused at the
handshake itself (HTTP 403, which the test communicator reports as a close before accepting).
"""

from __future__ import annotations

from channels.testing import WebsocketCommunicator

# A refusal's close follows its accept at once, in the same coroutine: this is ample for it to arrive.
REFUSAL_WAIT_SECONDS = 0.2


async def handshake(communicator: WebsocketCommunicator, timeout: float = 5) -> tuple[bool, int | None]:
    """(True, None) for an open WebSocket, (False, close code) for a refused one. What an open one sent first
    stays in the communicator's queue, in order, for the test to receive."""
    connected, code = await communicator.connect(timeout=timeout)
    if not connected:
        return False, code
    if await communicator.receive_nothing(timeout=REFUSAL_WAIT_SECONDS):
        return True, None
    queued = [await communicator.receive_output()]
    if queued[0]["type"] == "websocket.close":
        return False, queued[0].get("code")
    while not communicator.output_queue.empty():
        queued.append(communicator.output_queue.get_nowait())
    for message in queued:
        communicator.output_queue.put_nowait(message)
    return True, None
