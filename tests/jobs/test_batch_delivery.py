"""Workers deliver a cluster's queued jobs in batches: each job keeps its own outcome, none is lost when Slurm
does not answer, two workers draining the same cluster submit each job once, and a batch costs few queries;
on the real local cluster and PostgreSQL.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster
from clusters.slurm import SlurmClient
from jobs import job_sync, sync_schedule
from jobs.job_sync import DeliveryRun, jobs_deliver_queued
from jobs.models import Job, JobState, JobTransition
from jobs.paths import job_paths
from tests.conftest import SentTask
from tests.jobs.conftest import LiveProject

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

SCRIPT = "#!/bin/bash\ntrue\n"
# Nothing listens on the discard port: every request is refused at once, as by a slurmrestd that is down.
UNREACHABLE_URL = "http://127.0.0.1:9"


@pytest.fixture
def project(live_project: LiveProject, slurm_client: SlurmClient) -> Iterator[LiveProject]:
    """`live_project`; afterwards its jobs are cancelled and waited for, and their output directories removed.

    Waited for: `live_project` then deletes the project's Slurm accounts, and deleting an account whose jobs are
    still completing can leave slurmctld's association tree broken (README, "Slurm 24.11 and 26.05").
    """
    yield live_project
    account = live_project.project.slurm_account
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listing = slurm_client.list_jobs()
        listed = listing.jobs if listing else ()
        active = [job for job in listed if job.account == account and not job.state.is_finished]
        if not active:
            break
        for slurm_job in active:
            slurm_client.cancel_job(user=slurm_client.admin_user, job_id=slurm_job.job_id)
        time.sleep(0.5)
    shutil.rmtree(Path(live_project.cluster.log_root) / live_project.project.tenant.slug, ignore_errors=True)


def queued_job(project: LiveProject, *, created_at: Any = None, **fields: Any) -> Job:
    """A job stored as the API stores one, without the message to a worker; of any shape, even one the API
    would refuse."""
    job_id = uuid.uuid4()
    paths = job_paths(
        log_root=project.cluster.log_root,
        tenant_slug=project.project.tenant.slug,
        project_slug=project.project.slug,
        job_id=job_id,
    )
    now = created_at or timezone.now()
    values: dict[str, Any] = {
        "name": "batch",
        "partition": project.partition,
        "gpu_type": project.gpu_type,
        "gpus": 1,
        "time_limit_minutes": 1,
        "working_directory": paths.working_directory,
        "stdout_path": paths.stdout,
        "stderr_path": paths.stderr,
    }
    job = Job.objects.create(
        id=job_id,
        project=project.project,
        cluster=project.cluster,
        user=project.member,
        cluster_username="alice",
        script=SCRIPT,
        created_at=now,
        updated_at=now,
        **{**values, **fields},
    )
    JobTransition.objects.create(job=job, from_state="", to_state=JobState.QUEUED, at=now, detail="accepted")
    return job


def queued_jobs(project: LiveProject, count: int) -> list[Job]:
    return [queued_job(project, name=f"batch-{number}") for number in range(count)]


def slurm_ids_by_tag(client: SlurmClient, tags: Iterable[str]) -> dict[str, list[int]]:
    """The ids of the Slurm jobs carrying these tags, by tag: exactly once means one id per tag."""
    wanted = set(tags)
    listing = client.list_jobs()
    found: dict[str, list[int]] = {}
    for slurm_job in listing.jobs if listing else ():
        if slurm_job.comment in wanted:
            found.setdefault(slurm_job.comment, []).append(slurm_job.job_id)
    return found


def outcomes(run: DeliveryRun) -> dict[uuid.UUID, str]:
    return {job_id: delivery.outcome for job_id, delivery in run.deliveries.items()}


def timeline(job: Job) -> list[tuple[str, str]]:
    return [(step.to_state, step.detail) for step in job.transitions.order_by("id")]


# One job's fate is its own ---------------------------------------------------------------------------------


def test_a_batch_rejects_the_jobs_that_cannot_run_and_submits_the_others_once(
    project: LiveProject, slurm_client: SlurmClient
) -> None:
    first, second, third = queued_jobs(project, 3)
    # Slurm refuses 9 GPUs on nodes of 4; a working directory outside the log root is never prepared.
    impossible = queued_job(project, name="impossible", gpus=9)
    misplaced = queued_job(project, name="misplaced", working_directory="/tmp/elsewhere")
    # Settled without Slurm: cancelled before any attempt, and queued for longer than the portal waits.
    cancelled = queued_job(project, name="cancelled", cancel_requested_at=timezone.now())
    too_old = queued_job(
        project,
        name="too-old",
        created_at=timezone.now() - timedelta(hours=settings.JOB_SUBMIT_GIVE_UP_HOURS, minutes=1),
        last_error="slurmrestd was down",
    )

    run = jobs_deliver_queued(job_id=second.pk)

    assert run.batches == 1
    assert outcomes(run) == {
        first.pk: "submitted",
        second.pk: "submitted",
        third.pk: "submitted",
        impossible.pk: "rejected",
        misplaced.pk: "rejected",
        cancelled.pk: "cancelled before submission",
        too_old.pk: "gave up",
    }
    delivered = list(Job.objects.filter(pk__in=[first.pk, second.pk, third.pk]))
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment for job in delivered]) == {
        job.slurm_comment: [job.slurm_job_id] for job in delivered
    }
    for job in delivered:
        assert (job.state, job.submit_attempts, job.submit_lease_until, job.last_error) == (
            JobState.PENDING,
            1,
            None,
            "",
        )
        assert timeline(job) == [("queued", "accepted"), ("pending", f"Slurm job {job.slurm_job_id}")]

    slurm_words = "Requested node configuration is not available (Slurm error 2014)"
    impossible.refresh_from_db()
    assert (impossible.state, impossible.last_error, impossible.slurm_job_id) == (JobState.REJECTED, slurm_words, None)
    assert timeline(impossible) == [("queued", "accepted"), ("rejected", slurm_words)]
    misplaced.refresh_from_db()
    directory_words = f"/tmp/elsewhere is not under the cluster's log root {project.cluster.log_root}"
    assert (misplaced.state, misplaced.last_error, misplaced.slurm_job_id) == (
        JobState.REJECTED,
        directory_words,
        None,
    )
    assert timeline(misplaced) == [("queued", "accepted"), ("rejected", directory_words)]
    cancelled.refresh_from_db()
    assert (cancelled.state, cancelled.submit_attempts) == (JobState.CANCELLED, 0)
    assert timeline(cancelled) == [("queued", "accepted"), ("cancelled", "cancelled by a user before it reached Slurm")]
    too_old.refresh_from_db()
    gave_up_words = f"Slurm could not be reached for {settings.JOB_SUBMIT_GIVE_UP_HOURS} hours: slurmrestd was down"
    assert (too_old.state, too_old.last_error, too_old.submit_attempts) == (JobState.REJECTED, gave_up_words, 0)
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment for job in (misplaced, cancelled, too_old)]) == {}


def test_a_message_for_a_job_a_batch_already_delivered_delivers_the_clusters_other_due_jobs(
    project: LiveProject,
) -> None:
    first, second = queued_jobs(project, 2)
    jobs_deliver_queued(job_id=first.pk)

    with CaptureQueriesContext(connection) as queries:
        run = jobs_deliver_queued(job_id=second.pk)
    # Nothing else is due: the check that the database is not a restored copy, the job's glance, one look for due
    # jobs (in its transaction), and one more after the run gave the cluster's wake back.
    assert (outcomes(run), run.batches) == ({second.pk: "nothing to do"}, 0)
    assert [query["sql"].split()[0] for query in queries] == ["SELECT", "SELECT", *["BEGIN", "SELECT", "COMMIT"] * 2]

    # A job accepted while that message waited sent none of its own: the message delivers it.
    late = queued_job(project, name="late")
    run = jobs_deliver_queued(job_id=second.pk)
    assert (outcomes(run), run.batches) == ({second.pk: "nothing to do", late.pk: "submitted"}, 1)


def test_jobs_accepted_while_a_delivery_message_waits_send_none_and_that_message_delivers_them(
    project: LiveProject, sent_tasks: list[SentTask]
) -> None:
    ids = [str(project.submit(name=f"burst-{number}")["id"]) for number in range(3)]
    assert sent_tasks == [("jobs.tasks.job_submit", (ids[0],))]  # one message stands for all three

    run = jobs_deliver_queued(job_id=uuid.UUID(ids[0]))

    assert {str(job_id): delivery.outcome for job_id, delivery in run.deliveries.items()} == dict.fromkeys(
        ids, "submitted"
    )
    # The run took the message: the next job accepted sends one again.
    later = str(project.submit(name="after")["id"])
    assert sent_tasks[1:] == [("jobs.tasks.job_submit", (later,))]


def test_jobs_accepted_while_a_run_drains_send_none_and_that_run_delivers_them(
    project: LiveProject, sent_tasks: list[SentTask], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = str(project.submit(name="first")["id"])
    late: list[str] = []
    deliver = job_sync._batch_deliver

    def deliver_while_more_arrive(**arguments: Any) -> Any:
        if len(late) < 2:  # accepted while the run submits a batch: one in the first, one in the second
            late.append(str(project.submit(name=f"late-{len(late)}")["id"]))
        return deliver(**arguments)

    monkeypatch.setattr(job_sync, "_batch_deliver", deliver_while_more_arrive)
    run = jobs_deliver_queued(job_id=uuid.UUID(first))

    assert {str(job_id): delivery.outcome for job_id, delivery in run.deliveries.items()} == dict.fromkeys(
        [first, *late], "submitted"
    )
    assert (run.batches, run.holding_wake) == (3, False)
    assert sent_tasks == [("jobs.tasks.job_submit", (first,))]  # the late ones sent no message of their own
    after = str(project.submit(name="after")["id"])  # the run gave the wake back: the next job sends one
    assert sent_tasks[1:] == [("jobs.tasks.job_submit", (after,))]


def test_a_job_accepted_just_before_a_run_gives_its_wake_back_is_delivered_by_that_run(
    project: LiveProject, sent_tasks: list[SentTask], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = str(project.submit(name="first")["id"])
    late: list[str] = []
    give_back = sync_schedule.delivery_wake_taken

    def accepted_then_given_back(cluster_id: int) -> None:
        if not late:  # the run found nothing due and is about to give the wake back: a job comes in between
            late.append(str(project.submit(name="late")["id"]))
        give_back(cluster_id)

    monkeypatch.setattr(job_sync, "delivery_wake_taken", accepted_then_given_back)
    run = jobs_deliver_queued(job_id=uuid.UUID(first))

    assert {str(job_id): delivery.outcome for job_id, delivery in run.deliveries.items()} == dict.fromkeys(
        [first, *late], "submitted"
    )
    assert sent_tasks == [("jobs.tasks.job_submit", (first,))]  # the late job saw the wake held: no message


def test_after_a_small_batch_a_run_lingers_so_its_next_batch_carries_the_jobs_accepted_meanwhile(
    project: LiveProject, sent_tasks: list[SentTask], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.JOB_DELIVERY_LINGER_MS = 500  # longer than a batch takes even on a loaded machine: the run waits
    first = str(project.submit(name="first")["id"])
    late: list[str] = []
    waits: list[float] = []
    batch_sizes: list[int] = []
    linger, deliver = job_sync._linger, job_sync._batch_deliver

    def accepted_while_lingering(seconds: float) -> None:
        waits.append(seconds)
        if not late:  # two jobs come in while the run waits after its first batch
            late.extend(str(project.submit(name=f"late-{number}")["id"]) for number in range(2))
        linger(seconds)

    def counted(**arguments: Any) -> Any:
        batch_sizes.append(len(arguments["claimed"]))
        return deliver(**arguments)

    monkeypatch.setattr(job_sync, "_linger", accepted_while_lingering)
    monkeypatch.setattr(job_sync, "_batch_deliver", counted)
    run = jobs_deliver_queued(job_id=uuid.UUID(first))

    assert {str(job_id): delivery.outcome for job_id, delivery in run.deliveries.items()} == dict.fromkeys(
        [first, *late], "submitted"
    )
    assert batch_sizes == [1, 2]  # the two late jobs in one batch
    # After each of the two small batches, counted from its claim: no job waits more than the linger for its claim.
    # The claim that found nothing ended the run as before, without lingering.
    assert len(waits) == 2
    assert all(0 < wait <= 0.5 for wait in waits), waits
    assert sent_tasks == [("jobs.tasks.job_submit", (first,))]  # the late ones sent no message of their own


@pytest.mark.parametrize(("linger_ms", "lingers"), [(40, 1), (0, 0)])
def test_a_run_claims_again_at_once_after_a_full_batch_or_with_no_linger_set(
    project: LiveProject, monkeypatch: pytest.MonkeyPatch, settings: Any, linger_ms: int, lingers: int
) -> None:
    settings.JOB_DELIVERY_BATCH_SIZE = 2
    settings.JOB_DELIVERY_LINGER_MS = linger_ms
    jobs = queued_jobs(project, 3)
    waits: list[float] = []
    monkeypatch.setattr(job_sync, "_linger", waits.append)

    run = jobs_deliver_queued(job_id=jobs[0].pk)

    assert (outcomes(run), run.batches) == ({job.pk: "submitted" for job in jobs}, 2)
    assert len(waits) == lingers  # only after the second batch (one job), never after the full first one


def test_a_message_before_its_jobs_retry_is_due_delivers_nothing(project: LiveProject) -> None:
    waiting = queued_job(project, next_attempt_at=timezone.now() + timedelta(minutes=1))

    run = jobs_deliver_queued(job_id=waiting.pk)

    waiting.refresh_from_db()
    assert (outcomes(run), waiting.state, waiting.submit_attempts) == ({waiting.pk: "not due yet"}, "queued", 0)


# Slurm not answering ------------------------------------------------------------------------------------


def test_a_batch_that_finds_slurm_unreachable_retries_every_job_and_loses_none(
    project: LiveProject, slurm_client: SlurmClient, settings: Any
) -> None:
    settings.JOB_DELIVERY_THREADS = 2  # fewer than the jobs: those not started once one fails are not sent
    jobs = queued_jobs(project, 6)
    Cluster.objects.filter(pk=project.cluster.pk).update(slurmrestd_url=UNREACHABLE_URL)

    run = jobs_deliver_queued(job_id=jobs[0].pk)

    assert run.batches == 1
    assert set(outcomes(run).values()) == {"retry"}
    assert set(run.deliveries) == {job.pk for job in jobs}
    unreachable = (
        rf"Slurm is not answering \(attempt 1\): slurmrestd at {UNREACHABLE_URL} is unreachable: .+; "
        r"the portal will try again\."
    )
    for job in Job.objects.filter(pk__in=[job.pk for job in jobs]):
        delay = run.deliveries[job.pk].retry_in
        assert delay is not None
        assert 4 <= delay <= 6
        assert (job.state, job.slurm_job_id, job.submit_attempts, job.submit_lease_until) == ("queued", None, 1, None)
        assert job.next_attempt_at is not None
        assert job.next_attempt_at > timezone.now()
        assert re.fullmatch(unreachable, job.last_error), job.last_error
    cluster = Cluster.objects.get(pk=project.cluster.pk)
    assert cluster.last_ping_ok is False
    assert UNREACHABLE_URL in cluster.last_ping_error

    # The cluster answers again and the retries come due: each job reaches Slurm once, after looking for its tag.
    Cluster.objects.filter(pk=project.cluster.pk).update(slurmrestd_url=settings.LOCAL_CLUSTER_URL)
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(next_attempt_at=timezone.now())

    run = jobs_deliver_queued(job_id=jobs[0].pk)

    assert outcomes(run) == {job.pk: "submitted" for job in jobs}
    delivered = list(Job.objects.filter(pk__in=[job.pk for job in jobs]))
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment for job in delivered]) == {
        job.slurm_comment: [job.slurm_job_id] for job in delivered
    }
    for job in delivered:
        assert (job.state, job.submit_attempts, job.last_error) == (JobState.PENDING, 2, "")
        assert timeline(job) == [("queued", "accepted"), ("pending", f"Slurm job {job.slurm_job_id}")]


# Two workers at once ------------------------------------------------------------------------------------


def test_two_workers_draining_the_same_cluster_at_once_submit_each_job_once(
    project: LiveProject, slurm_client: SlurmClient, settings: Any
) -> None:
    settings.JOB_DELIVERY_BATCH_SIZE = 4  # many small batches, so that the two runs interleave
    jobs = queued_jobs(project, 24)
    start = threading.Barrier(2)
    runs: list[DeliveryRun] = []

    def drain(first: Job) -> None:
        try:
            start.wait(timeout=10)
            runs.append(jobs_deliver_queued(job_id=first.pk))
        finally:
            connections.close_all()  # this thread's own connection

    threads = [threading.Thread(target=drain, args=(first,)) for first in (jobs[0], jobs[-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(runs) == 2
    submitted = [job_id for run in runs for job_id, outcome in outcomes(run).items() if outcome == "submitted"]
    assert sorted(submitted) == sorted(job.pk for job in jobs)  # each job by one of the two runs, none by both
    delivered = list(Job.objects.filter(pk__in=[job.pk for job in jobs]))
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment for job in delivered]) == {
        job.slurm_comment: [job.slurm_job_id] for job in delivered
    }
    assert {(job.state, job.submit_attempts) for job in delivered} == {(JobState.PENDING, 1)}


# Cost ---------------------------------------------------------------------------------------------------


def test_a_batch_of_20_costs_at_most_3_queries_per_delivered_job(project: LiveProject) -> None:
    jobs = queued_jobs(project, 20)

    with CaptureQueriesContext(connection) as queries:
        run = jobs_deliver_queued(job_id=jobs[0].pk)

    assert outcomes(run) == {job.pk: "submitted" for job in jobs}
    assert len(queries) / len(jobs) <= 3, [query["sql"][:120] for query in queries]
