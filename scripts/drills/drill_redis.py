"""Drill: Redis (broker, channel layer, cache) shut down for 15 s mid-burst and started again empty.

The drill runs its own redis-server on port 6391 without persistence, so a restart loses every queued task
message, as a real Redis restart without persistence does; the shared Redis on 6379 is never touched. The
database is the source of truth: jobs accepted meanwhile (or whose messages were lost) are delivered by the
periodic sweep once Redis is back; a submission the portal cannot take must be refused clearly, never lost.
Usage: python scripts/drills/drill_redis.py
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

# Before the harness imports Django settings: the whole portal stack uses the drill's own Redis.
REDIS_PORT = 6391
os.environ.setdefault("BENCH_REDIS_BASE", f"redis://127.0.0.1:{REDIS_PORT}")

import harness  # noqa: E402  (sets up Django on the drill's database)
import redis  # noqa: E402
from burst import Burst  # noqa: E402
from ledger import ledger_check  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

from jobs.models import Job, JobState  # noqa: E402

REDIS_DIRECTORY = Path(tempfile.mkdtemp(prefix="gpuportal-drill-redis-"))  # its pid file; it saves nothing
ACCEPTED_BEFORE_FAULT = 40
DOWN_SECONDS = 15


def redis_client() -> redis.Redis:
    """A client that reports a refused connection at once, instead of retrying with backoff."""
    return redis.Redis(port=REDIS_PORT, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)


def redis_start() -> None:
    """Start the drill's redis-server (no snapshots, no append-only file) and wait until it answers."""
    subprocess.run(  # noqa: S603 -- fixed arguments
        [  # noqa: S607
            "redis-server",
            "--port",
            str(REDIS_PORT),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--pidfile",
            str(REDIS_DIRECTORY / "redis.pid"),
            "--dir",
            str(REDIS_DIRECTORY),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    client = redis_client()
    if not harness.wait_for(lambda: _answers(client), timeout_seconds=10, poll_seconds=0.1):
        raise RuntimeError(f"the drill's redis-server on port {REDIS_PORT} did not start")
    client.close()


def redis_stop() -> None:
    """Shut the drill's redis-server down without saving (everything in it is lost)."""
    client = redis_client()
    # redis-py may report the connection that a successful shutdown closed as an error.
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(nosave=True)
    harness.wait_for(lambda: not _answers(client), timeout_seconds=10, poll_seconds=0.1)
    client.close()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def run(drill: harness.Drill) -> bool:
    burst = Burst.start(drill)
    burst.wait_accepted(ACCEPTED_BEFORE_FAULT)
    # While a delivery is in flight: the worker then holds an unacknowledged message when the broker goes.
    in_flight = harness.wait_for_delivery_in_flight(drill)
    redis_stop()
    queued = Job.objects.filter(project=drill.world.project, state=JobState.QUEUED).count()
    drill.say(
        f"Redis shut down (nosave) after {burst.accepted} accepted, {in_flight} deliveries in flight, "
        f"{queued} jobs queued; down {DOWN_SECONDS} s"
    )
    time.sleep(DOWN_SECONDS)
    answered = burst.answered
    redis_start()
    drill.say(f"Redis started again, empty; {answered} submissions answered so far ({burst.accepted} accepted)")
    processes_survived = all_survived(drill)
    burst.wait()
    return ledger_check(drill, burst.submissions) and processes_survived


def all_survived(drill: harness.Drill) -> bool:
    """Whether the portal's processes outlived the outage. One that exited is restarted, as a supervisor would
    (systemd's Restart=always), so that the ledger check still shows whether anything was lost; the drill fails
    all the same: deployed without a supervisor, the portal would stop delivering until someone noticed."""
    survived = True
    for name in ("web", "worker", "beat"):
        if drill.portal.is_running(name):
            continue
        survived = False
        drill.say(f"FOUND: the portal's {name} process exited during the outage; see {drill.portal.log_dir}/{name}.log")
        drill.portal.restart(name)
        drill.say(f"{name} restarted (as a supervisor would)")
    if survived:
        drill.say("web, worker and beat all survived the outage")
    return survived


if __name__ == "__main__":
    redis_start()
    harness.main(
        "redis", f"Redis shut down for {DOWN_SECONDS} s mid-burst and started again empty", run, after=redis_stop
    )
