"""Live job logs: a byte-exact file tailer, and the WebSocket that streams a job's stdout and stderr with it.

Protocol of `/ws/jobs/{id}/log/` (session or `Authorization: Bearer <token>`):

- Resume: `?stdout_offset=N&stderr_offset=M` (byte offsets, default 0). A client that reconnects with the
  `next_offset` of the last chunk it got for each stream receives exactly the bytes after it.
- `{"type": "log.chunk", "stream": "stdout"|"stderr", "offset": start, "next_offset": end, "data": text}`:
  the file's bytes `[start, end)`. `data` is their UTF-8 text; when they are not valid UTF-8, the chunk
  carries `data_b64` (standard base64 of the bytes) instead, so the client can rebuild the file byte for
  byte. A character is never split between chunks: an incomplete UTF-8 sequence at the end of the file is
  held back until its remaining bytes arrive (or sent as `data_b64` once the job is over). Chunks are at
  most 64 KiB whatever the lines, and carriage returns pass through untouched (progress bars are drawn by
  a terminal-like viewer).
- `{"type": "log.waiting", "stream": ..., "state": <job state>}`: the file does not exist (yet); sent each
  time it goes missing, never for a finished job.
- `{"type": "log.truncated", "stream": ..., "offset": 0, "previous_offset": N}`: the file shrank below
  the offset or was replaced; what the client holds of that stream is stale, and chunks resume from 0.
- `{"type": "log.error", "stream": ..., "message": ...}`: that stream cannot be read (its file is a symlink
  or not a regular file, or the portal does not know where an external job writes it); it is not followed.
- `{"type": "log.end", "state": <final state>, "stdout_offset": N, "stderr_offset": M}` once the job is
  final and both files have been read to their end after that; the socket then closes with 1000.

A refused socket is accepted and closed at once with 4401 (not logged in), 4403 (role too low), 4404 (job not
visible) or 4400 (an offset that is not a non-negative integer), so that browsers see the code
(portal.ws_auth.websocket_refuse). An open socket closes with 4403 or 4404 as soon as the
viewer loses access (the membership services push `access.changed` to the viewer's `user_access_group`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import logging
import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.core.exceptions import PermissionDenied
from django.http import Http404

from jobs.arrays import array_output_path
from jobs.job_services import job_group
from jobs.log_readers import log_file_followed
from jobs.models import FINAL_JOB_STATES, Job, JobArrayTask
from jobs.selectors import job_get_for_user
from portal.ws_auth import websocket_refuse
from tenants.services import user_access_group

logger = logging.getLogger(__name__)

LogStream = Literal["stdout", "stderr"]
LOG_STREAMS: tuple[LogStream, ...] = ("stdout", "stderr")
CHUNK_BYTES = 64 * 1024
T = TypeVar("T")

# The tailer: no Django below this line until `job_log_path` ---------------------------------------------


@dataclass(frozen=True)
class LogChunk:
    """The file's bytes `[offset, next_offset)`."""

    offset: int
    next_offset: int
    data: bytes


@dataclass(frozen=True)
class LogTruncated:
    """The file shrank below the offset or was replaced by another file: reading restarts at 0."""

    previous_offset: int


@dataclass(frozen=True)
class LogMissing:
    """The file does not exist (yet, or any more)."""


LogEvent = LogChunk | LogTruncated | LogMissing


class LogFileRefused(Exception):
    """The path is not a regular file the portal may read (a symlink, a FIFO, a directory, outside the root)."""


