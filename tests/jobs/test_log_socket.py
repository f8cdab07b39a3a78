"""Live logs through the whole ASGI app (`/ws/jobs/{id}/log/`) and the download API (`/api/v1/jobs/{id}/log/`).

The job's files are written by the test as Slurm would write them; the run with a real Slurm job and a
real worker is in the job flow tests.
"""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import AsyncClient, Client

import jobs.log_stream
from clusters.models import Cluster
from jobs.job_services import jobs_push
from jobs.log_readers import followed_paths, watch_stopped
from jobs.models import Job, JobState
from jobs.paths import job_paths
from tenants.services import token_create
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user, unique_slug
from tests.websockets import handshake

pytestmark = pytest.mark.django_db(transaction=True)

SAME_ORIGIN = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]


@dataclass
class LogJob:
    job: Job
    viewer: User  # project role viewer: the least that may read the log
    tenant_member: User  # in the tenant, not in the project
    outsider: User  # admin of another tenant
    stdout: Path
    stderr: Path

    def append(self, data: bytes, *, stream: str = "stdout") -> None:
        path = self.stdout if stream == "stdout" else self.stderr
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as output:
            output.write(data)


@pytest.fixture(autouse=True)
def quick_polls(settings: Any) -> None:
    """The fallback poll, quick; tests that must show a change woke the viewers by itself turn it off."""
    settings.JOB_LOG_POLL_SECONDS = 0.05


@pytest.fixture
def no_poll(settings: Any) -> None:
    settings.JOB_LOG_POLL_SECONDS = 60.0  # longer than any wait below: whatever arrives was woken by inotify


@pytest.fixture
def log_job(tmp_path: Path) -> LogJob:
    """A running job of a fresh project, its output paths under a log root of its own (files not created)."""
    viewer, tenant_member, outsider = make_user(), make_user(), make_user()
    tenant = make_tenant()
    project = make_project(tenant)
    add_project_member(project, viewer, "viewer")
    add_tenant_member(tenant, tenant_member)
    add_project_member(make_project(make_tenant(admin=outsider)), outsider, "manager")
    log_root = tmp_path / "logs"
    log_root.mkdir()
    cluster = Cluster.objects.create(
        name=unique_slug("logs"),
        slurmrestd_url="http://127.0.0.1:6820",
        jwt_key_file="/dev/null",
        log_root=str(log_root),
    )
    job_id = uuid.uuid4()
    paths = job_paths(log_root=str(log_root), tenant_slug=tenant.slug, project_slug=project.slug, job_id=job_id)
    job = Job.objects.create(
        id=job_id,
        project=project,
        cluster=cluster,
        user=viewer,
        cluster_username="alice",
        name="train run/1",
        partition="h100",
        gpus=1,
        time_limit_minutes=10,
        state=JobState.RUNNING,
        working_directory=paths.working_directory,
        stdout_path=paths.stdout,
        stderr_path=paths.stderr,
    )
    return LogJob(job, viewer, tenant_member, outsider, Path(paths.stdout), Path(paths.stderr))


def set_state(job: Job, state: JobState, *, push: bool) -> None:
    Job.objects.filter(pk=job.pk).update(state=state)
    if push:
        jobs_push([job.pk])


def session_cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


# The socket --------------------------------------------------------------------------------------------


