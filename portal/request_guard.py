"""Refuse requests that carry a NUL character in the address or a cookie, before any view runs.

PostgreSQL text cannot hold NUL, so `/api/v1/tenants/a%00b/` (or such a session cookie) made the first query
that used it fail with a 500. Serializers and forms already refuse NUL in the values they read; this covers
what reaches the database without them: path parameters, raw query parameters and cookies.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from portal.api_errors import error_body

NUL = "\x00"
MESSAGE = "The request contains a NUL character (%00) in its {where}; remove it and send the request again."


def _where_nul(request: HttpRequest) -> str | None:
    if NUL in request.path:
        return "address"
    if any(NUL in text for key, values in request.GET.lists() for text in (key, *values)):
        return "query string"
    if any(NUL in key or NUL in value for key, value in request.COOKIES.items()):
        return "cookies"
    return None


View = Callable[[HttpRequest], HttpResponse]


def nul_characters_refused(get_response: View) -> View:
    def middleware(request: HttpRequest) -> HttpResponse:
        where = _where_nul(request)
        if where is None:
            return get_response(request)
        message = MESSAGE.format(where=where)
        if request.path.startswith("/api/"):
            return JsonResponse(error_body(code="invalid", message=message), status=400)
        return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")

    return middleware
