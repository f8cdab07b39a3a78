"""A restore of the database from a backup, on the live cluster: the jobs it lost are rebuilt from Slurm with
their original ids and what Slurm knows of them, charged once; a job the backup holds as queued and that Slurm
already ran is adopted, never submitted again; a lost job still running is rebuilt by the job sync."""

from __future__ import annotations

import io
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.slurm import SlurmClient
from clusters.slurm.types import AccountingRecord, SlurmJob
from jobs import tasks
from jobs.database_restores import database_restore_check
from jobs.job_recovery import SETTLE_AFTER, cluster_recovery_search, jobs_rebuild
from jobs.job_sync import Delivery, job_deliver, jobs_deliver_queued
from jobs.models import (
    RECOVERED_DETAIL,
    ClusterRecovery,
    DatabaseIdentity,
    DatabaseRestore,
    Job,
    JobArrayTask,
    JobState,
    JobTransition,
)
from jobs.quota_usage import quota_usage_collect
from quotas.models import Allocation, LedgerEntry
from tests.conftest import SentTask, wait_until
from tests.jobs.conftest import LiveProject

pytestmark = pytest.mark.django_db(transaction=True)

# What a rebuilt job must have as the lost one had it. Not in Slurm: its script, and when the portal accepted it
# and heard Slurm accept it (a rebuilt job has Slurm's submit time for both).
REBUILT_FIELDS = [
    "project_id",
    "cluster_id",
    "user_id",
    "cluster_username",
    "is_external",
    "name",
    "partition",
    "gpu_type",
    "gpus",
    "time_limit_minutes",
    "working_directory",
    "stdout_path",
    "stderr_path",
    "state",
    "slurm_state",
    "slurm_job_id",
    "started_at",
    "ended_at",
    "nodes",
    "exit_code",
]


def _fields(job: Job) -> dict[str, Any]:
    return {name: getattr(job, name) for name in REBUILT_FIELDS}


def _ledger(job_id: uuid.UUID) -> list[tuple[str, int, str]]:
    entries = LedgerEntry.objects.filter(job_id=job_id).order_by("id")
    return [(entry.kind, entry.gpu_seconds, entry.note) for entry in entries]


def _allocation(live_project: LiveProject) -> Allocation:
    return Allocation.objects.get(project=live_project.project, cluster=live_project.cluster)


def _balances(live_project: LiveProject) -> tuple[int, int]:
    allocation = _allocation(live_project)
    return allocation.reserved_gpu_seconds, allocation.charged_gpu_seconds


def _cluster(live_project: LiveProject) -> Cluster:
    return Cluster.objects.get(pk=live_project.cluster.pk)


def _restore_backup_taken_at(moment: datetime, *, balances: tuple[int, int], live_project: LiveProject) -> None:
    """Make the database look restored from a backup taken at `moment`: what was written since is gone, and the
    identity row is one a restore wrote (its transaction is not the one named in it)."""
    lost = Job.objects.filter(project=live_project.project, created_at__gte=moment)
    LedgerEntry.objects.filter(job__in=lost).delete()
    lost.delete()
    reserved, charged = balances
    Allocation.objects.filter(pk=_allocation(live_project).pk).update(
        reserved_gpu_seconds=reserved, charged_gpu_seconds=charged
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {DatabaseIdentity._meta.db_table} SET written_xid = 0, checked_at = %s",
            [moment],
        )


def _charge_until_done(live_project: LiveProject, count: int) -> None:
    """Collect usage as the periodic sync does until `count` jobs are charged (slurmdbd lags a little)."""
    charged = 0
    deadline = time.monotonic() + 60
    while charged < count:
        charged += quota_usage_collect(
            cluster=_cluster(live_project), client=slurm_client_for(live_project.cluster)
        ).charged
        if time.monotonic() > deadline:
            pytest.fail(f"only {charged} of {count} jobs were charged within 60 s")
        time.sleep(0.5)


def _finished_in_accounting(client: SlurmClient, job: Job) -> bool:
    records = client.accounting_job_records(job_id=job.slurm_job_id or 0)
    return any(record.comment == job.slurm_comment and record.state.is_finished for record in records)


