"""Drill: the portal's database restored from a backup after jobs ran and were charged.

As the README's "Backups" section says a site does it: `pg_dump` of the database; then jobs accepted, run,
finished and charged (and three that the backup holds as queued, delivered only after it); the portal stopped,
the backup restored with `pg_restore`, the portal started. The portal notices the restore, rebuilds every job it
lost from Slurm (by the tag in the comment) and charges each once; the queued ones are adopted, not submitted
again. It ends with the ledger check and a reconciliation report that must find no difference, and prints the
time from the restore to a complete ledger.
Usage: python scripts/drills/drill_restore.py   (RESTORE_LOST_JOBS=1000 for the measurement of 1,000 lost jobs)
"""

from __future__ import annotations

import os
import signal

import harness  # first: sets up Django on the drill's database
from backups import backup, rate_ensure, reconciliation_clean, recovery_summary, restore, wait_complete
from burst import Burst
from ledger import ledger_check

from jobs.models import Job, JobState

IN_BACKUP = 5  # ran and were charged before the backup
QUEUED_IN_BACKUP = 3  # accepted before the backup, delivered after it
LOST = int(os.environ.get("RESTORE_LOST_JOBS", "20"))  # accepted after the backup: what the restore loses
# Of those, still running when the backup is restored (none when measuring: the wait for a complete ledger would
# then be the wait for them to end).
STILL_RUNNING = 2 if LOST <= 50 else 0
SCRIPT = "#!/bin/bash\necho restore drill $SLURM_JOB_ID\nsleep 2\n"
LONG_SCRIPT = "#!/bin/bash\necho restore drill $SLURM_JOB_ID\nsleep 45\n"


def run(drill: harness.Drill) -> bool:
    rate_ensure(drill)
    earlier = Burst.start(drill, count=IN_BACKUP, per_second=10, script=SCRIPT)
    earlier.wait()
    harness.wait_for(lambda: _final(drill) == IN_BACKUP, timeout_seconds=120)

    drill.portal.kill("worker", signal.SIGTERM)
    queued = Burst.start(drill, count=QUEUED_IN_BACKUP, per_second=10, script=SCRIPT)
    queued.wait()
    drill.say(
        f"worker stopped; {Job.objects.filter(project=drill.world.project, state=JobState.QUEUED).count()} queued"
    )
    dump = backup(drill)
    drill.portal.restart("worker")
    drill.say("worker started: the jobs the backup holds as queued are delivered now")

    per_second = 4.0 if LOST <= 50 else 40.0
    lost = Burst.start(drill, count=LOST - STILL_RUNNING, per_second=per_second, script=SCRIPT)
    lost.wait()
    submissions = [*earlier.submissions, *queued.submissions, *lost.submissions]
    if STILL_RUNNING:
        running = Burst.start(drill, count=STILL_RUNNING, per_second=10, script=LONG_SCRIPT)
        running.wait()
        submissions += running.submissions
    accepted = [submission.job_id for submission in submissions if submission.job_id]
    harness.wait_for(
        lambda: (
            Job.objects.filter(project=drill.world.project, state=JobState.RUNNING).count() >= STILL_RUNNING
            and _final(drill) >= len(accepted) - STILL_RUNNING
        ),
        timeout_seconds=900,
    )
    drill.say(f"{_final(drill)} jobs final, {STILL_RUNNING} running; waiting for their charges before the restore")
    harness.wait_for(lambda: _charged(drill) >= len(accepted) - STILL_RUNNING, timeout_seconds=300, poll_seconds=1)
    drill.say(f"{_charged(drill)} jobs charged; restoring the backup")

    restore(drill, dump)
    in_portal = Job.objects.filter(project=drill.world.project).count()
    drill.say(f"right after the restore the portal has {in_portal} of the {len(accepted)} accepted jobs")
    seconds = wait_complete(drill, accepted)
    drill.say(f"ledger complete {seconds:.1f} s after the portal started on the restored database ({LOST} lost jobs)")
    recovery_summary(drill)
    passed = ledger_check(drill, submissions)
    reconciled = reconciliation_clean(drill)
    resubmitted = Job.objects.filter(project=drill.world.project, submit_attempts__gt=1).count()
    drill.say(f"{resubmitted} jobs looked up by their tag before delivery (the queued ones the backup held)")
    return passed and reconciled


def _final(drill: harness.Drill) -> int:
    return Job.objects.filter(project=drill.world.project, state__in=[JobState.COMPLETED, JobState.FAILED]).count()


def _charged(drill: harness.Drill) -> int:
    return Job.objects.filter(project=drill.world.project, quota_ledger_entries__kind="charge").count()


if __name__ == "__main__":
    harness.main("restore", "the database restored from a backup after jobs ran and were charged", run)
