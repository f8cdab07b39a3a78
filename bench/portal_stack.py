"""What the portal benchmarks share: their own database and Redis databases, demo-like data, and a portal (its
web tier as scripts/portal.sh runs it: nginx, gunicorn and uvicorn; a Celery worker) that a benchmark starts and
stops itself.

Import this before anything from Django: it points the settings at the benchmark's database
(`gpuportal_bench`, recreated on every run) and Redis databases 10-12, so a benchmark never meets the demo
(database `gpuportal`, Redis 0) or the tests (`test_gpuportal`, Redis 13-15). `BENCH_DATABASE_URL`,
`BENCH_REDIS_BASE` and `BENCH_REDIS_DBS` (three numbers: broker, channel layer, cache) move them elsewhere, so
the drills and the load test can run beside a benchmark.

`BENCH_CLUSTER` (local, north or south; default local) picks the local cluster a benchmark runs against, as
`scripts/cluster.sh up` describes it in /var/lib/gpuportal/clusters/; `make bench` runs each benchmark on each.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_REDIS_BASE = os.environ.get("BENCH_REDIS_BASE", "redis://127.0.0.1:6379")
_BROKER_DB, _CHANNELS_DB, _CACHE_DB = os.environ.get("BENCH_REDIS_DBS", "10,11,12").split(",")
DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench")
BENCH_ENVIRONMENT = {
    "DJANGO_SETTINGS_MODULE": "portal.settings",
    "DATABASE_URL": DATABASE_URL,
    "CELERY_BROKER_URL": f"{_REDIS_BASE}/{_BROKER_DB}",
    "CHANNELS_REDIS_URL": f"{_REDIS_BASE}/{_CHANNELS_DB}",
    "REDIS_URL": f"{_REDIS_BASE}/{_CACHE_DB}",
    # Production-like: with DEBUG on, Django keeps every query of a process in memory.
    "PORTAL_DEBUG": "false",
    # As the demo: plain HTTP on loopback (the checkout's own secret key, var/secret_key, is read as usual).
    "PORTAL_HTTPS": "false",
    "PORTAL_LOG_LEVEL": "WARNING",
}
os.environ.update(BENCH_ENVIRONMENT)

import django  # noqa: E402

django.setup()

import psutil  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.utils import timezone  # noqa: E402

from clusters import accounts  # noqa: E402
from clusters.clients import slurm_client_for  # noqa: E402
from clusters.models import Cluster, ClusterAccount, ProjectSlurmAccount  # noqa: E402
from clusters.services import cluster_check, cluster_sync_inventory  # noqa: E402
from clusters.slurm import SlurmClient, SlurmError, SlurmRetryableError  # noqa: E402
from quotas.services import allocation_create  # noqa: E402
from tenants import services  # noqa: E402
from tenants.models import Project, ProjectRole, TenantRole  # noqa: E402
from tests.live_clusters import LiveCluster, live_clusters  # noqa: E402


def _target() -> LiveCluster:
    name = os.environ.get("BENCH_CLUSTER", "local")
    described = {cluster.name: cluster for cluster in live_clusters()}
    cluster = described.get(name)
    if cluster is None:
        raise SystemExit(f"cluster {name} is not described in /var/lib/gpuportal/clusters; run `make cluster`")
    if cluster.status != "up":
        print(f"cluster {name}: skipped, it could not be started on this machine ({cluster.reason})")
        raise SystemExit(0)
    return cluster


# The cluster this run measures, its GPU partition and type.
TARGET = _target()
CLUSTER = TARGET.name
PARTITION = TARGET.gpu_partition
GPU_TYPE = TARGET.gpu_type
JOB_USER = "alice"  # a POSIX user on the cluster's nodes (scripts/cluster.sh creates it)
TENANT = "bench"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def database_recreate() -> float:
    """Drop and recreate the benchmark database, then migrate it; returns the seconds it took.

    A fresh database per run: no rows left by an earlier (or crashed) run skew a figure, and a migration that
    changed under development cannot leave it in a state `migrate` refuses.
    """
    started = time.perf_counter()
    parts = urlsplit(DATABASE_URL)
    name = parts.path.lstrip("/")
    assert name.startswith("gpuportal_bench"), f"refusing to drop {name!r}: not a benchmark database"
    connections.close_all()
    admin_url = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", interactive=False, verbosity=0)
    return time.perf_counter() - started


def redis_flush() -> None:
    """Empty the benchmark's Redis databases: a task message left by a crashed run must not be delivered."""
    for url in (settings.CELERY_BROKER_URL, os.environ["CHANNELS_REDIS_URL"], settings.REDIS_URL):
        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()