def test_jobs_lost_by_a_restore_are_rebuilt_from_slurm_as_they_were_and_charged_once(
    live_project: LiveProject, slurm_client: SlurmClient, sent_tasks: list[SentTask]
) -> None:
    backup_taken_at = timezone.now()
    balances_in_backup = _balances(live_project)
    replies = [
        live_project.submit(name="lost-ok", gpus=2, script="#!/bin/bash\nsleep 2\n"),
        live_project.submit(name="lost-failed", gpus=1, script="#!/bin/bash\nsleep 1\nexit 3\n"),
    ]
    for reply in replies:
        job_deliver(job_id=uuid.UUID(str(reply["id"])))
    originals = [live_project.wait_for(reply["id"], lambda job: job.is_final) for reply in replies]
    wait_until(lambda: all(_finished_in_accounting(slurm_client, job) for job in originals), what="accounting")
    _charge_until_done(live_project, 2)
    before = {job.pk: _fields(Job.objects.get(pk=job.pk)) for job in originals}
    charges = {job.pk: [row for row in _ledger(job.pk) if row[0] == "charge"] for job in originals}
    assert [originals[0].state, originals[1].state, originals[1].exit_code] == [JobState.COMPLETED, JobState.FAILED, 3]
    charged_in_all = sum(rows[0][1] for rows in charges.values())
    assert _balances(live_project) == (balances_in_backup[0], balances_in_backup[1] + charged_in_all)

    _restore_backup_taken_at(backup_taken_at, balances=balances_in_backup, live_project=live_project)
    assert not Job.objects.filter(pk__in=before).exists()
    sent_tasks.clear()

    restore = database_restore_check()
    assert restore is not None
    assert restore.backup_after == backup_taken_at
    assert database_restore_check() is None  # noticed once
    assert ("jobs.tasks.cluster_recover", (live_project.cluster.pk,)) in sent_tasks
    recovery = ClusterRecovery.objects.get(restore=restore, cluster=live_project.cluster)

    result = cluster_recovery_search(recovery=recovery, client=slurm_client_for(live_project.cluster))

    assert (result.recovered, result.charged, result.finished, result.error) == (2, 2, False, "")
    for job_id, fields in before.items():
        rebuilt = Job.objects.get(pk=job_id)
        assert _fields(rebuilt) == fields
        assert rebuilt.submitted_at == rebuilt.created_at == rebuilt.slurm_submit_time
        timeline = list(JobTransition.objects.filter(job=rebuilt).values_list("to_state", "detail"))
        assert timeline[0] == (JobState.PENDING, f"{RECOVERED_DETAIL}: Slurm job {rebuilt.slurm_job_id}")
        assert [state for state, _ in timeline[1:]] == [JobState.RUNNING, rebuilt.state]
        (charge,) = charges[job_id]
        reserved = rebuilt.gpus * rebuilt.time_limit_minutes * 60
        assert _ledger(job_id) == [
            ("reserve", reserved, "recovered after a restore"),
            ("release", reserved, "replaced by the charge"),
            charge,
        ]
    assert _balances(live_project) == (balances_in_backup[0], balances_in_backup[1] + charged_in_all)
    recovery.refresh_from_db()
    assert (recovery.recovered_jobs, recovery.searches, recovery.not_rebuilt) == (2, 1, [])

    # Searching again, and the usage collection, find nothing more to do; the last search ends the recovery.
    later = restore.detected_at + SETTLE_AFTER
    again = cluster_recovery_search(recovery=recovery, client=slurm_client_for(live_project.cluster), now=later)
    assert (again.recovered, again.charged, again.finished) == (0, 0, True)
    assert (
        quota_usage_collect(cluster=_cluster(live_project), client=slurm_client_for(live_project.cluster)).charged == 0
    )
    assert _balances(live_project) == (balances_in_backup[0], balances_in_backup[1] + charged_in_all)
    assert sum(len(_ledger(job_id)) for job_id in before) == 6
    assert not ClusterRecovery.objects.filter(finished_at__isnull=True).exists()


TASK_FIELDS = ["index", "state", "slurm_state", "slurm_job_id", "nodes", "exit_code", "started_at", "ended_at"]


