"""The channel layer as the servers configure it, against the real Redis."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer


@pytest.mark.asyncio
async def test_hundreds_of_websockets_join_their_groups_at_once() -> None:
    # Each handshake joins its groups over a connection of its own; with redis-py's default cap of 100 per pool
    # the 101st at the same moment failed ("Too many connections") and its viewer got HTTP 500.
    layer = get_channel_layer()
    channels = [await layer.new_channel() for _ in range(300)]
    try:
        await asyncio.gather(*(layer.group_add("burst-test", channel) for channel in channels))
    finally:
        await asyncio.gather(*(layer.group_discard("burst-test", channel) for channel in channels))
