"""`make load`: 50 researchers browse, list and submit against the portal for two minutes (locust, headless).

Prepares its own world (database `gpuportal_bench_load`, Redis databases 4-6, port 8102): tenant `load` with a few
projects of ten researchers each, every one with a password, an API token, a cluster account (POSIX user
`loadNN`, created on this host for the run: jobs run as their owner, and Slurm needs that user on the nodes),
GPU-hours that never run out, a template per project and a few hundred finished, priced jobs so that lists
paginate. Then it starts the portal as scripts/portal.sh runs it (nginx in front of gunicorn for pages and the
API and uvicorn for WebSockets; bench/portal_stack.py's `deployed_topology`), a Celery worker and beat, runs
`bench/locustfile.py` in a locust process of its own (locust patches the standard library with gevent, so it
never shares a process with Django), and prints throughput, latency percentiles and errors per route. Any error
makes the exit status non-zero.

Afterwards: how many jobs the load submitted and whether each reached Slurm, then the run's Slurm jobs are
cancelled and its Slurm accounts, POSIX users and job directories removed. Locust's CSV files stay in
`var/load/`.

50 users thinking 1-3 s offer ~22 requests/s. Why that web tier, and its figures against uvicorn alone:
bench/http_topology.py and the README ("Processes"). Overrides: LOAD_USERS (50), LOAD_SECONDS (120),
LOAD_SPAWN_RATE (users started per second, 2), LOAD_WEB_WORKERS (gunicorn processes; as scripts/portal.sh: 2 per
core + 1), LOAD_WEB_THREADS (threads per gunicorn process, 1), LOAD_PROJECTS (5), LOAD_HISTORY_JOBS (finished jobs
per project, 60), LOAD_MIX (portal: the mix above; floor: the users only ever ask for their profile page, the
cheapest signed-in page, which bounds what any page could get from the machine).
"""

from __future__ import annotations

import csv
import json
import os
import pwd
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg

os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench_load")
os.environ.setdefault("BENCH_REDIS_DBS", "4,5,6")

import portal_stack as stack  # sets up Django on the load test's database: before anything from Django
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from billing.rates import rate_create
from billing.usage import usage_import
from clusters import accounts
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount, ProjectSlurmAccount
from clusters.services import cluster_check, cluster_sync_inventory
from clusters.slurm import SlurmClient
from jobs import job_services
from jobs.job_services import JobRequest
from jobs.models import Job, JobState, JobTransition
from quotas.models import period_start
from quotas.services import quota_charge
from tenants import services
from tenants.models import Project, ProjectRole, TenantRole

TENANT = "load"
PROJECTS = ("vision", "nlp", "genomics", "climate", "robotics", "physics", "chemistry", "speech")
PASSWORD = "load-test-password"
PORT = 8102
PARTITION = "debug"
JOB_NAME_PREFIX = "load-"  # the locustfile names its jobs so; history jobs are named otherwise
# Slurm job ids of the invented history: far above anything the local cluster hands out.
HISTORY_SLURM_JOB_ID_BASE = 50_000_000
DRAIN_SECONDS = 90
OUTPUT_ROOT = stack.ROOT / "var" / "load"
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
# How bench/locustfile.py names a 503 with Retry-After that it waited out and sent again (not an error).
RETRIED_PREFIX = "503, retried: "
TEMPLATE = {
    "name": "Smoke test",
    "description": "One GPU for a second: checks that the project's jobs start.",
    "partition": PARTITION,
    "gpus": 1,
    "time_limit_minutes": 1,
    "script": "#!/bin/bash\nnvidia-smi -L 2>/dev/null || echo no nvidia-smi\nsleep 1\n",
}


# What the users do (bench/locustfile.py's user classes): the load test's mix of pages, API calls and submissions,
# or the floor: only the cheapest signed-in page, for the best latency any page could have on this machine.
MIXES = {"portal": "Researcher", "floor": "ProfileOnly"}


def mix_from_environment() -> str:
    mix = os.environ.get("LOAD_MIX", "portal")
    if mix not in MIXES:
        raise SystemExit(f"LOAD_MIX={mix!r} is not a mix; use one of: {', '.join(MIXES)}")
    return mix