@dataclass(frozen=True)
class World:
    cluster: Cluster
    user: User
    project: Project
    token: str  # an API token of `user`, for `Authorization: Bearer`

    @property
    def project_label(self) -> str:
        return f"{self.project.tenant.slug}/{self.project.slug}"


def world_create(*, project_slug: str) -> World:
    """The demo's shape, made through the services: the target cluster with its inventory, tenant `bench` with one
    project, user alice (tenant admin, project manager, username alice on the cluster), her API token, and the
    project's Slurm account with alice associated."""
    cluster, _ = Cluster.objects.update_or_create(
        name=CLUSTER,
        defaults={
            "slurmrestd_url": TARGET.slurmrestd_url,
            "jwt_key_file": TARGET.jwt_key_file,
            "log_root": TARGET.log_root,
            "admin_user": TARGET.admin_user,
            "is_active": True,
        },
    )
    with bare_client() as probe:
        slurmrestd_wait(probe)  # the delivery fault tests stop it for a few seconds at a time
    client = slurm_client_for(cluster)
    if not cluster_check(cluster=cluster, client=client):
        raise SystemExit(f"slurmrestd at {cluster.slurmrestd_url} does not answer; start the cluster: make cluster")
    cluster_sync_inventory(cluster=cluster, client=client)
    user, _ = get_user_model().objects.get_or_create(username=JOB_USER, defaults={"email": "alice@example.org"})
    tenant = services.tenant_create(actor=None, slug=TENANT, name="Benchmarks")
    project = services.project_create(actor=None, tenant=tenant, slug=project_slug, name=f"Benchmark {project_slug}")
    services.tenant_member_add(actor=None, tenant=tenant, user=user, role=TenantRole.ADMIN)
    services.project_member_add(actor=None, project=project, user=user, role=ProjectRole.MANAGER)
    ClusterAccount.objects.update_or_create(cluster=cluster, user=user, defaults={"username": JOB_USER})
    allocation_ample(project=project, cluster=cluster)
    _, token = services.token_create(user=user, name=f"bench-{uuid.uuid4().hex[:8]}")
    # The services scheduled this as a task too; running it here means the project is ready now. The task
    # messages are flushed before a worker starts, so no worker repeats it during a measurement.
    accounts.project_slurm_sync(project_id=project.pk)
    row = ProjectSlurmAccount.objects.get(project=project, cluster=cluster)
    if row.state != ProjectSlurmAccount.State.READY:
        raise SystemExit(f"the project's Slurm account is not ready: {row.state} {row.last_error}")
    redis_flush()
    cluster.refresh_from_db()
    project.refresh_from_db()
    return World(cluster=cluster, user=user, project=project, token=token)


def allocation_ample(*, project: Project, cluster: Cluster, days_back: int = 1) -> None:
    """Enough GPU-hours from `days_back` days ago to 30 days ahead that the portal's quota check never refuses
    a benchmark job."""
    today = timezone.now().date()
    allocation_create(
        actor=None,
        project=project,
        cluster=cluster,
        gpu_hours=Decimal(10_000_000),
        starts_on=today - timedelta(days=days_back),
        ends_on=today + timedelta(days=30),
    )


def bare_client() -> SlurmClient:
    """A Slurm client of its own (not the pooled one), for the benchmark's direct calls and its cleanup."""
    return SlurmClient(
        base_url=TARGET.slurmrestd_url, key_file=TARGET.jwt_key_file, admin_user=TARGET.admin_user, timeout_seconds=30
    )


