"""What every fault drill shares: its own database and Redis databases, a portal with beat, a timeline of what
the drill did, faults on the cluster's daemons, and the cleanup that always puts the cluster back.

Import this module before anything from Django (it imports `bench/portal_stack.py`, which sets Django up). It
points the stack at database `gpuportal_bench_drills` and Redis databases 7, 8 and 9 unless `BENCH_DATABASE_URL`,
`BENCH_REDIS_BASE` or `BENCH_REDIS_DBS` say otherwise (the Redis drill sets `BENCH_REDIS_BASE` to its own
server before importing this), and shortens the periodic intervals so that what the workers repair by
themselves (the sweep of lost deliveries, job sync, usage import) happens within a drill's few minutes.

A drill module looks like this (see drill_slurmrestd.py):

    import harness  # first: sets up Django on the drill's database
    from burst import Burst
    from ledger import ledger_check

    def run(drill: harness.Drill) -> bool:
        burst = Burst.start(drill)                # 200 submissions through the REST API, in a thread
        ...                                       # the fault, with drill.say(...) for each step
        burst.wait()
        return ledger_check(drill, burst.submissions).passed

    if __name__ == "__main__":
        harness.main("name", "one line on the fault", run)

`harness.main` prints a header, runs `run` inside `drill_stack` (fresh database, world, portal on port 8101 with
a Celery worker and beat; afterwards leftover Slurm jobs cancelled, the drill's Slurm account removed, processes
stopped, `scripts/cluster.sh up`), prints PASS or FAIL and exits 0 or 1. `scripts/drills/run.py` runs each
drill module in a process of its own, so each can choose its environment before Django starts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRILL_PORT = 8101

os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench_drills")
os.environ.setdefault("BENCH_REDIS_DBS", "7,8,9")
# Short intervals, so that the periodic repairs happen within a drill. Set before the portal's processes
# start: they inherit this environment.
DRILL_INTERVALS = {
    "JOB_SYNC_INTERVAL_SECONDS": "3",
    "JOB_SUBMIT_SWEEP_GRACE_SECONDS": "10",
    "BILLING_IMPORT_INTERVAL_SECONDS": "10",
    "CLUSTER_SYNC_INTERVAL_SECONDS": "30",
}
for _name, _value in DRILL_INTERVALS.items():
    os.environ.setdefault(_name, _value)

sys.path.insert(0, str(ROOT / "bench"))
import portal_stack as stack  # noqa: E402  (sets up Django on the drill's database)
from django.utils import timezone  # noqa: E402

from clusters.slurm import SlurmClient  # noqa: E402
from jobs.models import Job, JobState  # noqa: E402


class Timeline:
    """What a drill did, printed as it happens with the wall-clock time and the seconds since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        now = datetime.now().astimezone()
        print(f"  {now:%H:%M:%S} +{time.monotonic() - self.started:6.1f}s  {text}", flush=True)


@dataclass
class Drill:
    """A running drill: its timeline, the world it made, its portal and a Slurm client of its own."""

    name: str
    timeline: Timeline
    world: stack.World
    portal: stack.Portal
    slurm: SlurmClient
    started_at: datetime  # before the first submission: the Slurm accounting window starts here

    def say(self, text: str) -> None:
        self.timeline.say(text)

    @property
    def account(self) -> str:
        """The project's Slurm account, which holds every job of the drill."""
        return str(self.world.project.slurm_account)


def cluster_daemon_stop(daemon: str) -> None:
    """Stop one daemon of the local cluster (munged, slurmdbd, slurmctld, slurmrestd, gpu01..gpu04)."""
    _cluster_script("stop", daemon)


def cluster_up() -> None:
    """Start whatever daemon of the local cluster is missing (a no-op when all run)."""
    _cluster_script("up")


def _cluster_script(*arguments: str) -> None:
    subprocess.run(  # noqa: S603 -- the project's own script, with fixed arguments
        ["bash", str(ROOT / "scripts" / "cluster.sh"), *arguments],  # noqa: S607
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=180,
    )