def test_an_array_lost_by_a_restore_is_rebuilt_as_one_job_with_its_tasks_each_charged_once(
    live_project: LiveProject, slurm_client: SlurmClient, sent_tasks: list[SentTask]
) -> None:
    # `sent_tasks` keeps the recovery task the restore check sends from a worker an earlier test left running: the
    # search below is the one under test.
    backup_taken_at = timezone.now()
    balances_in_backup = _balances(live_project)
    reply = live_project.submit(
        name="lost-array", array="0-2%2", script="#!/bin/bash\nsleep 1\nexit $((SLURM_ARRAY_TASK_ID == 2))\n"
    )
    job_deliver(job_id=uuid.UUID(str(reply["id"])))
    original = live_project.wait_for(reply["id"], lambda job: job.is_final)
    tasks_before = list(JobArrayTask.objects.filter(job=original).order_by("index").values(*TASK_FIELDS))

    def charged() -> dict[int | None, int]:
        quota_usage_collect(cluster=_cluster(live_project), client=slurm_client)
        return dict(
            LedgerEntry.objects.filter(job_id=original.pk, kind="charge").values_list("array_task", "gpu_seconds")
        )

    wait_until(lambda: len(charged()) == 3, what="every task charged")
    charges = charged()
    assert (original.state, original.array_progress["completed"], original.array_progress["failed"]) == (
        JobState.FAILED,
        2,
        1,
    )

    _restore_backup_taken_at(backup_taken_at, balances=balances_in_backup, live_project=live_project)
    restore = database_restore_check()
    assert restore is not None
    recovery = ClusterRecovery.objects.get(restore=restore, cluster=live_project.cluster)
    result = cluster_recovery_search(recovery=recovery, client=slurm_client_for(live_project.cluster))

    assert (result.recovered, result.charged, result.error) == (1, 3, "")
    rebuilt = Job.objects.get(pk=original.pk)
    assert {name: getattr(rebuilt, name) for name in ("array", "array_task_count", "array_max_running")} == {
        "array": "0-2%2",
        "array_task_count": 3,
        "array_max_running": 2,
    }
    assert list(JobArrayTask.objects.filter(job=rebuilt).order_by("index").values(*TASK_FIELDS)) == tasks_before
    assert rebuilt.array_progress == original.array_progress
    assert _fields(rebuilt) == _fields(original) | {"slurm_state": rebuilt.slurm_state}
    assert charged() == charges  # each task charged once, as before the restore
    reserved = 3 * rebuilt.gpus * rebuilt.time_limit_minutes * 60
    assert _balances(live_project) == (balances_in_backup[0], balances_in_backup[1] + sum(charges.values()))
    assert sum(entry[1] for entry in _ledger(rebuilt.pk) if entry[0] == "reserve") == reserved
    # Searching again rebuilds and charges nothing more.
    again = cluster_recovery_search(recovery=recovery, client=slurm_client_for(live_project.cluster))
    assert (again.recovered, again.charged) == (0, 0)
    assert JobArrayTask.objects.filter(job=rebuilt).count() == 3


def test_a_job_queued_in_the_backup_that_slurm_already_ran_is_adopted_not_submitted_again(
    live_project: LiveProject, slurm_client: SlurmClient, sent_tasks: list[SentTask]
) -> None:
    reply = live_project.submit(name="queued-in-backup", script="#!/bin/bash\nsleep 1\n")
    job_id = uuid.UUID(str(reply["id"]))
    in_backup = Job.objects.get(pk=job_id)
    assert (in_backup.state, in_backup.submit_attempts) == (JobState.QUEUED, 0)
    assert database_restore_check(heartbeat=True) is None  # the database's own, checked now
    checked_at = DatabaseIdentity.objects.get().checked_at

    assert job_deliver(job_id=job_id).outcome == "submitted"
    delivered = live_project.wait_for(job_id, lambda job: job.is_final)
    wait_until(lambda: _finished_in_accounting(slurm_client, delivered), what="the job's accounting record")

    # The restored copy: the job as the backup held it, accepted and not yet delivered.
    JobTransition.objects.filter(job_id=job_id).exclude(to_state=JobState.QUEUED).delete()
    Job.objects.filter(pk=job_id).update(
        state=JobState.QUEUED,
        slurm_job_id=None,
        slurm_state="",
        submitted_at=None,
        started_at=None,
        ended_at=None,
        nodes="",
        exit_code=None,
        submit_attempts=0,
        submit_lease_until=None,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {DatabaseIdentity._meta.db_table} SET written_xid = 0, checked_at = %s",
            [checked_at],
        )

    delivery = job_deliver(job_id=job_id)

    assert delivery.outcome == "found in Slurm"
    assert DatabaseRestore.objects.count() == 1
    adopted = live_project.wait_for(job_id, lambda job: job.is_final)
    assert (adopted.slurm_job_id, adopted.state) == (delivered.slurm_job_id, JobState.COMPLETED)
    # One Slurm job carries the tag: slurmctld lists finished jobs for MinJobAge (300 s), so a second submission
    # would be listed beside the first. (Accounting is asked by id: 22.05's slurmdbd answered a query by time
    # window, or by a new account, with nothing about one time in two here, while the job's own record was there.)
    listing = slurm_client.list_jobs()
    listed = [job.job_id for job in (listing.jobs if listing else ()) if job.comment == adopted.slurm_comment]
    assert listed == [delivered.slurm_job_id]
    accounted = slurm_client.accounting_job_records(job_id=delivered.slurm_job_id or 0)
    assert [record.comment for record in accounted] == [adopted.slurm_comment]


