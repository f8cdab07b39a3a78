"""Drill: the portal spread over hosts as a site runs it; one web host and one worker host cut off mid-burst.

Each host is a network namespace on this machine (scripts/drills/netns.py): PostgreSQL and Redis on `db`, nginx
on `proxy` in front of two web hosts (`web1`, `web2`: gunicorn and uvicorn each), two worker hosts (`worker1`,
`worker2`: a Celery worker each) and `beat`; the local cluster's slurmrestd on `slurm`, on a network of its own
that only the worker hosts join. Every process runs the production settings, pointed at the others' addresses.

While log viewers follow three jobs' output through the proxy and 520 jobs are submitted, web1 and worker1 lose
their links (their switch ports go down) for 90 s, longer than a delivery's lease, then come back. Then: every
accepted job is in Slurm exactly once and charged exactly (the ledger check); every viewer got its log byte for
byte, those on web1 after reconnecting by offset; the proxy's failed upstream attempts all name the cut-off web
host; requests failed only where they were in flight on it (retried by the client with the same key).

`DRILL_HOSTS_LAYOUT=single` runs the same load on the single-host portal, without a cut: the figures to compare.
Usage: python scripts/drills/drill_hosts.py   (as root: it creates network namespaces)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import harness  # first: sets up Django on the drill's database
import httpx
import netns
import portal_stack as stack
from burst import Burst, Submission
from django.utils import timezone
from drill_websocket import LogViewer, query
from ledger import ledger_check
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from clusters.models import Cluster
from jobs.models import Job, JobState, JobTransition

DB = netns.Host("db", lan=f"{netns.LAN_PREFIX}.2")
PROXY = netns.Host("proxy", lan=f"{netns.LAN_PREFIX}.3")
WEB = [netns.Host("web1", lan=f"{netns.LAN_PREFIX}.11"), netns.Host("web2", lan=f"{netns.LAN_PREFIX}.12")]
WORKERS = [
    netns.Host("worker1", lan=f"{netns.LAN_PREFIX}.21", clusters=f"{netns.CLUSTER_PREFIX}.21"),
    netns.Host("worker2", lan=f"{netns.LAN_PREFIX}.22", clusters=f"{netns.CLUSTER_PREFIX}.22"),
]
BEAT = netns.Host("beat", lan=f"{netns.LAN_PREFIX}.31")
SLURM = netns.Host("slurm", clusters=f"{netns.CLUSTER_PREFIX}.2")
HOSTS = [DB, PROXY, *WEB, *WORKERS, BEAT, SLURM]
WSGI_PORT, ASGI_PORT = 8000, 8001
# Per web host: two sync workers each (five would be gunicorn's rule for two cores; here ten processes of two
# hosts share the machine's two cores with everything else).
WEB_WORKERS = 2

BURST_JOBS = 520  # 130 s at 4/s: it goes on for a while after the hosts return
BURST_PER_SECOND = 4.0
CUT_AFTER_ACCEPTED = 60
# Longer than a delivery's lease (JOB_SUBMIT_LEASE_SECONDS, 60) and than nginx's read timeout on /ws/ (60 s):
# worker2 takes over worker1's deliveries, and nginx closes the viewers' sockets to web1.
CUT_SECONDS = 90
LOG_JOBS = 3
VIEWERS_PER_JOB = 2
LOG_LINES = 1800  # one every 0.1 s: the jobs print for about three minutes, across the whole cut
LOG_SCRIPT = (
    "#!/bin/bash\n"
    f"for i in $(seq 1 {LOG_LINES}); do\n"
    '  echo "line $i of the drill log"\n'
    '  if (( i % 10 == 0 )); then echo "warning $i" >&2; fi\n'
    "  sleep 0.1\n"
    "done\n"
)
VIEWER_DEADLINE_SECONDS = 600


def _on_lan(url: str) -> str:
    """`url` (a service on this machine's loopback) at the db host's address instead."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", f"expected a loopback URL, got {url}"
    return parts._replace(netloc=parts.netloc.replace("127.0.0.1", DB.lan or "")).geturl()


class HostsPortal(stack.Portal):
    """The portal's processes, each on its host (see the module's description), with the forwarders that stand
    in for PostgreSQL, Redis and slurmrestd on their hosts, and the drill's way in: 127.0.0.1:8101, forwarded
    to the proxy. `stop()` ends the processes and removes the network."""

    def __init__(self) -> None:
        super().__init__(port=harness.DRILL_PORT, worker_concurrency=2, with_beat=True)
        self.network = netns.Network(HOSTS)
        self.worker_names = {
            host.name: f"drill-{host.name}-{uuid.uuid4().hex[:6]}@{host.namespace}" for host in WORKERS
        }
        rest = urlsplit(stack.TARGET.slurmrestd_url)
        self.slurmrestd_port = rest.port or 80
        self.slurmrestd_url = f"{rest.scheme}://{SLURM.clusters}:{self.slurmrestd_port}"

    @property
    def lan_environment(self) -> dict[str, str]:
        names = ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNELS_REDIS_URL", "REDIS_URL")
        return {name: _on_lan(stack.BENCH_ENVIRONMENT[name]) for name in names}

    def start(self, *, timeout_seconds: float = 90) -> None:
        from portal.celery import app as celery_app

        for leftover in netns.remove_stale():
            print(f"  removed a leftover of an earlier run: {leftover}", flush=True)
        self.network.create()
        database = urlsplit(stack.DATABASE_URL)
        redis = urlsplit(stack.BENCH_ENVIRONMENT["REDIS_URL"])
        forwards = {
            "postgresql": (f"{DB.namespace}/{DB.lan}:{database.port}", f"-/127.0.0.1:{database.port}"),
            "redis": (f"{DB.namespace}/{DB.lan}:{redis.port}", f"-/127.0.0.1:{redis.port}"),
            "slurmrestd": (
                f"{SLURM.namespace}/{SLURM.clusters}:{self.slurmrestd_port}",
                f"-/127.0.0.1:{self.slurmrestd_port}",
            ),
            "entry": (f"-/127.0.0.1:{self.port}", f"{PROXY.namespace}/{PROXY.lan}:{self.port}"),
        }
        for name, (listen, target) in forwards.items():
            self.network.forward(listen, target, log=self.log_dir / f"forward-{name}.log")
        # The cluster as a site registers it: at slurmrestd's address on the clusters' network.
        Cluster.objects.filter(name=stack.CLUSTER).update(slurmrestd_url=self.slurmrestd_url)
        bin_dir = Path(sys.executable).parent
        lan = {**self.lan_environment, "PORTAL_NUM_PROXIES": "1"}
        for host in WEB:
            self._start(
                f"{host.name}-wsgi",
                host.command(
                    [
                        str(bin_dir / "gunicorn"),
                        "portal.wsgi:application",
                        f"--bind=0.0.0.0:{WSGI_PORT}",
                        f"--workers={WEB_WORKERS}",
                        "--timeout=60",
                        "--log-level=warning",
                        f"--access-logfile={self.log_dir / f'{host.name}-access.log'}",
                    ]
                ),
                {**lan, "DATABASE_CONN_MAX_AGE": str(stack.WSGI_CONN_MAX_AGE_SECONDS)},
            )
            self._start(
                f"{host.name}-asgi",
                host.command(
                    [
                        str(bin_dir / "uvicorn"),
                        "portal.asgi:application",
                        "--host=0.0.0.0",
                        f"--port={ASGI_PORT}",
                        "--workers=1",
                        "--no-access-log",
                        "--log-level=warning",
                    ]
                ),
                {**lan, "DATABASE_CONN_MAX_AGE": "0", "DATABASE_POOL_SIZE": stack.ASGI_POOL_SIZE},
            )
        for host in WORKERS:
            self._start(
                host.name,
                host.command(
                    [
                        str(bin_dir / "celery"),
                        "-A",
                        "portal",
                        "worker",
                        "--loglevel=WARNING",
                        f"--concurrency={self.worker_concurrency}",
                        f"--hostname={self.worker_names[host.name]}",
                        "--without-mingle",
                        "--without-gossip",
                    ]
                ),
                lan,
            )
        self._start(
            BEAT.name,
            BEAT.command(
                [
                    str(bin_dir / "celery"),
                    "-A",
                    "portal",
                    "beat",
                    "--loglevel=WARNING",
                    f"--schedule={self.log_dir / 'beat-schedule'}",
                    f"--pidfile={self.log_dir / 'beat.pid'}",
                ]
            ),
            lan,
        )
        config = self.run_dir / "nginx.conf"
        config.write_text(
            stack.nginx_config_render(
                listen=f"{PROXY.lan}:{self.port}",
                wsgi_upstream=[f"{host.lan}:{WSGI_PORT}" for host in WEB],
                asgi_upstream=[f"{host.lan}:{ASGI_PORT}" for host in WEB],
                state_dir=self.run_dir,
                access_log="off",
            )
        )
        self._start(PROXY.name, PROXY.command([stack.nginx_binary(), "-c", str(config), "-e", str(self.error_log)]))
        deadline = time.monotonic() + timeout_seconds
        for host in WEB:
            for port in (WSGI_PORT, ASGI_PORT):
                self._answers_wait(f"http://{host.lan}:{port}/healthz", namespace=PROXY.namespace, deadline=deadline)
        self._answers_wait(f"{self.base_url}/healthz", namespace=None, deadline=deadline)
        names = list(self.worker_names.values())
        while len(celery_app.control.ping(destination=names, timeout=1) or []) < len(names):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Celery workers did not all answer; logs in {self.log_dir}")

    @property
    def error_log(self) -> Path:
        """nginx's error log: each failed attempt to reach a web host, with the host's address."""
        return self.run_dir / "nginx-error.log"

    def _answers_wait(self, url: str, *, namespace: str | None, deadline: float) -> None:
        def probe() -> bool:
            try:
                # With the site's name, as a load balancer's health check sends it (PORTAL_ALLOWED_HOSTS).
                return httpx.get(url, headers={"Host": "localhost"}, timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        while not (netns.run_on(namespace, probe) if namespace else probe()):
            if any(process.poll() is not None for process in self._processes.values()):
                raise RuntimeError(f"a portal process exited early; logs in {self.log_dir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} does not answer; logs in {self.log_dir}")
            time.sleep(0.3)

    def stop(self) -> None:
        # nginx's error log lives in the run directory, which stopping removes.
        with contextlib.suppress(OSError):
            (self.log_dir / "nginx-error.log").write_bytes(self.error_log.read_bytes())
        try:
            super().stop()
        finally:
            self.network.remove()


# The viewers ------------------------------------------------------------------------------------------------


@dataclass
class Viewer:
    """One viewer of one job's log, as the browser's log viewer behaves: it sends no pings of its own, and when
    its socket closes it reconnects with the offsets it holds (log-viewer.js)."""

    job: Job
    log: LogViewer = field(default_factory=LogViewer)
    connects: int = 0
    closed_at: list[float] = field(default_factory=list)  # seconds since the drill's start, per unasked close
    refused: list[str] = field(default_factory=list)  # reconnects that failed (and were tried again)


async def follow(drill: harness.Drill, viewer: Viewer) -> None:
    deadline = time.monotonic() + VIEWER_DEADLINE_SECONDS
    headers = {"Authorization": f"Bearer {drill.world.token}"}
    while viewer.log.ended is None and time.monotonic() < deadline:
        url = f"ws://127.0.0.1:{drill.portal.port}/ws/jobs/{viewer.job.pk}/log/{query(viewer.log)}"
        try:
            socket = await connect(url, additional_headers=headers, open_timeout=30, ping_interval=None, max_queue=None)
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            viewer.refused.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1)
            continue
        viewer.connects += 1
        try:
            while viewer.log.ended is None:
                viewer.log.take(json.loads(await socket.recv()))
        except ConnectionClosed:
            viewer.closed_at.append(time.monotonic() - drill.timeline.started)
            await asyncio.sleep(1)  # the browser's first pause
        finally:
            await socket.close()


def viewers_run(drill: harness.Drill, viewers: list[Viewer]) -> threading.Thread:
    async def all_of_them() -> None:
        await asyncio.gather(*(follow(drill, viewer) for viewer in viewers))

    thread = threading.Thread(target=lambda: asyncio.run(all_of_them()), name="viewers", daemon=True)
    thread.start()
    return thread


def viewers_check(drill: harness.Drill, viewers: list[Viewer]) -> bool:
    passed = True
    for number, viewer in enumerate(viewers, 1):
        problems = list(viewer.log.problems)
        if viewer.log.ended is None:
            problems.append("no log.end")
        for stream, path in (("stdout", viewer.job.stdout_path), ("stderr", viewer.job.stderr_path)):
            if bytes(viewer.log.received[stream]) != Path(path).read_bytes():
                problems.append(f"{stream} differs from the file")
        numbers = [int(line.split()[1]) for line in viewer.log.received["stdout"].decode().splitlines()]
        if numbers != list(range(1, LOG_LINES + 1)):
            problems.append(f"stdout lines not 1..{LOG_LINES} once each in order ({len(numbers)} lines)")
        closes = ", ".join(f"+{at:.0f}s" for at in viewer.closed_at) or "none"
        drill.say(
            f"viewer {number} (job {str(viewer.job.pk)[:8]}): {viewer.connects} connections, closed by the portal "
            f"at {closes}, {len(viewer.refused)} refused reconnects; stdout {viewer.log.offset('stdout')} B, "
            f"stderr {viewer.log.offset('stderr')} B: {'; '.join(problems) or 'identical to the files, lines in order'}"
        )
        passed = passed and not problems
    return passed


# Figures ----------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # seconds since the drill's start
    accepted: int
    delivered: int


def sampler(drill: harness.Drill, burst: Burst, samples: list[Sample], stop: threading.Event) -> threading.Thread:
    """Once a second: how many jobs the burst has had accepted, how many are in Slurm."""

    def run() -> None:
        jobs = Job.objects.filter(project=drill.world.project, slurm_job_id__isnull=False)
        while not stop.is_set():
            at = time.monotonic() - drill.timeline.started
            samples.append(Sample(at=at, accepted=burst.accepted, delivered=jobs.count() - LOG_JOBS))
            stop.wait(1)
        from django.db import connection

        connection.close()

    thread = threading.Thread(target=run, name="sampler", daemon=True)
    thread.start()
    return thread


def _percentile(values: list[float], fraction: float) -> float:
    return stack.percentile(values, fraction) if values else float("nan")


def figures(drill: harness.Drill, burst: Burst, samples: list[Sample], phases: list[tuple[str, float, float]]) -> None:
    """Per phase: submissions answered per second, POST p50/p95 (first attempt to final answer, retries
    included), jobs that reached Slurm per second."""
    started = drill.timeline.started
    for label, begin, end in phases:
        answered = [
            s for s in burst.submissions if s.answered_at is not None and begin <= s.answered_at - started < end
        ]
        latencies = [1000 * (s.answered_at - s.sent_at) for s in answered if s.sent_at and s.answered_at]
        inside = [sample for sample in samples if begin <= sample.at <= end]
        delivered = (inside[-1].delivered - inside[0].delivered) if len(inside) > 1 else 0
        seconds = max(end - begin, 1e-9)
        drill.say(
            f"figures {label} (+{begin:.0f}s..+{end:.0f}s): {len(answered) / seconds:.2f} submissions answered/s, "
            f"POST p50 {_percentile(latencies, 0.5):.0f} ms p95 {_percentile(latencies, 0.95):.0f} ms "
            f"max {max(latencies, default=float('nan')):.0f} ms; {delivered / seconds:.2f} jobs reached Slurm/s"
        )
    first = next((sample.at for sample in samples if sample.delivered >= burst.accepted), None)
    if first is not None:
        drill.say(f"all {burst.accepted} accepted jobs of the burst were in Slurm by +{first:.0f}s")


UPSTREAM_ERROR = re.compile(
    r"\[error\] .*?: \*\d+ (?P<what>[^,]+?)(?: while (?P<when>[^,]+))?,.*upstream: \"\w+://(?P<host>[\d.]+):(?P<port>\d+)(?P<path>[^\"]*)\""
)


def upstream_errors(portal: HostsPortal) -> Counter[tuple[str, str, str]]:
    """nginx's failed attempts to reach a web host, by (host address, server, what happened)."""
    found: Counter[tuple[str, str, str]] = Counter()
    with contextlib.suppress(FileNotFoundError):
        for line in portal.error_log.read_text(errors="replace").splitlines():
            if match := UPSTREAM_ERROR.search(line):
                server = "gunicorn" if int(match["port"]) == WSGI_PORT else "uvicorn"
                what = match["what"] + (f" while {match['when']}" if match["when"] else "")
                found[(match["host"], server, what)] += 1
    return found


def served_by_host(portal: HostsPortal) -> dict[str, Counter[str]]:
    """gunicorn's access logs: each web host's answers by status."""
    served: dict[str, Counter[str]] = {}
    for host in WEB:
        statuses: Counter[str] = Counter()
        with contextlib.suppress(FileNotFoundError):
            for line in (portal.log_dir / f"{host.name}-access.log").read_text(errors="replace").splitlines():
                if match := re.search(r'" (\d{3}) ', line):
                    statuses[match[1]] += 1
        served[host.name] = statuses
    return served


def client_failures(submissions: list[Submission]) -> Counter[str]:
    return Counter(problem.split(":")[0] for submission in submissions for problem in submission.problems)


# The drill --------------------------------------------------------------------------------------------------


def isolation_check(drill: harness.Drill, portal: HostsPortal) -> bool:
    """slurmrestd answers the worker hosts only: a web host reaches it neither on the clusters' network nor on
    its own loopback; the web hosts do reach PostgreSQL."""
    port = portal.slurmrestd_port
    outcomes = {
        f"{host.name} -> slurmrestd {SLURM.clusters}:{port}": netns.connect_outcome(
            host.namespace, SLURM.clusters or "", port
        )
        for host in [*WEB, *WORKERS, BEAT]
    }
    for host in WEB:
        outcomes[f"{host.name} -> 127.0.0.1:{port}"] = netns.connect_outcome(host.namespace, "127.0.0.1", port)
        outcomes[f"{host.name} -> PostgreSQL {DB.lan}:5432"] = netns.connect_outcome(host.namespace, DB.lan or "", 5432)
    for label, outcome in outcomes.items():
        drill.say(f"reachability: {label}: {outcome}")
    expected = {label: "PostgreSQL" in label or label.startswith("worker") for label in outcomes}
    passed = all((outcomes[label] == "connected") == connects for label, connects in expected.items())
    drill.say(f"reachability as required (slurmrestd from the worker hosts only): {passed}")
    return passed


def log_jobs_start(drill: harness.Drill) -> tuple[Burst, list[Job]]:
    burst = Burst.start(drill, count=LOG_JOBS, concurrency=LOG_JOBS, script=LOG_SCRIPT, time_limit_minutes=6)
    burst.wait()
    ids = [submission.job_id for submission in burst.submissions if submission.job_id]

    def running() -> bool:
        jobs = list(Job.objects.filter(pk__in=ids))
        return len(jobs) == LOG_JOBS and all(
            job.state == JobState.RUNNING and Path(job.stdout_path).exists() for job in jobs
        )

    harness.wait_for(running, timeout_seconds=120)
    jobs = list(Job.objects.filter(pk__in=ids).order_by("created_at"))
    drill.say(f"log jobs: {', '.join(f'{str(job.pk)[:8]} {job.state}' for job in jobs)}")
    return burst, jobs


def leased(drill: harness.Drill) -> set[uuid.UUID]:
    """The jobs whose delivery a worker holds right now."""
    return set(
        Job.objects.filter(
            project=drill.world.project, state=JobState.QUEUED, submit_lease_until__gt=timezone.now()
        ).values_list("pk", flat=True)
    )


def cut_worker_mid_delivery(drill: harness.Drill, portal: HostsPortal) -> None:
    """Cut worker1 off while it holds a delivery. A delivery takes milliseconds, so it is caught in the middle:
    worker2 is paused (SIGSTOP) so that the next delivery to start is worker1's, worker1 is paused as soon as it
    has leased its jobs, then its cable is pulled and both go on. worker1 then tries to reach slurmrestd and
    PostgreSQL over a dead link; its lease runs out while it is away, and worker2 takes the jobs over (looking
    for them in Slurm first) while worker1 may still believe it is submitting them."""
    worker1, worker2 = portal.pid("worker1"), portal.pid("worker2")
    os.killpg(worker2, signal.SIGSTOP)
    try:
        worker2_holds = leased(drill)
        for _ in range(20):
            harness.wait_for(lambda: bool(leased(drill) - worker2_holds), timeout_seconds=30, poll_seconds=0.002)
            os.killpg(worker1, signal.SIGSTOP)
            worker1_holds = leased(drill) - worker2_holds
            if worker1_holds:
                break
            os.killpg(worker1, signal.SIGCONT)  # it had finished already: catch the next one
        portal.network.cut("worker1")
    finally:
        os.killpg(worker1, signal.SIGCONT)
        os.killpg(worker2, signal.SIGCONT)
    drill.say(
        f"worker1 cut off (its switch ports down) while it held the delivery of {len(worker1_holds)} jobs "
        f"(worker2 and then worker1 paused for that moment; worker2 held {len(worker2_holds)})"
    )


def web_requests_in_flight(portal: HostsPortal, host: netns.Host) -> int:
    """Requests to gunicorn on `host` in flight: the proxy's connections to it that are established (nginx opens
    one per request to gunicorn, which closes it after the answer), from the kernel's table of the host's
    namespace as any process there sees it."""
    table = Path(f"/proc/{portal.pid(f'{host.name}-wsgi')}/net/tcp").read_text().splitlines()[1:]
    local_port = f":{WSGI_PORT:04X}"
    return sum(1 for line in table if line.split()[1].endswith(local_port) and line.split()[3] == "01")


def cut_web_mid_request(drill: harness.Drill, portal: HostsPortal) -> None:
    """Cut web1 off while a request of the burst is in flight on it: gunicorn on web1 is paused until the proxy
    has sent it one (so it cannot answer first), then its cable is pulled and it goes on, over a dead link."""
    web1 = portal.pid("web1-wsgi")
    os.killpg(web1, signal.SIGSTOP)
    try:
        harness.wait_for(lambda: web_requests_in_flight(portal, WEB[0]) > 0, timeout_seconds=30, poll_seconds=0.01)
        in_flight = web_requests_in_flight(portal, WEB[0])
        portal.network.cut("web1")
    finally:
        os.killpg(web1, signal.SIGCONT)
    drill.say(f"web1 cut off (its switch port down) with {in_flight} requests in flight on it (paused for that moment)")


def run(drill: harness.Drill) -> bool:
    portal = drill.portal if isinstance(drill.portal, HostsPortal) else None
    isolated = isolation_check(drill, portal) if portal else True
    log_burst, log_jobs = log_jobs_start(drill)
    viewers = [Viewer(job=job) for job in log_jobs for _ in range(VIEWERS_PER_JOB)]
    viewing = viewers_run(drill, viewers)
    harness.wait_for(lambda: all(viewer.connects for viewer in viewers), timeout_seconds=60)
    drill.say(f"{len(viewers)} viewers follow the {LOG_JOBS} jobs' logs through the proxy")
    burst = Burst.start(drill, count=BURST_JOBS, per_second=BURST_PER_SECOND)
    samples: list[Sample] = []
    stop_sampling = threading.Event()
    sampling = sampler(drill, burst, samples, stop_sampling)
    burst_began = time.monotonic() - drill.timeline.started
    burst.wait_accepted(CUT_AFTER_ACCEPTED)
    cut_at = time.monotonic() - drill.timeline.started
    if portal:
        cut_worker_mid_delivery(drill, portal)
        cut_web_mid_request(drill, portal)
        cut_at = time.monotonic() - drill.timeline.started
        drill.say(f"keeping web1 and worker1 off for {CUT_SECONDS} s; {burst.accepted} accepted so far")
        until = time.monotonic() + CUT_SECONDS
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(15.0, left))
            delivered = samples[-1].delivered if samples else 0
            drill.say(f"  cut off: {burst.accepted} accepted, {delivered} of the burst in Slurm")
        portal.network.restore("web1")
        portal.network.restore("worker1")
        drill.say(f"web1 and worker1 back on the network; {burst.accepted} accepted so far")
    restored_at = time.monotonic() - drill.timeline.started
    burst.wait()
    burst_ended = time.monotonic() - drill.timeline.started
    harness.wait_for(lambda: bool(samples) and samples[-1].delivered >= burst.accepted, timeout_seconds=300)
    stop_sampling.set()
    sampling.join()
    if portal:
        phases = [
            ("before the cut", burst_began, cut_at),
            ("during the cut", cut_at, restored_at),
            ("after the cut", restored_at, burst_ended),
        ]
    else:
        phases = [("burst", burst_began, burst_ended)]
    phases.append(("whole burst", burst_began, burst_ended))
    figures(drill, burst, samples, phases)
    viewing.join(timeout=VIEWER_DEADLINE_SECONDS)
    viewers_ok = viewers_check(drill, viewers)
    failures = client_failures(burst.submissions)
    drill.say(f"client: failed attempts by kind (each retried with its Idempotency-Key): {dict(failures) or 'none'}")
    hosts_ok = True
    if portal:
        for host, statuses in served_by_host(portal).items():
            drill.say(f"gunicorn on {host} answered {sum(statuses.values())} requests: {dict(statuses)}")
        errors = upstream_errors(portal)
        for (address, server, what), count in sorted(errors.items()):
            drill.say(f"proxy: {count} x {server} on {address}: {what}")
        others = {key: count for key, count in errors.items() if key[0] != WEB[0].lan}
        hosts_ok = not others
        drill.say(f"proxy errors only for the cut-off web host {WEB[0].lan}: {hosts_ok}")
        resumed = sum(1 for viewer in viewers if viewer.connects > 1)
        drill.say(f"{resumed} viewers reconnected and resumed by offset; the others stayed connected throughout")
    submissions = [*log_burst.submissions, *burst.submissions]
    ledger_ok = ledger_check(drill, submissions)
    retried = Job.objects.filter(project=drill.world.project, submit_attempts__gt=1).count()
    found = JobTransition.objects.filter(job__project=drill.world.project, detail__startswith="found in Slurm").count()
    drill.say(f"{retried} jobs needed more than one delivery attempt; {found} were found in Slurm by their tag")
    return isolated and viewers_ok and hosts_ok and ledger_ok


if __name__ == "__main__":
    if os.environ.get("DRILL_HOSTS_LAYOUT") == "single":
        harness.main("hosts", "the same load on the single-host portal, no fault (figures to compare)", run)
    if os.geteuid() != 0:
        raise SystemExit("the multi-host drill creates network namespaces: run it as root")
    subprocess.run(["bash", str(harness.ROOT / "scripts" / "services.sh"), "iproute2"], check=True)  # noqa: S603, S607
    harness.main(
        "hosts",
        "web1 and worker1 of a portal spread over 8 hosts cut off for 90 s mid-burst, with log viewers open",
        run,
        portal_factory=HostsPortal,
    )