class Viewer:
    """One WebSocket client of a job's log, keeping what it has received of each stream."""

    def __init__(self, job: Job, *, headers: list[tuple[bytes, bytes]], query: str = "") -> None:
        path = f"/ws/jobs/{job.pk}/log/" + (f"?{query}" if query else "")
        self.communicator = WebsocketCommunicator(jobs_application(), path, headers=[*SAME_ORIGIN, *headers])
        self.messages: list[dict[str, Any]] = []
        self.received: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.next_offsets: dict[str, int] = {"stdout": 0, "stderr": 0}

    async def connect(self) -> tuple[bool, int | None]:
        connected, code = await handshake(self.communicator, timeout=5)
        return bool(connected), code

    async def receive_until(
        self, done: Callable[[dict[str, Any]], bool], *, timeout: float = 5
    ) -> list[dict[str, Any]]:
        """Messages up to and including the first for which `done` holds; chunks must join without gap or overlap."""
        new: list[dict[str, Any]] = []
        while True:
            message = await self.communicator.receive_json_from(timeout=timeout)
            new.append(message)
            if message["type"] == "log.chunk":
                stream = message["stream"]
                assert message["offset"] == self.next_offsets[stream], (message, self.next_offsets)
                data = message["data"].encode() if "data" in message else base64.b64decode(message["data_b64"])
                assert message["next_offset"] - message["offset"] == len(data)
                self.received[stream] += data
                self.next_offsets[stream] = message["next_offset"]
            elif message["type"] == "log.truncated":
                self.received[message["stream"]] = b""
                self.next_offsets[message["stream"]] = 0
            if done(message):
                self.messages += new
                return new

    async def receive_stdout(self, expected: bytes) -> list[dict[str, Any]]:
        return await self.receive_until(lambda _: self.received["stdout"] == expected)

    async def close_code(self) -> int:
        output = await self.communicator.receive_output(timeout=5)
        assert output["type"] == "websocket.close", output
        return int(output.get("code", 1000))

    async def disconnect(self) -> None:
        await self.communicator.disconnect()


def jobs_application() -> Any:
    from portal.asgi import application

    return application


def test_output_arrives_byte_for_byte_as_it_is_written(log_job: LogJob) -> None:
    log_job.append(b"hello\n")
    cookie = session_cookie(log_job.viewer)
    written = [
        "caf\u00e9 ".encode()[:-2],  # ends inside "é"
        "caf\u00e9 ".encode()[-2:] + b"\n",
        b"binary \xff\xfe\x00 noise\n",
        b"  0%|          |\r 50%|#####     |\r100%|##########|\n",
        b"x" * 200_000,  # one long line, no newline
    ]

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        assert await viewer.connect() == (True, None)
        first = await viewer.receive_until(lambda message: message["type"] == "log.waiting")
        assert first == [
            {"type": "log.chunk", "stream": "stdout", "offset": 0, "next_offset": 6, "data": "hello\n"},
            {"type": "log.waiting", "stream": "stderr", "state": "running"},
        ]
        log_job.append(written[0])
        await viewer.receive_stdout(b"hello\ncaf")  # the first byte of "é" waits for the second
        for data in written[1:]:
            log_job.append(data)
            await viewer.receive_stdout(log_job.stdout.read_bytes())
        log_job.append(b"warning: low memory\n", stream="stderr")
        await viewer.receive_until(lambda _: viewer.received["stderr"] == b"warning: low memory\n")
        await viewer.disconnect()
        assert viewer.received["stdout"] == b"hello\n" + b"".join(written)
        chunks = [message for message in viewer.messages if message["type"] == "log.chunk"]
        assert max(message["next_offset"] - message["offset"] for message in chunks) <= 65_536
        assert any("data_b64" in message for message in chunks)  # the invalid bytes, kept exactly
        assert any("\r 50%" in message.get("data", "") for message in chunks)  # progress bars untouched

    async_to_sync(scenario)()


def test_a_client_that_reconnects_with_its_offsets_gets_the_rest_exactly_once(log_job: LogJob) -> None:
    log_job.append(b"line 1\nline 2\n")
    log_job.append(b"err 1\n", stream="stderr")
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        first = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await first.connect()
        await first.receive_until(lambda _: first.received == {"stdout": b"line 1\nline 2\n", "stderr": b"err 1\n"})
        await first.disconnect()
        log_job.append("line 3 \u2713\n".encode())  # written while nobody watches
        log_job.append(b"err 2\n", stream="stderr")

        query = f"stdout_offset={first.next_offsets['stdout']}&stderr_offset={first.next_offsets['stderr']}"
        second = Viewer(log_job.job, headers=[(b"cookie", cookie)], query=query)
        second.next_offsets = dict(first.next_offsets)
        await second.connect()
        await second.receive_until(lambda _: second.received["stdout"] != b"" and second.received["stderr"] != b"")
        await second.disconnect()
        assert second.received == {"stdout": "line 3 \u2713\n".encode(), "stderr": b"err 2\n"}
        assert first.received["stdout"] + second.received["stdout"] == log_job.stdout.read_bytes()
        assert first.received["stderr"] + second.received["stderr"] == log_job.stderr.read_bytes()

    async_to_sync(scenario)()