def slurm_jobs_cancel(client: SlurmClient, *, account: str, timeout_seconds: float = 180) -> tuple[int, float]:
    """Cancel every unfinished job in `account` (as the admin user), then wait until slurmctld lists none of
    them as pending or running. Returns how many were cancelled and the seconds it took.

    Rides out a slurmrestd that is briefly away (the delivery fault tests stop and restart it) until the timeout.
    """
    started = time.perf_counter()
    cancelled = 0
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            listing = client.list_jobs()
        except SlurmRetryableError:
            listing, active = None, None
        else:
            jobs = listing.jobs if listing else ()
            active = [job for job in jobs if job.account == account and not job.state.is_finished]
        if active == []:
            return cancelled, time.perf_counter() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs in Slurm account {account} are still active after {timeout_seconds}s")
        for job in active or ():
            with contextlib.suppress(SlurmError):  # already ending, or slurmrestd away: the next listing tells
                client.cancel_job(user=client.admin_user, job_id=job.job_id)
                cancelled += 1
        time.sleep(0.5)


def slurm_account_delete(
    client: SlurmClient, *, account: str, usernames: Iterable[str] = (JOB_USER,), timeout_seconds: float = 60
) -> bool:
    """Remove a per-run Slurm account (its users' associations, alice's by default, then the account); whether
    it is gone.

    slurmdbd refuses while it still counts a cancelled job as active, so this tries again for a while.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            for username in usernames:  # removing an association that does not exist succeeds
                client.remove_user_association(account=account, user=username, cluster=CLUSTER)
            client.delete_account(name=account)
            return True
        except SlurmError as exc:
            if any(message.error_number == 1900 for message in exc.messages):
                return True  # 22.05's answer for an account that does not exist (any more)
            if time.monotonic() > deadline:
                return False
            time.sleep(1)


# Where scripts/cluster.sh (and slurm-chroot.sh, inside its chroot) keeps it.
SLURMRESTD_PID_FILE = Path(TARGET.chroot or "/") / "run/slurm/slurmrestd.pid"


def slurmrestd_pid() -> str:
    """slurmrestd's process id: a different one after a run means it was restarted meanwhile (the delivery
    fault tests stop and kill it), and the run's figures include that outage."""
    try:
        return SLURMRESTD_PID_FILE.read_text().strip()
    except OSError:
        return "?"


def slurmrestd_wait(client: SlurmClient, *, timeout_seconds: float = 120) -> None:
    """Wait until slurmrestd answers again."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            client.ping()
            return
        except SlurmRetryableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def machine_note() -> str:
    """One line on how busy the machine was: the benchmarks share 2 cores with whatever else runs."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} (1 min) {five:.1f} (5 min) at the start"


def disturbance_note(pid_before: str) -> str:
    pid_after = slurmrestd_pid()
    if pid_after != pid_before:
        return f"WARNING: slurmrestd was restarted during the run (pid {pid_before} -> {pid_after}); figures disturbed"
    return ""


def job_directories_remove() -> None:
    """Remove the output directories the workers prepared for the benchmark tenant's jobs."""
    shutil.rmtree(Path(TARGET.log_root) / TENANT, ignore_errors=True)