@dataclass(frozen=True)
class Settings:
    users: int
    seconds: int
    spawn_rate: float
    web_workers: int | None  # None: as scripts/portal.sh sizes it
    web_threads: int | None
    projects: int
    history_jobs: int
    mix: str  # a key of MIXES

    @classmethod
    def from_environment(cls) -> Settings:
        return cls(
            users=int(os.environ.get("LOAD_USERS", "50")),
            seconds=int(os.environ.get("LOAD_SECONDS", "120")),
            spawn_rate=float(os.environ.get("LOAD_SPAWN_RATE", "2")),
            web_workers=int(os.environ["LOAD_WEB_WORKERS"]) if os.environ.get("LOAD_WEB_WORKERS") else None,
            web_threads=int(os.environ["LOAD_WEB_THREADS"]) if os.environ.get("LOAD_WEB_THREADS") else None,
            projects=min(len(PROJECTS), int(os.environ.get("LOAD_PROJECTS", "5"))),
            history_jobs=int(os.environ.get("LOAD_HISTORY_JOBS", "60")),
            mix=mix_from_environment(),
        )


@dataclass(frozen=True)
class Researcher:
    user: User
    project: Project
    role: str
    token: str


# The world ---------------------------------------------------------------------------------------------


def cluster_register() -> Cluster:
    """Cluster `local` with its partitions and nodes as slurmrestd reports them now."""
    cluster, _ = Cluster.objects.update_or_create(
        name=stack.CLUSTER,
        defaults={
            "slurmrestd_url": settings.LOCAL_CLUSTER_URL,
            "jwt_key_file": settings.LOCAL_CLUSTER_KEY_FILE,
            "log_root": settings.LOCAL_CLUSTER_LOG_ROOT,
            "admin_user": settings.LOCAL_CLUSTER_ADMIN_USER,
            "is_active": True,
        },
    )
    with stack.bare_client() as probe:
        stack.slurmrestd_wait(probe)
    client = slurm_client_for(cluster)
    if not cluster_check(cluster=cluster, client=client):
        raise SystemExit(f"slurmrestd at {cluster.slurmrestd_url} does not answer; start the cluster: make cluster")
    cluster_sync_inventory(cluster=cluster, client=client)
    return cluster


def username_of(number: int) -> str:
    return f"load{number:02d}"


def posix_users_create(usernames: list[str]) -> list[str]:
    """Create the POSIX users that do not exist yet (Slurm runs each job as its owner, so they must exist on the
    nodes, which are this host); returns those created, for removal at the end."""
    created = []
    for username in usernames:
        try:
            pwd.getpwnam(username)
        except KeyError:
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/bin/bash", "--user-group", username], check=True
            )
            created.append(username)
    return created


def posix_users_remove(usernames: list[str]) -> None:
    for username in usernames:
        subprocess.run(["userdel", username], check=False, stderr=subprocess.DEVNULL)


def researchers_create(*, cluster: Cluster, options: Settings) -> list[Researcher]:
    """Tenant `load`, its projects and researchers, made through the services as an admin would make them: the
    first researcher of each project manages it (and sees its billing), the others are members."""
    tenant = services.tenant_create(actor=None, slug=TENANT, name="Load test")
    projects = [
        services.project_create(actor=None, tenant=tenant, slug=slug, name=f"Load {slug}")
        for slug in PROJECTS[: options.projects]
    ]
    password_hash = make_password(PASSWORD)  # hashing once for all of them (portal/hashers.py)
    today = timezone.now().date()
    researchers = []
    for number in range(1, options.users + 1):
        project = projects[(number - 1) % len(projects)]
        role = ProjectRole.MANAGER if number <= len(projects) else ProjectRole.MEMBER
        username = username_of(number)
        user = get_user_model().objects.create(
            username=username, email=f"{username}@example.org", password=password_hash
        )
        services.tenant_member_add(actor=None, tenant=tenant, user=user, role=TenantRole.MEMBER)
        services.project_member_add(actor=None, project=project, user=user, role=role)
        ClusterAccount.objects.create(cluster=cluster, user=user, username=username)
        _, token = services.token_create(user=user, name="load test")
        researchers.append(Researcher(user=user, project=project, role=role, token=token))
    for project in projects:
        # From 30 days back: the history jobs of the last two weeks are charged to it.
        stack.allocation_ample(project=project, cluster=cluster, days_back=30)
        manager = next(researcher.user for researcher in researchers if researcher.project == project)
        job_services.job_template_save(user=manager, project=project, values=TEMPLATE)
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("2.00"),
        currency="EUR",
        valid_from=period_start(today - timedelta(days=30)),
    )
    return researchers


