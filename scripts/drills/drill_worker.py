"""Drill: the Celery worker killed (SIGKILL, its whole process group) while it delivers a burst, then restarted.

Task messages are acknowledged late, but a worker killed outright leaves the ones it held unacknowledged in
Redis until the broker's visibility timeout (an hour): the portal must not wait for that. A job whose delivery
died keeps its lease until JOB_SUBMIT_LEASE_SECONDS pass; then the periodic sweep requeues it, and the delivery
looks for the job's tag in Slurm first, so a submission that reached Slurm before the kill is not repeated.
Usage: python scripts/drills/drill_worker.py
"""

from __future__ import annotations

import time

import harness  # first: sets up Django on the drill's database
from burst import Burst
from ledger import ledger_check

from jobs.models import Job, JobState, JobTransition

ACCEPTED_BEFORE_FAULT = 40
DOWN_SECONDS = 10


def run(drill: harness.Drill) -> bool:
    burst = Burst.start(drill)
    burst.wait_accepted(ACCEPTED_BEFORE_FAULT)
    in_flight = harness.wait_for_delivery_in_flight(drill)
    drill.portal.kill("worker")
    queued = Job.objects.filter(project=drill.world.project, state=JobState.QUEUED).count()
    drill.say(
        f"worker killed (SIGKILL to its process group) after {burst.accepted} accepted; {in_flight} deliveries were "
        f"in flight, {queued} jobs queued; keeping it down {DOWN_SECONDS} s"
    )
    time.sleep(DOWN_SECONDS)
    drill.portal.restart("worker")
    drill.say(f"worker restarted and answering; {burst.accepted} accepted so far")
    burst.wait()
    passed = ledger_check(drill, burst.submissions)
    retried = Job.objects.filter(project=drill.world.project, submit_attempts__gt=1).count()
    found = JobTransition.objects.filter(job__project=drill.world.project, detail__startswith="found in Slurm").count()
    drill.say(f"{retried} jobs needed more than one delivery attempt; {found} were found in Slurm by their tag")
    return passed


if __name__ == "__main__":
    harness.main("worker", "the Celery worker killed (SIGKILL) mid-burst and restarted", run)
