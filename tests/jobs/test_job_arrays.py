"""Job arrays: one portal job, one Slurm submission, a task table the sync keeps in bulk, per-task charges and logs.

The journey runs on every live cluster (Slurm 22.05, 24.11, 26.05) through the API and a real Celery worker; the
concurrency cap is observed in Slurm's own listing and in the tasks the sync recorded, never by timing.
"""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import ReconciliationReport, UsageRecord
from billing.rates import rate_create
from billing.reconciliation import reconciliation_report_run
from billing.selectors import JobUsage, job_usage
from billing.usage import UsageImportResult, usage_daily_mismatches, usage_import
from clusters.clients import slurm_client_for
from clusters.models import Cluster
from jobs.arrays import ArrayExpressionError, array_parse
from jobs.models import Job, JobArrayTask, JobState
from jobs.quota_usage import quota_usage_collect
from quotas.models import Allocation, LedgerEntry, LedgerKind
from quotas.usage import ledger_daily_mismatches
from tests.factories import make_job, make_matrix_cluster, unique_slug
from tests.jobs.conftest import LiveProject
from tests.jobs.test_log_socket import SAME_ORIGIN, jobs_application, session_cookie
from tests.live_clusters import LiveCluster
from tests.websockets import handshake

pytestmark = pytest.mark.django_db(transaction=True)


def _running_in_slurm(project: LiveProject, array_job_id: int) -> tuple[int, set[int | None]]:
    """How many of the array's tasks Slurm lists as running now, and the `%N` caps its records carry."""
    listing = slurm_client_for(project.cluster).list_jobs()
    records = [job for job in (listing.jobs if listing else ()) if job.array_job_id == array_job_id]
    running = sum(1 for record in records if record.state.value == "RUNNING")
    return running, {record.array_max_tasks for record in records}


def _charges(job: Job) -> dict[int | None, int]:
    return dict(LedgerEntry.objects.filter(job=job, kind=LedgerKind.CHARGE).values_list("array_task", "gpu_seconds"))


async def _task_log_over_websocket(job: Job, cookie: bytes, query: str) -> list[dict[str, Any]]:
    communicator = WebsocketCommunicator(
        jobs_application(), f"/ws/jobs/{job.pk}/log/?{query}", headers=[*SAME_ORIGIN, (b"cookie", cookie)]
    )
    assert await handshake(communicator) == (True, None)
    messages = []
    while True:
        message = await communicator.receive_json_from(timeout=10)
        messages.append(message)
        if message["type"] in {"log.end", "log.error"}:
            break
    await communicator.disconnect()
    return messages


