"""Sending to the channel layer from synchronous code (web requests, Celery tasks, the job sync).

`async_to_sync` starts an event loop for every call, and channels_redis keeps its Redis connections per event
loop: each push paid a thread hop, a new loop and a new Redis connection (about 3 ms of a worker's CPU for one
job's push, bench/job_submission.py). Here one daemon thread per process runs one loop for the process's life,
so the layer's connections are made once and reused. A forked child (gunicorn and Celery workers) starts its
own thread on its first send.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterable
from typing import Any

from channels.layers import get_channel_layer

# A send waits at most this long for Redis (the layer's socket timeout is 30 s, portal/settings.py).
SEND_TIMEOUT_SECONDS = 35

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0


def group_send_all(sends: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """`group_send` each (group, message) in order, from synchronous code; raises what the layer raises (Redis
    down), which callers log: the database holds the truth, and watchers re-read it when they connect."""
    layer = get_channel_layer()
    pending = list(sends)
    if layer is None or not pending:
        return
    future = asyncio.run_coroutine_threadsafe(_send_all(layer, pending), _process_loop())
    future.result(timeout=SEND_TIMEOUT_SECONDS)


async def _send_all(layer: Any, sends: list[tuple[str, dict[str, Any]]]) -> None:
    for group, message in sends:
        await layer.group_send(group, message)


def _process_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="channel-layer-sends", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop
