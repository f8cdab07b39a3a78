"""Restores of the portal's database from a backup: noticing them, and rebuilding from Slurm the jobs they lost.

Slurm is the record of what ran. A backup holds the portal's jobs up to the moment it was taken; the jobs it
accepted afterwards ran in Slurm all the same, tagged with their portal id in the comment. After a restore:

- The portal notices it (`database_restore_check`, before every delivery run and from beat): `pg_dump`'s
  restore writes every row again in its own transaction, so the one row of `DatabaseIdentity` no longer carries
  the id of the transaction that wrote it. (A physical restore keeps the rows as they were: declare it with
  `manage.py restore_check --declare`.)
- Every job the restored copy holds as queued may have reached Slurm after the backup: it counts as tried, so
  its delivery looks for its tag in Slurm first and adopts what it finds instead of submitting it again.
- Each cluster's Slurm is searched (`cluster_recovery_search` in jobs/job_recovery.py: the live listing and
  the accounting database from the backup's time on, in the projects' accounts) for tagged jobs no portal row
  has. Each is rebuilt (`jobs_rebuild`) with its original id, project (by account), user (by the cluster's
  POSIX user mapping), name, times, state, exit code and nodes, its timeline starting with RECOVERED_DETAIL;
  it is reserved as a job found in Slurm is, and charged once from its accounting records through the quota
  ledger, which billing prices as it prices every charge. The job sync rebuilds a lost job it sees in the
  listing at any time too.
- What cannot be rebuilt is kept on the cluster's recovery row and listed by `manage.py restore_check`, with the
  invoices whose finalisation the backup may have missed (billing holds those until an operator has looked).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import ClusterRecovery, DatabaseIdentity, DatabaseRestore, Job, JobState
from portal.queue import task_enqueue_on_commit
from tenants.services import audit_record

logger = logging.getLogger(__name__)

# PostgreSQL's xmin is the low 32 bits of the 64-bit transaction id that txid_current() gives.
_XID_MODULUS = 2**32


# Noticing a restore -------------------------------------------------------------------------------------


def _identity_read(*, lock: bool) -> tuple[int, int, int, datetime] | None:
    table = DatabaseIdentity._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, written_xid, xmin::text::bigint, checked_at FROM {table} ORDER BY id LIMIT 1"  # noqa: S608
            + (" FOR UPDATE" if lock else "")
        )
        row = cursor.fetchone()
    return (int(row[0]), int(row[1]), int(row[2]), row[3]) if row else None


def _identity_write(*, identity_id: int | None, now: datetime) -> None:
    """Write the row anew in this transaction: its xmin and `written_xid` are then this transaction's id."""
    table = DatabaseIdentity._meta.db_table
    with connection.cursor() as cursor:
        if identity_id is None:
            cursor.execute(
                f"INSERT INTO {table} (written_xid, checked_at) VALUES (txid_current(), %s)",  # noqa: S608
                [now],
            )
        else:
            cursor.execute(
                f"UPDATE {table} SET written_xid = txid_current(), checked_at = %s WHERE id = %s",  # noqa: S608
                [now, identity_id],
            )


def _is_restored_copy(identity: tuple[int, int, int, datetime]) -> bool:
    _, written_xid, xmin, _ = identity
    return written_xid % _XID_MODULUS != xmin


def database_restore_check(*, heartbeat: bool = False, now: datetime | None = None) -> DatabaseRestore | None:
    """Notice a restore of the database: the restore, when this call noticed one, else None.

    One small read when nothing happened. `heartbeat` (beat's check) also records that the database was its
    own at `now`: in a later backup of it, that moment tells from when on Slurm must be searched.
    """
    now = now or timezone.now()
    if connection.in_atomic_block:
        # Inside another transaction the row would be written by a savepoint, whose transaction id is not the one
        # txid_current() names: the next check would take the database for a restored copy. The check is made in
        # a transaction of its own (beat's, the workers'); here it does nothing.
        return None
    identity = _identity_read(lock=False)
    if identity is not None and not _is_restored_copy(identity):
        if heartbeat:
            with transaction.atomic():
                _identity_write(identity_id=identity[0], now=now)
        return None
    with transaction.atomic():
        identity = _identity_read(lock=True)
        if identity is None:  # a database made before the row existed, or emptied by tests: it starts now
            _identity_write(identity_id=None, now=now)
            return None
        if not _is_restored_copy(identity):
            return None  # another process noticed it first
        restore = _restore_open(backup_after=identity[3], now=now, declared_by="")
        _identity_write(identity_id=identity[0], now=now)
    logger.warning(
        "the portal's database is a restored copy (its last check before the backup: %s); searching Slurm for "
        "the jobs it lost",
        identity[3],
    )
    return restore


def database_restore_declare(
    *, backup_after: datetime, declared_by: str, now: datetime | None = None
) -> DatabaseRestore:
    """An operator's word that the database was restored from a backup taken after `backup_after` (for the
    restores the portal cannot notice itself, such as a physical or point-in-time one)."""
    now = now or timezone.now()
    with transaction.atomic():
        return _restore_open(backup_after=backup_after, now=now, declared_by=declared_by)


def _restore_open(*, backup_after: datetime, now: datetime, declared_by: str) -> DatabaseRestore:
    """In the caller's transaction: record the restore, mark the queued jobs as tried, open a recovery per
    cluster and have the workers search each one after commit."""
    restore = DatabaseRestore.objects.create(detected_at=now, backup_after=backup_after, declared_by=declared_by)
    # The backup may have been taken between a job's acceptance and its delivery: its delivery now looks for
    # its tag first, as the retry of an attempt whose reply was lost does.
    queued = Job.objects.filter(state=JobState.QUEUED, submit_attempts=0).update(submit_attempts=1)
    clusters = list(Cluster.objects.filter(is_active=True))
    ClusterRecovery.objects.bulk_create([ClusterRecovery(restore=restore, cluster=cluster) for cluster in clusters])
    audit_record(
        actor=None,
        action="database.restore_noticed" if not declared_by else "database.restore_declared",
        target=restore,
        tenant=None,
        before=None,
        after={
            "backup_after": backup_after.isoformat(),
            "declared_by": declared_by,
            "queued_jobs_to_look_up": queued,
            "clusters": [cluster.name for cluster in clusters],
        },
    )
    for cluster in clusters:
        task_enqueue_on_commit("jobs.tasks.cluster_recover", cluster.pk, fallback="beat's next restore check does it")
    return restore


def job_lost_before_delivery(*, job_id: uuid.UUID, now: datetime | None = None) -> bool:
    """A delivery message named a job the database does not have. Soon after a restore, that is a job accepted
    after the backup that never reached Slurm (Slurm's jobs are rebuilt): recorded on the restore, for
    `manage.py restore_check` to list. Whether it was recorded."""
    now = now or timezone.now()
    window = timedelta(hours=settings.JOB_SUBMIT_GIVE_UP_HOURS)
    with transaction.atomic():
        restore = (
            DatabaseRestore.objects.select_for_update(of=("self",))
            .filter(detected_at__gte=now - window)
            .order_by("-detected_at")
            .first()
        )
        if restore is None:
            return False
        if str(job_id) not in restore.undelivered_jobs:
            restore.undelivered_jobs = [*restore.undelivered_jobs, str(job_id)]
            restore.save(update_fields=["undelivered_jobs"])
    logger.warning("job %s: accepted, but neither the restored database nor Slurm has it: it never ran", job_id)
    return True
