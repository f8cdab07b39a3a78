"""How the portal's web tier should run, measured: uvicorn for everything versus gunicorn (sync or gthread
workers) for HTTP beside uvicorn for WebSockets, each with and without nginx in front, in one run.

For every candidate (bench/portal_stack.py's `Topology`, started by its `Portal` without a Celery worker, so
only the web tier is measured) 4 clients, each on a keep-alive connection of its own, send for a fixed time
first `GET /api/v1/jobs/?page_size=20` with a bearer token (the project has a few hundred jobs), then
`POST /api/v1/jobs/` (a job is stored `queued` and its delivery task queued in Redis; no worker takes it). It
prints requests/s and p50/p95 of each, errors, and the most PostgreSQL connections the web tier held on the
benchmark's database while loaded and once idle again. The candidates take turns, round after round, so that
a busy moment on this shared machine does not land on one candidate only; the table pools the rounds.

Usage: python bench/http_topology.py [--seconds S] [--rounds R] [--clients C] [--candidates a,b,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import portal_stack as stack  # sets up Django on the benchmark's database first
import psycopg
from django.db import connections

from jobs import job_services
from jobs.job_services import JobRequest

PORT = 8100
HISTORY_JOBS = 300
SCRIPT = "#!/bin/bash\necho bench\n"


def candidates() -> dict[str, stack.Topology]:
    """Each kind at the size it is usually given on this machine's cores; nginx+gunicorn-sync is the one
    scripts/portal.sh runs, sized as it sizes it."""
    cores = os.cpu_count() or 1
    sync = stack.deployed_topology(web_threads=1)
    return {
        topology.name: topology
        for topology in (
            stack.Topology(name="uvicorn", http_server="uvicorn", proxy=False, http_workers=2),
            dataclasses.replace(sync, name="gunicorn-sync", proxy=False),
            stack.Topology(
                name="gunicorn-gthread", http_server="gunicorn-gthread", proxy=False, http_workers=cores, threads=4
            ),
            stack.Topology(name="nginx+uvicorn", http_server="uvicorn", proxy=True, http_workers=2),
            sync,
            stack.Topology(
                name="nginx+gunicorn-gthread", http_server="gunicorn-gthread", proxy=True, http_workers=cores, threads=4
            ),
        )
    }


@dataclass
class Sample:
    """One request kind's answers for one candidate, over all rounds."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile_ms(self, fraction: float) -> float:
        return 1000 * stack.percentile(self.latencies, fraction) if self.latencies else float("nan")


@dataclass
class Figures:
    get: Sample = field(default_factory=Sample)
    post: Sample = field(default_factory=Sample)
    connections_loaded: int = 0
    connections_idle: int = 0
    rates: list[str] = field(default_factory=list)  # each round's GET and POST rates, to show the spread


class ConnectionCounter(threading.Thread):
    """The most client connections on the benchmark's database other than its own, sampled every 100 ms."""

    QUERY = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self._done = threading.Event()

    @classmethod
    def now(cls) -> int:
        with psycopg.connect(stack.DATABASE_URL, autocommit=True) as sampling:
            row = sampling.execute(cls.QUERY).fetchone()
        assert row is not None
        return int(row[0])

    def run(self) -> None:
        with psycopg.connect(stack.DATABASE_URL, autocommit=True) as sampling:
            while not self._done.wait(0.1):
                row = sampling.execute(self.QUERY).fetchone()
                assert row is not None
                self.peak = max(self.peak, int(row[0]))

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


Request = Callable[[http.client.HTTPConnection], tuple[int, bytes]]


def load(*, port: int, clients: int, seconds: float, request: Request, expected: int, into: Sample) -> float:
    """`clients` threads send `request` back to back for `seconds`; returns the requests/s of this phase."""
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    answered = 0

    def client() -> None:
        nonlocal answered
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        latencies, errors = [], []
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                status, body = request(connection)
            except (OSError, http.client.HTTPException) as exc:
                errors.append(repr(exc))
                connection.close()
                continue
            if status == expected:
                latencies.append(time.perf_counter() - started)
            else:
                errors.append(f"{status} {body[:200]!r}")
        connection.close()
        with lock:
            into.latencies.extend(latencies)
            into.errors.extend(errors)
            answered += len(latencies)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    into.seconds += elapsed
    return answered / elapsed


