"""Drill: slurmctld stopped while jobs run and more are being submitted, kept down ~20 s, then started again.

Running jobs live on in slurmd while the controller is away; slurmctld reloads its state when it starts and
learns from slurmd what ended meanwhile. The portal must show the cluster unreachable during the outage (its
health check fails), mark no job failed or lost because Slurm did not answer (the sync keeps what it knew,
deliveries wait and retry), and follow every job to completion afterwards, charging each once.
Usage: python scripts/drills/drill_slurmctld.py
"""

from __future__ import annotations

import os

# The portal's health check every 5 s (the drill's default is 30 s), so that it falls inside the outage.
os.environ.setdefault("CLUSTER_SYNC_INTERVAL_SECONDS", "5")

import time
from collections import Counter

import harness  # first of the project's modules: sets up Django on the drill's database
import httpx
from burst import Burst
from ledger import ledger_check

from clusters.models import Cluster
from jobs.models import Job, JobState

JOBS = 20
# 40 to 60 s of work, different per job; one submission a second so that some arrive while slurmctld is down.
SCRIPT = '#!/bin/bash\necho "start $(date +%s)"\nsleep $((40 + SLURM_JOB_ID % 21))\necho "done $(date +%s)"\n'
SUBMISSIONS_PER_SECOND = 1.0
RUNNING_BEFORE_FAULT = 5
OUTAGE_SECONDS = 20
# The outage lasts until the portal has shown the cluster unreachable, but no longer than this.
OUTAGE_MAX_SECONDS = 45
SETTLE_SECONDS = 300


def states(drill: harness.Drill) -> Counter[str]:
    return Counter(Job.objects.filter(project=drill.world.project).values_list("state", flat=True))


def states_text(counts: Counter[str]) -> str:
    return ", ".join(f"{state} {count}" for state, count in sorted(counts.items())) or "none"


def cluster_view(api: httpx.Client) -> dict[str, object]:
    """The cluster as users see it: GET /api/v1/clusters/local/ (`ok` is the last health check)."""
    body: dict[str, object] = api.get("/api/v1/clusters/local/").json()
    return body


def outage(drill: harness.Drill, api: httpx.Client) -> tuple[float | None, list[str]]:
    """Keep slurmctld down while watching the portal: when it first showed the cluster unreachable (seconds into
    the outage), and the jobs that became failed or lost meanwhile."""
    started = time.monotonic()
    shown_at: float | None = None
    sync_failed = False
    wrongly_ended: list[str] = []
    bad_states = (JobState.FAILED, JobState.NODE_FAIL, JobState.REJECTED, JobState.CANCELLED, JobState.TIMEOUT)
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= OUTAGE_MAX_SECONDS or (elapsed >= OUTAGE_SECONDS and shown_at is not None):
            return shown_at, wrongly_ended
        view = cluster_view(api)
        if view["ok"] is False and shown_at is None:
            shown_at = elapsed
            error = Cluster.objects.get(name="local").last_ping_error
            drill.say(f"portal shows cluster local unreachable (ok=false, checked {view['checked_at']}): {error[:160]}")
        sync_error = Cluster.objects.get(name="local").jobs_sync_error
        if sync_error and not sync_failed:
            sync_failed = True
            drill.say(
                f"the portal's job sync failed {elapsed:.0f} s into the outage, job states kept: {sync_error[:160]}"
            )
        ended = Job.objects.filter(project=drill.world.project, state__in=bad_states)
        wrongly_ended = [f"{str(job.pk)[:8]} {job.state}: {job.last_error[:100]}" for job in ended]
        time.sleep(1)


def run(drill: harness.Drill) -> bool:
    burst = Burst.start(
        drill, count=JOBS, per_second=SUBMISSIONS_PER_SECOND, script=SCRIPT, time_limit_minutes=3, concurrency=4
    )
    harness.wait_for(lambda: states(drill)[JobState.RUNNING] >= RUNNING_BEFORE_FAULT, timeout_seconds=120)
    headers = {"Authorization": f"Bearer {drill.world.token}"}
    with httpx.Client(base_url=drill.portal.base_url, headers=headers, timeout=30) as api:
        drill.say(f"before the fault: {states_text(states(drill))}; {burst.accepted} accepted")
        harness.cluster_daemon_stop("slurmctld")
        drill.say("slurmctld stopped (scripts/cluster.sh stop slurmctld)")
        try:
            shown_at, wrongly_ended = outage(drill, api)
            drill.say(f"end of the outage: {states_text(states(drill))}; {burst.accepted} accepted")
        finally:
            harness.cluster_up()
        drill.say("slurmctld started again (scripts/cluster.sh up)")
        back = harness.wait_for(lambda: cluster_view(api)["ok"] is True, timeout_seconds=60)
        drill.say(f"portal shows cluster local {'reachable again' if back else 'STILL unreachable after 60 s'}")
    burst.wait()
    passed = ledger_check(drill, burst.submissions, settle_seconds=SETTLE_SECONDS)
    final = states(drill)
    drill.say(f"in the end: {states_text(final)}")
    if shown_at is None:
        drill.say(f"FAILED: the portal never showed the cluster unreachable in {OUTAGE_MAX_SECONDS} s")
    else:
        drill.say(f"the portal showed the cluster unreachable {shown_at:.0f} s into the outage")
    for line in wrongly_ended:
        drill.say(f"FAILED: ended during the outage: {line}")
    all_completed = final[JobState.COMPLETED] == burst.accepted == JOBS
    if not all_completed:
        drill.say(f"FAILED: expected all {JOBS} jobs completed")
    return passed and shown_at is not None and not wrongly_ended and back and all_completed


if __name__ == "__main__":
    harness.main("slurmctld", f"slurmctld stopped for ~{OUTAGE_SECONDS} s while jobs run, then started again", run)