def test_the_job_sync_rebuilds_a_lost_job_still_running_and_a_repeat_does_nothing(
    live_project: LiveProject, slurm_client: SlurmClient, sent_tasks: list[SentTask]
) -> None:
    reply = live_project.submit(name="lost-running", gpus=1, script="#!/bin/bash\nsleep 60\n")
    job_id = uuid.UUID(str(reply["id"]))
    job_deliver(job_id=job_id)
    running = live_project.wait_for(job_id, lambda job: job.state == JobState.RUNNING)
    LedgerEntry.objects.filter(job_id=job_id).delete()
    Job.objects.filter(pk=job_id).delete()
    Cluster.objects.filter(pk=live_project.cluster.pk).update(jobs_listed_at=None)  # the backup's older listing

    tasks.cluster_jobs_sync(live_project.cluster.pk)

    rebuilt = Job.objects.get(pk=job_id)
    assert _fields(rebuilt) == _fields(running)
    assert (rebuilt.state, rebuilt.slurm_job_id, rebuilt.nodes, rebuilt.started_at) == (
        JobState.RUNNING,
        running.slurm_job_id,
        running.nodes,
        running.started_at,
    )
    assert (rebuilt.project_id, rebuilt.user_id, rebuilt.cluster_username, rebuilt.name) == (
        running.project_id,
        running.user_id,
        "alice",
        "lost-running",
    )
    assert _ledger(job_id) == [("reserve", 120, "recovered after a restore")]
    first = JobTransition.objects.filter(job=rebuilt).values_list("detail", flat=True).first()
    assert first == f"{RECOVERED_DETAIL}: Slurm job {running.slurm_job_id}"

    again = jobs_rebuild(cluster=_cluster(live_project), found=_listed(slurm_client, rebuilt))
    assert again.rebuilt == []
    assert _ledger(job_id) == [("reserve", 120, "recovered after a restore")]
    slurm_client.cancel_job(user=slurm_client.admin_user, job_id=running.slurm_job_id or 0)


def _listed(client: SlurmClient, job: Job) -> list[SlurmJob | AccountingRecord]:
    listing = client.list_jobs()
    return [each for each in (listing.jobs if listing else ()) if each.comment == job.slurm_comment]


def test_a_delivery_message_for_a_job_the_restore_lost_before_slurm_had_it_is_recorded_and_listed(
    sent_tasks: list[SentTask],
) -> None:
    stale_message_for = uuid.uuid4()
    assert jobs_deliver_queued(job_id=stale_message_for).deliveries == {stale_message_for: Delivery("nothing to do")}
    assert not DatabaseRestore.objects.exists()  # no restore: a message for a deleted job is only that

    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {DatabaseIdentity._meta.db_table} SET written_xid = 0")
    jobs_deliver_queued(job_id=stale_message_for)
    jobs_deliver_queued(job_id=stale_message_for)  # redelivered: recorded once

    restore = DatabaseRestore.objects.get()
    assert restore.undelivered_jobs == [str(stale_message_for)]
    out = io.StringIO()
    call_command("restore_check", stdout=out)
    assert f"NOT REBUILT: job {stale_message_for} was accepted after the backup" in out.getvalue()


def test_a_check_inside_another_transaction_neither_writes_nor_notices_a_restore() -> None:
    """Inside another transaction the identity row would be written by a savepoint, whose transaction id is not the
    one the row names, and the next check would take the database for a restored copy."""
    with transaction.atomic():
        assert database_restore_check() is None
        assert database_restore_check() is None
    assert not DatabaseIdentity.objects.exists()
    assert not DatabaseRestore.objects.exists()
    # In a transaction of its own (beat's, a worker's) the check records the database and a repeat notices nothing.
    assert database_restore_check() is None
    assert database_restore_check() is None
    assert DatabaseIdentity.objects.count() == 1
    assert not DatabaseRestore.objects.exists()