def requests_for(world: stack.World) -> tuple[Request, Request]:
    headers = {"Authorization": f"Bearer {world.token}", "Host": f"127.0.0.1:{PORT}"}

    def get(connection: http.client.HTTPConnection) -> tuple[int, bytes]:
        connection.request("GET", "/api/v1/jobs/?page_size=20", headers=headers)
        response = connection.getresponse()
        return response.status, response.read()

    def post(connection: http.client.HTTPConnection) -> tuple[int, bytes]:
        body = json.dumps(
            {
                "project": world.project_label,
                "cluster": stack.CLUSTER,
                "partition": stack.PARTITION,
                "gpus": 1,
                "time_limit_minutes": 1,
                "name": f"topology-{uuid.uuid4().hex[:8]}",
                "script": SCRIPT,
            }
        )
        connection.request("POST", "/api/v1/jobs/", body=body, headers={**headers, "Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()

    return get, post


def history_create(world: stack.World, count: int) -> None:
    """Jobs for the list to page through, submitted through the service (they stay queued: no worker runs)."""
    request = JobRequest(
        cluster=stack.CLUSTER, partition=stack.PARTITION, gpus=1, time_limit_minutes=1, name="history", script=SCRIPT
    )
    for _ in range(count):
        job_services.job_submit(user=world.user, project=world.project, request=request)
    stack.redis_flush()  # their delivery messages: no worker is meant to see them


def candidate_measure(
    topology: stack.Topology, *, world: stack.World, figures: Figures, seconds: float, clients: int
) -> None:
    get, post = requests_for(world)
    with stack.Portal(port=PORT, with_worker=False, topology=topology):
        # Warm up: every process imports its views and opens its connections before the clock runs.
        load(port=PORT, clients=clients, seconds=2, request=get, expected=200, into=Sample())
        counter = ConnectionCounter()
        counter.start()
        get_rate = load(port=PORT, clients=clients, seconds=seconds, request=get, expected=200, into=figures.get)
        post_rate = load(port=PORT, clients=clients, seconds=seconds, request=post, expected=202, into=figures.post)
        figures.connections_loaded = max(figures.connections_loaded, counter.stop())
        time.sleep(1)
        figures.connections_idle = max(figures.connections_idle, ConnectionCounter.now())
    figures.rates.append(f"{get_rate:.0f}/{post_rate:.0f}")
    stack.redis_flush()  # the POSTs' delivery messages


def report(results: dict[str, Figures], *, topologies: dict[str, stack.Topology], clients: int) -> None:
    print()
    print(f"{clients} clients; GET /api/v1/jobs/?page_size=20 and POST /api/v1/jobs/, rounds pooled")
    print(
        f"{'candidate':24}{'GET req/s':>10}{'p50 ms':>8}{'p95 ms':>8}{'POST req/s':>11}{'p50 ms':>8}{'p95 ms':>8}"
        f"{'errors':>7}{'DB conns':>9}{'idle':>6}  per round (GET/POST req/s)"
    )
    for name, figures in results.items():
        errors = len(figures.get.errors) + len(figures.post.errors)
        print(
            f"{name:24}{figures.get.per_second:10.1f}{figures.get.percentile_ms(0.5):8.0f}"
            f"{figures.get.percentile_ms(0.95):8.0f}{figures.post.per_second:11.1f}"
            f"{figures.post.percentile_ms(0.5):8.0f}{figures.post.percentile_ms(0.95):8.0f}{errors:7}"
            f"{figures.connections_loaded:9}{figures.connections_idle:6}  {' '.join(figures.rates)}"
        )
    print()
    for name, figures in results.items():
        chosen = " (what scripts/portal.sh runs)" if topologies[name] == stack.deployed_topology() else ""
        print(f"  {name}: {topologies[name].describe()}{chosen}")
        for error in (figures.get.errors + figures.post.errors)[:3]:
            print(f"    error: {error}")
    print("DB conns: the most PostgreSQL connections the web tier held while loaded; idle: 1 s after the load.")


def main() -> None:
    topologies = candidates()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=15, help="length of each GET and each POST phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--candidates", default=",".join(topologies), help=f"of: {', '.join(topologies)}")
    args = parser.parse_args()
    chosen = {name: topologies[name] for name in args.candidates.split(",")}
    print(f"machine: {stack.machine_note()}")
    slurmrestd_pid = stack.slurmrestd_pid()
    with stack.timed("world"):
        stack.database_recreate()
        stack.redis_flush()
        world = stack.world_create(project_slug="topology")
        history_create(world, HISTORY_JOBS)
        connections.close_all()  # this process's own connection must not count as the web tier's
    results = {name: Figures() for name in chosen}
    for round_number in range(1, args.rounds + 1):
        for name, topology in chosen.items():
            with stack.timed(f"round {round_number}: {name} ({topology.describe()})"):
                candidate_measure(
                    topology, world=world, figures=results[name], seconds=args.seconds, clients=args.clients
                )
    report(results, topologies=chosen, clients=args.clients)
    if note := stack.disturbance_note(slurmrestd_pid):
        print(note)
    stack.job_directories_remove()


if __name__ == "__main__":
    main()