def test_a_pending_jobs_viewer_waits_for_the_file_and_then_gets_it(log_job: LogJob) -> None:
    set_state(log_job.job, JobState.PENDING, push=False)
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        waiting = await viewer.receive_until(lambda message: message["stream"] == "stderr")
        assert waiting == [
            {"type": "log.waiting", "stream": "stdout", "state": "pending"},
            {"type": "log.waiting", "stream": "stderr", "state": "pending"},
        ]
        log_job.append(b"started on gpu01\n")  # Slurm creates the file when the job starts
        await viewer.receive_stdout(b"started on gpu01\n")
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_the_stream_ends_once_the_job_is_final_and_both_files_are_drained(log_job: LogJob) -> None:
    log_job.append(b"epoch 1\n")
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        await viewer.receive_stdout(b"epoch 1\n")
        # The last output lands just before the job is seen final: it must come before the end.
        log_job.append(b"epoch 2\ndone\n")
        log_job.append(b"bye\n", stream="stderr")
        await database_sync_to_async(set_state)(log_job.job, JobState.COMPLETED, push=True)
        rest = await viewer.receive_until(lambda message: message["type"] == "log.end")
        assert rest[-1] == {"type": "log.end", "state": "completed", "stdout_offset": 21, "stderr_offset": 4}
        assert viewer.received == {"stdout": b"epoch 1\nepoch 2\ndone\n", "stderr": b"bye\n"}
        assert await viewer.close_code() == 1000
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_without_a_push_the_end_comes_from_the_databases_state(
    log_job: LogJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs.log_stream, "STATE_RECHECK_SECONDS", 0.2)
    log_job.append(b"out\n")
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        await viewer.receive_stdout(b"out\n")
        await database_sync_to_async(set_state)(log_job.job, JobState.FAILED, push=False)
        rest = await viewer.receive_until(lambda message: message["type"] == "log.end")
        assert rest[-1] == {"type": "log.end", "state": "failed", "stdout_offset": 4, "stderr_offset": 0}
        assert await viewer.close_code() == 1000
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_a_finished_jobs_viewer_gets_the_whole_file_then_the_end(log_job: LogJob) -> None:
    set_state(log_job.job, JobState.COMPLETED, push=False)
    log_job.append(b"a" * 300_000)
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        messages = await viewer.receive_until(lambda message: message["type"] == "log.end")
        # No stderr file and none to come: no waiting message for a finished job.
        assert {message["type"] for message in messages} == {"log.chunk", "log.end"}
        assert viewer.received["stdout"] == b"a" * 300_000
        assert messages[-1] == {"type": "log.end", "state": "completed", "stdout_offset": 300_000, "stderr_offset": 0}
        assert await viewer.close_code() == 1000
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_a_truncated_file_is_announced_and_sent_again_from_the_start(log_job: LogJob) -> None:
    log_job.append(b"first attempt\n")
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        await viewer.receive_until(lambda message: message["type"] == "log.waiting")  # stdout, then stderr's wait
        assert viewer.received["stdout"] == b"first attempt\n"
        log_job.stdout.write_bytes(b"requeued\n")  # the job was requeued: Slurm truncates its output
        messages = await viewer.receive_stdout(b"requeued\n")
        assert messages[0] == {"type": "log.truncated", "stream": "stdout", "offset": 0, "previous_offset": 14}
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_a_symlink_in_place_of_the_output_is_refused_with_an_error(log_job: LogJob, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours\n")
    log_job.stdout.parent.mkdir(parents=True)
    log_job.stdout.symlink_to(secret)
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        messages = await viewer.receive_until(lambda message: message["stream"] == "stderr")
        assert messages[0]["type"] == "log.error"
        assert messages[0]["stream"] == "stdout"
        assert "symbolic link" in messages[0]["message"]
        assert viewer.received["stdout"] == b""
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_viewers_at_different_offsets_share_one_reader_and_each_gets_its_own_rest(
    log_job: LogJob, no_poll: None
) -> None:
    log_job.append(b"line 1\nline 2\n")
    log_job.append(b"", stream="stderr")
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        early = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        late = Viewer(log_job.job, headers=[(b"cookie", cookie)], query="stdout_offset=7")
        late.next_offsets["stdout"] = 7
        for viewer in (early, late):
            assert await viewer.connect() == (True, None)
        await early.receive_stdout(b"line 1\nline 2\n")
        await late.receive_stdout(b"line 2\n")
        assert followed_paths() == {str(log_job.stdout), str(log_job.stderr)}  # one reader per file for both
        log_job.append(b"line 3\n")
        log_job.append(b"warning\n", stream="stderr")
        await early.receive_until(
            lambda _: early.received == {"stdout": b"line 1\nline 2\nline 3\n", "stderr": b"warning\n"}
        )
        await late.receive_until(lambda _: late.received == {"stdout": b"line 2\nline 3\n", "stderr": b"warning\n"})
        await early.disconnect()
        assert followed_paths() == {str(log_job.stdout), str(log_job.stderr)}  # still one viewer
        log_job.append(b"line 4\n")
        await late.receive_stdout(b"line 2\nline 3\nline 4\n")
        await late.disconnect()
        assert followed_paths() == set()  # the last viewer left: the readers and their watch stop
        await watch_stopped()

    async_to_sync(scenario)()


def test_a_file_that_appears_after_the_viewer_connected_is_streamed_without_waiting_for_a_poll(
    log_job: LogJob, no_poll: None
) -> None:
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        waiting = await viewer.receive_until(lambda message: message["stream"] == "stderr")
        assert [message["type"] for message in waiting] == ["log.waiting", "log.waiting"]
        log_job.append(b"started on gpu01\n")  # makes the job's directory too
        await viewer.receive_stdout(b"started on gpu01\n")
        log_job.stdout.write_bytes(b"requeued\n")
        messages = await viewer.receive_stdout(b"requeued\n")
        assert messages[0] == {"type": "log.truncated", "stream": "stdout", "offset": 0, "previous_offset": 17}
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_with_polling_forced_the_output_still_arrives(log_job: LogJob, settings: Any) -> None:
    settings.JOB_LOG_FORCE_POLLING = True
    log_job.append(b"one\n")
    cookie = session_cookie(log_job.viewer)

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"cookie", cookie)])
        await viewer.connect()
        await viewer.receive_stdout(b"one\n")
        log_job.append(b"two\n")
        log_job.append(b"three\n")
        await viewer.receive_stdout(b"one\ntwo\nthree\n")
        await viewer.disconnect()

    async_to_sync(scenario)()


def test_many_viewers_of_one_job_connect_with_a_shared_access_check(log_job: LogJob) -> None:
    log_job.append(b"shared\n")
    _, secret = token_create(user=log_job.viewer, name="many")
    headers = [(b"authorization", f"Bearer {secret}".encode())]

    async def scenario() -> None:
        viewers = [Viewer(log_job.job, headers=headers) for _ in range(20)]
        answers = await asyncio.gather(*(viewer.connect() for viewer in viewers))
        assert answers == [(True, None)] * 20
        for viewer in viewers:
            await viewer.receive_stdout(b"shared\n")
        await asyncio.gather(*(viewer.disconnect() for viewer in viewers))
        await watch_stopped()

    async_to_sync(scenario)()


def test_who_may_not_read_the_log_is_refused_at_the_handshake(log_job: LogJob) -> None:
    cookies = {
        name: session_cookie(user)
        for name, user in {
            "outsider": log_job.outsider,
            "tenant_member": log_job.tenant_member,
            "viewer": log_job.viewer,
        }.items()
    }
    ghost = Job(pk=uuid.uuid4())

    async def code(job: Job, headers: list[tuple[bytes, bytes]], query: str = "") -> tuple[bool, int | None]:
        viewer = Viewer(job, headers=headers, query=query)
        answer = await viewer.connect()
        await viewer.disconnect()
        return answer

    async def scenario() -> None:
        assert await code(log_job.job, []) == (False, 4401)
        assert await code(log_job.job, [(b"cookie", cookies["outsider"])]) == (False, 4404)
        assert await code(ghost, [(b"cookie", cookies["outsider"])]) == (False, 4404)
        assert await code(log_job.job, [(b"cookie", cookies["tenant_member"])]) == (False, 4403)
        assert await code(log_job.job, [(b"cookie", cookies["viewer"])], "stdout_offset=-1") == (False, 4400)
        assert await code(log_job.job, [(b"cookie", cookies["viewer"])], "stderr_offset=ten") == (False, 4400)

    async_to_sync(scenario)()


def test_an_api_token_opens_the_log_socket(log_job: LogJob) -> None:
    log_job.append(b"token reader\n")
    _, secret = token_create(user=log_job.viewer, name="log-reader")

    async def scenario() -> None:
        viewer = Viewer(log_job.job, headers=[(b"authorization", f"Bearer {secret}".encode())])
        assert await viewer.connect() == (True, None)
        await viewer.receive_stdout(b"token reader\n")
        await viewer.disconnect()
        refused = Viewer(log_job.job, headers=[(b"authorization", b"Bearer gpp_not-a-real-token")])
        assert await refused.connect() == (False, 4401)
        await refused.disconnect()

    async_to_sync(scenario)()


# The download ------------------------------------------------------------------------------------------

CONTENT = "step 1\nstep 2 \u2713\nprogress 50%\rprogress 100%\n".encode() + b"\xff\xfe raw\n"


def download(log_job: LogJob, user: User | None, *, query: str = "", **headers: str) -> Any:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client.get(f"/api/v1/jobs/{log_job.job.pk}/log/{query}", headers=headers)


def test_the_whole_file_downloads_as_written(log_job: LogJob) -> None:
    log_job.append(CONTENT)

    response = download(log_job, log_job.viewer, Accept="text/plain")

    assert response.status_code == 200
    assert response.content == CONTENT
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Length"] == str(len(CONTENT))
    assert response["Accept-Ranges"] == "bytes"
    assert response["Content-Disposition"] == 'attachment; filename="train_run_1-stdout.log"'
    assert response["Cache-Control"] == "private, no-store"


def test_stderr_is_downloaded_on_request(log_job: LogJob) -> None:
    log_job.append(b"out\n")
    log_job.append(b"err\n", stream="stderr")

    response = download(log_job, log_job.viewer, query="?stream=stderr")

    assert (response.status_code, response.content) == (200, b"err\n")
    assert response["Content-Disposition"] == 'attachment; filename="train_run_1-stderr.log"'
    assert download(log_job, log_job.viewer, query="?stream=both").status_code == 400


@pytest.mark.parametrize(
    ("range_header", "first", "last"),
    [
        ("bytes=2-5", 2, 5),
        ("bytes=7-", 7, len(CONTENT) - 1),
        ("bytes=-4", len(CONTENT) - 4, len(CONTENT) - 1),
        ("bytes=0-100000", 0, len(CONTENT) - 1),
        ("bytes=-100000", 0, len(CONTENT) - 1),
    ],
)
def test_a_byte_range_gets_206_with_exactly_those_bytes(
    log_job: LogJob, range_header: str, first: int, last: int
) -> None:
    log_job.append(CONTENT)

    response = download(log_job, log_job.viewer, Range=range_header)

    assert response.status_code == 206
    assert response.content == CONTENT[first : last + 1]
    assert response["Content-Range"] == f"bytes {first}-{last}/{len(CONTENT)}"
    assert response["Content-Length"] == str(last - first + 1)