@pytest.mark.cluster
def test_an_array_of_20_tasks_capped_at_4_runs_at_most_4_at_once_is_charged_per_task_and_logs_per_task(
    live: LiveCluster, contract_project: LiveProject, celery_worker: str
) -> None:
    reply = contract_project.submit(
        name="sweep",
        array="0-19%4",
        gpus=1,
        time_limit_minutes=2,
        script="#!/bin/bash\necho task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT\nsleep 4\n",
    )
    assert (reply["array"], reply["array_tasks"], reply["array_max_running"]) == ("0-19%4", 20, 4)
    assert reply["array_progress"] == {"pending": 20, "running": 0, "completed": 0, "failed": 0, "cancelled": 0}
    job = Job.objects.get(pk=str(reply["id"]))
    reservations = LedgerEntry.objects.filter(job=job, kind=LedgerKind.RESERVE)
    assert sorted(reservations.values_list("array_task", "gpu_seconds")) == [(index, 120) for index in range(20)]
    assert reply["estimate"]["gpu_hours"] == "0.67"  # type: ignore[index]  # 20 tasks x 1 GPU x 2 min

    job = contract_project.wait_for(job.pk, lambda job: job.slurm_job_id is not None)
    most_in_slurm, most_recorded, caps = 0, 0, set[int | None]()
    deadline = time.monotonic() + 240
    while not Job.objects.get(pk=job.pk).is_final:
        assert time.monotonic() < deadline, Job.objects.get(pk=job.pk).array_progress
        running, seen_caps = _running_in_slurm(contract_project, job.slurm_job_id or 0)
        most_in_slurm, caps = max(most_in_slurm, running), caps | seen_caps
        contract_project.sync()
        recorded = JobArrayTask.objects.filter(job=job, state=JobState.RUNNING).count()
        most_recorded = max(most_recorded, recorded)
        time.sleep(0.3)
    assert caps <= {4}
    assert most_in_slurm == 4
    assert most_recorded == 4

    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.COMPLETED
    assert job.array_progress == {"pending": 0, "running": 0, "completed": 20, "failed": 0, "cancelled": 0}
    tasks = list(JobArrayTask.objects.filter(job=job).order_by("index"))
    assert [task.index for task in tasks] == list(range(20))
    assert {(task.state, task.exit_code) for task in tasks} == {(JobState.COMPLETED, 0)}
    assert all(task.nodes and task.started_at and task.ended_at for task in tasks)
    assert len({task.slurm_job_id for task in tasks}) == 20

    # Charged task by task, from each task's own accounting record, exactly once.
    deadline = time.monotonic() + 90
    while len(_charges(job)) < 20 and time.monotonic() < deadline:
        cluster = Cluster.objects.get(pk=contract_project.cluster.pk)
        quota_usage_collect(cluster=cluster, client=slurm_client_for(cluster))
        time.sleep(1)
    records = slurm_client_for(contract_project.cluster).accounting_jobs(
        account=contract_project.project.slurm_account, start_time=job.created_at.replace(microsecond=0)
    )
    used = {
        record.array_task_id: record.elapsed_seconds * record.gpus_allocated
        for record in records
        if record.array_job_id == job.slurm_job_id and record.state.is_finished
    }
    assert _charges(job) == used
    assert len(used) == 20
    cluster = Cluster.objects.get(pk=contract_project.cluster.pk)
    assert quota_usage_collect(cluster=cluster, client=slurm_client_for(cluster)).tasks_charged == 0  # once
    allocation = Allocation.objects.get(project=contract_project.project, cluster=cluster)
    assert allocation.reserved_gpu_seconds == 0
    assert allocation.charged_gpu_seconds == sum(used.values())
    # The allocation's days (burn-down) took every task's reservation, release and charge.
    assert ledger_daily_mismatches() == []

    # Priced task by task (one usage record each, once), and the job costs their sum.
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("36.00"),
        currency="EUR",
        valid_from=job.created_at - timedelta(hours=1),
    )
    assert usage_import().imported == 20
    assert usage_import() == UsageImportResult()
    priced = dict(UsageRecord.objects.filter(job=job).values_list("array_task", "gpu_seconds"))
    assert priced == used
    assert job_usage(job=job) == JobUsage(
        gpu_seconds=sum(used.values()),
        amount=Decimal(sum(used.values())) / 100,  # 36.00 per GPU-hour: a cent per GPU-second
        currency="EUR",
        priced=20,
        complete=True,
    )
    assert usage_daily_mismatches() == []
    # Reconciliation compares each task with its own accounting record: no finding for any of them.
    report = ReconciliationReport.objects.create(
        cluster=cluster, period_start=job.created_at - timedelta(minutes=1), period_end=timezone.now()
    )
    report = reconciliation_report_run(report_id=report.pk, client=slurm_client_for(cluster))
    task_slurm_ids = {task.slurm_job_id for task in tasks}
    assert [finding for finding in report.findings if finding["job"] == str(job.pk)] == []
    assert [finding for finding in report.findings if finding["slurm_job_id"] in task_slurm_ids] == []
    assert report.summary["jobs_compared"] >= 20

    # Each task's log: the download and the WebSocket.
    download = contract_project.api.get(f"/api/v1/jobs/{job.pk}/log/?task=7")
    assert download.status_code == 200
    assert download.content == b"task 7 of 20\n"
    cookie = session_cookie(contract_project.member)
    messages = async_to_sync(_task_log_over_websocket)(job, cookie, "task=13")
    assert messages == [
        {"type": "log.chunk", "stream": "stdout", "offset": 0, "next_offset": 14, "data": "task 13 of 20\n"},
        {"type": "log.end", "state": "completed", "stdout_offset": 14, "stderr_offset": 0},
    ]
    whole = async_to_sync(_task_log_over_websocket)(job, cookie, "")
    assert whole[0]["type"] == "log.error"
    assert "add ?task=N" in whole[0]["message"]


