"""Delivery of jobs to Slurm through faults: slurmrestd down, a worker killed inside its submit call, a message
delivered twice, and Slurm's refusal; on the real local cluster, PostgreSQL, Redis and real Celery workers.

These tests stop, freeze and kill the local cluster's slurmrestd for a few seconds each (a concurrent run on
the same cluster sees that too); a fixture always brings it back.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.accounts import project_slurm_sync
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount
from clusters.services import cluster_check, cluster_sync_inventory
from clusters.slurm import SlurmClient, SlurmError, SlurmUnavailable
from clusters.slurm.types import JobState as SlurmState
from clusters.slurm.types import SlurmJob
from jobs.job_sync import cluster_jobs_sync, job_deliver
from jobs.models import Job, JobState, JobTransition, job_comment_tag
from jobs.paths import job_paths
from jobs.tasks import cluster_jobs_sync as cluster_jobs_sync_task
from jobs.tasks import job_submit as job_submit_task
from portal.celery import app as celery_app
from tenants.models import Project
from tests.conftest import wait_until
from tests.factories import add_project_member, grant_allocation, make_project, make_tenant, make_user, unique_slug
from tests.processes import portal_environment

pytestmark = [pytest.mark.cluster, pytest.mark.disrupts_clusters, pytest.mark.django_db(transaction=True)]

REPOSITORY = Path(settings.BASE_DIR)
SLURMRESTD_PID_FILE = Path("/run/slurm/slurmrestd.pid")  # where scripts/cluster.sh keeps it
SLURMRESTD_PORT = urlsplit(settings.LOCAL_CLUSTER_URL).port
SCRIPT = "#!/bin/bash\necho hi\n"
UNREACHABLE = re.compile(
    r"Slurm is not answering \(attempt \d+\): "
    rf"slurmrestd at {re.escape(settings.LOCAL_CLUSTER_URL)} is unreachable: .+; the portal will try again\."
)


# Workers ------------------------------------------------------------------------------------------------

# Retries back off to at most 1 s instead of 5 minutes, and the sweep takes over a job as soon as its lease
# has run out, so that each fault heals within seconds.
WORKER_ENVIRONMENT = {"JOB_SUBMIT_RETRY_MAX_SECONDS": "1", "JOB_SUBMIT_SWEEP_GRACE_SECONDS": "0"}

# A worker whose default queue is a queue of its own: the retries it schedules come back to it, and the worker
# of a concurrent test run on the same broker (which knows another database) never takes these messages.
WORKER_MAIN = """
import sys
from portal.celery import app
app.conf.task_default_queue = sys.argv[1]
app.worker_main(sys.argv[2:])
"""


@dataclass
class Worker:
    name: str
    queue: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL: the worker dies wherever it is, as on an out-of-memory kill or a lost machine."""
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Stop it if it still runs, then remove its queue from the broker that concurrent runs share."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        with celery_app.connection_for_write() as broker:
            channel: Any = broker.default_channel
            for key in channel.client.scan_iter(f"*{self.queue}*"):  # the queue and its bindings
                channel.client.delete(key)
            # A killed worker's message stays in kombu's `unacked` hash, to come back into the queue in an hour.
            for tag, payload in channel.client.hscan_iter(channel.unacked_key):
                if self.queue in payload.decode():
                    channel.client.hdel(channel.unacked_key, tag)
                    channel.client.zrem(channel.unacked_index_key, tag)

    def tasks_run(self, task_name: str) -> int:
        """How many `task_name` tasks this worker has taken; a solo worker answers only between tasks."""
        stats: dict[str, Any] = celery_app.control.inspect(destination=[self.name], timeout=2).stats() or {}
        return int(stats.get(self.name, {}).get("total", {}).get(task_name, 0))


