"""The life of a job on the real stack: API, a real Celery worker, slurmrestd, the sync, cancelling."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction

from clusters.slurm import SlurmClient
from clusters.slurm.types import JobSubmission
from jobs.job_services import JobRequest, job_cancel, job_submit
from jobs.models import Job, JobState
from tenants.services import token_create
from tests.conftest import wait_until
from tests.jobs.conftest import LiveProject
from tests.websockets import handshake

pytestmark = pytest.mark.django_db(transaction=True)

# Bytes a terminal-minded job writes: UTF-8, carriage-return progress, a long line.
PROGRESS_SCRIPT = r"""#!/bin/bash
printf 'début ✓\n'
for pct in 25 50 75 100; do printf '\rprogress %3d%%' "$pct"; sleep 0.2; done
printf '\n'
head -c 5000 /dev/zero | tr '\0' 'x'
printf '\nerr line\n' >&2
"""
PROGRESS_OUTPUT = (
    "début ✓\n" + "".join(f"\rprogress {pct:3d}%" for pct in (25, 50, 75, 100)) + "\n" + "x" * 5000
).encode()


# Ten lines, written over about three seconds, so that a viewer can drop out halfway and come back.
SLOW_SCRIPT = r"""#!/bin/bash
for i in $(seq 1 10); do printf 'line %02d ünïcödé\n' "$i"; sleep 0.3; done
printf 'bad byte: \377\n'
printf 'warning\n' >&2
"""
SLOW_OUTPUT = "".join(f"line {i:02d} ünïcödé\n" for i in range(1, 11)).encode() + b"bad byte: \xff\n"


def _states(job: Job) -> list[str]:
    return [transition.to_state for transition in job.transitions.order_by("id")]


def test_a_job_submitted_through_the_api_runs_to_completion(live_project: LiveProject, celery_worker: str) -> None:
    reply = live_project.submit(name="progress", script=PROGRESS_SCRIPT)
    assert reply["state"] == "queued"
    assert reply["slurm_job_id"] is None

    job = live_project.wait_for(reply["id"], lambda job: job.is_final)

    assert job.state == JobState.COMPLETED
    assert _states(job) == ["queued", "pending", "running", "completed"]
    assert job.exit_code == 0
    assert job.nodes in {"gpu01", "gpu02"}
    assert job.submit_attempts == 1
    assert job.started_at is not None
    assert job.ended_at is not None
    assert job.started_at <= job.ended_at
    with open(job.stdout_path, "rb") as stdout, open(job.stderr_path, "rb") as stderr:
        assert stdout.read() == PROGRESS_OUTPUT
        assert stderr.read() == b"\nerr line\n"
    detail = live_project.api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["state"] == "completed"
    assert detail["slurm_job_id"] == job.slurm_job_id
    assert [step["to_state"] for step in detail["transitions"]] == ["queued", "pending", "running", "completed"]


class LogViewer:
    """A WebSocket client of /ws/jobs/<id>/log/ that keeps the bytes it received and its offsets."""

    def __init__(self, job_id: object, secret: str) -> None:
        self.job_id, self.secret = job_id, secret
        self.received: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.offsets = {"stdout": 0, "stderr": 0}
        self.end: dict[str, Any] | None = None

    async def connect(self) -> WebsocketCommunicator:
        from portal.asgi import application

        query = f"stdout_offset={self.offsets['stdout']}&stderr_offset={self.offsets['stderr']}"
        headers = [
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"authorization", f"Bearer {self.secret}".encode()),
        ]
        socket = WebsocketCommunicator(application, f"/ws/jobs/{self.job_id}/log/?{query}", headers=headers)
        connected, code = await handshake(socket, timeout=10)
        assert connected, code
        return socket

    def take(self, message: dict[str, Any]) -> None:
        if message["type"] == "log.chunk":
            stream = message["stream"]
            # Resuming from an offset must continue exactly where the last chunk ended.
            assert message["offset"] == self.offsets[stream], message
            data = base64.b64decode(message["data_b64"]) if "data_b64" in message else message["data"].encode()
            assert len(data) == message["next_offset"] - message["offset"]
            self.received[stream] += data
            self.offsets[stream] = message["next_offset"]
        elif message["type"] == "log.end":
            self.end = message


def test_a_running_jobs_log_streams_byte_for_byte_across_a_reconnect(
    live_project: LiveProject, celery_worker: str
) -> None:
    _, secret = token_create(user=live_project.member, name="log viewer")
    reply = live_project.submit(name="slow", script=SLOW_SCRIPT)
    viewer = LogViewer(reply["id"], secret)

    async def sync_like_beat() -> None:
        while True:
            await sync_to_async(live_project.sync)()
            await asyncio.sleep(0.5)

    async def follow() -> None:
        beat = asyncio.create_task(sync_like_beat())
        try:
            # First viewing: connect while the job is queued, leave after the first lines.
            socket = await viewer.connect()
            while len(viewer.received["stdout"]) < 20:
                viewer.take(await socket.receive_json_from(timeout=60))
            await socket.disconnect()
            # Reconnect with the last offsets and stay to the end.
            socket = await viewer.connect()
            while viewer.end is None:
                viewer.take(await socket.receive_json_from(timeout=60))
            assert (await socket.receive_output(timeout=5))["type"] == "websocket.close"
        finally:
            beat.cancel()

    async_to_sync(follow)()

    job = Job.objects.get(pk=str(reply["id"]))
    assert job.state == JobState.COMPLETED
    assert bytes(viewer.received["stdout"]) == SLOW_OUTPUT
    assert bytes(viewer.received["stderr"]) == b"warning\n"
    with open(job.stdout_path, "rb") as written:
        assert bytes(viewer.received["stdout"]) == written.read()
    assert viewer.end == {
        "type": "log.end",
        "state": "completed",
        "stdout_offset": len(SLOW_OUTPUT),
        "stderr_offset": len(b"warning\n"),
    }


def test_the_manager_cancels_a_running_job(live_project: LiveProject, celery_worker: str) -> None:
    reply = live_project.submit(name="sleeper", script="#!/bin/bash\necho started\nsleep 120\n")
    live_project.wait_for(reply["id"], lambda job: job.state == JobState.RUNNING)

    manager = live_project.client_for(live_project.manager)
    response = manager.post(f"/api/v1/jobs/{reply['id']}/cancel/")

    assert response.status_code == 202, response.json()
    assert response.json()["cancel_requested"] is True
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)
    assert job.state == JobState.CANCELLED
    assert job.slurm_state == "CANCELLED"
    assert _states(job) == ["queued", "pending", "running", "cancelled"]
    again = manager.post(f"/api/v1/jobs/{reply['id']}/cancel/")
    assert again.status_code == 409
    assert again.json()["message"] == "The job has already ended (cancelled); nothing to cancel."


def test_a_job_cancelled_while_queued_never_reaches_slurm(
    live_project: LiveProject, celery_worker: str, slurm_client: SlurmClient
) -> None:
    # Submitted and cancelled in one transaction: the worker receives the job only after it is cancelled.
    with transaction.atomic():
        job, created = job_submit(
            user=live_project.member,
            project=live_project.project,
            request=JobRequest(cluster="local", partition="h100", script="#!/bin/bash\necho never\n"),
        )
        job_cancel(user=live_project.member, job=job)
    assert created

    # The worker got the task; give it time to (not) submit, then look everywhere Slurm could have it.
    time.sleep(2)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.slurm_job_id is None
    assert job.submit_attempts == 0
    assert _states(job) == ["queued", "cancelled"]
    listing = slurm_client.list_jobs()
    assert listing is not None
    assert all(slurm_job.comment != job.slurm_comment for slurm_job in listing.jobs)


def test_an_owner_cancels_a_pending_job_and_the_sync_records_it(
    live_project: LiveProject, celery_worker: str, slurm_client: SlurmClient
) -> None:
    # A GPU-minute limit below what the job needs keeps it pending, with Slurm's quota reason in words.
    slurm_client.set_account_gpu_minutes_limit(account=live_project.project.slurm_account, cluster="local", minutes=1)
    reply = live_project.submit(time_limit_minutes=2, script="#!/bin/bash\nsleep 5\n")
    job = live_project.wait_for(reply["id"], lambda job: job.state_reason == "AssocGrpGRESMinutes")
    assert job.state == JobState.PENDING
    detail = live_project.api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["pending_reason"] == "the project's GPU-hour quota on this cluster is used up"

    assert live_project.api.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202
    job = live_project.wait_for(job.pk, lambda job: job.is_final)

    assert job.state == JobState.CANCELLED
    assert job.started_at is None
    assert _states(job) == ["queued", "pending", "cancelled"]


def test_jobs_submitted_outside_the_portal_appear_read_only(
    live_project: LiveProject, slurm_client: SlurmClient
) -> None:
    submitted = slurm_client.submit_job(
        user="alice",
        submission=JobSubmission(
            name="by-hand",
            account=live_project.project.slurm_account,
            partition="a100",
            script="#!/bin/bash\nsleep 30\n",
            time_limit_minutes=1,
            working_directory="/tmp",
            standard_output="/dev/null",
            standard_error="/dev/null",
            gpus=2,
            gpu_type="a100",
            hold=True,
        ),
    )
    result = live_project.sync()

    job = Job.objects.get(cluster=live_project.cluster, slurm_job_id=submitted.job_id, is_external=True)
    assert result.external_created >= 1
    assert job.project == live_project.project
    assert job.user == live_project.member  # alice's portal account on the cluster
    assert (job.name, job.partition, job.gpus, job.gpu_type, job.state) == ("by-hand", "a100", 2, "a100", "pending")
    listed = live_project.api.get("/api/v1/jobs/", {"external": "true"}).json()
    assert [row["id"] for row in listed["results"]] == [str(job.pk)]
    refused = live_project.api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert refused.status_code == 409
    assert "outside the portal" in refused.json()["message"]
    assert Job.objects.filter(is_external=True).count() == 1
    live_project.sync()  # a second sync adds nothing
    assert Job.objects.filter(is_external=True).count() == 1


def test_a_sync_with_nothing_changed_costs_one_304(live_project: LiveProject) -> None:
    live_project.sync()
    time.sleep(1.1)  # the controller's clock has one-second resolution
    results = []

    def unchanged() -> bool:
        # Jobs of earlier tests may still be ending or being purged; wait for a quiet moment.
        results.append(live_project.sync())
        return results[-1].unchanged_listing

    wait_until(unchanged, timeout_seconds=30, what="a 304 from slurmrestd")
    assert results[-1].requests == 1
    assert results[-1].changed == 0


def test_a_lost_submission_of_a_job_cancelled_in_the_portal_is_cancelled_in_slurm(
    live_project: LiveProject, slurm_client: SlurmClient
) -> None:
    # The portal cancelled a queued job whose earlier attempt timed out; that attempt reached Slurm after all.
    with transaction.atomic():
        job, _ = job_submit(
            user=live_project.member,
            project=live_project.project,
            request=JobRequest(cluster="local", partition="h100", script="#!/bin/bash\nsleep 60\n"),
        )
        job_cancel(user=live_project.member, job=job)
    lost = slurm_client.submit_job(
        user="alice",
        submission=JobSubmission(
            name=job.name,
            account=live_project.project.slurm_account,
            partition="h100",
            script=job.script,
            time_limit_minutes=1,
            working_directory="/tmp",
            standard_output="/dev/null",
            standard_error="/dev/null",
            gpus=1,
            comment=job.slurm_comment,
            hold=True,
        ),
    )

    result = live_project.sync()

    assert result.duplicates_cancelled == 1
    assert slurm_client.get_job(job_id=lost.job_id).state.is_finished
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id) == (JobState.CANCELLED, None)