def wait_for(condition: Callable[[], bool], *, timeout_seconds: float, poll_seconds: float = 0.5) -> bool:
    """Poll `condition` until it holds or the time is up; whether it held."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_seconds)
    return True


def deliveries_in_flight(drill: Drill) -> int:
    """Jobs a worker holds the delivery lease of right now: a fault at this moment interrupts their delivery."""
    return Job.objects.filter(
        project=drill.world.project, state=JobState.QUEUED, submit_lease_until__gt=timezone.now()
    ).count()


def wait_for_delivery_in_flight(drill: Drill, *, timeout_seconds: float = 5) -> int:
    """Wait (briefly) until a delivery is in flight, so the fault that follows hits one; how many there are."""
    wait_for(lambda: deliveries_in_flight(drill) > 0, timeout_seconds=timeout_seconds, poll_seconds=0.005)
    return deliveries_in_flight(drill)


@contextlib.contextmanager
def drill_stack(
    name: str,
    *,
    timeline: Timeline,
    worker_concurrency: int = 2,
    portal_factory: Callable[[], stack.Portal] | None = None,
) -> Iterator[Drill]:
    """A fresh database and world, a portal with a worker and beat on port 8101 (or the one `portal_factory`
    makes: the multi-host drill's); afterwards everything the drill left is cleaned up and the cluster restored,
    whatever happened."""
    stack.database_recreate()
    stack.redis_flush()
    world = stack.world_create(project_slug=f"drill-{name}-{uuid.uuid4().hex[:6]}")
    timeline.say(f"world ready: project {world.project_label}, Slurm account {world.project.slurm_account}")
    slurm = stack.bare_client()
    if portal_factory is None:
        portal = stack.Portal(port=DRILL_PORT, worker_concurrency=worker_concurrency, with_beat=True)
    else:
        portal = portal_factory()
    try:
        portal.start()
        timeline.say(f"portal up on {portal.base_url}: {', '.join(portal.process_names)}; logs in {portal.log_dir}")
        yield Drill(name=name, timeline=timeline, world=world, portal=portal, slurm=slurm, started_at=timezone.now())
    finally:
        _cleanup(world=world, portal=portal, slurm=slurm, timeline=timeline)


def _cleanup(*, world: stack.World, portal: stack.Portal, slurm: SlurmClient, timeline: Timeline) -> None:
    """Each step on its own: one failing must not keep the cluster from being restored."""
    steps: list[tuple[str, Callable[[], object]]] = [
        ("stop the portal", portal.stop),
        ("restore the cluster", cluster_up),
        ("cancel leftover Slurm jobs", lambda: stack.slurm_jobs_cancel(slurm, account=world.project.slurm_account)),
        ("remove the Slurm account", lambda: stack.slurm_account_delete(slurm, account=world.project.slurm_account)),
        ("remove the job directories", stack.job_directories_remove),
        ("close the Slurm client", slurm.close),
    ]
    for label, step in steps:
        try:
            step()
        except Exception as exc:  # reported; the next step still runs
            timeline.say(f"cleanup: could not {label}: {exc}")
    timeline.say("cleaned up: portal stopped, cluster restored, Slurm jobs and account removed")


def main(
    name: str,
    fault: str,
    run: Callable[[Drill], bool],
    *,
    worker_concurrency: int = 2,
    after: Callable[[], None] | None = None,
    portal_factory: Callable[[], stack.Portal] | None = None,
) -> None:
    """Run one drill, then `after` (the drill's own cleanup), and exit 0 when it passed, 1 when it failed or
    crashed. The exit is immediate: client threads still retrying against a stopped portal must not hold it up.
    `portal_factory` makes a portal other than the single-host one (it must stop everything it started in
    `stop()`, which the cleanup calls whatever happened)."""
    print(f"=== drill {name}: {fault}", flush=True)
    timeline = Timeline()
    passed = False
    try:
        with drill_stack(
            name, timeline=timeline, worker_concurrency=worker_concurrency, portal_factory=portal_factory
        ) as drill:
            passed = run(drill)
    except Exception:  # a crashed drill is a failed drill; its traceback says why
        traceback.print_exc()
        passed = False
    if after is not None:
        after()
    print(f"=== drill {name}: {'PASS' if passed else 'FAIL'}", flush=True)
    sys.stderr.flush()
    os._exit(0 if passed else 1)