@dataclass(frozen=True)
class Topology:
    """How the web tier runs: which server answers HTTP, with how many processes and threads, and whether nginx
    is in front (deploy/nginx.conf.template: /ws/ and log downloads to uvicorn, the rest to gunicorn, /static/
    from the collected files). WebSockets are always uvicorn's (`portal.asgi`)."""

    name: str
    http_server: Literal["uvicorn", "gunicorn-sync", "gunicorn-gthread"]
    proxy: bool
    http_workers: int  # uvicorn's or gunicorn's processes
    threads: int = 1  # gunicorn-gthread's threads per process
    asgi_workers: int = 1  # uvicorn's processes beside gunicorn, for WebSockets and log downloads

    @property
    def database_conn_max_age(self) -> int:
        # gunicorn runs a request start to end in one thread, which keeps its connection for the next one; under
        # ASGI a kept connection outlives its request's thread (portal/env.py), so uvicorn keeps 0.
        return 0 if self.http_server == "uvicorn" else WSGI_CONN_MAX_AGE_SECONDS

    def describe(self) -> str:
        if self.http_server == "uvicorn":
            http = f"uvicorn x{self.http_workers}"
        elif self.http_server == "gunicorn-sync":
            http = f"gunicorn sync x{self.http_workers} + uvicorn x{self.asgi_workers} (/ws/)"
        else:
            http = f"gunicorn gthread {self.http_workers}x{self.threads} + uvicorn x{self.asgi_workers} (/ws/)"
        return f"nginx -> {http}" if self.proxy else http


WSGI_CONN_MAX_AGE_SECONDS = 60
ASGI_POOL_SIZE = "4"  # as scripts/portal.sh runs uvicorn (PORTAL_ASGI_DB_POOL)


def deployed_topology(*, web_workers: int | None = None, web_threads: int | None = None) -> Topology:
    """The topology scripts/portal.sh runs (README, "Processes"), sized as it sizes it: nginx in front, gunicorn
    with PORTAL_WEB_WORKERS processes (default: 2 per core + 1) of PORTAL_WEB_THREADS threads (1: sync workers;
    more: gthread workers), and PORTAL_ASGI_WORKERS uvicorn processes (1) for the WebSockets and log downloads.
    The benchmarks, the drills and the load test start it unless told otherwise; the arguments override the
    environment."""
    threads = web_threads or int(os.environ.get("PORTAL_WEB_THREADS") or 1)
    return Topology(
        name="nginx+gunicorn-gthread" if threads > 1 else "nginx+gunicorn-sync",
        http_server="gunicorn-gthread" if threads > 1 else "gunicorn-sync",
        proxy=True,
        http_workers=web_workers or int(os.environ.get("PORTAL_WEB_WORKERS") or 2 * (os.cpu_count() or 1) + 1),
        threads=threads,
        asgi_workers=int(os.environ.get("PORTAL_ASGI_WORKERS") or 1),
    )


NGINX_TEMPLATE = ROOT / "deploy" / "nginx.conf.template"


def nginx_servers(addresses: list[str]) -> str:
    """An upstream's `server` lines: one server is never set aside (there is no other to send to), several get
    nginx's defaults (set aside for 10 s after a failed connection), as the template describes."""
    if len(addresses) == 1:
        return f"server {addresses[0]} fail_timeout=0;"
    return " ".join(f"server {address};" for address in addresses)


def nginx_config_render(
    *,
    listen: str,
    wsgi_upstream: str | list[str],
    asgi_upstream: str | list[str],
    state_dir: Path,
    access_log: str,
) -> str:
    """deploy/nginx.conf.template with its placeholders filled in (scripts/portal.sh does the same with sed). An
    upstream is a socket or address, or a list of them (one per web host)."""
    values = {
        "LISTEN": listen,
        "WSGI_SERVERS": nginx_servers([wsgi_upstream] if isinstance(wsgi_upstream, str) else wsgi_upstream),
        "ASGI_SERVERS": nginx_servers([asgi_upstream] if isinstance(asgi_upstream, str) else asgi_upstream),
        "STATIC_ROOT": str(settings.STATIC_ROOT),
        "STATE_DIR": str(state_dir),
        "ACCESS_LOG": access_log,
        "ERROR_LOG": str(state_dir / "nginx-error.log"),
        "WORKER_PROCESSES": "1",
        "USER": pwd.getpwuid(os.getuid()).pw_name,
    }
    text = NGINX_TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    left = re.findall(r"@@[A-Z_]+@@", text)
    assert not left, f"deploy/nginx.conf.template has placeholders nobody fills in: {left}"
    return text