def _start_worker(log_directory: Path) -> Worker:
    queue = f"delivery-faults-{uuid.uuid4().hex[:8]}"
    name = f"{queue}@localhost"
    environment = portal_environment(**WORKER_ENVIRONMENT)
    arguments = ["worker", "--pool=solo", "--loglevel=INFO", "--hostname", name, "--queues", queue]
    arguments += ["--without-mingle", "--without-gossip"]
    log = log_directory / f"{queue}.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", WORKER_MAIN, queue, *arguments],
            cwd=REPOSITORY,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not celery_app.control.ping(destination=[name], timeout=0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the Celery worker did not start; its log:\n{log.read_text()}")
    return Worker(name=name, queue=queue, process=process, log=log)


@pytest.fixture(scope="module")
def worker(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A real worker on the test database, shared by this file's tests; it is never killed."""
    started = _start_worker(tmp_path_factory.mktemp("workers"))
    yield started
    started.stop()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[[], Worker]]:
    """Starts workers that a test may kill; those still alive are stopped afterwards."""
    started: list[Worker] = []

    def start() -> Worker:
        started.append(_start_worker(tmp_path))
        return started[-1]

    yield start
    for each in started:
        each.stop()


@pytest.fixture
def send_tasks_to(monkeypatch: pytest.MonkeyPatch) -> Callable[[Worker], None]:
    """Route the task messages this process sends (the API's, `.delay()`) to one worker's queue."""

    def route(target: Worker) -> None:
        monkeypatch.setattr(celery_app.conf, "task_default_queue", target.queue)

    return route


# slurmrestd ---------------------------------------------------------------------------------------------


class Slurmrestd:
    """The local cluster's slurmrestd, stopped, frozen or killed by a test; `restore` brings it back."""

    def __init__(self) -> None:
        self.pid = int(SLURMRESTD_PID_FILE.read_text())

    def stop(self) -> None:
        """Stopped: connections are refused at once."""
        _cluster_script("stop", "slurmrestd")

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts connections and buffers requests, but nothing answers them."""
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: it goes on and serves the requests that arrived while it was frozen."""
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, frozen or not: the requests it had not read yet die with it."""
        os.kill(self.pid, signal.SIGKILL)
        wait_until(lambda: not _running(self.pid), timeout_seconds=10, what="slurmrestd's exit")

    def restore(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        _cluster_script("up")
        self.pid = int(SLURMRESTD_PID_FILE.read_text())


def _running(pid: int) -> bool:
    """Whether the process exists and is no zombie (exited, not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cluster_script(*arguments: str) -> None:
    subprocess.run(["bash", str(REPOSITORY / "scripts" / "cluster.sh"), *arguments], check=True, capture_output=True)


@pytest.fixture
def slurmrestd() -> Iterator[Slurmrestd]:
    daemon = Slurmrestd()
    try:
        yield daemon
    finally:
        daemon.restore()


def _connected_to_slurmrestd(pid: int) -> bool:
    """Whether the process holds an established TCP connection to slurmrestd: its request is out."""
    sockets = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        # remote address, state (01: established) and inode, in /proc/net/tcp's columns
        if fields[2].endswith(f":{SLURMRESTD_PORT:04X}") and fields[3] == "01" and fields[9] in sockets:
            return True
    return False


# A project that can submit ------------------------------------------------------------------------------


@dataclass
class World:
    cluster: Cluster
    project: Project
    member: User  # runs as the POSIX user alice
    api: APIClient  # logged in as `member`

    def submit(self, **fields: object) -> uuid.UUID:
        """POST /api/v1/jobs/ as the member; the job's id."""
        body = {
            "project": f"{self.project.tenant.slug}/{self.project.slug}",
            "cluster": self.cluster.name,
            "partition": "h100",
            "gpu_type": "h100",
            "gpus": 1,
            "time_limit_minutes": 1,
            "script": SCRIPT,
            **fields,
        }
        response = self.api.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 202, response.json()
        return uuid.UUID(response.json()["id"])

    def queued_job(self, **fields: Any) -> Job:
        """A job stored as the API stores one, but with no message to a worker; and any shape, even one the
        API would refuse."""
        job_id = uuid.uuid4()
        paths = job_paths(
            log_root=self.cluster.log_root,
            tenant_slug=self.project.tenant.slug,
            project_slug=self.project.slug,
            job_id=job_id,
        )
        now = timezone.now()
        values = {"name": "job", "partition": "h100", "gpu_type": "h100", "gpus": 1, "time_limit_minutes": 1}
        job = Job.objects.create(
            id=job_id,
            project=self.project,
            cluster=self.cluster,
            user=self.member,
            cluster_username="alice",
            script=SCRIPT,
            working_directory=paths.working_directory,
            stdout_path=paths.stdout,
            stderr_path=paths.stderr,
            created_at=now,
            updated_at=now,
            next_attempt_at=now,
            **{**values, **fields},
        )
        JobTransition.objects.create(job=job, from_state="", to_state=JobState.QUEUED, at=now, detail="accepted")
        return job

    def detail(self, job_id: uuid.UUID) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/jobs/{job_id}/")
        assert response.status_code == 200
        data: dict[str, Any] = response.json()
        return data


@dataclass
class SharedProject:
    """The tenant and project every test here recreates (the database is emptied after each), so that their
    Slurm accounts are created once for the file: slurmdbd takes seconds to create and delete accounts."""

    tenant_slug: str
    project_slug: str
    slurm_accounts: list[str]  # the project's, then the tenant's parent


@pytest.fixture(scope="module")
def shared_project(slurm_client: SlurmClient) -> Iterator[SharedProject]:
    shared = SharedProject(tenant_slug=unique_slug("tn"), project_slug=unique_slug("pr"), slurm_accounts=[])
    yield shared
    for name in shared.slurm_accounts:
        for _ in range(40):  # slurmdbd refuses while a cancelled job is still completing
            try:
                if name == shared.slurm_accounts[0]:
                    slurm_client.remove_user_association(account=name, user="alice", cluster="local")
                slurm_client.delete_account(name=name)
                break
            except SlurmError as exc:
                if any(message.error_number in (1900, 9003) for message in exc.messages):
                    break  # 22.05's answers for what does not exist (any more)
                time.sleep(0.5)
    shutil.rmtree(Path(settings.LOCAL_CLUSTER_LOG_ROOT) / shared.tenant_slug, ignore_errors=True)


@pytest.fixture
def world(slurm_client: SlurmClient, shared_project: SharedProject) -> Iterator[World]:
    """The local cluster synced, the shared project with its Slurm account, and a member who runs as alice.

    Afterwards the account's jobs still queued or running in Slurm are cancelled.
    """
    cluster = Cluster.objects.create(
        name="local",
        slurmrestd_url=settings.LOCAL_CLUSTER_URL,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
        admin_user=settings.LOCAL_CLUSTER_ADMIN_USER,
    )
    client = slurm_client_for(cluster)
    assert cluster_check(cluster=cluster, client=client), cluster.last_ping_error
    cluster_sync_inventory(cluster=cluster, client=client)
    member = make_user()
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    tenant = make_tenant(shared_project.tenant_slug)
    project = make_project(tenant, shared_project.project_slug)
    shared_project.slurm_accounts[:] = [project.slurm_account, tenant.slurm_parent_account]
    add_project_member(project, member, "member")
    grant_allocation(project, cluster)
    project_slurm_sync(project_id=project.pk)
    api = APIClient()
    api.force_authenticate(member)
    yield World(cluster=Cluster.objects.get(pk=cluster.pk), project=project, member=member, api=api)
    for slurm_job in slurm_jobs(slurm_client):
        if slurm_job.account == project.slurm_account and not slurm_job.state.is_finished:
            slurm_client.cancel_job(user=slurm_client.admin_user, job_id=slurm_job.job_id)


def slurm_jobs(client: SlurmClient) -> tuple[SlurmJob, ...]:
    """All jobs slurmctld lists, ended ones included (it lists them for 5 minutes)."""
    for attempt in range(3):
        try:
            listing = client.list_jobs()
            break
        except SlurmUnavailable:
            # A keep-alive connection that slurmrestd dropped while it was frozen or restarted: this read is
            # the test's own, not under test, so it is simply sent again.
            if attempt == 2:
                raise
            time.sleep(0.2)
    assert listing is not None
    return listing.jobs


def slurm_jobs_tagged(client: SlurmClient, tags: Iterable[str]) -> list[SlurmJob]:
    wanted = set(tags)
    return [slurm_job for slurm_job in slurm_jobs(client) if slurm_job.comment in wanted]


def slurm_ids_by_tag(client: SlurmClient, tags: Iterable[str]) -> dict[str, list[int]]:
    """The ids of the Slurm jobs carrying these tags, by tag: exactly-once means one id per tag."""
    found: dict[str, list[int]] = {}
    for slurm_job in slurm_jobs_tagged(client, tags):
        found.setdefault(slurm_job.comment, []).append(slurm_job.job_id)
    return found


def wait_for_jobs(job_ids: list[uuid.UUID], condition: Callable[[Job], bool], *, what: str) -> list[Job]:
    """Poll the jobs until `condition` holds for each; fail saying where each one stands."""
    deadline = time.monotonic() + 30
    while True:
        jobs = list(Job.objects.filter(pk__in=job_ids).order_by("created_at"))
        if len(jobs) == len(job_ids) and all(condition(job) for job in jobs):
            return jobs
        if time.monotonic() > deadline:
            states = "; ".join(f"{job.state}, {job.submit_attempts} attempts: {job.last_error}" for job in jobs)
            pytest.fail(f"{what} did not happen within 30s: {states}")
        time.sleep(0.2)


def transitions(job: Job) -> list[tuple[str, str]]:
    return [(step.to_state, step.detail) for step in job.transitions.order_by("id")]


# slurmrestd down ----------------------------------------------------------------------------------------


def test_jobs_submitted_while_slurmrestd_is_down_wait_queued_then_reach_slurm_exactly_once(
    world: World,
    worker: Worker,
    send_tasks_to: Callable[[Worker], None],
    slurmrestd: Slurmrestd,
    slurm_client: SlurmClient,
) -> None:
    send_tasks_to(worker)
    slurmrestd.stop()

    job_ids = [world.submit(name=f"outage-{number}") for number in range(3)]

    wait_until(
        lambda: Job.objects.filter(pk__in=job_ids, submit_attempts__gte=2).count() == 3,
        what="two attempts at each job while slurmrestd is down",
    )
    for job_id in job_ids:
        detail = world.detail(job_id)
        assert (detail["state"], detail["slurm_job_id"]) == ("queued", None)
        assert detail["submit_attempts"] >= 2
        assert UNREACHABLE.fullmatch(detail["last_error"]), detail["last_error"]

    slurmrestd.restore()

    jobs = wait_for_jobs(
        job_ids, lambda job: job.slurm_job_id is not None, what="the submissions once slurmrestd is back"
    )
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment for job in jobs]) == {
        job.slurm_comment: [job.slurm_job_id] for job in jobs
    }
    for job in jobs:
        assert (job.state, job.last_error, job.submit_lease_until) == (JobState.PENDING, "", None)
        assert transitions(job) == [("queued", "accepted"), ("pending", f"Slurm job {job.slurm_job_id}")]
        detail = world.detail(job.pk)
        assert (detail["state"], detail["slurm_job_id"], detail["last_error"]) == ("pending", job.slurm_job_id, "")


