"""Download of a job's stdout or stderr file as written, whole or by byte range (under /api/v1/)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from jobs.log_stream import LOG_STREAMS, LogFileRefused, LogStream, job_log_path, job_task_state, open_log_file
from jobs.models import Job
from jobs.selectors import job_get_for_user
from portal.api_errors import ERROR_SHAPE, ERRORS, error_body

# Up to this many bytes are read at once and sent as a plain response. Larger answers stream from an async
# iterator: Django's ASGI handler would read a synchronous one (FileResponse included) whole into memory.
BUFFERED_BODY_MAX_BYTES = 256 * 1024
STREAM_BLOCK_BYTES = 64 * 1024
CONTENT_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class ByteRange:
    first: int
    last: int  # inclusive, as in HTTP

    @property
    def length(self) -> int:
        return self.last - self.first + 1


class RangeNotSatisfiable(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(f"no byte of the range lies within the file's {size} bytes")
        self.size = size


_SINGLE_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*")


def byte_range(header: str | None, *, size: int) -> ByteRange | None:
    """The range a `Range` header asks for in a file of `size` bytes; None to send the whole file.

    One range only (`a-b`, `a-`, `-n`). Several ranges, other units and malformed headers are ignored, as
    RFC 9110 allows, and get the whole file. RangeNotSatisfiable when the range lies beyond the file.
    """
    match = _SINGLE_RANGE.fullmatch(header or "")
    if match is None or match.groups() == ("", ""):
        return None
    first_text, last_text = match.groups()
    if not first_text:
        suffix_length = int(last_text)
        if suffix_length == 0 or size == 0:
            raise RangeNotSatisfiable(size)
        return ByteRange(first=max(0, size - suffix_length), last=size - 1)
    first = int(first_text)
    last = int(last_text) if last_text else size - 1
    if last_text and last < first:
        return None
    if first >= size:
        raise RangeNotSatisfiable(size)
    return ByteRange(first=first, last=min(last, size - 1))


def download_filename(*, job: Job, stream: str) -> str:
    """`<job name>-<stream>.log` in characters every file system and browser accepts; the id when none are left."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", job.name).strip("._-")[:100]
    return f"{name or job.id}-{stream}.log"


class _FileSlice:
    """`length` bytes of an open file from `first`, read in blocks off the event loop.

    Django calls `close` when the response is done, sent or not, so the descriptor never outlives it.
    """

    def __init__(self, descriptor: int, *, first: int, length: int) -> None:
        self.descriptor = descriptor
        self.first = first
        self.length = length
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._blocks()

    async def _blocks(self) -> AsyncIterator[bytes]:
        position, remaining = self.first, self.length
        while remaining > 0:
            block = await asyncio.to_thread(os.pread, self.descriptor, min(STREAM_BLOCK_BYTES, remaining), position)
            if not block:
                return  # truncated meanwhile: the body comes up short of Content-Length and the client sees it
            position += len(block)
            remaining -= len(block)
            yield block

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.descriptor)


class JobLogDownloadQuerySerializer(serializers.Serializer[Any]):
    stream = serializers.ChoiceField(choices=list(LOG_STREAMS), default="stdout", required=False)
    task = serializers.IntegerField(required=False, min_value=0, help_text="A job array's task: its own file")


