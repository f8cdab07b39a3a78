"""Past what the machine can serve, a request waits briefly and then gets 503 with Retry-After, never a 500.

Two ways a request meets overload:
- It waited in line too long before a web worker took it: the proxy stamps when it passed the request on
  (`X-Request-Start: t=<seconds since the epoch>`, deploy/nginx.conf.template), and a request that waited longer
  than PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS is answered 503 at once (code `overloaded`), before any view or query
  runs: its client has likely given up or will retry, and serving it would only make the requests behind it
  wait longer too. Here.
- PostgreSQL cannot give it a connection: 503 (code `database_unavailable`) instead of the 500 Django would
  answer; `portal.api_errors.handler500`.
Both answer in the API's error shape under /api/, as a short page elsewhere, with `Retry-After`
(PORTAL_RETRY_AFTER_SECONDS): clients that honour it come back when the burst is over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from portal.api_errors import service_unavailable

logger = logging.getLogger(__name__)

View = Callable[[HttpRequest], HttpResponse]

OVERLOADED = "The portal is busier than it can serve right now; send the request again after {seconds} seconds."


def queued_seconds(request: HttpRequest, *, now: float) -> float | None:
    """How long the request waited between the proxy and this process; None without a trusted proxy's stamp."""
    if not settings.REST_FRAMEWORK.get("NUM_PROXIES"):
        return None  # no proxy in front: the header would be the client's own, and mean nothing
    stamp = request.META.get("HTTP_X_REQUEST_START", "")
    try:
        started = float(stamp.removeprefix("t="))
    except ValueError:
        return None
    return max(0.0, now - started)


def overload_shed(get_response: View) -> View:
    """Middleware, outside everything that reads the database: a request that waited in line longer than
    PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS is answered 503 at once."""

    def middleware(request: HttpRequest) -> HttpResponse:
        limit = settings.PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS
        waited = queued_seconds(request, now=time.time())
        if limit and waited is not None and waited > limit:
            logger.warning("%s %s waited %.1f s in line: answered 503", request.method, request.path, waited)
            return service_unavailable(request, code="overloaded", message=OVERLOADED)
        return get_response(request)

    return middleware
