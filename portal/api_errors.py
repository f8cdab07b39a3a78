"""One JSON shape for every API error: `{"code": ..., "message": ..., "fields": {...}}`.

`message` is one sentence a person can act on; `fields` maps each input field to its problems (empty when
the error is not about a field; `non_field_errors` holds problems of the input as a whole). DRF's own
errors, Django's `ValidationError`/`Http404`/`PermissionDenied` raised by services and selectors, and
unknown routes (with DEBUG on too: `api_not_found_as_json`), requests Django refuses (too large, a foreign
Host) or crashes under `/api/` all come out in this shape.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, TooManyFieldsSent
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from psycopg_pool import PoolTimeout
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from portal.errors import Conflict

# The shape, for the OpenAPI schema: `responses={200: ..., **ERRORS}` documents the error replies.
ERROR_SHAPE = inline_serializer(
    name="Error",
    fields={
        "code": serializers.CharField(),
        "message": serializers.CharField(),
        "fields": serializers.DictField(child=serializers.ListField(child=serializers.CharField())),
    },
)
ERROR_CODES = (400, 401, 403, 404)
ERRORS = {code: OpenApiResponse(ERROR_SHAPE) for code in ERROR_CODES}
ERRORS_WITH_CONFLICT = {**ERRORS, 409: OpenApiResponse(ERROR_SHAPE)}


def _error_response() -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}, "description": ""}


# 429: too many unknown bearer tokens (or, at POST /api/v1/tokens/, passwords) from one address.
SCHEMA_ERROR_CODES = (*ERROR_CODES, 429)


def schema_errors_everywhere(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation documents the errors any operation can give.

    A list answers 404 for a page past its end, 400 for a bad filter, 401 for a revoked token, 403 when
    a role does not allow it and 429 while its address is held back for guessing tokens, whether or not
    its view lists `ERRORS`; clients generated from the schema must expect them everywhere. Views still
    document their own extra codes (409).
    """
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for code in SCHEMA_ERROR_CODES:
                operation["responses"].setdefault(str(code), _error_response())
    return result


class ConflictError(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The object's current state does not allow this."


def error_body(*, code: str, message: str, fields: dict[str, list[str]] | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "fields": fields or {}}


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF nests errors for nested serializers and lists; flatten them to `field.sub` -> messages."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return {prefix or "non_field_errors": [str(item) for item in detail]}
        flat = {}
        for index, item in enumerate(detail):
            flat.update(_flatten(item, f"{prefix}.{index}" if prefix else str(index)))
        return flat
    return {prefix or "non_field_errors": [str(detail)]}


def _validation_message(fields: dict[str, list[str]]) -> str:
    first_field, problems = next(iter(fields.items()))
    first = problems[0] if problems else "is invalid"
    summary = first if first_field == "non_field_errors" else f"{first_field}: {first}"
    others = len(fields) - 1
    if others:
        summary += f" (and {others} more field{'s' if others > 1 else ''}; see 'fields')"
    return summary


def _as_drf(exc: Exception) -> Exception:
    if isinstance(exc, DjangoValidationError):
        detail: Any = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return exceptions.ValidationError(detail)
    if isinstance(exc, Http404):
        return exceptions.NotFound(str(exc) or "Nothing is here; check the address.")
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied(str(exc) or "You may not do this.")
    if isinstance(exc, Conflict):
        return ConflictError(str(exc) or None, code=exc.code)
    return exc


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    exc = _as_drf(exc)
    response = exception_handler(exc, context)
    if response is None:
        return None  # an unexpected error: Django's 500 handler answers (in JSON under /api/)
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        response.data = error_body(code="invalid", message=_validation_message(fields), fields=fields)
        return response
    assert isinstance(exc, exceptions.APIException)
    detail = exc.detail
    message = str(detail) if not isinstance(detail, dict | list) else _validation_message(_flatten(detail))
    code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        message = message.rstrip(".") + (
            ". Log in, or send 'Authorization: Bearer <token>' with a token from POST /api/v1/tokens/."
        )
    response.data = error_body(code=str(code), message=message)
    return response


# Django-level handlers: errors raised outside DRF views (unknown routes, crashes).


def _wants_json(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _wants_json(request):
        body = error_body(code="not_found", message=f"There is no API route {request.path}; see /api/docs/.")
        return JsonResponse(body, status=status.HTTP_404_NOT_FOUND)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Http404())


def api_not_found_as_json(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """Middleware: an unknown `/api/` path answers the error shape in every mode. With DEBUG on, Django answers an
    unresolved path with its own HTML page (listing the URL patterns) instead of handler404. It sits outside
    CommonMiddleware, so `/api/v1/jobs` still redirects to `/api/v1/jobs/` (APPEND_SLASH) first."""

    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        if (
            response.status_code == status.HTTP_404_NOT_FOUND
            and _wants_json(request)
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            return handler404(request)
        return response

    return middleware


def _bad_request_message(exception: Exception) -> str:
    if isinstance(exception, RequestDataTooBig):
        limit_mb = settings.DATA_UPLOAD_MAX_MEMORY_SIZE / (1024 * 1024)
        return f"The request body is larger than the {limit_mb:.1f} MB the portal accepts; send less."
    if isinstance(exception, TooManyFieldsSent):
        return (
            f"The request has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} parameters; "
            "send fewer query parameters or form fields."
        )
    if isinstance(exception, DisallowedHost):
        return "The request's Host header names a host this portal does not serve; use the portal's own address."
    return "The portal could not read this request; check its address, headers and body."


def handler400(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Requests Django refuses before any view runs (a body too large, too many parameters, a foreign Host)."""
    if _wants_json(request):
        body = error_body(code="bad_request", message=_bad_request_message(exception))
        return JsonResponse(body, status=status.HTTP_400_BAD_REQUEST)
    from django.views.defaults import bad_request

    return bad_request(request, exception)


# PostgreSQL could not serve the request (every connection in use, "too many clients", a restart, an empty pool,
# a deadlock or a statement timeout): the request was sound and will likely succeed a little later.
DATABASE_UNAVAILABLE = (
    "The portal's database cannot take this request right now; send it again after {seconds} seconds."
)


def service_unavailable(request: HttpRequest, *, code: str, message: str) -> HttpResponse:
    """503 with Retry-After (PORTAL_RETRY_AFTER_SECONDS; `message` may name it as {seconds}): the error shape
    under /api/, a short text page elsewhere."""
    seconds = settings.PORTAL_RETRY_AFTER_SECONDS
    text = message.format(seconds=seconds)
    response: HttpResponse
    if _wants_json(request):
        response = JsonResponse(error_body(code=code, message=text), status=status.HTTP_503_SERVICE_UNAVAILABLE)
    else:
        response = HttpResponse(text, status=status.HTTP_503_SERVICE_UNAVAILABLE, content_type="text/plain")
    response["Retry-After"] = str(seconds)
    return response


def handler500(request: HttpRequest) -> HttpResponse:
    """Every exception no view handled. Django calls this while handling it, so the exception is at hand: one
    that says the database could not serve the request is a 503 to retry, not the portal's failure."""
    if isinstance(sys.exception(), OperationalError | PoolTimeout):
        return service_unavailable(request, code="database_unavailable", message=DATABASE_UNAVAILABLE)
    if _wants_json(request):
        body = error_body(
            code="server_error",
            message="The portal failed to handle this request; it has been logged. Try again, or tell the admins.",
        )
        return JsonResponse(body, status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    from django.views.defaults import server_error

    return server_error(request)
