"""Drill: the portal's database restored from a backup in the middle of a burst of submissions.

A burst of 200 jobs through the REST API; `pg_dump` after 60 are accepted; after 120, the portal is stopped, the
backup restored with `pg_restore` and the portal started while the burst goes on (its clients retry what the
stopped portal did not answer, with the same Idempotency-Key). Jobs the backup holds as queued may have been
delivered after it: they are adopted, never submitted twice; jobs accepted after it are rebuilt from Slurm and
charged once. It ends with the ledger check and a reconciliation report that must find no difference.
Usage: python scripts/drills/drill_restore_burst.py
"""

from __future__ import annotations

import harness  # first: sets up Django on the drill's database
from backups import backup, rate_ensure, reconciliation_clean, recovery_summary, restore, wait_complete
from burst import Burst
from ledger import ledger_check

from jobs.models import Job

BACKUP_AFTER = 60  # accepted jobs
RESTORE_AFTER = 120


def run(drill: harness.Drill) -> bool:
    rate_ensure(drill)
    burst = Burst.start(drill)
    burst.wait_accepted(BACKUP_AFTER)
    dump = backup(drill)
    drill.say(f"{burst.accepted} accepted when the backup was taken")
    burst.wait_accepted(RESTORE_AFTER)
    accepted_before_restore = burst.accepted
    restore(drill, dump)
    in_portal = Job.objects.filter(project=drill.world.project).count()
    drill.say(
        f"{accepted_before_restore} had been accepted when the portal stopped; the restored database has {in_portal}"
    )
    burst.wait()
    accepted = [submission.job_id for submission in burst.submissions if submission.job_id]
    seconds = wait_complete(drill, accepted)
    drill.say(f"ledger complete {seconds:.1f} s after the burst ended")
    recovery_summary(drill)
    passed = ledger_check(drill, burst.submissions)
    reconciled = reconciliation_clean(drill)
    looked_up = Job.objects.filter(project=drill.world.project, submit_attempts__gt=1).count()
    drill.say(f"{looked_up} jobs were looked up by their tag before delivery")
    return passed and reconciled


if __name__ == "__main__":
    harness.main("restore-burst", "the database restored from a backup in the middle of a burst", run)