@pytest.mark.cluster
def test_one_task_is_cancelled_and_the_others_go_on_then_the_whole_array(
    live: LiveCluster, contract_project: LiveProject, celery_worker: str
) -> None:
    live_project = contract_project
    reply = live_project.submit(array="0-3%1", script="#!/bin/bash\necho started\nsleep 60\n")
    live_project.wait_for(reply["id"], lambda job: job.array_progress.get("running") == 1)

    answer = live_project.api.post(f"/api/v1/jobs/{reply['id']}/tasks/2/cancel/")
    assert answer.status_code == 202, answer.json()
    assert (answer.json()["index"], answer.json()["cancel_requested"]) == (2, True)
    job = live_project.wait_for(reply["id"], lambda job: job.array_progress.get("cancelled") == 1)
    states = dict(JobArrayTask.objects.filter(job=job).values_list("index", "state"))
    assert states == {0: "running", 1: "pending", 2: "cancelled", 3: "pending"}
    assert job.state == JobState.RUNNING

    assert live_project.api.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202
    job = live_project.wait_for(job.pk, lambda job: job.is_final)
    assert job.state == JobState.CANCELLED
    assert job.array_progress == {"pending": 0, "running": 0, "completed": 0, "failed": 0, "cancelled": 4}
    assert JobArrayTask.objects.get(job=job, index=0).started_at is not None
    # The three tasks that never ran give their reservations back; the one that ran is charged.
    cluster = Cluster.objects.get(pk=live_project.cluster.pk)
    quota_usage_collect(cluster=cluster, client=slurm_client_for(cluster))
    released = LedgerEntry.objects.filter(job=job, kind=LedgerKind.RELEASE, note="task never ran")
    assert sorted(index or 0 for index in released.values_list("array_task", flat=True)) == [1, 2, 3]
    assert ledger_daily_mismatches() == []


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("array", "words"),
    [
        ("ten", "'ten' is not a task index or range"),
        ("5-2", "The range '5-2' ends before it starts; write it as 2-5."),
        ("0-9%0", "'%0' is not a limit of running tasks"),
        ("0-5000", "Task indexes must be below 1001 (the cluster's MaxArraySize); '0-5000' goes up to 5000."),
        ("1,,2", "'' is not a task index or range"),
    ],
)
def test_a_bad_array_expression_is_refused_by_name(live_project: LiveProject, array: str, words: str) -> None:
    body = {
        "project": live_project.label,
        "cluster": "local",
        "partition": "h100",
        "gpu_type": "h100",
        "script": "#!/bin/bash\n",
        "array": array,
    }
    response = live_project.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert list(response.json()["fields"]) == ["array"]
    assert words in response.json()["fields"]["array"][0]
    assert not Job.objects.filter(project=live_project.project).exists()


@pytest.mark.cluster
def test_an_array_that_cannot_fit_is_refused_saying_how_many_tasks_would(
    live_project: LiveProject, sent_tasks: list[Any]
) -> None:
    allocation = Allocation.objects.get(project=live_project.project)
    Allocation.objects.filter(pk=allocation.pk).update(granted_gpu_seconds=3600)  # room for 30 tasks of 2 GPU-min
    body = {
        "project": live_project.label,
        "cluster": "local",
        "partition": "h100",
        "gpus": 1,
        "time_limit_minutes": 2,
        "script": "#!/bin/bash\n",
        "array": "0-99",
    }
    shape = {key: value for key, value in body.items() if key != "script"}
    estimate = live_project.api.post("/api/v1/estimates/", shape, format="json").json()
    assert (estimate["array_tasks"], estimate["array_tasks_that_fit"], estimate["fits"]) == (100, 30, False)

    response = live_project.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "quota_exceeded"
    assert "(100 tasks x 1 GPU x 2 min)" in response.json()["message"]
    assert "enough for 30 of its tasks; ask for at most 30 tasks" in response.json()["message"]
    # The estimate's verdict is the submission's refusal, in the same words.
    assert estimate["message"].endswith(response.json()["message"])
    assert not Job.objects.filter(project=live_project.project).exists()

    accepted = live_project.api.post("/api/v1/jobs/", {**body, "array": "0-29"}, format="json")
    assert accepted.status_code == 202
    assert Allocation.objects.get(pk=allocation.pk).reserved_gpu_seconds == 3600
    deliveries = [task for task in sent_tasks if task[0] == "jobs.tasks.job_submit"]
    assert deliveries == [("jobs.tasks.job_submit", (accepted.json()["id"],))]  # one delivery for the whole array