def open_log_file(path: str) -> int:
    """A read-only descriptor of the regular file at `path`; FileNotFoundError when there is none.

    The job's user owns the job's directory, so they could put a symlink (to another tenant's log or a
    secret the portal can read) or a FIFO (whose open would hang) where their output belongs: the last
    component is never followed, opening never blocks, and anything but a regular file is refused.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LogFileRefused(f"{path} is a symbolic link; job output must be a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise LogFileRefused(f"{path} is not a regular file")
    return descriptor


def _incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character whose remaining bytes are not there yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: the character started further back
            continue
        if 0xC0 <= byte < 0xE0:
            needed = 2
        elif 0xE0 <= byte < 0xF0:
            needed = 3
        elif 0xF0 <= byte < 0xF8:
            needed = 4
        else:
            needed = 1
        return back if back < needed else 0
    return 0  # only continuation bytes: invalid whatever follows, nothing worth waiting for


def chunk_payload(data: bytes) -> dict[str, str]:
    """`{"data": text}` for valid UTF-8, else `{"data_b64": ...}`: either way the exact bytes travel."""
    try:
        return {"data": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"data_b64": base64.b64encode(data).decode("ascii")}


class LogTailer:
    """Follows one file from a byte offset, in chunks of at most `chunk_bytes`.

    `poll()` reports one thing at a time: the next chunk, a truncation, the file going missing, or None
    when there is nothing new. It holds no file open between polls (a viewer polls when the file's shared
    reader says it changed) and buffers nothing: an incomplete UTF-8 character at the end is simply not consumed yet, so
    `offset` is always where the next chunk starts and a new tailer at that offset continues exactly.
    """

    def __init__(self, path: str, *, offset: int = 0, chunk_bytes: int = CHUNK_BYTES) -> None:
        if offset < 0:
            raise ValueError("the offset must not be negative")
        if chunk_bytes < 4:
            raise ValueError("a chunk must hold at least one UTF-8 character (4 bytes)")
        self.path = path
        self.offset = offset
        self.chunk_bytes = chunk_bytes
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file last read
        self._reported_missing = False

    def poll(self, *, final: bool = False) -> LogEvent | None:
        """The next event. With `final` (the writer is done), an incomplete character at the end is sent too."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            if self._reported_missing:
                return None
            self._reported_missing = True
            return LogMissing()
        self._reported_missing = False
        if stat.S_ISLNK(info.st_mode):
            raise LogFileRefused(f"{self.path} is a symbolic link; job output must be a regular file")
        if not stat.S_ISREG(info.st_mode):
            raise LogFileRefused(f"{self.path} is not a regular file")
        identity = (info.st_dev, info.st_ino)
        replaced = self._identity is not None and identity != self._identity
        self._identity = identity
        if replaced or info.st_size < self.offset:
            previous, self.offset = self.offset, 0
            return LogTruncated(previous_offset=previous)
        if info.st_size == self.offset:
            return None
        return self._read(size=info.st_size, identity=identity, final=final)

    def _read(self, *, size: int, identity: tuple[int, int], final: bool) -> LogChunk | None:
        descriptor = open_log_file(self.path)
        try:
            opened = os.fstat(descriptor)
            if (opened.st_dev, opened.st_ino) != identity:
                return None  # replaced between lstat and open: the next poll reports it
            data = os.pread(descriptor, min(self.chunk_bytes, size - self.offset), self.offset)
        finally:
            os.close(descriptor)
        at_end = self.offset + len(data) >= size
        held_back = _incomplete_utf8_tail(data)
        if held_back and not (final and at_end):
            data = data[:-held_back]
        if not data:
            return None
        chunk = LogChunk(offset=self.offset, next_offset=self.offset + len(data), data=data)
        self.offset = chunk.next_offset
        return chunk


# The job's files ----------------------------------------------------------------------------------------


