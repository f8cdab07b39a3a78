"""REST API for archived job history (mounted under /api/v1/): a tenant's archived transitions, streamed as JSON
lines to its admins and the portal's (jobs/history_archive.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from jobs.history_archive import archived_transitions_export
from portal.api_errors import ERRORS
from portal.api_inputs import BodyInput
from tenants.selectors import TenantAction, project_get_for_user, tenant_get_for_user

CONTENT_TYPE = "application/x-ndjson"


class ArchivedTransitionsQuery(BodyInput):
    project = serializers.SlugField(required=False, help_text="One project of the tenant (its slug); all if absent")


class _Chunks:
    """Chunks of a sync generator that queries the database: read in place under WSGI, and one chunk at a time in
    Django's thread for sync code under ASGI (rather than the whole export in memory first, as Django would)."""

    def __init__(self, chunks: Iterator[str]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[str]:
        return self._chunks

    async def __aiter__(self) -> AsyncIterator[str]:
        next_chunk = sync_to_async(lambda: next(self._chunks, None))
        while (chunk := await next_chunk()) is not None:
            yield chunk


class ArchivedTransitionsExportApi(APIView):
    @extend_schema(
        operation_id="tenant_archived_transitions_export",
        summary="Export a tenant's archived job transitions (tenant admins)",
        description="JSON lines, oldest first: one object per transition older than HISTORY_ARCHIVE_AFTER_MONTHS "
        "(id, job, project, job_name, user, from_state, to_state, at, detail), streamed. A job's own timeline "
        "(GET /api/v1/jobs/<id>/) shows its archived transitions too.",
        parameters=[ArchivedTransitionsQuery],
        responses={(200, CONTENT_TYPE): OpenApiResponse(OpenApiTypes.STR), **ERRORS},
    )
    def get(self, request: Request, tenant: str) -> StreamingHttpResponse:
        found = tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        query = ArchivedTransitionsQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        project_slug: str | None = query.validated_data.get("project")
        if project_slug is not None:  # an unknown project is a 404 worded as everywhere else
            project_get_for_user(user=request.user, tenant_slug=found.slug, project_slug=project_slug)
        lines = archived_transitions_export(tenant=found, project_slug=project_slug)
        response = StreamingHttpResponse(_Chunks(lines), content_type=CONTENT_TYPE)
        response["Content-Disposition"] = f'attachment; filename="{found.slug}-archived-transitions.jsonl"'
        return response