def _array_of(tasks: int) -> Job:
    """An array's row and its tasks in a project of its own, on a cluster of its own (as synced, no Slurm)."""
    cluster = make_matrix_cluster(unique_slug("arrays"))
    job = make_job(cluster, array=f"0-{tasks - 1}", array_task_count=tasks, state=JobState.RUNNING)
    JobArrayTask.objects.bulk_create(JobArrayTask(job=job, index=index) for index in range(tasks))
    return job


def test_the_tasks_api_reads_a_constant_number_of_queries_whatever_the_number_of_tasks() -> None:
    counts = []
    for tasks in (3, 150):
        job = _array_of(tasks)
        api = APIClient()
        api.force_authenticate(job.user)
        with CaptureQueriesContext(connection) as queries:
            page = api.get(f"/api/v1/jobs/{job.pk}/tasks/?page_size=200")
        assert page.status_code == 200
        assert page.json()["count"] == tasks
        assert [task["index"] for task in page.json()["results"]] == list(range(tasks))
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_the_tasks_of_another_tenants_array_are_not_found() -> None:
    job = _array_of(2)
    outsider = make_job(make_matrix_cluster(unique_slug("other"))).user
    api = APIClient()
    api.force_authenticate(outsider)
    assert api.get(f"/api/v1/jobs/{job.pk}/tasks/").status_code == 404
    assert api.post(f"/api/v1/jobs/{job.pk}/tasks/0/cancel/").status_code == 404
    assert JobArrayTask.objects.filter(job=job, cancel_requested_at__isnull=False).count() == 0


@pytest.mark.parametrize(
    ("expression", "indexes", "cap"),
    [("0-3", (0, 1, 2, 3), None), ("1,5,9%2", (1, 5, 9), 2), ("0-8:4,3", (0, 3, 4, 8), None), ("7", (7,), None)],
)
def test_array_expressions_are_read_as_sbatch_reads_them(expression: str, indexes: tuple[int, ...], cap: int) -> None:
    spec = array_parse(expression)
    assert (spec.indexes, spec.max_running, spec.task_count) == (indexes, cap, len(indexes))


def test_an_index_at_the_cluster_limit_is_refused() -> None:
    with pytest.raises(ArrayExpressionError, match="below 10 "):
        array_parse("0-10", max_array_size=10)


@pytest.mark.cluster
def test_a_saved_template_carries_an_array_and_a_bad_one_is_refused(
    live_project: LiveProject, sent_tasks: list[Any]
) -> None:
    body = {"project": live_project.label, "name": "sweep", "script": "#!/bin/bash\necho $SLURM_ARRAY_TASK_ID\n"}
    refused = live_project.api.post("/api/v1/job-templates/", {**body, "array": "x"}, format="json")
    assert refused.status_code == 400
    assert list(refused.json()["fields"]) == ["array"]
    saved = live_project.api.post("/api/v1/job-templates/", {**body, "array": "0-4%2"}, format="json")
    assert (saved.status_code, saved.json()["array"]) == (201, "0-4%2")

    reply = live_project.submit(template=saved.json()["id"])
    assert (reply["array"], reply["array_tasks"], reply["array_max_running"]) == ("0-4%2", 5, 2)
    assert JobArrayTask.objects.filter(job_id=str(reply["id"])).count() == 5