def job_log_path(*, job: Job, stream: LogStream, task: int | None = None) -> str | None:
    """The file of one of the job's streams (of an array: of its task `task`), None when the portal does not know it
    (external jobs).

    The path comes from the Job row only, never from a request. It is refused unless its directory,
    symlinks resolved, lies under the cluster's log root: the directories down to the job's are the
    portal's, and `open_log_file` refuses a symlink in the last component, the only one the job's user controls.
    """
    path = job.stdout_path if stream == "stdout" else job.stderr_path
    if not path:
        return None
    if job.is_array:
        if task is None:
            raise LogFileRefused(f"Job '{job.id}' is an array: each task has its own {stream}; add ?task=N.")
        path = array_output_path(path, array_job_id=job.slurm_job_id, task_index=task)
    root = os.path.realpath(job.cluster.log_root)
    directory, name = os.path.split(path)
    if not os.path.isabs(path) or name in {"", ".", ".."}:
        raise LogFileRefused(f"The job's {stream} path {path!r} does not name a file under a log root")
    resolved = os.path.realpath(directory)
    if os.path.commonpath([root, resolved]) != root:
        raise LogFileRefused(f"The job's {stream} file is not under its cluster's log root {root}")
    return os.path.join(resolved, name)


# The WebSocket ------------------------------------------------------------------------------------------

# A follower reads at most this many chunks of a stream per pass before letting other sockets have the
# loop (and the file-reading threads): 256 KiB per stream per pass bounds each viewer's memory.
CHUNKS_PER_PASS = 4
# Pushes on the job's group say when its state changes; the database is asked again at this interval
# in case a push was lost (and so that a viewer who lost access stops getting the log).
STATE_RECHECK_SECONDS = 10.0


@dataclass(frozen=True)
class _Target:
    state: str
    paths: dict[LogStream, str]  # the streams to follow
    unreadable: dict[LogStream, str]  # the others, with why


def _authorise(user: Any, job_id: uuid.UUID, task: int | None = None) -> _Target:
    job = job_get_for_user(user=user, job_id=job_id)
    state = job_task_state(job=job, task=task) if task is not None else job.state
    paths: dict[LogStream, str] = {}
    unreadable: dict[LogStream, str] = {}
    for stream in LOG_STREAMS:
        try:
            path = job_log_path(job=job, stream=stream, task=task)
        except LogFileRefused as exc:
            unreadable[stream] = str(exc)
            continue
        if path is None:
            unreadable[stream] = (
                f"The portal does not know where this job writes its {stream}: it was submitted outside the portal."
            )
        else:
            paths[stream] = path
    return _Target(state=state, paths=paths, unreadable=unreadable)


def job_task_state(*, job: Job, task: int) -> str:
    """The state of task `task` of the array `job` (its log ends when the task does); 404 for no such task."""
    state = JobArrayTask.objects.filter(job=job, index=task).values_list("state", flat=True).first()
    if state is None:
        raise Http404(f"Job '{job.id}' has no task {task}." if job.is_array else f"Job '{job.id}' is not an array.")
    return state


def _current_state(user: Any, job_id: uuid.UUID, task: int | None = None) -> str:
    job = job_get_for_user(user=user, job_id=job_id)
    return job_task_state(job=job, task=task) if task is not None else job.state


class _SharedCheck:
    """One run of an access check in the database thread, which the viewers who ask before it starts share."""

    def __init__(self, check: Callable[..., Any], user: Any, job_id: uuid.UUID, task: int | None) -> None:
        self.started = False
        self.result = asyncio.ensure_future(database_sync_to_async(self._run)(check, user, job_id, task))

    def _run(self, check: Callable[..., Any], user: Any, job_id: uuid.UUID, task: int | None) -> Any:
        self.started = True
        return check(user, job_id, task)


_CheckKey = tuple[Callable[..., Any], int, uuid.UUID, int | None]
_checks_waiting: dict[_CheckKey, _SharedCheck] = {}


def _check_forget(key: _CheckKey, done: _SharedCheck) -> None:
    if _checks_waiting.get(key) is done:
        del _checks_waiting[key]


