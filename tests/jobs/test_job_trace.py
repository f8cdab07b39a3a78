"""One trace per job: a job's id and its request's id in the logs of the web server and of the worker that
delivers it, and in its audit event (README, "Logs and tracing a job").

The web server is gunicorn started as scripts/portal.sh starts it (its own lines in the portal's format too);
the worker is the session's real one, delivering to the real local cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.contextvars import bound_contextvars

from jobs.job_services import JobRequest, job_submit
from jobs.job_sync import jobs_deliver_queued
from jobs.models import Job
from portal.celery import app as celery_app
from tenants.models import AuditEvent
from tenants.services import token_create
from tests.conftest import SentTask, celery_workers_idle, wait_until
from tests.jobs.conftest import LiveProject
from tests.log_lines import lines_logged
from tests.processes import gunicorn_running, portal_environment

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def gunicorn_server(directory: Path) -> Iterator[tuple[str, Path]]:
    """gunicorn on the test database with the logging configuration scripts/portal.sh gives it; yields its base
    URL and its log file."""
    environment = portal_environment(PORTAL_LOG_FORMAT="json", PORTAL_LOG_LEVEL="INFO")
    config = directory / "logging.json"
    config.write_text(
        subprocess.run(
            [sys.executable, "-m", "portal.logs"], env=environment, capture_output=True, text=True, check=True
        ).stdout
    )
    log = directory / "wsgi.log"
    options = ("--workers=1", "--timeout=60", "--log-config-json", str(config))
    with gunicorn_running(*options, environment=environment, log=log) as base_url:
        yield base_url, log


def _json_lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _lines_about(log: Path, job_id: str) -> list[dict[str, Any]]:
    """The lines of `log` that mention the job, each parsed: any that is not JSON fails the test here."""
    return [json.loads(line) for line in log.read_text().splitlines() if job_id in line]


def test_one_grep_of_a_job_id_follows_it_from_the_request_through_the_worker_to_slurmrestd(
    live_project: LiveProject, celery_worker_log: Path, tmp_path: Path
) -> None:
    _, secret = token_create(user=live_project.member, name="trace")
    request_id = f"test-{uuid.uuid4().hex}"
    body = {
        "project": live_project.label,
        "cluster": live_project.cluster.name,
        "partition": live_project.partition,
        "gpu_type": live_project.gpu_type,
        "gpus": 1,
        "time_limit_minutes": 2,
        "script": "#!/bin/bash\necho traced\n",
    }
    with gunicorn_server(tmp_path) as (base_url, web_log):
        response = httpx.post(
            f"{base_url}/api/v1/jobs/",
            json=body,
            headers={"Authorization": f"Bearer {secret}", "X-Request-ID": request_id},
            timeout=30,
        )
        assert response.status_code == 202, response.text
        assert response.headers["X-Request-ID"] == request_id
        job_id = response.json()["id"]

        def delivery_logged() -> bool:
            return any(line["event"] == "job delivery submitted" for line in _lines_about(celery_worker_log, job_id))

        wait_until(delivery_logged, what="the worker's log line of the job's delivery")
        web_lines = _json_lines(web_log)  # every line of the web server's log, gunicorn's own included

    def ended_after_a_sync() -> bool:  # the worker follows the job as beat would have it do
        celery_app.send_task("jobs.tasks.cluster_jobs_sync", args=(live_project.cluster.pk,))
        return Job.objects.get(pk=job_id).is_final

    wait_until(ended_after_a_sync, what="the job's end, followed by the worker's sync")
    celery_workers_idle()

    job = Job.objects.get(pk=job_id)
    assert job.state == "completed"
    assert job.slurm_job_id is not None
    assert job.request_id == request_id

    accepted = [line for line in web_lines if line.get("job_id") == job_id]
    assert [line["event"] for line in accepted] == ["job accepted"]
    assert accepted[0]["request_id"] == request_id
    assert accepted[0]["cluster"] == live_project.cluster.name
    assert accepted[0]["project"] == live_project.label
    assert accepted[0]["level"] == "info"
    assert accepted[0]["logger"] == "jobs.job_services"
    assert accepted[0]["timestamp"].endswith("Z")
    assert any(line["logger"] == "gunicorn.error" for line in web_lines)

    worker_lines = _lines_about(celery_worker_log, job_id)
    submits = [line for line in worker_lines if line["logger"] == "clusters.slurm.client"]
    assert len(submits) == 1
    submit = submits[0]
    assert submit["event"] == "slurmrestd submit"
    assert submit["job_id"] == job_id
    assert submit["request_id"] == request_id
    assert submit["cluster"] == live_project.cluster.name
    assert submit["api_version"] == "0.0.38"
    assert submit["status"] == 200
    assert submit["slurm_job_id"] == job.slurm_job_id
    assert submit["slurm_user"] == "alice"
    assert submit["duration_ms"] > 0
    assert submit["task"] == "jobs.tasks.job_submit"
    delivered = [line for line in worker_lines if line["event"] == "job delivery submitted"]
    assert len(delivered) == 1
    assert delivered[0]["request_id"] == request_id
    assert delivered[0]["slurm_job_id"] == job.slurm_job_id
    assert delivered[0]["task_id"] == submit["task_id"]
    # The sync, in tasks of its own, follows it by the ids on its row.
    states = [line for line in worker_lines if line["logger"] == "jobs.job_sync" and " -> " in line["event"]]
    assert [line["event"].split(":")[0] for line in states] == ["job pending -> running", "job running -> completed"]
    assert {(line["request_id"], line["slurm_job_id"], line["task"]) for line in states} == {
        (request_id, job.slurm_job_id, "jobs.tasks.cluster_jobs_sync")
    }

    audit = AuditEvent.objects.get(action="job.submit", target_id=job_id)
    assert audit.request_id == request_id


def test_each_job_of_a_batch_is_logged_with_its_own_id_and_its_own_requests_id(
    live_project: LiveProject, sent_tasks: list[SentTask]
) -> None:
    """One delivery run submits many jobs, side by side in threads: each line names the job it is about."""
    request_ids: dict[str, str] = {}
    for number in range(3):
        request_id = f"batch-{number}-{uuid.uuid4().hex[:8]}"
        job_request = JobRequest(
            cluster=live_project.cluster.name,
            partition=live_project.partition,
            gpu_type=live_project.gpu_type,
            gpus=1,
            time_limit_minutes=2,
            script="#!/bin/bash\necho batched\n",
        )
        with bound_contextvars(request_id=request_id), lines_logged("jobs.job_services") as accepted:
            job, _ = job_submit(user=live_project.member, project=live_project.project, request=job_request)
        assert [(line["event"], line["job_id"], line["request_id"]) for line in accepted] == [
            ("job accepted", str(job.pk), request_id)
        ]
        request_ids[str(job.pk)] = request_id

    with lines_logged("clusters.slurm.client") as submits, lines_logged("jobs.job_sync") as outcomes:
        run = jobs_deliver_queued(job_id=uuid.UUID(next(iter(request_ids))))

    assert run.batches == 1
    assert {line["job_id"]: line["request_id"] for line in submits} == request_ids
    assert len(submits) == 3
    delivered = [line for line in outcomes if line["event"] == "job delivery submitted"]
    assert {line["job_id"]: line["request_id"] for line in delivered} == request_ids
    slurm_job_ids = dict(Job.objects.filter(pk__in=list(request_ids)).values_list("pk", "slurm_job_id"))
    assert {line["job_id"]: line["slurm_job_id"] for line in submits} == {
        str(job_id): slurm_job_id for job_id, slurm_job_id in slurm_job_ids.items()
    }