class JobLogDownloadApi(APIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        # The file is the answer whatever the client accepts (`Accept: text/plain` included); errors come out
        # in JSON, the API's only renderer.
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        operation_id="jobs_log_download",
        summary="Download the job's stdout or stderr file, whole or by byte range",
        description=(
            "The file's bytes as written (usually UTF-8 text; not re-encoded). A single `Range: bytes=a-b`, "
            "`bytes=a-` or `bytes=-n` gets 206 with `Content-Range`; a range beyond the file gets 416. "
            "While the job runs the file grows: a download holds the bytes written when it started. "
            "404 when the job has not written the file yet. For live output use the WebSocket "
            "`/ws/jobs/{id}/log/`."
        ),
        parameters=[
            JobLogDownloadQuerySerializer,
            OpenApiParameter("Range", OpenApiTypes.STR, OpenApiParameter.HEADER, description="e.g. bytes=-65536"),
        ],
        responses={
            # Text (a string), not `format: binary`: generated clients then read the body as text, where a
            # binary text/plain answer made openapi-python-client's code crash (BytesIO(response.text)).
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="The whole file"),
            (206, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="The requested byte range"),
            416: OpenApiResponse(ERROR_SHAPE, description="The range lies beyond the end of the file"),
            **ERRORS,
        },
    )
    def get(self, request: Request, job_id: UUID) -> HttpResponseBase:
        job = job_get_for_user(user=request.user, job_id=job_id)
        query = JobLogDownloadQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        stream: LogStream = "stderr" if query.validated_data["stream"] == "stderr" else "stdout"
        task: int | None = query.validated_data.get("task")
        if task is not None:
            job_task_state(job=job, task=task)  # 404 unless the array has this task
        descriptor = _open(job=job, stream=stream, task=task)
        try:
            response = _file_response(descriptor, range_header=request.headers.get("Range"))
        except RangeNotSatisfiable as exc:
            message = (
                f"The file is empty; there is no byte range to send yet (the job is {job.state})."
                if exc.size == 0
                else f"The range starts beyond the file's {exc.size} bytes; ask for bytes 0 to {exc.size - 1}."
            )
            refusal = JsonResponse(error_body(code="range_not_satisfiable", message=message), status=416)
            refusal["Content-Range"] = f"bytes */{exc.size}"
            return refusal
        response["Accept-Ranges"] = "bytes"
        return _as_download(response, job=job, stream=stream, task=task)


def _as_download(response: HttpResponseBase, *, job: Job, stream: LogStream, task: int | None) -> HttpResponseBase:
    response["Content-Disposition"] = content_disposition_header(
        True, download_filename(job=job, stream=f"{task}-{stream}" if task is not None else stream)
    )
    # The output of a tenant's job: no shared cache may keep it.
    response["Cache-Control"] = "private, no-store"
    return response


def job_log_download(*, job: Job, stream: LogStream, task: int | None = None) -> HttpResponseBase:
    """The whole file as a download, for the job's page (the caller has checked access): raises Http404 when it
    is not written yet, PermissionDenied or ValidationError when the portal refuses to serve it."""
    if task is not None:
        job_task_state(job=job, task=task)
    return _as_download(
        _file_response(_open(job=job, stream=stream, task=task), range_header=None), job=job, stream=stream, task=task
    )


def _open(*, job: Job, stream: LogStream, task: int | None = None) -> int:
    """A descriptor of the job's file. Its path comes from the Job row only (and a task index), never from the
    request."""
    try:
        path = job_log_path(job=job, stream=stream, task=task)
        if path is None:
            raise Http404(
                f"The portal does not know where job '{job.id}' writes its {stream}: it was submitted outside "
                "the portal."
            )
        return open_log_file(path)
    except FileNotFoundError:
        raise Http404(f"The job has not written any output yet (no {stream} file); it is {job.state}.") from None
    except LogFileRefused as exc:
        if job.is_array and task is None:
            raise serializers.ValidationError({"task": [str(exc)]}) from None
        raise PermissionDenied(
            f"The portal refuses to serve the {stream} of job '{job.id}': its file is not a regular file under "
            "the cluster's log root. Tell the portal's admins."
        ) from None


def _file_response(descriptor: int, *, range_header: str | None) -> HttpResponseBase:
    """The file, or the range asked for, as of its size now (it may still grow).

    Owns `descriptor`: closes it on every path but the streamed one, whose response closes it when done.
    """
    try:
        size = os.fstat(descriptor).st_size
        wanted = byte_range(range_header, size=size)
    except BaseException:
        os.close(descriptor)
        raise
    sent = wanted or ByteRange(first=0, last=size - 1)
    response: HttpResponseBase
    if sent.length > BUFFERED_BODY_MAX_BYTES:
        response = StreamingHttpResponse(
            _FileSlice(descriptor, first=sent.first, length=sent.length), content_type=CONTENT_TYPE
        )
    else:
        try:
            body = os.pread(descriptor, sent.length, sent.first)
        finally:
            os.close(descriptor)
        response = HttpResponse(body, content_type=CONTENT_TYPE)
    # The length as of now: the body never reads past it, so a growing file cannot overrun it.
    response["Content-Length"] = str(sent.length)
    if wanted is not None:
        response.status_code = 206
        response["Content-Range"] = f"bytes {wanted.first}-{wanted.last}/{size}"
    return response