def test_a_range_beyond_the_file_gets_416(log_job: LogJob) -> None:
    log_job.append(CONTENT)

    response = download(log_job, log_job.viewer, Range=f"bytes={len(CONTENT)}-")

    assert response.status_code == 416
    assert response["Content-Range"] == f"bytes */{len(CONTENT)}"
    assert response.json() == {
        "code": "range_not_satisfiable",
        "message": f"The range starts beyond the file's {len(CONTENT)} bytes; ask for bytes 0 to {len(CONTENT) - 1}.",
        "fields": {},
    }
    assert download(log_job, log_job.viewer, Range="bytes=-0").status_code == 416


def test_ranges_it_does_not_serve_get_the_whole_file(log_job: LogJob) -> None:
    log_job.append(CONTENT)

    for header in ("bytes=0-1,4-5", "lines=1-2", "bytes=5-2"):
        response = download(log_job, log_job.viewer, Range=header)
        assert (response.status_code, response.content) == (200, CONTENT), header


def test_an_outsider_gets_the_same_404_as_for_a_job_that_does_not_exist(log_job: LogJob) -> None:
    log_job.append(CONTENT)
    ghost_id = uuid.uuid4()

    response = download(log_job, log_job.outsider)
    ghost = Client()
    ghost.force_login(log_job.outsider)
    ghost_response = ghost.get(f"/api/v1/jobs/{ghost_id}/log/")

    assert response.status_code == ghost_response.status_code == 404
    assert response.json()["message"].replace(str(log_job.job.pk), str(ghost_id)) == ghost_response.json()["message"]
    assert download(log_job, log_job.tenant_member).status_code == 403
    assert download(log_job, None).status_code == 401


def test_a_job_without_output_yet_gets_a_404_that_says_so(log_job: LogJob) -> None:
    set_state(log_job.job, JobState.PENDING, push=False)

    response = download(log_job, log_job.viewer)

    assert response.status_code == 404
    assert response.json() == {
        "code": "not_found",
        "message": "The job has not written any output yet (no stdout file); it is pending.",
        "fields": {},
    }


def test_a_file_that_is_not_a_regular_file_under_the_log_root_is_not_served(log_job: LogJob, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours\n")
    log_job.stdout.parent.mkdir(parents=True)
    log_job.stdout.symlink_to(secret)

    assert download(log_job, log_job.viewer).status_code == 403

    escaping = log_job.stdout.parent / ".." / ".." / ".." / ".." / "secret.txt"
    Job.objects.filter(pk=log_job.job.pk).update(stdout_path=str(escaping))
    response = download(log_job, log_job.viewer)
    assert response.status_code == 403
    assert b"not yours" not in response.content


def test_an_api_token_downloads_and_a_large_file_streams_exactly(log_job: LogJob) -> None:
    content = os.urandom(1_500_000)
    log_job.append(content)
    _, secret = token_create(user=log_job.viewer, name="log-download")

    async def fetch(range_header: str | None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {secret}"} | ({"Range": range_header} if range_header else {})
        response: Any = await AsyncClient().get(f"/api/v1/jobs/{log_job.job.pk}/log/", headers=headers)
        assert response.streaming
        body = b"".join([part async for part in response.streaming_content])
        return response.status_code, dict(response.headers), body

    status, headers, body = async_to_sync(fetch)(None)
    assert (status, body) == (200, content)
    assert headers["Content-Length"] == str(len(content))
    status, headers, body = async_to_sync(fetch)("bytes=100000-1399999")
    assert (status, body) == (206, content[100_000:1_400_000])
    assert headers["Content-Range"] == f"bytes 100000-1399999/{len(content)}"
