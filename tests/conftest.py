"""Shared fixtures: the real local Slurm cluster (started by `make cluster`), its accounts and job directories;
the demo's OpenID provider (tests/oidc_provider.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from channels.layers import channel_layers
from django.conf import settings

from clusters.clients import slurm_clients_close
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import JobState, JobSubmission, SlurmJob
from portal.celery import app as celery_app
from tests.live_clusters import LiveCluster, live_cluster_params
from tests.oidc_provider import SCRIPT as OIDC_PROVIDER_SCRIPT
from tests.oidc_provider import DemoProvider, provider_process

CLUSTER_NAME = "local"
JOB_USER = "alice"


@pytest.fixture(scope="session")
def slurm_client() -> Iterator[SlurmClient]:
    """A client of the real local slurmrestd; the suite fails loudly if the cluster is not up."""
    client = SlurmClient(
        base_url=settings.LOCAL_CLUSTER_URL,
        key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        admin_user=settings.LOCAL_CLUSTER_ADMIN_USER,
        timeout_seconds=10,
    )
    try:
        client.ping()
    except SlurmError as exc:
        pytest.fail(f"the local Slurm cluster is not reachable ({exc}); start it with `make cluster`")
    yield client
    client.close()


@pytest.fixture(scope="session", params=live_cluster_params())
def live(request: pytest.FixtureRequest) -> LiveCluster:
    """Each live cluster in turn (Slurm 22.05, 24.11, 26.05) for the tests that must hold on every generation.

    Session-scoped, so pytest runs one cluster's tests together.
    """
    cluster: LiveCluster | None = request.param
    if cluster is None:
        pytest.fail(
            "no local Slurm cluster is described in /var/lib/gpuportal/clusters; start them with `make cluster`"
        )
    return cluster


TEST_PARENT_ACCOUNT = "pytest"


@pytest.fixture(scope="session")
def slurm_parent_account(slurm_client: SlurmClient) -> str:
    """The parent of the tests' accounts, as a tenant's account is the parent of its projects'."""
    return parent_account_ensure(slurm_client, cluster=CLUSTER_NAME)


def parent_account_ensure(client: SlurmClient, *, cluster: str) -> str:
    """The tests' parent account with its association on `cluster`: created when either is missing. An account
    can outlive its association (22.05's slurmdbd lost one after a day of benchmarks deleting accounts), and then
    every account created under it fails with 'Unspecified error'; creating it again restores the association."""
    try:
        client.account_gpu_minutes_limit(account=TEST_PARENT_ACCOUNT, cluster=cluster)  # reads its association
    except SlurmError:  # none: SlurmNotFound, or 22.05's "Nothing found" (9003)
        client.create_account(name=TEST_PARENT_ACCOUNT, cluster=cluster, description="pytest", organization="pytest")
    return TEST_PARENT_ACCOUNT


@pytest.fixture
def slurm_account(slurm_client: SlurmClient, slurm_parent_account: str) -> Iterator[str]:
    """A fresh Slurm account with alice associated; its jobs are cancelled and the account removed afterwards."""
    name = f"t{uuid.uuid4().hex[:10]}"
    slurm_client.create_account(
        name=name,
        cluster=CLUSTER_NAME,
        description="pytest",
        organization="pytest",
        parent_account=slurm_parent_account,
    )
    slurm_client.add_user_association(account=name, user=JOB_USER, cluster=CLUSTER_NAME)
    yield name
    listing = slurm_client.list_jobs()
    for job in listing.jobs if listing else ():
        if job.account == name and not job.state.is_finished:
            slurm_client.cancel_job(user=slurm_client.admin_user, job_id=job.job_id)
    _remove_account(slurm_client, name)


def _remove_account(client: SlurmClient, name: str) -> None:
    celery_workers_idle()  # never under a worker's sync of it (see tests/jobs/conftest.py)
    # slurmdbd refuses to delete an account while a cancelled job is still completing: retry briefly.
    for _ in range(20):
        try:
            client.remove_user_association(account=name, user=JOB_USER, cluster=CLUSTER_NAME)
            client.delete_account(name=name)
            return
        except SlurmError:
            time.sleep(0.5)