class Portal:
    """The portal's web tier (see `Topology`; `deployed_topology()` by default) and a Celery worker (and beat) on
    the benchmark's database and Redis databases.

    Processes, by name: `web` (uvicorn, `portal.asgi`: WebSockets, and all HTTP when it is the HTTP server),
    `wsgi` (gunicorn, `portal.wsgi`), `nginx`, `worker`, `beat`; `process_names` lists those started. Each runs
    in its own process group, with logs in a temporary directory that is printed on failure. `base_url` is where
    clients go: nginx when it is in front, else the HTTP server.
    """

    def __init__(
        self,
        *,
        port: int = 8100,
        worker_concurrency: int = 2,
        with_worker: bool = True,
        with_beat: bool = False,
        topology: Topology | None = None,
    ) -> None:
        self.port = port
        self.worker_concurrency = worker_concurrency
        self.with_worker = with_worker
        # Beat sends the periodic tasks (job sync, the sweep that requeues lost deliveries, usage import); its
        # intervals come from the environment (JOB_SYNC_INTERVAL_SECONDS etc., see portal/settings.py).
        self.with_beat = with_beat
        self.topology = topology or deployed_topology()
        self.log_dir = Path(tempfile.mkdtemp(prefix="gpuportal-bench-"))
        # The servers' sockets and nginx's files: nginx's workers (www-data) must be able to reach the sockets.
        self.run_dir = Path(tempfile.mkdtemp(prefix="gpuportal-bench-run-"))
        self.run_dir.chmod(0o711)
        # Its processes' metrics (multiprocess mode, as scripts/portal.sh runs them): GET /metrics sums them.
        self.metrics_dir = self.run_dir / "metrics"
        self.metrics_dir.mkdir()
        self.worker_name = f"bench-{uuid.uuid4().hex[:8]}@localhost"
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._commands: dict[str, list[str]] = {}
        self._environments: dict[str, dict[str, str]] = {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def process_names(self) -> list[str]:
        return list(self._processes)

    @property
    def asgi_socket(self) -> Path:
        return self.run_dir / "asgi.sock"

    @property
    def wsgi_socket(self) -> Path:
        return self.run_dir / "wsgi.sock"

    def _start(self, name: str, command: list[str], environment: dict[str, str] | None = None) -> None:
        self._commands[name] = command
        if environment is not None:
            self._environments[name] = environment
        log = (self.log_dir / f"{name}.log").open("ab")
        self._processes[name] = subprocess.Popen(
            command,
            cwd=ROOT,
            env={
                **os.environ,
                **BENCH_ENVIRONMENT,
                "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
                **self._environments.get(name, {}),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def pid(self, name: str) -> int:
        """The process id of `web`, `wsgi`, `nginx`, `worker` or `beat` (the master of a group of processes)."""
        return self._processes[name].pid

    def is_running(self, name: str) -> bool:
        """Whether the process is still running (a fault may have made it exit)."""
        return self._processes[name].poll() is None

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to the process's whole group (a worker's pool processes too), and wait until its leader is
        gone: a fault drill's crash."""
        process = self._processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        process.wait(timeout=30)

    def restart(self, name: str, *, timeout_seconds: float = 60) -> None:
        """Start `name` again with the command it was started with; wait until it answers."""
        from portal.celery import app as celery_app

        if name in {"web", "wsgi"}:  # a killed server leaves its socket file behind
            (self.asgi_socket if name == "web" else self.wsgi_socket).unlink(missing_ok=True)
        self._start(name, self._commands[name])
        deadline = time.monotonic() + timeout_seconds
        if name in {"web", "wsgi", "nginx"}:
            self._servers_wait(deadline=deadline)
        while name == "worker" and not self._worker_answers(celery_app):
            if self._processes[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the restarted Celery worker does not answer; logs in {self.log_dir}")

    def _worker_answers(self, celery_app: Any) -> bool:
        """Whether the worker answers a ping, over a connection of its own: after a broker restart the pooled
        connections of this process are broken."""
        with celery_app.connection_for_write() as connection:
            try:
                return bool(celery_app.control.ping(destination=[self.worker_name], timeout=0.5, connection=connection))
            except connection.connection_errors:
                return False

    def _web_start(self) -> None:
        topology = self.topology
        bin_dir = Path(sys.executable).parent
        proxied = {"PORTAL_NUM_PROXIES": "1"} if topology.proxy else {}
        asgi_alone = topology.http_server == "uvicorn"
        bind_asgi = (
            ["--host", "127.0.0.1", "--port", str(self.port)]
            if asgi_alone and not topology.proxy
            else ["--uds", str(self.asgi_socket)]
        )
        self._start(
            "web",
            [
                str(bin_dir / "uvicorn"),
                "portal.asgi:application",
                *bind_asgi,
                f"--workers={topology.http_workers if asgi_alone else topology.asgi_workers}",
                "--no-access-log",
                "--log-level=warning",
            ],
            # Set, not inherited: a kept connection under ASGI is the leak portal/env.py describes; a pool is not.
            {"DATABASE_CONN_MAX_AGE": "0", "DATABASE_POOL_SIZE": ASGI_POOL_SIZE, **proxied},
        )
        if not asgi_alone:
            bind_wsgi = f"unix:{self.wsgi_socket}" if topology.proxy else f"127.0.0.1:{self.port}"
            threads = (
                ["--worker-class=gthread", f"--threads={topology.threads}"]
                if topology.http_server == "gunicorn-gthread"
                else []
            )
            self._start(
                "wsgi",
                [
                    str(bin_dir / "gunicorn"),
                    "portal.wsgi:application",
                    "--config=python:portal.gunicorn_conf",
                    f"--bind={bind_wsgi}",
                    f"--workers={topology.http_workers}",
                    *threads,
                    "--timeout=60",
                    "--log-level=warning",
                ],
                {"DATABASE_CONN_MAX_AGE": str(topology.database_conn_max_age), **proxied},
            )
        if topology.proxy:
            subprocess.run(
                [str(bin_dir / "python"), "manage.py", "collectstatic", "--noinput", "-v0"],
                cwd=ROOT,
                env={**os.environ, **BENCH_ENVIRONMENT},
                check=True,
            )
            upstream_asgi = f"unix:{self.asgi_socket}"
            config = self.run_dir / "nginx.conf"
            config.write_text(
                nginx_config_render(
                    listen=f"127.0.0.1:{self.port}",
                    wsgi_upstream=upstream_asgi if asgi_alone else f"unix:{self.wsgi_socket}",
                    asgi_upstream=upstream_asgi,
                    state_dir=self.run_dir,
                    access_log="off",
                )
            )
            self._start("nginx", [nginx_binary(), "-c", str(config), "-e", str(self.log_dir / "nginx.log")])

    def _servers_wait(self, *, deadline: float) -> None:
        """Until every web server answers /healthz, each at its own address (the proxy's answer alone would
        not show that the ASGI server behind it is up)."""
        import httpx

        probes = [httpx.Client(base_url=self.base_url, timeout=2)]
        if self.topology.proxy or self.topology.http_server != "uvicorn":
            transport = httpx.HTTPTransport(uds=str(self.asgi_socket))
            probes.append(httpx.Client(base_url="http://localhost", transport=transport, timeout=2))
        if self.topology.proxy and self.topology.http_server != "uvicorn":
            transport = httpx.HTTPTransport(uds=str(self.wsgi_socket))
            probes.append(httpx.Client(base_url="http://localhost", transport=transport, timeout=2))
        try:
            for probe in probes:
                while True:
                    if any(process.poll() is not None for process in self._processes.values()):
                        raise RuntimeError(f"a portal process exited early; logs in {self.log_dir}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the portal did not start in time; logs in {self.log_dir}")
                    try:
                        probe.get("/healthz")
                        break
                    except httpx.TransportError:
                        time.sleep(0.2)
        finally:
            for probe in probes:
                probe.close()

    def start(self, *, timeout_seconds: float = 60) -> None:
        from portal.celery import app as celery_app

        bin_dir = Path(sys.executable).parent
        if self.with_worker:
            self._start(
                "worker",
                [
                    str(bin_dir / "celery"),
                    "-A",
                    "portal",
                    "worker",
                    "--loglevel=WARNING",
                    f"--concurrency={self.worker_concurrency}",
                    f"--hostname={self.worker_name}",
                    "--without-mingle",
                    "--without-gossip",
                ],
            )
        if self.with_beat:
            self._start(
                "beat",
                [
                    str(bin_dir / "celery"),
                    "-A",
                    "portal",
                    "beat",
                    "--loglevel=WARNING",
                    f"--schedule={self.log_dir / 'beat-schedule'}",
                    f"--pidfile={self.log_dir / 'beat.pid'}",
                ],
            )
        deadline = time.monotonic() + timeout_seconds
        self._web_start()
        self._servers_wait(deadline=deadline)
        while self.with_worker and not celery_app.control.ping(destination=[self.worker_name], timeout=0.5):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Celery worker did not answer within {timeout_seconds}s; logs in {self.log_dir}"
                )

    def stop(self) -> None:
        for process in reversed(self._processes.values()):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self._processes.clear()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def log_count(self, text: str) -> dict[str, int]:
        """How often each process's log mentions `text` (e.g. an error the processes logged)."""
        return {log.stem: log.read_text(errors="replace").count(text) for log in sorted(self.log_dir.glob("*.log"))}

    def __enter__(self) -> Portal:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        raise SystemExit(
            "nginx is not installed: `make nginx` (or `bash scripts/services.sh nginx`) installs Debian's nginx-light"
        )
    return found


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    print(f"  {label}: {time.perf_counter() - started:.1f}s")


# The machine's other daemons, by process name, for `CpuMeter`.
_DAEMONS = {
    "postgres": "PostgreSQL",
    "redis-server": "Redis",
    "slurmrestd": "slurmrestd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "mariadbd": "MariaDB",
}


def _cpu_by_part(portal: Portal) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each part of the stack: the portal's processes by name (each
    with its children: gunicorn's and Celery's workers, nginx's), the daemons, and this benchmark."""
    groups = {portal.pid(name): name for name in portal.process_names}
    used: dict[str, float] = {}
    for process in psutil.process_iter(["name"]):
        try:
            with process.oneshot():
                if process.pid == os.getpid():
                    part = "benchmark (clients)"
                elif (group := os.getpgid(process.pid)) in groups:
                    part = groups[group]
                elif (name := process.info["name"]) in _DAEMONS:
                    part = _DAEMONS[name]
                else:
                    continue
                times = process.cpu_times()
        except (psutil.Error, ProcessLookupError):
            continue  # gone meanwhile
        used[part] = used.get(part, 0.0) + times.user + times.system
    return used


class CpuMeter:
    """CPU each part of the stack used while the block ran: `with CpuMeter(portal) as cpu: ...`, then
    `cpu.table(per=jobs)`. Counts the processes alive at the end (a process that ended inside is not counted)."""

    def __init__(self, portal: Portal) -> None:
        self.portal = portal
        self.before: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.seconds = 0.0

    def __enter__(self) -> CpuMeter:
        self.before, self._started = _cpu_by_part(self.portal), time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.seconds = time.perf_counter() - self._started
        after = _cpu_by_part(self.portal)
        self.used = {part: seconds - self.before.get(part, 0.0) for part, seconds in after.items()}

    def table(self, *, per: int, unit: str) -> str:
        """One line per part, busiest first: CPU seconds, share of one core over the block, ms per `unit`."""
        lines = [f"  {'CPU used':30}{'s':>7}{'cores':>7}{'ms/' + unit:>10}"]
        for part, seconds in sorted(self.used.items(), key=lambda item: -item[1]):
            if seconds >= 0.005:
                lines.append(f"  {part:30}{seconds:7.2f}{seconds / self.seconds:7.2f}{1000 * seconds / per:10.2f}")
        total = sum(self.used.values())
        lines.append(f"  {'all':30}{total:7.2f}{total / self.seconds:7.2f}{1000 * total / per:10.2f}")
        return "\n".join(lines)