async def _checked(
    check: Callable[[Any, uuid.UUID, int | None], T], user: Any, job_id: uuid.UUID, task: int | None = None
) -> T:
    """`check(user, job_id)` in the database thread, run once for all of a user's sockets of a job that ask together.

    Connecting 100 viewers would otherwise queue 100 identical checks in the one database thread. A caller
    joins only a check that has not begun reading the database yet: its answer is then as fresh as one of
    the caller's own, and the caller, subscribed to its access group before asking, hears of any later change.
    """
    key = (check, user.pk, job_id, task)
    waiting = _checks_waiting.get(key)
    if waiting is None or waiting.started or waiting.result.get_loop() is not asyncio.get_running_loop():
        waiting = _checks_waiting[key] = _SharedCheck(check, user, job_id, task)
        waiting.result.add_done_callback(lambda _: _check_forget(key, waiting))
    result: T = await asyncio.shield(waiting.result)
    return result


def _task_asked(query_string: bytes) -> int | None:
    """`task` from the query string (an array's task whose log to follow); ValueError unless a non-negative integer."""
    value = parse_qs(query_string.decode("latin-1")).get("task", [""])[-1]
    if not value:
        return None
    if not value.isascii() or not value.isdigit():
        raise ValueError("task must be a non-negative integer")
    return int(value)


def _resume_offsets(query_string: bytes) -> dict[LogStream, int]:
    """`stdout_offset` and `stderr_offset` from the query string; ValueError unless non-negative integers."""
    query = parse_qs(query_string.decode("latin-1"))
    offsets: dict[LogStream, int] = {}
    for stream in LOG_STREAMS:
        value = query.get(f"{stream}_offset", ["0"])[-1]
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"{stream}_offset must be a non-negative integer")
        offsets[stream] = int(value)
    return offsets


class JobLogConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """`/ws/jobs/{id}/log/`: the job's stdout and stderr as they are written (protocol: this module's docstring).

    Each file has one reader per process (`jobs.log_readers`), which wakes the file's viewers when it
    changes; each viewer then reads from its own offsets. The job's state comes from its channel group, with
    a database check every `STATE_RECHECK_SECONDS`, so a viewer costs almost no queries.
    """

    job_id: uuid.UUID | None = None
    task: int | None = None  # an array's task (`?task=7`)
    access_group: str = ""
    follower: asyncio.Task[None] | None = None
    # Set when a file may have changed or a push says the job did; `state_stale` tells which.
    wake: asyncio.Event
    state_stale: bool = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await websocket_refuse(self, 4401)
            return
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        try:
            self.task = _task_asked(self.scope.get("query_string", b""))
        except ValueError:
            await websocket_refuse(self, 4400)
            return
        self.job_id, self.access_group = job_id, user_access_group(user.pk)
        self.wake = asyncio.Event()
        # Subscribed before the access check, which also reads the job's state: no change can slip in between.
        await asyncio.gather(
            self.channel_layer.group_add(job_group(job_id), self.channel_name),
            self.channel_layer.group_add(self.access_group, self.channel_name),
        )
        try:
            target = await _checked(_authorise, user, job_id, self.task)
        except Http404:
            await websocket_refuse(self, 4404)
            return
        except PermissionDenied:
            await websocket_refuse(self, 4403)
            return
        try:
            offsets = _resume_offsets(self.scope.get("query_string", b""))
        except ValueError:
            await websocket_refuse(self, 4400)
            return
        await self.accept()
        self.follower = asyncio.create_task(self._follow(user, job_id, target, offsets))

    async def disconnect(self, code: int) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.follower
        if self.job_id is not None:
            await asyncio.gather(
                self.channel_layer.group_discard(job_group(self.job_id), self.channel_name),
                self.channel_layer.group_discard(self.access_group, self.channel_name),
            )

    async def job_update(self, event: dict[str, Any]) -> None:
        # Only a hint to look again: pushes may arrive out of order, the database says what is current.
        self.state_stale = True
        self.wake.set()

    async def access_changed(self, event: dict[str, Any]) -> None:
        """The viewer's memberships changed: stop streaming at once unless they may still see the job."""
        if self.job_id is None:
            return  # not subscribed to anything yet
        try:
            await _checked(_current_state, self.scope["user"], self.job_id, self.task)
        except (Http404, PermissionDenied) as exc:
            if self.follower is not None:
                self.follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.follower
            await self.close(code=4404 if isinstance(exc, Http404) else 4403)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say; resuming is done with the query string."""

    async def _follow(self, user: Any, job_id: uuid.UUID, target: _Target, offsets: dict[LogStream, int]) -> None:
        try:
            with contextlib.ExitStack() as readers:
                for path in target.paths.values():
                    readers.enter_context(log_file_followed(path, wake=self.wake))
                await self._stream(user, job_id, target, offsets)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("streaming the log of job %s failed", self.job_id)
            await self.close(code=1011)

    async def _stream(self, user: Any, job_id: uuid.UUID, target: _Target, offsets: dict[LogStream, int]) -> None:
        tailers = {stream: LogTailer(path, offset=offsets[stream]) for stream, path in target.paths.items()}
        for stream, reason in target.unreadable.items():
            await self.send_json({"type": "log.error", "stream": stream, "message": reason})
        loop = asyncio.get_running_loop()
        state = target.state
        recheck_at = loop.time() + STATE_RECHECK_SECONDS
        while True:
            # Cleared before looking: a change while this pass reads sets it again, and is read next pass.
            self.wake.clear()
            if state not in FINAL_JOB_STATES and (self.state_stale or loop.time() >= recheck_at):
                self.state_stale = False
                try:
                    state = await _checked(_current_state, user, job_id, self.task)
                except Http404:
                    await self.close(code=4404)
                    return
                except PermissionDenied:
                    await self.close(code=4403)
                    return
                recheck_at = loop.time() + STATE_RECHECK_SECONDS
            # Only reads that start after the job was seen final are sure to find all it wrote: the end
            # message waits for a pass of them that finds nothing left.
            final = state in FINAL_JOB_STATES
            messages, busy = await asyncio.to_thread(_read_pass, tailers, state=state, final=final)
            for message in messages:
                await self.send_json(message)
            for stream, tailer in tailers.items():
                offsets[stream] = tailer.offset
            if final and not busy:
                await self.send_json(
                    {
                        "type": "log.end",
                        "state": state,
                        "stdout_offset": offsets["stdout"],
                        "stderr_offset": offsets["stderr"],
                    }
                )
                await self.close(code=1000)
                return
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=max(0.0, recheck_at - loop.time()))


def _read_pass(tailers: dict[LogStream, LogTailer], *, state: str, final: bool) -> tuple[list[dict[str, Any]], bool]:
    """One pass over the streams, in a worker thread: the messages to send, and whether any stream has more.

    A stream that cannot be read gets a `log.error` and is dropped from `tailers`.
    """
    messages: list[dict[str, Any]] = []
    busy = False
    for stream, tailer in list(tailers.items()):
        try:
            for _ in range(CHUNKS_PER_PASS):
                event = tailer.poll(final=final)
                if event is None:
                    break
                message = _event_message(stream, event, state=state)
                if message is not None:
                    messages.append(message)
            else:  # the pass's share is used up: there may be more to read right away
                busy = True
        except (LogFileRefused, OSError) as exc:
            reason = str(exc) if isinstance(exc, LogFileRefused) else f"Cannot read {tailer.path}: {exc.strerror}"
            messages.append({"type": "log.error", "stream": stream, "message": reason})
            del tailers[stream]
    return messages, busy


def _event_message(stream: LogStream, event: LogEvent, *, state: str) -> dict[str, Any] | None:
    if isinstance(event, LogChunk):
        position = {"offset": event.offset, "next_offset": event.next_offset}
        return {"type": "log.chunk", "stream": stream, **position, **chunk_payload(event.data)}
    if isinstance(event, LogTruncated):
        return {"type": "log.truncated", "stream": stream, "offset": 0, "previous_offset": event.previous_offset}
    if state in FINAL_JOB_STATES:
        return None  # a finished job will not write the file: nothing to wait for
    return {"type": "log.waiting", "stream": stream, "state": state}