@pytest.fixture
def job_directory() -> Iterator[Path]:
    """A directory under the cluster's log root that alice's jobs can write their output to."""
    path = Path(settings.LOCAL_CLUSTER_LOG_ROOT) / "pytest" / uuid.uuid4().hex
    path.mkdir(parents=True)
    user = pwd.getpwnam(JOB_USER)
    os.chown(path, user.pw_uid, user.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_submission(slurm_account: str, job_directory: Path) -> Callable[..., JobSubmission]:
    def make(**overrides: object) -> JobSubmission:
        values: dict[str, object] = {
            "name": "pytest-job",
            "account": slurm_account,
            "partition": "h100",
            "script": "#!/bin/bash\necho started\nsleep 2\necho done\n",
            "time_limit_minutes": 1,
            "working_directory": str(job_directory),
            "standard_output": str(job_directory / "stdout.txt"),
            "standard_error": str(job_directory / "stderr.txt"),
            "gpus": 1,
            "gpu_type": "h100",
        }
        values.update(overrides)
        return JobSubmission(**values)  # type: ignore[arg-type]

    return make


def wait_for_job(
    client: SlurmClient, job_id: int, until: Callable[[SlurmJob], bool], *, timeout_seconds: float = 60
) -> SlurmJob:
    """Poll the job until `until` holds; fail with its last state when the timeout passes."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        job = client.get_job(job_id=job_id)
        if until(job):
            return job
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} is still {job.state} ({job.state_reason}) after {timeout_seconds}s")
        time.sleep(0.25)


def is_finished(job: SlurmJob) -> bool:
    return job.state.is_finished


def is_running(job: SlurmJob) -> bool:
    return job.state is JobState.RUNNING or job.state.is_finished


SentTask = tuple[str, tuple[object, ...]]


@pytest.fixture
def sent_tasks(monkeypatch: pytest.MonkeyPatch) -> list[SentTask]:
    """Tasks the services hand to the broker after commit (portal.queue), as (registered name, args), recorded
    instead of sent: for tests that run no worker."""
    sent: list[SentTask] = []

    def record(name: str, args: tuple[object, ...] = (), **options: object) -> None:
        sent.append((name, tuple(args)))

    monkeypatch.setattr(celery_app, "send_task", record)
    return sent


class SentArguments:
    """The first argument of each task named `name` sent so far (e.g. the ids it is about), read as they come:
    compares equal to a list, iterates, and `clear()` forgets them."""

    def __init__(self, sent: list[SentTask], name: str) -> None:
        self.sent, self.name = sent, name

    @property
    def values(self) -> list[object]:
        return [args[0] for name, args in self.sent if name == self.name]

    def __eq__(self, other: object) -> bool:
        return self.values == other

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[object]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def clear(self) -> None:
        self.sent[:] = [(name, args) for name, args in self.sent if name != self.name]


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real Celery worker process on the test broker and the test database; yields its name.

    Tests that use it must be transactional (`django_db(transaction=True)`): the worker only sees what
    the test has committed. It logs JSON lines, as in production, to the file `celery_worker_log` names.
    """
    from tests.processes import portal_environment

    name = f"pytest-{uuid.uuid4().hex[:8]}@localhost"
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    environment = portal_environment(PORTAL_LOG_FORMAT="json", PORTAL_LOG_LEVEL="INFO")
    _worker_logs[name] = log
    command = [sys.executable, "-m", "celery", "-A", "portal", "--quiet", "worker", "--pool=solo"]
    command += ["--hostname", name, "--without-mingle", "--without-gossip"]
    with log.open("w") as output:
        worker = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not celery_app.control.ping(destination=[name], timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Celery worker did not start; its log:\n{log.read_text()}")
        _running_workers.append(name)
        yield name
    finally:
        _running_workers.clear()
        worker.terminate()
        worker.wait(timeout=30)


_running_workers: list[str] = []
_worker_logs: dict[str, Path] = {}


@pytest.fixture
def celery_worker_log(celery_worker: str) -> Path:
    """The log file of the session's Celery worker (its stdout and stderr: JSON lines, portal/logs.py)."""
    return _worker_logs[celery_worker]


@pytest.fixture(autouse=True)
def slurm_connections_closed() -> Iterator[None]:
    """Each test's clusters are new rows with pooled clients of their own: close them when the test ends."""
    yield
    slurm_clients_close()


@pytest.fixture(autouse=True)
def quiet_celery_worker() -> Iterator[None]:
    """After each test, drop the tasks it queued and wait until the session's worker is idle.

    Tests that go through the services queue tasks (a project's Slurm sync, a job's delivery). Left to run
    while the next transactional test truncates the tables, a task's query can deadlock with the TRUNCATE.
    A solo worker answers a ping only between tasks, so the answer means it is idle.
    """
    yield
    celery_workers_idle()


def celery_workers_idle() -> None:
    """Drop queued tasks and wait until the session's worker (if one runs) has finished the one it is on."""
    if _running_workers:
        celery_app.control.purge()
        if not celery_app.control.ping(destination=_running_workers, timeout=60):
            pytest.fail("the Celery worker stayed busy for 60 s")


def wait_until(condition: Callable[[], bool], *, timeout_seconds: float = 30, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_seconds}s")
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def fresh_channel_layer() -> Iterator[None]:
    """A new channel layer for each test: a layer keeps locks bound to the event loop that first used it,
    and every test's `async_to_sync` runs a loop of its own."""
    yield
    channel_layers.backends.clear()


@pytest.fixture(scope="session")
def wsgi_portal(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The portal's WSGI server as scripts/portal.sh runs it (gunicorn with its hooks), with two worker processes, on
    a free port and the test database; yields its base URL. Tests that use it must be transactional."""
    from tests.processes import gunicorn_running, portal_environment

    log = tmp_path_factory.mktemp("gunicorn") / "wsgi.log"
    with gunicorn_running(
        "--config=python:portal.gunicorn_conf", "--workers=2", environment=portal_environment(), log=log
    ) as base_url:
        yield base_url


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoProvider]:
    """The demo's OpenID provider (a real one: the `oidc-provider` package under node), once for the whole run."""
    if not (OIDC_PROVIDER_SCRIPT.parent / "node_modules" / "oidc-provider").is_dir() or shutil.which("node") is None:
        pytest.skip("the demo's OpenID provider is not installed; `make oidc-install` installs it")
    with provider_process(tmp_path_factory.mktemp("oidc") / "provider.log") as provider:
        yield provider