def slurm_accounts_ready(projects: list[Project]) -> None:
    """Create the projects' Slurm accounts and their members' associations now, as the services' task would."""
    for project in projects:
        accounts.project_slurm_sync(project_id=project.pk)
        row = ProjectSlurmAccount.objects.get(project=project)
        if row.state != ProjectSlurmAccount.State.READY:
            raise SystemExit(f"the Slurm account of {project} is not ready: {row.state} {row.last_error}")


def history_create(*, researchers: list[Researcher], jobs_per_project: int) -> int:
    """Finished jobs of the last two weeks, submitted through the service and then ended as the sync and the
    accounting import would end them (transitions, a charge replacing the reservation, a priced usage record)."""
    rng = random.Random(8)
    by_project: dict[int, list[Researcher]] = {}
    for researcher in researchers:
        by_project.setdefault(researcher.project.pk, []).append(researcher)
    now = timezone.now()
    number = 0
    for members in by_project.values():
        for _ in range(jobs_per_project):
            number += 1
            researcher = rng.choice(members)
            request = JobRequest(
                cluster=stack.CLUSTER,
                partition=PARTITION,
                gpus=rng.choice((1, 1, 2, 4)),
                time_limit_minutes=30,
                name=f"train-{number}",
                script="#!/bin/bash\npython train.py\n",
            )
            job, _ = job_services.job_submit(user=researcher.user, project=researcher.project, request=request)
            started = now - timedelta(days=14) * rng.random() - timedelta(hours=1)
            job_end(job=job, number=number, started=started, seconds=rng.randint(60, 1800))
    usage_import()
    return number


def job_end(*, job: Job, number: int, started: datetime, seconds: int) -> None:
    accepted = started - timedelta(seconds=30)
    ended = started + timedelta(seconds=seconds)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        JobTransition.objects.filter(job=job).update(at=accepted)
        transitions = [
            job_services.job_transition(job=job, to_state=JobState.PENDING, at=accepted + timedelta(seconds=1)),
            job_services.job_transition(job=job, to_state=JobState.RUNNING, at=started),
            job_services.job_transition(job=job, to_state=JobState.COMPLETED, at=ended),
        ]
        JobTransition.objects.bulk_create(transitions)
        job.slurm_job_id = HISTORY_SLURM_JOB_ID_BASE + number
        job.slurm_state, job.nodes, job.exit_code = "COMPLETED", "gpu01", 0
        job.created_at = job.updated_at = accepted
        job.submitted_at, job.slurm_submit_time = accepted + timedelta(seconds=1), accepted + timedelta(seconds=1)
        job.started_at, job.ended_at = started, ended
        job.save()
        quota_charge(job=job, gpu_seconds=seconds * job.gpus, now=ended, note="load test history")


def world_file_write(*, path: Path, base_url: str, researchers: list[Researcher]) -> None:
    """What the locust process needs to know: who logs in how, and the jobs each project already has."""
    history: dict[int, list[str]] = {}
    for job_id, project_id in Job.objects.values_list("id", "project_id"):
        history.setdefault(project_id, []).append(str(job_id))
    world = {
        "base_url": base_url,
        "cluster": stack.CLUSTER,
        "partition": PARTITION,
        "job_name_prefix": JOB_NAME_PREFIX,
        "researchers": [
            {
                "username": researcher.user.username,
                "password": PASSWORD,
                "token": researcher.token,
                "project": f"{TENANT}/{researcher.project.slug}",
                "is_manager": researcher.role == ProjectRole.MANAGER,
                "job_ids": history.get(researcher.project.pk, []),
            }
            for researcher in researchers
        ],
    }
    path.write_text(json.dumps(world))


# The run -------------------------------------------------------------------------------------------------


