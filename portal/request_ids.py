"""The request id: one per HTTP request or WebSocket, in every log line written for it and in what it stores.

Taken from the proxy's `X-Request-ID` when it is well formed (nginx sends its own, or a well-formed one from a
balancer in front: deploy/nginx.conf.template), else made here; bound to the logging context for the request
(portal/logs.py) and sent back in the response's `X-Request-ID`. What a request stores keeps it (a job's row,
an audit event), so the worker that delivers a job hours later still logs the id of the request that submitted
it. README, "Logs and tracing a job".
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from structlog.contextvars import bound_contextvars, get_contextvars

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
# Where the request keeps its id, for what is logged about it after the middleware has returned: Django logs a
# 4xx or 5xx answer ("Not Found: /path") with the request, outside every middleware (portal/logs.py reads it).
REQUEST_ID_META_KEY = "PORTAL_REQUEST_ID"
REQUEST_ID_MAX_LENGTH = 64
# Letters, digits and a few separators: enough for UUIDs, nginx's hex ids and most balancers' ids; nothing that
# could forge a log line or a shell word.
_WELL_FORMED = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{REQUEST_ID_MAX_LENGTH - 1}}}")


def request_id_accept(given: str | None) -> str:
    """`given` when it is a well-formed request id, else a new one."""
    if given and _WELL_FORMED.fullmatch(given):
        return given
    return uuid.uuid4().hex


def current_request_id() -> str:
    """The id of the request (or the task's originating request) being served; "" outside any."""
    return str(get_contextvars().get("request_id") or "")


View = Callable[[HttpRequest], HttpResponse]


def request_id_middleware(get_response: View) -> View:
    """Binds the request's id for everything that runs (and logs) on its behalf; first in MIDDLEWARE."""

    def middleware(request: HttpRequest) -> HttpResponse:
        request_id = request_id_accept(request.META.get("HTTP_X_REQUEST_ID"))
        request.META[REQUEST_ID_META_KEY] = request_id
        with bound_contextvars(request_id=request_id):
            response = get_response(request)
        response[REQUEST_ID_HEADER] = request_id
        return response

    return middleware


class WebsocketRequestIdMiddleware:
    """The same for a WebSocket: its id is bound for the connection's whole life, and its opening is logged."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        with bound_contextvars(request_id=request_id_accept(given)):
            logger.info("websocket connect %s", scope.get("path", ""))
            return await self.inner(scope, receive, send)
