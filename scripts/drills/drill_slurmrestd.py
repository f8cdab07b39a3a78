"""Drill: slurmrestd stopped for 60 s during a burst of 200 submissions.

The web tier never calls slurmrestd, so submissions go on being accepted; the workers' deliveries fail with a
retryable error and are tried again with backoff (or by the sweep) once slurmrestd is back.
Usage: python scripts/drills/drill_slurmrestd.py
"""

from __future__ import annotations

import time

import harness  # first: sets up Django on the drill's database
from burst import Burst
from ledger import ledger_check

OUTAGE_SECONDS = 60
ACCEPTED_BEFORE_FAULT = 20


def run(drill: harness.Drill) -> bool:
    burst = Burst.start(drill)
    burst.wait_accepted(ACCEPTED_BEFORE_FAULT)
    harness.cluster_daemon_stop("slurmrestd")
    drill.say(f"slurmrestd stopped after {burst.accepted} accepted submissions; keeping it down {OUTAGE_SECONDS} s")
    time.sleep(OUTAGE_SECONDS)
    drill.say(f"{burst.accepted} accepted so far; starting slurmrestd again (scripts/cluster.sh up)")
    harness.cluster_up()
    drill.say("slurmrestd is back")
    burst.wait()
    return ledger_check(drill, burst.submissions)


if __name__ == "__main__":
    harness.main("slurmrestd", f"slurmrestd stopped for {OUTAGE_SECONDS} s during a burst of 200 submissions", run)