# A worker killed inside the submit call -----------------------------------------------------------------

# How the take-over goes: the message delivered again (Redis restoring an unacknowledged message, or another
# message for the job), or the periodic sync's sweep; what it finds depends on whether the killed attempt
# reached Slurm. Expected: submit attempts in the end, and the detail of the job's move to `pending`.
TAKE_OVER_CASES = {
    "reached-slurm-then-redelivered": (True, "redelivered", 2, "found in Slurm after a lost reply"),
    "reached-slurm-then-swept": (True, "swept", 1, "found in Slurm"),
    "never-reached-slurm-then-redelivered": (False, "redelivered", 2, "Slurm job {slurm_job_id}"),
    "never-reached-slurm-then-swept": (False, "swept", 2, "Slurm job {slurm_job_id}"),
}


@pytest.mark.parametrize(
    ("reached_slurm", "take_over", "attempts", "detail"), list(TAKE_OVER_CASES.values()), ids=list(TAKE_OVER_CASES)
)
def test_a_worker_killed_inside_the_submit_call_leaves_exactly_one_slurm_job(
    reached_slurm: bool,
    take_over: str,
    attempts: int,
    detail: str,
    world: World,
    worker: Worker,
    start_worker: Callable[[], Worker],
    send_tasks_to: Callable[[Worker], None],
    slurmrestd: Slurmrestd,
    slurm_client: SlurmClient,
) -> None:
    doomed = start_worker()
    send_tasks_to(doomed)
    slurmrestd.freeze()
    job_id = world.submit(name="killed-mid-call")
    tag = job_comment_tag(job_id)
    wait_until(
        lambda: Job.objects.filter(pk=job_id, submit_attempts=1, submit_lease_until__isnull=False).exists(),
        what="the worker taking the job's lease",
    )
    wait_until(lambda: _connected_to_slurmrestd(doomed.process.pid), what="the worker's submit request")

    doomed.kill()
    if reached_slurm:
        slurmrestd.thaw()  # it now submits the request it had buffered, and its reply goes nowhere
        # Once the job has ended, what the sweep records of it no longer depends on when it looks.
        wait_until(
            lambda: [slurm_job.state.is_finished for slurm_job in slurm_jobs_tagged(slurm_client, [tag])] == [True],
            what="the buffered submission arriving in Slurm and ending",
        )
    else:
        slurmrestd.kill()
        slurmrestd.restore()
    job = Job.objects.get(pk=job_id)
    in_slurm_before = slurm_ids_by_tag(slurm_client, [tag])
    assert (job.state, job.slurm_job_id, job.submit_attempts) == (JobState.QUEUED, None, 1)
    assert [len(ids) for ids in in_slurm_before.values()] == ([1] if reached_slurm else [])

    # The killed worker's lease would run out JOB_SUBMIT_LEASE_SECONDS (60 s) after it was taken: moving it
    # into the past stands for that wait. A short lease for the worker instead would also let a slow but
    # living submission lose its lease, which is not the fault under test.
    Job.objects.filter(pk=job_id).update(submit_lease_until=timezone.now() - timedelta(seconds=1))
    send_tasks_to(worker)
    if take_over == "redelivered":
        job_submit_task.delay(str(job_id))
    else:
        cluster_jobs_sync_task.delay(world.cluster.pk)
    (job,) = wait_for_jobs([job_id], lambda job: job.slurm_job_id is not None, what="the take-over's record")

    assert slurm_ids_by_tag(slurm_client, [tag]) == {tag: [job.slurm_job_id]}
    if reached_slurm:
        assert in_slurm_before == {tag: [job.slurm_job_id]}  # the job the killed worker's request made
    assert (job.submit_attempts, job.submit_lease_until, job.last_error) == (attempts, None, "")
    assert transitions(job)[:2] == [
        ("queued", "accepted"),
        ("pending", detail.format(slurm_job_id=job.slurm_job_id)),
    ]