def locust_run(*, options: Settings, world_path: Path, host: str, output: Path) -> int:
    """Run locust headless in its own process; returns its exit status (non-zero when a request failed)."""
    command = [
        str(Path(sys.executable).parent / "locust"),
        "--locustfile",
        str(LOCUSTFILE),
        MIXES[options.mix],
        "--headless",
        "--users",
        str(options.users),
        "--spawn-rate",
        str(options.spawn_rate),
        "--run-time",
        f"{options.seconds}s",
        "--stop-timeout",
        "10",
        "--host",
        host,
        "--csv",
        str(output / "load"),
        # Each route's figures over locust's last 10 s, every 2 s (without it the history's percentiles are the
        # run's so far): what the load got once every user had started (`steady_state_read`).
        "--csv-full-history",
        "--only-summary",
        "--loglevel",
        "WARNING",
    ]
    with (output / "locust.log").open("wb") as log:
        process = subprocess.run(
            command,
            env={**os.environ, "LOAD_WORLD": str(world_path), "LOAD_ACCEPTED": str(output / "accepted.json")},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process.returncode


@dataclass(frozen=True)
class RouteStats:
    method: str
    name: str
    requests: int
    failures: int
    per_second: float
    p50: str
    p95: str
    p99: str
    max: str


def stats_read(output: Path) -> list[RouteStats]:
    with (output / "load_stats.csv").open() as file:
        return [
            RouteStats(
                method=row["Type"],
                name=row["Name"],
                requests=int(row["Request Count"]),
                failures=int(row["Failure Count"]),
                per_second=float(row["Requests/s"]),
                p50=row["50%"],
                p95=row["95%"],
                p99=row["99%"],
                max=f"{float(row['Max Response Time']):.0f}",
            )
            for row in csv.DictReader(file)
        ]


@dataclass(frozen=True)
class SteadyState:
    seconds: int  # how long every user was running
    per_second: float  # locust's rate over its last 10 s, the median of its samples
    p95_median: int  # ms, the p95 over locust's last 10 s: the median and the worst of its samples
    p95_max: int


def steady_state_read(output: Path, *, users: int) -> SteadyState | None:
    """All routes together once every user had started: a run's own figures include the ramp, while users are
    still being started (the first 100 s of 200 users started 2 a second), and so understate the rate the machine
    serves and its latency at that rate. None when the users never all ran."""
    with (output / "load_stats_history.csv").open() as file:
        rows = [
            row
            for row in csv.DictReader(file)
            if row["Name"] == "Aggregated" and int(row["User Count"]) == users and row["95%"].isdigit()
        ]
    if len(rows) < 2:
        return None
    p95s = sorted(int(row["95%"]) for row in rows)
    return SteadyState(
        seconds=int(rows[-1]["Timestamp"]) - int(rows[0]["Timestamp"]),
        per_second=statistics.median(float(row["Requests/s"]) for row in rows),
        p95_median=int(statistics.median(p95s)),
        p95_max=p95s[-1],
    )


def failures_read(output: Path) -> list[str]:
    lines = []
    for name in ("load_failures.csv", "load_exceptions.csv"):
        path = output / name
        if path.exists():
            with path.open() as file:
                lines += [", ".join(f"{key}: {value}" for key, value in row.items()) for row in csv.DictReader(file)]
    return lines


def stats_print(routes: list[RouteStats]) -> None:
    print(f"{'route':52}{'requests':>9}{'errors':>7}{'req/s':>8}{'p50 ms':>8}{'p95 ms':>8}{'p99 ms':>8}{'max ms':>8}")
    for route in routes:
        label = f"{route.method} {route.name}".strip() if route.name != "Aggregated" else "all routes"
        print(
            f"{label[:51]:52}{route.requests:9}{route.failures:7}{route.per_second:8.1f}"
            f"{route.p50:>8}{route.p95:>8}{route.p99:>8}{route.max:>8}"
        )


def load_jobs_drain(*, since: datetime, timeout_seconds: float) -> tuple[list[Job], float]:
    """Wait until every job the load submitted has left `queued` (reached Slurm, or was refused with a reason)
    and the running ones have ended, or until the timeout; the jobs as stored then, and the seconds waited."""
    started = time.monotonic()
    while True:
        jobs = list(Job.objects.filter(created_at__gte=since, name__startswith=JOB_NAME_PREFIX))
        unsettled = [job for job in jobs if job.state in {JobState.QUEUED, JobState.PENDING, JobState.RUNNING}]
        waited = time.monotonic() - started
        if not unsettled or waited > timeout_seconds:
            return jobs, waited
        time.sleep(1)


def jobs_report(jobs: list[Job], *, waited: float, accepted: set[str]) -> bool:
    """Print what became of the submitted jobs; whether every job the portal accepted reached Slurm.

    A job stored without an accepted answer was in flight when locust stopped its users."""
    states = Counter(job.state for job in jobs)
    stored = {str(job.pk) for job in jobs}
    lost = accepted - stored
    in_slurm = [job for job in jobs if job.slurm_job_id is not None]
    not_in_slurm = [job for job in jobs if job.slurm_job_id is None]
    print(
        f"jobs: {len(accepted)} accepted (202), {len(stored)} stored ({len(stored - accepted)} of them answered after "
        f"locust stopped), {len(lost)} accepted but not stored; {len(in_slurm)} reached Slurm, "
        f"{len(not_in_slurm)} did not after a drain of {waited:.0f}s; states now: "
        + ", ".join(f"{state} {count}" for state, count in sorted(states.items()))
    )
    for job in not_in_slurm[:10]:
        print(f"  job {job.pk} {job.state}: {job.last_error or 'no error recorded'}")
    return not lost and not not_in_slurm


# Cleanup -------------------------------------------------------------------------------------------------


def slurm_cleanup(*, slurm: SlurmClient, projects: list[Project], usernames: list[str]) -> str:
    """Cancel the run's Slurm jobs, then remove its associations and accounts (parent last)."""
    cancelled = 0
    for project in projects:
        cancelled += stack.slurm_jobs_cancel(slurm, account=project.slurm_account)[0]
    left = [
        name
        for name in [*(project.slurm_account for project in projects), projects[0].tenant.slurm_parent_account]
        if not stack.slurm_account_delete(slurm, account=name, usernames=usernames)
    ]
    note = f"{cancelled} Slurm jobs cancelled; Slurm accounts removed"
    return note + (f" except {', '.join(left)}" if left else "")


@dataclass(frozen=True)
class World:
    researchers: list[Researcher]
    projects: list[Project]
    history_jobs: int
    usernames: list[str]


def world_create(*, options: Settings, usernames: list[str]) -> World:
    stack.database_recreate()
    stack.redis_flush()
    cluster = cluster_register()
    researchers = researchers_create(cluster=cluster, options=options)
    projects = list(Project.objects.filter(tenant__slug=TENANT).select_related("tenant").order_by("pk"))
    slurm_accounts_ready(projects)
    history = history_create(researchers=researchers, jobs_per_project=options.history_jobs)
    stack.redis_flush()  # the history's delivery messages: those jobs have ended already
    return World(researchers=researchers, projects=projects, history_jobs=history, usernames=usernames)


@dataclass(frozen=True)
class Outcome:
    locust_status: int
    routes: list[RouteStats]
    jobs: list[Job]
    drained_seconds: float
    server_tracebacks: dict[str, int]


class ConnectionSampler(threading.Thread):
    """The most PostgreSQL client connections seen during the run, on the load's database and in all (the
    server's max_connections is shared with everything else on the machine), and the job sync's lag: how long
    ago the cluster's jobs were last synced, at worst (the web load must not slow the sync down)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_own = self.peak_all = self.limit = 0
        self.sync_lags: list[float] = []
        self._done = threading.Event()

    def run(self) -> None:
        query = (
            "SELECT count(*) FILTER (WHERE datname = current_database()), count(*), "
            "current_setting('max_connections')::int FROM pg_stat_activity WHERE backend_type = 'client backend'"
        )
        with psycopg.connect(stack.DATABASE_URL, autocommit=True) as sampling:
            while not self._done.wait(0.25):
                row = sampling.execute(query).fetchone()
                assert row is not None
                own, everyone, self.limit = row
                self.peak_own, self.peak_all = max(self.peak_own, own), max(self.peak_all, everyone)
                lag = sampling.execute(
                    "SELECT extract(epoch FROM now() - jobs_synced_at) FROM clusters_cluster WHERE name = %s",
                    (stack.CLUSTER,),
                ).fetchone()
                if lag is not None and lag[0] is not None:
                    self.sync_lags.append(float(lag[0]))

    def stop(self) -> str:
        self._done.set()
        self.join()
        lags = sorted(self.sync_lags) or [float("nan")]
        return (
            f"PostgreSQL client connections at most {self.peak_own} on the load's database, {self.peak_all} in all "
            f"(max_connections {self.limit}); job sync lag (since the cluster's last sync, sampled every 0.25 s) "
            f"p50 {stack.percentile(lags, 0.5):.1f} s, p95 {stack.percentile(lags, 0.95):.1f} s, max {lags[-1]:.1f} s"
        )


def load_run(*, options: Settings, world: World, output: Path) -> Outcome:
    """Start the portal, let locust loose on it, then wait for the jobs it submitted to settle."""
    topology = stack.deployed_topology(web_workers=options.web_workers, web_threads=options.web_threads)
    portal = stack.Portal(port=PORT, worker_concurrency=2, with_beat=True, topology=topology)
    world_path = output / "world.json"
    world_file_write(path=world_path, base_url=portal.base_url, researchers=world.researchers)
    print(
        f"load: {options.users} locust users (started {options.spawn_rate}/s, mix {options.mix}), {options.seconds}s, "
        f"think time 1-3 s, against {topology.describe()} + Celery worker (2 processes) + beat on "
        f"{portal.base_url}"
    )
    load_started = timezone.now()
    with portal:
        sampler = ConnectionSampler()
        sampler.start()
        with stack.timed("locust run"):
            status = locust_run(options=options, world_path=world_path, host=portal.base_url, output=output)
        print(f"  {sampler.stop()}")
        print(f"  machine at the end of the load: load average {os.getloadavg()[0]:.1f} (1 min)")
        with stack.timed("drain"):
            jobs, waited = load_jobs_drain(since=load_started, timeout_seconds=DRAIN_SECONDS)
        tracebacks = portal.log_count("Traceback")
    return Outcome(status, stats_read(output), jobs, waited, tracebacks)


def outcome_print(outcome: Outcome, *, output: Path, users: int) -> bool:
    """The summary; whether the run passed (no failed request, every submitted job in Slurm)."""
    routes = outcome.routes
    stats_print(routes)
    if steady := steady_state_read(output, users=users):
        print(
            f"once all {users} users had started ({steady.seconds} s): {steady.per_second:.1f} requests/s, p95 "
            f"{steady.p95_median} ms (worst {steady.p95_max} ms; locust's last 10 s, sampled every 2 s)"
        )
    total = next(route for route in routes if route.name == "Aggregated")
    print(
        f"errors: {total.failures} of {total.requests} requests ({100 * total.failures / max(total.requests, 1):.2f}%)"
        f"; locust exit status {outcome.locust_status}; tracebacks in the server logs: "
        + ", ".join(f"{name} {count}" for name, count in outcome.server_tracebacks.items())
    )
    for line in failures_read(output)[:20]:
        print(f"  {line}")
    # The portal shedding load (portal/overload.py): waited out and sent again, as bench/locustfile.py does.
    shed = sum(route.requests for route in routes if route.name.startswith(RETRIED_PREFIX))
    print(
        f"answered 503 with Retry-After and sent again: {shed} ({100 * shed / max(total.requests, 1):.2f}% of answers;"
        " listed as '503, retried: <route>' above and counted in 'all routes', not as errors)"
    )
    accepted = set(json.loads((output / "accepted.json").read_text()))
    all_in_slurm = jobs_report(outcome.jobs, waited=outcome.drained_seconds, accepted=accepted)
    print(f"locust's CSV files: {output}")
    return total.failures == 0 and outcome.locust_status == 0 and all_in_slurm


def main() -> int:
    options = Settings.from_environment()
    print(f"machine: {stack.machine_note()}")
    slurmrestd_pid = stack.slurmrestd_pid()
    output = OUTPUT_ROOT / timezone.now().strftime("%Y%m%d-%H%M%S")
    output.mkdir(parents=True, exist_ok=True)
    usernames = [username_of(number) for number in range(1, options.users + 1)]
    created_users = posix_users_create(usernames)
    slurm = stack.bare_client()
    world = None
    try:
        with stack.timed("world"):
            world = world_create(options=options, usernames=usernames)
        print(
            f"  {options.users} researchers in {len(world.projects)} projects of tenant {TENANT} (POSIX users "
            f"{usernames[0]}..{usernames[-1]}), {world.history_jobs} finished jobs"
        )
        outcome = load_run(options=options, world=world, output=output)
    finally:
        with stack.timed("cleanup"):
            if world is not None:
                print(f"  {slurm_cleanup(slurm=slurm, projects=world.projects, usernames=usernames)}")
            slurm.close()
            posix_users_remove(created_users)
            shutil.rmtree(Path(settings.LOCAL_CLUSTER_LOG_ROOT) / TENANT, ignore_errors=True)
    passed = outcome_print(outcome, output=output, users=options.users)
    if note := stack.disturbance_note(slurmrestd_pid):
        print(note)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