# The same delivery twice --------------------------------------------------------------------------------


def test_a_submit_message_delivered_three_times_makes_one_slurm_job(
    world: World, worker: Worker, send_tasks_to: Callable[[Worker], None], slurm_client: SlurmClient
) -> None:
    send_tasks_to(worker)
    runs_before = worker.tasks_run("jobs.tasks.job_submit")

    job_id = world.submit(name="redelivered")
    job_submit_task.delay(str(job_id))
    job_submit_task.delay(str(job_id))

    wait_until(
        lambda: worker.tasks_run("jobs.tasks.job_submit") == runs_before + 3, what="the worker taking 3 deliveries"
    )
    job = Job.objects.get(pk=job_id)
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment]) == {job.slurm_comment: [job.slurm_job_id]}
    assert (job.state, job.submit_attempts) == (JobState.PENDING, 1)
    assert transitions(job) == [("queued", "accepted"), ("pending", f"Slurm job {job.slurm_job_id}")]


def test_two_deliveries_at_the_same_moment_submit_once(world: World, slurm_client: SlurmClient) -> None:
    job = world.queued_job(name="raced")
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def deliver() -> None:
        try:
            start.wait(timeout=10)
            outcomes.append(job_deliver(job_id=job.pk).outcome)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    # The second either waits on the row lock and finds the lease, or comes after the first has recorded it.
    assert sorted(outcomes) in (["another worker holds it", "submitted"], ["nothing to do", "submitted"])
    job.refresh_from_db()
    assert slurm_ids_by_tag(slurm_client, [job.slurm_comment]) == {job.slurm_comment: [job.slurm_job_id]}
    assert (job.state, job.submit_attempts) == (JobState.PENDING, 1)


# Slurm refuses ------------------------------------------------------------------------------------------


def test_a_job_slurm_refuses_ends_rejected_with_slurms_words(
    world: World, worker: Worker, send_tasks_to: Callable[[Worker], None], slurm_client: SlurmClient
) -> None:
    # The API refuses 9 GPUs on h100 (its nodes have 4), so the job is stored directly: Slurm must say no.
    job = world.queued_job(name="impossible", gpus=9)
    send_tasks_to(worker)

    job_submit_task.delay(str(job.pk))

    (job,) = wait_for_jobs([job.pk], lambda job: job.is_final, what="the job's rejection")
    slurm_words = "Requested node configuration is not available (Slurm error 2014)"
    assert (job.state, job.last_error, job.slurm_job_id, job.submit_attempts) == (
        JobState.REJECTED,
        slurm_words,
        None,
        1,
    )
    assert transitions(job) == [("queued", "accepted"), ("rejected", slurm_words)]

    # slurmctld 22.05 keeps a submission it refused as a FAILED job carrying the tag: the sync must not take
    # that for the job's submission and overwrite the refusal.
    assert [
        (slurm_job.comment, slurm_job.state, slurm_job.state_reason)
        for slurm_job in slurm_jobs_tagged(slurm_client, [job.slurm_comment])
    ] == [(job.slurm_comment, SlurmState.FAILED, "BadConstraints")]
    cluster = Cluster.objects.get(pk=world.cluster.pk)
    cluster_jobs_sync(cluster=cluster, client=slurm_client_for(cluster))

    job.refresh_from_db()
    assert (job.state, job.last_error, job.slurm_job_id, job.slurm_state) == (JobState.REJECTED, slurm_words, None, "")
    assert transitions(job) == [("queued", "accepted"), ("rejected", slurm_words)]
    detail = world.detail(job.pk)
    assert (detail["state"], detail["last_error"], detail["slurm_job_id"]) == ("rejected", slurm_words, None)
