"""Worker-side job services: deliver a submission to Slurm exactly once, cancel in Slurm, follow Slurm's state.

Only Celery tasks call these: they build Slurm clients, which read the cluster's key.

Exactly once: a job goes to Slurm tagged with its portal id (the comment). Before any attempt after the
first, the worker looks for that tag in slurmctld and in accounting, so a lost reply, a killed worker or a
redelivered message finds the job instead of submitting it again. A lease on the job row keeps two
workers from submitting at the same time, and the periodic sync adopts any tagged job whose submission
was never recorded, and cancels a second Slurm job carrying the same tag should one ever appear.

Workers deliver in batches: a run claims a cluster's due queued jobs in one transaction (SKIP LOCKED, so two
workers take disjoint jobs, then the lease), submits them over the cluster's one keep-alive client, and
records every outcome in a second transaction. Each job keeps its own outcome: one refused or retried job
changes nothing for the others of its batch.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from fast_update.query import FastUpdateQuerySet
from structlog.contextvars import bound_contextvars

from clusters import accounts
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount
from clusters.selectors import node_switch_map, node_switches_of, one_switch_constraint
from clusters.services import cluster_unreachable_record
from clusters.slurm import SlurmClient, SlurmError, SlurmNotFound, SlurmRetryableError, SlurmTerminalError, SlurmTimeout
from clusters.slurm.types import AccountingRecord, JobSubmission, SlurmJob
from clusters.slurm.types import JobState as SlurmState
from jobs.array_sync import array_records_of, arrays_apply_slurm_state
from jobs.arrays import array_tasks_end_before_slurm
from jobs.database_restores import database_restore_check, job_lost_before_delivery
from jobs.job_services import cancelled_before_slurm, job_log_fields, job_transition, jobs_push, jobs_push_loaded
from jobs.models import Job, JobState, JobTransition, job_id_from_tag
from jobs.paths import JobDirectoryError, job_directory_prepare
from jobs.pipelines import NEVER_SATISFIED_REASON, dependencies_resolve, dependents_wake, recheck_at, waiting_words
from jobs.sync_schedule import delivery_wake_hold, delivery_wake_taken
from portal import metrics
from portal.db import RelatedRows, insert_prepared, prepared_cursor, update_prepared
from portal.queue import task_enqueue_on_commit
from tenants.models import Project

logger = logging.getLogger(__name__)

# Slurm's error for an account (or a user's association with it) that slurmctld does not know yet.
INVALID_ACCOUNT_ERROR = 2045

SLURM_TO_PORTAL_STATE = {
    SlurmState.PENDING: JobState.PENDING,
    SlurmState.RUNNING: JobState.RUNNING,
    SlurmState.SUSPENDED: JobState.RUNNING,
    SlurmState.COMPLETING: JobState.RUNNING,
    SlurmState.COMPLETED: JobState.COMPLETED,
    SlurmState.CANCELLED: JobState.CANCELLED,
    SlurmState.FAILED: JobState.FAILED,
    SlurmState.OUT_OF_MEMORY: JobState.FAILED,
    SlurmState.TIMEOUT: JobState.TIMEOUT,
    SlurmState.DEADLINE: JobState.TIMEOUT,
    SlurmState.NODE_FAIL: JobState.NODE_FAIL,
    SlurmState.BOOT_FAIL: JobState.NODE_FAIL,
    SlurmState.PREEMPTED: JobState.CANCELLED,
}


# Delivery ----------------------------------------------------------------------------------------------

# A retry's message is due at the time its job was given (both come from the scheduling worker's clock, so the
# clocks of other hosts do not matter); Celery's timer may start it a moment early, so a job counts as due this
# much early. Not more: a message that runs before its job is due does nothing, which keeps one message per job.
DUE_TOLERANCE = timedelta(milliseconds=250)

# The outcome of a refusal for an account slurmctld did not know, before the account sync that follows it.
_ACCOUNT_UNKNOWN = "account unknown"

# What the recording of a batch's outcomes writes on a job row.
_DELIVERY_FIELDS = [
    "state",
    "slurm_job_id",
    "submitted_at",
    "submit_lease_until",
    "last_error",
    "ended_at",
    "next_attempt_at",
    "updated_at",
    "array_progress",  # an array that never reached Slurm: its tasks end with it
]


@dataclass(frozen=True)
class Delivery:
    """What became of one delivery attempt; `retry_in` seconds when it should be tried again."""

    outcome: str
    retry_in: float | None = None


@dataclass
class DeliveryRun:
    """What one worker's run did: the delivery of each job it handled, by id, and how many batches it claimed."""

    deliveries: dict[uuid.UUID, Delivery] = field(default_factory=dict)
    batches: int = 0
    more_due: bool = False  # stopped after JOB_DELIVERY_RUN_SECONDS: due jobs may be left
    holding_wake: bool = False  # the run holds the cluster's delivery wake (jobs accepted meanwhile send no message)


@dataclass(frozen=True)
class _Outcome:
    """What one job's attempt in a batch came to, before it is recorded: `delivery` names it (as Delivery's
    outcome); `message` is the rejection's or the retry's words."""

    delivery: str
    slurm_job_id: int | None = None
    detail: str = ""
    message: str = ""
    retry_in: float | None = None


@dataclass
class _Batch:
    deliveries: dict[uuid.UUID, Delivery]
    unreachable: bool  # the cluster did not answer: claiming more of its jobs now would only wait for it too


def job_deliver(*, job_id: uuid.UUID) -> Delivery:
    """Submit one queued job to Slurm now, unless an earlier attempt already did; safe to call any number of times.

    Its next attempt need not be due: this delivers the one job by hand (tests, benchmarks, the shell). Workers
    call `jobs_deliver_queued`, which delivers the same way in batches.
    """
    database_restore_check()  # a restored database's queued jobs may be in Slurm already: looked for first
    with transaction.atomic():
        job, refusal = _lock_own(job_id=job_id, now=timezone.now(), due_only=False)
        if job is None:
            return Delivery(refusal)
        claimed, settled = _claim([job], now=timezone.now())
    return _batch_deliver(cluster=job.cluster, claimed=claimed, settled=settled).deliveries[job.pk]


def jobs_deliver_queued(*, job_id: uuid.UUID) -> DeliveryRun:
    """Deliver this job and, in the same run, the other due queued jobs of its cluster, in batches.

    Batches are claimed with SKIP LOCKED and leased, so workers draining the same cluster at once take disjoint
    jobs. A job that is no longer queued, that another worker holds, or whose next attempt is not due yet is
    left alone, and the run delivers the cluster's other due jobs: a message stands for every job accepted
    while it waited or while a run drained the cluster (`jobs.sync_schedule.delivery_wake_needed`).

    The run holds the cluster's delivery wake while it drains, and claims again after each batch, so under a
    stream of submissions one run delivers them all instead of one message, and one run, per few jobs. With
    JOB_DELIVERY_LINGER_MS set, after a batch smaller than JOB_DELIVERY_BATCH_SIZE its next claim comes that long
    after the one before (at once if the batch took longer), so single submissions go several a batch. It ends
    when a claim finds no due job after the wake is given back (a job accepted just before that sent no message,
    so the run looks once more), when the cluster does not answer, or after JOB_DELIVERY_RUN_SECONDS with due jobs
    left (`more_due`: the task sends another message). A job it leaves queued has a retry message of its own, or
    is the periodic sweep's.
    """
    run = DeliveryRun()
    database_restore_check()  # a restored database's queued jobs may be in Slurm already: looked for first
    found = _GLANCE.fetch(_GLANCE_ONE, [job_id])
    glance = found[0] if found else None
    if glance is None:
        job_lost_before_delivery(job_id=job_id)  # a job the restored database lost before Slurm had it, if any
        run.deliveries[job_id] = Delivery("nothing to do")
        return run
    run.holding_wake = delivery_wake_hold(glance.cluster_id, taking_message=True)
    try:
        return _drain(run, glance=glance, job_id=job_id)
    finally:
        if run.holding_wake:
            delivery_wake_taken(glance.cluster_id)


def _drain(run: DeliveryRun, *, glance: Job, job_id: uuid.UUID) -> DeliveryRun:
    size = settings.JOB_DELIVERY_BATCH_SIZE
    linger = settings.JOB_DELIVERY_LINGER_MS / 1000
    stop_claiming_at = time.monotonic() + settings.JOB_DELIVERY_RUN_SECONDS
    own_id: uuid.UUID | None = job_id
    if refusal := _refusal(glance, now=timezone.now(), due_only=True):
        run.deliveries[job_id], own_id = Delivery(refusal), None
    claimed_at, short_batch = 0.0, False
    while True:
        if short_batch and run.holding_wake and linger > 0:
            # The jobs accepted meanwhile sent no message: let a few more come before claiming them, so a stream
            # of single submissions is delivered in batches of several. Counted from the last claim, so a job
            # waits at most `linger` longer than it would have; a claim that finds none still ends the run.
            _linger(claimed_at + linger - time.monotonic())
        claimed_at = time.monotonic()
        now = timezone.now()
        with transaction.atomic():
            batch: list[Job] = []
            if own_id is not None:
                # Its own job waits for a lock as a single delivery does: a user's cancel may hold it a moment.
                own, refusal = _lock_own(job_id=own_id, now=now, due_only=True)
                if own is None:
                    run.deliveries[job_id], own_id = Delivery(refusal), None
                else:
                    batch.append(own)
            batch += _lock_due(cluster_id=glance.cluster_id, now=now, limit=size - len(batch), exclude=own_id)
            if batch:
                claimed, settled = _claim(batch, now=now)
        if not batch:
            if not run.holding_wake:
                return run
            # Given back before the last look: a job accepted from now on sends a message, and one accepted
            # before saw the wake held and sent none, so the look below finds it.
            delivery_wake_taken(glance.cluster_id)
            run.holding_wake = False
            continue
        if not run.holding_wake:
            # Found after giving the wake back: hold it again unless a new message already took over.
            run.holding_wake = delivery_wake_hold(glance.cluster_id, taking_message=False)
        own_id = None
        short_batch = len(batch) < size
        result = _batch_deliver(cluster=batch[0].cluster, claimed=claimed, settled=settled)
        run.deliveries.update(result.deliveries)
        run.batches += 1
        if result.unreachable:
            return run
        if time.monotonic() > stop_claiming_at:
            run.more_due = True  # jobs accepted while the run held the wake sent no message
            return run
        if run.holding_wake:
            delivery_wake_hold(glance.cluster_id, taking_message=True)  # renewed: it lapses only if this run dies


def _linger(seconds: float) -> None:
    """Wait before the run's next claim (JOB_DELIVERY_LINGER_MS); no time left, no wait."""
    if seconds > 0:
        time.sleep(seconds)


_GLANCE = RelatedRows(
    Job, alias="job", only=("state", "cluster", "submit_lease_until", "next_attempt_at", "cancel_requested_at")
)
_GLANCE_ONE = f"{_GLANCE.select} WHERE job.id = %s"


def _refusal(job: Job | None, *, now: datetime, due_only: bool) -> str:
    """Why this job is not to be delivered now; "" when it is."""
    if job is None or job.state != JobState.QUEUED:
        return "nothing to do"
    if job.submit_lease_until is not None and job.submit_lease_until > now:
        return "another worker holds it"
    # A cancel request makes a job due at once: the delivery is what cancels a job whose submission is unsure.
    waiting = job.next_attempt_at is not None and job.next_attempt_at > now + DUE_TOLERANCE
    if due_only and waiting and job.cancel_requested_at is None:
        return "not due yet"
    return ""


# The job rows a delivery locks, with the cluster, project and tenant it reads: by hand-written prepared statements,
# since the ORM's SELECT ... FOR UPDATE over three joins cost a worker more CPU to build, at every claim, than the
# rest of a delivery (portal/db.py). FOR NO KEY UPDATE OF the job alone: locking the joined project and cluster
# rows too would deadlock with a concurrent submission, whose foreign-key checks take a share lock on those rows.
_CLAIMED = RelatedRows(Job, "cluster", "project__tenant", alias="job")
_LOCK_OWN = f"{_CLAIMED.select} WHERE job.id = %s FOR NO KEY UPDATE OF job"
# Oldest first, as the index on (cluster, state, created_at) serves; rows another worker holds are skipped.
_DUE = (
    f"{_CLAIMED.select} WHERE job.cluster_id = %s AND job.state = %s "
    "AND (job.submit_lease_until IS NULL OR job.submit_lease_until <= %s) "
    "AND (job.next_attempt_at IS NULL OR job.next_attempt_at <= %s)"
)
_LOCK_DUE = f"{_DUE} ORDER BY job.created_at, job.id LIMIT %s FOR NO KEY UPDATE OF job SKIP LOCKED"
_LOCK_DUE_EXCEPT = (
    f"{_DUE} AND job.id <> %s ORDER BY job.created_at, job.id LIMIT %s FOR NO KEY UPDATE OF job SKIP LOCKED"
)


def _lock_own(*, job_id: uuid.UUID, now: datetime, due_only: bool) -> tuple[Job | None, str]:
    """The job, locked, when it is to be delivered now; else None and why not."""
    found = _CLAIMED.fetch(_LOCK_OWN, [job_id])
    job = found[0] if found else None
    refusal = _refusal(job, now=now, due_only=due_only)
    return (None, refusal) if refusal else (job, "")


def _lock_due(*, cluster_id: int, now: datetime, limit: int, exclude: uuid.UUID | None) -> list[Job]:
    """Up to `limit` of the cluster's due queued jobs, oldest first, locked; rows another worker has locked
    (claiming them, or recording their outcome) are skipped, never waited for."""
    if limit <= 0:
        return []
    if exclude is None:
        return _CLAIMED.fetch(_LOCK_DUE, [cluster_id, JobState.QUEUED.value, now, now, limit])
    return _CLAIMED.fetch(_LOCK_DUE_EXCEPT, [cluster_id, JobState.QUEUED.value, now, now, exclude, limit])


_LEASE = "UPDATE jobs_job SET submit_attempts = submit_attempts + 1, submit_lease_until = %s WHERE id = ANY(%s)"


def _claim(batch: list[Job], *, now: datetime) -> tuple[list[Job], dict[uuid.UUID, Delivery]]:
    """In the transaction that locked `batch`: settle what needs no Slurm (cancelled before any attempt, given up
    on), lease the rest and count their attempt. Returns the leased jobs, and the settled ones' deliveries."""
    claimed: list[Job] = []
    settled: dict[uuid.UUID, Delivery] = {}
    finished: list[Job] = []
    waiting: list[Job] = []
    transitions: list[JobTransition] = []
    give_up = timedelta(hours=settings.JOB_SUBMIT_GIVE_UP_HOURS)
    # Jobs of a pipeline: what their parents allow now (one query for the batch; jobs/pipelines.py).
    resolutions = dependencies_resolve(batch)
    for job in batch:
        resolution = resolutions.get(job.pk)
        if job.cancel_requested_at is not None and job.submit_attempts == 0:
            transitions.append(_cancel_unsubmitted(job, now=now))
            settled[job.pk] = Delivery("cancelled before submission")
            finished.append(job)
        elif now - job.created_at > give_up:
            hours = settings.JOB_SUBMIT_GIVE_UP_HOURS
            transitions.append(_reject(job, f"Slurm could not be reached for {hours} hours: {job.last_error}", now=now))
            settled[job.pk] = Delivery("gave up")
            finished.append(job)
        elif resolution is not None and resolution.never:
            transitions.append(_never_runs(job, resolution.never, now=now))
            settled[job.pk] = Delivery("never able to run")
            finished.append(job)
        elif resolution is not None and resolution.waiting_for:
            # Not attempted, so not counted: it is sent once every parent has a Slurm job id (their delivery
            # wakes it), with nothing of its own exactly-once delivery changed.
            job.last_error = waiting_words(resolution.waiting_for)
            job.next_attempt_at = recheck_at(now)
            job.updated_at = now
            settled[job.pk] = Delivery("waiting for its parents")
            waiting.append(job)
        else:
            if resolution is not None:
                job.slurm_dependency = resolution.slurm_dependency
                Job.objects.filter(pk=job.pk).update(slurm_dependency=resolution.slurm_dependency)
            claimed.append(job)
            continue
        outcome = settled[job.pk].outcome
        level = logging.WARNING if outcome == "gave up" else logging.INFO
        logger.log(level, "job delivery %s", outcome, extra=job_log_fields(job, cluster=job.cluster.name))
    if finished:
        _jobs_save(finished, fields=[*_DELIVERY_FIELDS, "state_reason", "cancel_reason"])
        _transitions_insert(transitions)
        dependents_wake(parent_ids=[job.pk for job in finished], now=now)
    if waiting:
        _jobs_save(waiting, fields=["last_error", "next_attempt_at", "updated_at"])
    if claimed:
        lease = now + timedelta(seconds=settings.JOB_SUBMIT_LEASE_SECONDS)
        with prepared_cursor() as cursor:
            cursor.execute(_LEASE, [lease, [job.pk for job in claimed]])
        for job in claimed:
            job.submit_attempts += 1
            job.submit_lease_until = lease
    return claimed, settled


def _jobs_save(jobs: list[Job], *, fields: list[str]) -> None:
    """Write `fields` of these jobs in one statement: a plain UPDATE for one job, UPDATE ... FROM (VALUES ...) for
    several. Most delivery batches under a stream of submissions, and most syncs, change a few jobs, and building
    bulk_update's CASE expressions cost a worker more CPU than the statement costs PostgreSQL."""
    if len(jobs) == 1:
        update_prepared(jobs[0], fields=fields)
    elif jobs:
        FastUpdateQuerySet(model=Job).fast_update(jobs, fields, unfiltered=True)


def _transitions_insert(transitions: list[JobTransition]) -> None:
    """Store these transitions: one as a prepared statement (a delivery or sync under a stream of submissions
    changes a job or two at a time), several in bulk."""
    if len(transitions) == 1:
        insert_prepared(transitions[0])
    elif transitions:
        JobTransition.objects.bulk_create(transitions, batch_size=500)


def _batch_deliver(*, cluster: Cluster, claimed: list[Job], settled: dict[uuid.UUID, Delivery]) -> _Batch:
    """Deliver the claimed jobs (outside any transaction), then record every outcome in one transaction and push
    every change, the settled jobs' too, to watchers in one go."""
    outcomes: dict[uuid.UUID, _Outcome] = {}
    unreachable: SlurmError | None = None
    if claimed:
        client = slurm_client_for(cluster)
        outcomes, unreachable = _attempt(client=client, jobs=claimed)
        sync_error = _sync_unknown_accounts_then_retry(jobs=claimed, outcomes=outcomes)
        unreachable = unreachable or sync_error
    _record(outcomes=outcomes, claimed=claimed, settled=list(settled))
    for job in claimed:
        _outcome_log(job, outcomes[job.pk], cluster=cluster.name)
    if unreachable is not None:
        cluster_unreachable_record(cluster_id=cluster.pk, error=str(unreachable))
    deliveries = dict(settled)
    deliveries.update({job_id: Delivery(each.delivery, retry_in=each.retry_in) for job_id, each in outcomes.items()})
    return _Batch(deliveries=deliveries, unreachable=unreachable is not None)


def _outcome_log(job: Job, outcome: _Outcome, *, cluster: str) -> None:
    fields: dict[str, object] = {**job_log_fields(job, cluster=cluster), "attempt": job.submit_attempts}
    if outcome.slurm_job_id is not None:
        fields["slurm_job_id"] = outcome.slurm_job_id
    if outcome.retry_in is not None:
        fields["retry_in_seconds"] = round(outcome.retry_in, 1)
    # A message is a retry's or a refusal's words: something an operator may have to look at.
    level = logging.WARNING if outcome.message else logging.INFO
    words = f": {outcome.message}" if outcome.message else ""
    logger.log(level, "job delivery %s%s", outcome.delivery, words, extra=fields)


def _attempt(*, client: SlurmClient, jobs: list[Job]) -> tuple[dict[uuid.UUID, _Outcome], SlurmError | None]:
    """Each job's outcome: found by its tag (a job tried before), cancelled, or submitted now; and the error that
    showed the cluster not answering, if one did."""
    tried_before = [job for job in jobs if job.submit_attempts > 1]
    try:
        found, refused = _find_tagged(client=client, jobs=tried_before)
    except SlurmRetryableError as exc:
        # The cluster does not answer: no job of the batch is tried now.
        return {job.pk: _retry(job, exc, attempted=job.submit_attempts > 1) for job in jobs}, exc
    outcomes: dict[uuid.UUID, _Outcome] = {}
    to_submit: list[Job] = []
    for job in jobs:
        if job.pk in found:
            slurm_job_id = found[job.pk]
            outcomes[job.pk] = _Outcome(
                "found in Slurm", slurm_job_id=slurm_job_id, detail="found in Slurm after a lost reply"
            )
        elif job.pk in refused:
            outcomes[job.pk] = _refused(job, refused[job.pk])
        elif job.cancel_requested_at is not None:
            outcomes[job.pk] = _Outcome("cancelled before submission")
        else:
            to_submit.append(job)
    submitted, unreachable = _submit_all(client=client, jobs=to_submit)
    outcomes.update(submitted)
    return outcomes, unreachable


def _submit_all(*, client: SlurmClient, jobs: list[Job]) -> tuple[dict[uuid.UUID, _Outcome], SlurmError | None]:
    """Submit the jobs, up to JOB_DELIVERY_THREADS at once over the cluster's one client. Once one submission
    finds the cluster not answering, those not started yet are not sent: they wait for a retry with the others."""
    if not jobs:
        return {}, None
    not_answering = threading.Event()

    def submit(job: Job) -> _Outcome | SlurmRetryableError | None:
        if not_answering.is_set():
            return None
        # What this submission logs (the Slurm client's line among them) is about this job, whichever message
        # brought the batch: its own id and the id of the request that submitted it.
        with bound_contextvars(**job_log_fields(job, cluster=job.cluster.name)):
            return _submit_one(job)

    def _submit_one(job: Job) -> _Outcome | SlurmRetryableError | None:
        try:
            job_directory_prepare(
                log_root=job.cluster.log_root, working_directory=job.working_directory, username=job.cluster_username
            )
            result = client.submit_job(user=job.cluster_username, submission=_submission(job))
        except JobDirectoryError as exc:
            return _Outcome("rejected", message=str(exc))
        except SlurmRetryableError as exc:
            not_answering.set()
            return exc
        except SlurmTerminalError as exc:
            return _refused(job, exc)
        except Exception as exc:  # a fault of this one job's delivery must not lose the others' outcomes
            logger.exception("job %s: delivery failed", job.pk)
            return _retry(job, exc, attempted=True)
        return _Outcome("submitted", slurm_job_id=result.job_id, detail=f"Slurm job {result.job_id}")

    threads = min(settings.JOB_DELIVERY_THREADS, settings.SLURM_HTTP_MAX_CONNECTIONS, len(jobs))
    if threads > 1:
        # The pool's threads start with an empty context: each submission runs in a copy of the task's (its id).
        contexts = [contextvars.copy_context() for _ in jobs]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="job-delivery") as pool:
            results = list(pool.map(lambda context, job: context.run(submit, job), contexts, jobs))
    else:
        results = [submit(job) for job in jobs]
    unreachable = next((result for result in results if isinstance(result, SlurmRetryableError)), None)
    outcomes: dict[uuid.UUID, _Outcome] = {}
    for job, result in zip(jobs, results, strict=True):
        if isinstance(result, _Outcome):
            outcomes[job.pk] = result
        elif isinstance(result, SlurmRetryableError):
            outcomes[job.pk] = _retry(job, result, attempted=True)
        else:
            assert unreachable is not None  # not sent because another submission found the cluster not answering
            outcomes[job.pk] = _retry(job, unreachable, attempted=False)
    return outcomes, unreachable


def _submission(job: Job) -> JobSubmission:
    return JobSubmission(
        name=job.name,
        account=job.project.slurm_account,
        partition=job.partition,
        script=job.script,
        time_limit_minutes=job.time_limit_minutes,
        working_directory=job.working_directory,
        standard_output=job.stdout_path,
        standard_error=job.stderr_path,
        gpus=job.gpus,
        gpu_type=job.gpu_type or None,
        environment=dict(job.environment),
        comment=job.slurm_comment,
        cpus=job.cpus,
        memory_mb=job.memory_gb * 1024 if job.memory_gb else None,
        array=job.array,
        dependency=job.slurm_dependency,
        nodes=job.node_count,
        max_switches=job.max_switches,
        switch_wait_seconds=job.switch_wait_minutes * 60 if job.switch_wait_minutes is not None else None,
        # Read only for a job that asks for one switch (the v0.0.38 codec needs it): one query for such a job.
        one_switch_constraint=(
            one_switch_constraint(cluster_id=job.cluster_id, partition=job.partition) if job.max_switches == 1 else ""
        ),
    )


def _find_tagged(
    *, client: SlurmClient, jobs: list[Job]
) -> tuple[dict[uuid.UUID, int], dict[uuid.UUID, SlurmTerminalError]]:
    """The Slurm job ids carrying these jobs' tags, from one listing of slurmctld and, for jobs that already
    ended there, one accounting query per account; and the jobs whose lookup Slurm refused, with its refusal."""
    found: dict[uuid.UUID, int] = {}
    refused: dict[uuid.UUID, SlurmTerminalError] = {}
    if not jobs:
        return found, refused
    by_tag = {job.slurm_comment: job.pk for job in jobs}
    try:
        listing = client.list_jobs()
    except SlurmTerminalError as exc:
        return found, {job.pk: exc for job in jobs}
    for slurm_job in listing.jobs if listing else ():
        if slurm_job.comment in by_tag:
            found.setdefault(by_tag[slurm_job.comment], slurm_job.array_job_id or slurm_job.job_id)
    missing: dict[str, list[Job]] = {}
    for job in jobs:
        if job.pk not in found:
            missing.setdefault(job.project.slurm_account, []).append(job)
    for account, in_account in missing.items():
        since = min(job.created_at for job in in_account) - timedelta(minutes=1)
        try:
            records = client.accounting_jobs(account=account, start_time=since)
        except SlurmTerminalError as exc:
            refused.update((job.pk, exc) for job in in_account)
            continue
        for record in records:
            if record.comment in by_tag:
                found.setdefault(by_tag[record.comment], record.array_job_id or record.job_id)
    return found, refused


def _retry(job: Job, exc: Exception, *, attempted: bool) -> _Outcome:
    """Try the job again later: 5 s, 10 s, 20 s ... up to the cap, jittered so that a returning cluster is not
    hit by every job at once. `attempted`: this job's own request failed (else others showed the cluster down)."""
    delay = min(5 * 2 ** max(job.submit_attempts - 1, 0), settings.JOB_SUBMIT_RETRY_MAX_SECONDS)
    delay = delay * random.uniform(0.8, 1.2)  # noqa: S311 -- jitter, not security
    if isinstance(exc, SlurmError):
        message = f"Slurm is not answering (attempt {job.submit_attempts}): {exc}; the portal will try again"
        if attempted and isinstance(exc, SlurmTimeout):
            message += " and check first whether the earlier attempt arrived"
    else:
        message = (
            f"The delivery failed (attempt {job.submit_attempts}): {exc!r}; the portal will try again and check "
            "first whether the earlier attempt arrived"
        )
    return _Outcome("retry", message=message + ".", retry_in=delay)


def _refused(job: Job, exc: SlurmTerminalError) -> _Outcome:
    if _is_invalid_account(exc) and job.submit_attempts <= 2:
        # The member or the project may be newer than the last account sync: sync now, then try again.
        return _Outcome(_ACCOUNT_UNKNOWN, message=_slurm_words(exc))
    return _Outcome("rejected", message=_slurm_words(exc))


def _sync_unknown_accounts_then_retry(*, jobs: list[Job], outcomes: dict[uuid.UUID, _Outcome]) -> SlurmError | None:
    """Sync the account of each project whose jobs Slurm refused for an unknown account, once per project, and
    have those jobs tried again at once; returns a retryable error of a sync, if one failed so."""
    unknown = [job for job in jobs if outcomes[job.pk].delivery == _ACCOUNT_UNKNOWN]
    sync_errors: dict[int, SlurmError | None] = {}
    for project_id in {job.project_id for job in unknown}:
        try:
            accounts.project_slurm_sync(project_id=project_id)
            sync_errors[project_id] = None
        except SlurmError as exc:
            sync_errors[project_id] = exc
    for job in unknown:
        sync_error = sync_errors[job.project_id]
        if sync_error is not None:
            outcomes[job.pk] = _retry(job, sync_error, attempted=True)
            continue
        words = outcomes[job.pk].message
        outcomes[job.pk] = _Outcome(
            "retry after account sync",
            message=f"Slurm did not know the project's account yet ({words}); synced it, retrying.",
            retry_in=0,
        )
    return next((error for error in sync_errors.values() if error is not None and error.retryable), None)


def _is_invalid_account(exc: SlurmError) -> bool:
    return any(message.error_number == INVALID_ACCOUNT_ERROR for message in exc.messages)


def _slurm_words(exc: SlurmError) -> str:
    words = "; ".join(str(message) for message in exc.messages)
    return words or str(exc)


_RECORDED = RelatedRows(Job, "project__tenant", "cluster", "user", alias="job")
_LOCK_RECORDED = (
    f"{_RECORDED.select} WHERE job.id = ANY(%s) ORDER BY job.created_at DESC, job.id DESC FOR NO KEY UPDATE OF job"
)


def _record(*, outcomes: dict[uuid.UUID, _Outcome], claimed: list[Job], settled: list[uuid.UUID]) -> None:
    """Record the batch's outcomes on the jobs' rows in one transaction, then push the changed and settled jobs."""
    now = timezone.now()
    attempts = {job.pk: job.submit_attempts for job in claimed}
    changed: list[Job] = []
    transitions: list[JobTransition] = []
    with transaction.atomic():
        if outcomes:
            # In the model's ordering, as the job sync locks its jobs: two transactions that lock some of the
            # same jobs take them in the same order, so neither waits for the other while holding what it needs.
            # With what watchers are sent (job_event), so that the push after commit needs no query of its own.
            for job in _RECORDED.fetch(_LOCK_RECORDED, [list(outcomes)]):
                # The lease ran out and another worker took the job over: it records its own outcome.
                taken_over = job.submit_attempts != attempts[job.pk]
                if _record_one(job, outcomes[job.pk], taken_over=taken_over, now=now, transitions=transitions):
                    changed.append(job)
            _jobs_save(changed, fields=_DELIVERY_FIELDS)
            _transitions_insert(transitions)
            # In Slurm now, or ended before it: the children waiting in the portal for them may go on.
            dependents_wake(
                parent_ids=[job.pk for job in changed if job.slurm_job_id is not None or job.is_final], now=now
            )
        if changed:
            transaction.on_commit(lambda: jobs_push_loaded(changed))
            transaction.on_commit(lambda: _deliveries_count(changed, outcomes, now=now))
        if settled:
            transaction.on_commit(lambda: jobs_push(settled))


def _record_one(
    job: Job, outcome: _Outcome, *, taken_over: bool, now: datetime, transitions: list[JobTransition]
) -> bool:
    """Apply one outcome to its locked row; whether the row changed."""
    if outcome.slurm_job_id is not None:  # in Slurm: recorded whoever holds the job now
        if job.slurm_job_id is not None:
            if job.slurm_job_id != outcome.slurm_job_id:  # the sync adopted another copy first; keep one
                logger.error(
                    "job %s: Slurm jobs %s and %s carry its tag", job.pk, job.slurm_job_id, outcome.slurm_job_id
                )
            return False
        job.slurm_job_id = outcome.slurm_job_id
        job.submitted_at = now
        job.submit_lease_until = None
        job.last_error = ""
        job.updated_at = now
        if job.state == JobState.QUEUED:
            transitions.append(job_transition(job=job, to_state=JobState.PENDING, detail=outcome.detail, at=now))
        if job.cancel_requested_at is not None:
            task_enqueue_on_commit("jobs.tasks.job_cancel", str(job.pk), fallback="the next job sync cancels it")
        return True
    if job.state != JobState.QUEUED or job.slurm_job_id is not None or taken_over:
        return False  # adopted by the sync, cancelled by a user, or another worker's now
    if outcome.delivery == "rejected":
        transitions.append(_reject(job, outcome.message, now=now))
    elif outcome.delivery == "cancelled before submission":
        transitions.append(_cancel_unsubmitted(job, now=now))
    else:
        job.last_error = outcome.message
        job.submit_lease_until = None
        job.next_attempt_at = now + timedelta(seconds=outcome.retry_in or 0)
        job.updated_at = now
    return True


# A recorded outcome as the metrics name it (portal_job_deliveries_total).
_DELIVERY_METRIC = {"rejected": "rejected", "cancelled before submission": "cancelled"}


def _deliveries_count(changed: list[Job], outcomes: dict[uuid.UUID, _Outcome], *, now: datetime) -> None:
    for job in changed:
        outcome = outcomes[job.pk]
        if outcome.slurm_job_id is not None:
            lag = (now - job.created_at).total_seconds()
            metrics.job_delivery_record(cluster=job.cluster.name, outcome="delivered", lag_seconds=lag)
        else:
            metrics.job_delivery_record(
                cluster=job.cluster.name, outcome=_DELIVERY_METRIC.get(outcome.delivery, "retry")
            )


def _cancel_unsubmitted(job: Job, *, now: datetime) -> JobTransition:
    """Cancel the job in memory (the caller saves it); its transition, to be saved with it."""
    requester = job.cancel_requested_by.username if job.cancel_requested_by else "a user"
    transition = job_transition(job=job, to_state=JobState.CANCELLED, detail=cancelled_before_slurm(requester), at=now)
    array_tasks_end_before_slurm(job=job, state=JobState.CANCELLED, now=now)
    job.ended_at = now
    job.submit_lease_until = None
    job.updated_at = now
    return transition


def _never_runs(job: Job, words: str, *, now: datetime) -> JobTransition:
    """End a child whose parent already ended the wrong way, before Slurm (the caller saves it): cancelled, with
    the reason Slurm itself gives such a job, so that pages say "will never run" whichever of them found it."""
    transition = job_transition(
        job=job, to_state=JobState.CANCELLED, detail=f"never able to run: {words}"[:500], at=now
    )
    array_tasks_end_before_slurm(job=job, state=JobState.CANCELLED, now=now)
    job.state_reason = NEVER_SATISFIED_REASON
    job.last_error = f"Never able to run: {words}."
    job.cancel_reason = job.last_error[:500]  # the portal cancelled it: no user asked (Job.cancelled_by)
    job.ended_at = now
    job.submit_lease_until = None
    job.updated_at = now
    return transition


def _reject(job: Job, message: str, *, now: datetime) -> JobTransition:
    """Reject the job in memory (the caller saves it); its transition, to be saved with it."""
    transition = job_transition(job=job, to_state=JobState.REJECTED, detail=message[:500], at=now)
    array_tasks_end_before_slurm(job=job, state=JobState.REJECTED, now=now)
    job.last_error = message
    job.ended_at = now
    job.submit_lease_until = None
    job.updated_at = now
    return transition


def jobs_requeue_overdue(*, cluster: Cluster) -> list[uuid.UUID]:
    """Queued jobs whose delivery is overdue (its message lost with Redis or a killed worker): their ids."""
    cutoff = timezone.now() - timedelta(seconds=settings.JOB_SUBMIT_SWEEP_GRACE_SECONDS)
    overdue = Job.objects.filter(cluster=cluster, state=JobState.QUEUED, next_attempt_at__lt=cutoff).exclude(
        submit_lease_until__gt=timezone.now()
    )
    ids = list(overdue.values_list("pk", flat=True)[:500])
    Job.objects.filter(pk__in=ids).update(next_attempt_at=timezone.now())
    return ids


# Cancel in Slurm ---------------------------------------------------------------------------------------


def job_cancel_in_slurm(*, job_id: uuid.UUID) -> None:
    """Cancel a job that reached Slurm, as its owner, then record the state Slurm reports."""
    job = Job.objects.select_related("cluster", "project__tenant").filter(pk=job_id).first()
    if job is None or job.is_final or job.cancel_requested_at is None:
        return
    if job.slurm_job_id is None:
        # Still being delivered: the delivery cancels it once it knows whether it reached Slurm.
        from jobs.tasks import job_submit

        job_submit.delay(str(job.pk))
        return
    client = slurm_client_for(job.cluster)
    try:
        client.cancel_job(user=job.cluster_username, job_id=job.slurm_job_id)
    except SlurmTerminalError as exc:
        # Already ended, or gone from slurmctld: what Slurm reports next is the truth either way.
        logger.info("job %s: cancel in Slurm answered %s", job.pk, exc)
    if job.is_array:
        return  # its tasks' ends come with the next sync's listing, every record of the array at once
    try:
        slurm_job = client.get_job(job_id=job.slurm_job_id)
    except SlurmNotFound:
        return
    jobs_apply_slurm_state(cluster=job.cluster, updates={job.pk: slurm_job})


# Following Slurm ---------------------------------------------------------------------------------------


@dataclass
class SyncResult:
    requests: int = 0
    listed: int = 0
    changed: int = 0
    external_created: int = 0
    unchanged_listing: bool = False
    duplicates_cancelled: int = 0
    looked_up_in_accounting: int = 0
    requeued_ids: list[uuid.UUID] = field(default_factory=list)
    # Tagged jobs in a project's account that no portal job matches: lost by a restore, for jobs.job_recovery.
    lost: list[SlurmJob] = field(default_factory=list)


def cluster_jobs_sync(*, cluster: Cluster, client: SlurmClient) -> SyncResult:
    """Move the cluster's portal jobs to the state Slurm reports, from one listing with `update_time`.

    When nothing changed since the last listing, slurmrestd answers 304 and this costs one small request.
    Jobs that slurmctld no longer lists (it forgets finished jobs after a few minutes) are looked up in
    accounting. Jobs in a portal project's account without the portal's tag are recorded as external.
    """
    result = SyncResult()
    result.requeued_ids = jobs_requeue_overdue(cluster=cluster)
    since = cluster.jobs_listed_at - timedelta(seconds=1) if cluster.jobs_listed_at else None
    # The controller's clock has one-second resolution: asking from a second before the last listing
    # catches a change made in the same second as it, at the price of one more listing.
    listing = client.list_jobs(updated_since=since)
    result.requests += 1
    if listing is None and _start_estimates_due(cluster):
        # Slurm's backfill moves a pending job's expected start without marking the job changed (seen on 26.05),
        # so the listing since the last one misses it: while portal jobs wait, look at every job now and then.
        listing = client.list_jobs()
        result.requests += 1
    now = timezone.now()
    if listing is None:
        result.unchanged_listing = True
        Cluster.objects.filter(pk=cluster.pk).update(jobs_synced_at=now, jobs_sync_error="")
        return result
    result.listed = len(listing.jobs)

    tagged: dict[uuid.UUID, list[SlurmJob]] = {}
    untagged: list[SlurmJob] = []
    for slurm_job in listing.jobs:
        job_id = job_id_from_tag(slurm_job.comment)
        if job_id is not None:
            tagged.setdefault(job_id, []).append(slurm_job)
        else:
            untagged.append(slurm_job)

    known = {
        job.pk: job
        for job in Job.objects.filter(cluster=cluster, pk__in=list(tagged)).only(
            "pk", "slurm_job_id", "state", "started_at", "array"
        )
    }
    updates: dict[uuid.UUID, SlurmJob] = {}
    array_updates: dict[uuid.UUID, list[SlurmJob]] = {}
    lost: list[SlurmJob] = []
    for job_id, copies in tagged.items():
        job = known.get(job_id)
        if job is None:
            lost.extend(copies)  # a job the database lost (restored from a backup), or another portal's
            continue
        if job.slurm_job_id is None and job.is_final:
            # Cancelled or rejected in the portal while a lost submission reached Slurm after all: stop it.
            for orphan in copies:
                if not orphan.state.is_finished:
                    result.duplicates_cancelled += 1
                    result.requests += _cancel_duplicate(client=client, job_id=job_id, slurm_job=orphan)
            continue
        if job.is_array:
            array_updates[job_id], others = array_records_of(job, copies)
            for extra in others:
                if not extra.state.is_finished:
                    result.duplicates_cancelled += 1
                    result.requests += _cancel_duplicate(client=client, job_id=job_id, slurm_job=extra)
            continue
        keep = next((copy for copy in copies if copy.job_id == job.slurm_job_id), None) or min(
            copies, key=lambda copy: copy.job_id
        )
        updates[job_id] = keep
        for extra in copies:
            if extra is not keep and not extra.state.is_finished:
                result.duplicates_cancelled += 1
                result.requests += _cancel_duplicate(client=client, job_id=job_id, slurm_job=extra)

    if lost:
        accounts = set(
            Project.objects.filter(slurm_account__in={job.account for job in lost}).values_list(
                "slurm_account", flat=True
            )
        )
        result.lost = [job for job in lost if job.account in accounts]
    result.external_created, external_updates = _externals(cluster=cluster, slurm_jobs=untagged)
    updates.update(external_updates)
    requeued = {
        job.pk: (job, listed)
        for job in known.values()
        if isinstance(listed := updates.get(job.pk), SlurmJob) and is_requeued(job=job, slurm_job=listed)
    }
    causes = requeue_causes_find(client=client, requeued=requeued)
    result.requests += len(requeued)
    result.changed = jobs_apply_slurm_state(cluster=cluster, updates=updates, requeue_causes=causes)
    forgotten: set[uuid.UUID] = set()
    result.changed += arrays_apply_slurm_state(cluster=cluster, updates=array_updates, forgotten=forgotten)

    # Jobs the portal believes active but slurmctld no longer lists: their end is in accounting.
    listed_ids = {slurm_job.job_id for slurm_job in listing.jobs}
    listed_ids |= {slurm_job.array_job_id for slurm_job in listing.jobs if slurm_job.array_job_id}
    vanished = Job.objects.filter(cluster=cluster, state__in=[JobState.PENDING, JobState.RUNNING]).exclude(
        slurm_job_id__in=listed_ids
    )
    vanished_arrays = list(
        Job.objects.filter(cluster=cluster, state__in=[JobState.PENDING, JobState.RUNNING])
        .exclude(array="")
        .filter(Q(pk__in=forgotten) | ~Q(slurm_job_id__in=listed_ids))
        .select_related("project")[:100]
    )
    vanished = vanished.filter(array="")
    if vanished_arrays:
        result.requests += 1
        result.looked_up_in_accounting += len(vanished_arrays)
        result.changed += _apply_arrays_accounting(cluster=cluster, client=client, jobs=vanished_arrays)
    for job in vanished.select_related("project")[:100]:
        result.requests += 1
        result.looked_up_in_accounting += 1
        result.changed += _apply_accounting(cluster=cluster, client=client, job=job)

    Cluster.objects.filter(pk=cluster.pk).update(
        jobs_listed_at=listing.last_update or now, jobs_synced_at=now, jobs_sync_error=""
    )
    return result


def _start_estimates_due(cluster: Cluster) -> bool:
    """Whether this sync should list every job to refresh the start estimates of the portal's pending jobs: at
    most once per JOB_START_ESTIMATE_REFRESH_SECONDS per cluster, and only while some wait."""
    if not Job.objects.filter(cluster=cluster, state=JobState.PENDING, is_external=False).exists():
        return False
    try:
        return bool(
            cache.add(f"jobs.start-estimates.{cluster.pk}", True, timeout=settings.JOB_START_ESTIMATE_REFRESH_SECONDS)
        )
    except Exception:  # Redis down: the estimates are refreshed at each sync meanwhile; nothing is lost
        logger.warning("could not read the start-estimate refresh mark", exc_info=True)
        return True


def _apply_arrays_accounting(*, cluster: Cluster, client: SlurmClient, jobs: list[Job]) -> int:
    """Finish arrays slurmctld forgot, task by task, from one accounting request for all of them."""
    accounts = sorted({job.project.slurm_account for job in jobs})
    since = min(job.submitted_at or job.created_at for job in jobs) - timedelta(minutes=10)
    try:
        records = client.accounting_jobs(account=",".join(accounts), start_time=since)
    except SlurmError as exc:
        logger.warning("cluster %s: accounting lookup of %d arrays failed: %s", cluster.name, len(jobs), exc)
        return 0
    by_array = {(job.slurm_job_id, job.slurm_comment): job.pk for job in jobs}
    updates: dict[uuid.UUID, list[AccountingRecord]] = {}
    for record in records:
        job_id = by_array.get((record.array_job_id, record.comment))
        if job_id is not None:
            updates.setdefault(job_id, []).append(record)
    return arrays_apply_slurm_state(cluster=cluster, updates=updates)


def _cancel_duplicate(*, client: SlurmClient, job_id: uuid.UUID, slurm_job: SlurmJob) -> int:
    logger.error("job %s: cancelling Slurm job %s, a copy the portal does not follow", job_id, slurm_job.job_id)
    try:
        client.cancel_job(user=client.admin_user, job_id=slurm_job.job_id)
    except SlurmError as exc:
        logger.warning("job %s: could not cancel duplicate %s: %s", job_id, slurm_job.job_id, exc)
    return 1


def _externals(*, cluster: Cluster, slurm_jobs: list[SlurmJob]) -> tuple[int, dict[uuid.UUID, SlurmJob]]:
    """Record jobs in portal projects' accounts that the portal did not submit; return their ids to update."""
    projects = dict(Project.objects.values_list("slurm_account", "pk"))
    in_projects = [job for job in slurm_jobs if job.account in projects]
    if not in_projects:
        return 0, {}
    existing = {
        (job.slurm_job_id, job.slurm_submit_time): job.pk
        for job in Job.objects.filter(
            cluster=cluster, is_external=True, slurm_job_id__in=[job.job_id for job in in_projects]
        ).only("pk", "slurm_job_id", "slurm_submit_time")
    }
    users = dict(ClusterAccount.objects.filter(cluster=cluster).values_list("username", "user_id"))
    created: list[Job] = []
    updates: dict[uuid.UUID, SlurmJob] = {}
    now = timezone.now()
    for slurm_job in in_projects:
        key = (slurm_job.job_id, slurm_job.submit_time)
        if key in existing:
            updates[existing[key]] = slurm_job
            continue
        job = Job(
            project_id=projects[slurm_job.account],
            cluster=cluster,
            user_id=users.get(slurm_job.user_name),
            cluster_username=slurm_job.user_name[:32],
            is_external=True,
            name=slurm_job.name[:200],
            partition=slurm_job.partition[:64],
            gpu_type=slurm_job.gpu_type or "",
            gpus=slurm_job.gpus,
            time_limit_minutes=slurm_job.time_limit_minutes or 0,
            stdout_path=slurm_job.standard_output[:1000],
            stderr_path=slurm_job.standard_error[:1000],
            slurm_job_id=slurm_job.job_id,
            slurm_submit_time=slurm_job.submit_time,
            state=JobState.PENDING,
            created_at=slurm_job.submit_time or now,
            submitted_at=slurm_job.submit_time or now,
            updated_at=now,
        )
        created.append(job)
        updates[job.pk] = slurm_job
    Job.objects.bulk_create(created, ignore_conflicts=True)
    JobTransition.objects.bulk_create(
        [
            JobTransition(job=job, from_state="", to_state=JobState.PENDING, at=job.created_at, detail="found in Slurm")
            for job in created
        ]
    )
    return len(created), updates


def jobs_apply_slurm_state(
    *,
    cluster: Cluster,
    updates: Mapping[uuid.UUID, SlurmJob | AccountingRecord],
    requeue_causes: Mapping[uuid.UUID, SlurmState] | None = None,
) -> int:
    """Bring these jobs in line with what slurmctld reported; returns how many changed. Pushes the changes.

    `requeue_causes`: for jobs Slurm requeued, how their interrupted run ended (see `requeue_causes_find`).
    """
    if not updates:
        return 0
    causes = requeue_causes or {}
    changed: list[Job] = []
    transitions: list[JobTransition] = []
    now = timezone.now()
    switches = _SwitchMap(cluster_id=cluster.pk)
    with transaction.atomic():
        jobs = Job.objects.select_for_update(of=("self",), no_key=True).filter(cluster=cluster, pk__in=list(updates))
        for job in jobs:
            new_transitions = slurm_record_apply(
                job=job, slurm_job=updates[job.pk], now=now, requeue_cause=causes.get(job.pk), switch_of=switches
            )
            if new_transitions is not None:
                changed.append(job)
                transitions.extend(new_transitions)
                fields = {**job_log_fields(job, cluster=cluster.name), "slurm_job_id": job.slurm_job_id}
                for transition in new_transitions:
                    words = f": {transition.detail}" if transition.detail else ""
                    logger.info("job %s -> %s%s", transition.from_state, transition.to_state, words, extra=fields)
        _jobs_save(changed, fields=_SYNCED_FIELDS)
        _transitions_insert(transitions)
        changed_ids = [job.pk for job in changed]
        transaction.on_commit(lambda: jobs_push(changed_ids))
    return len(changed)


_SYNCED_FIELDS = [
    "state",
    "slurm_state",
    "state_reason",
    "slurm_job_id",
    "submitted_at",
    "started_at",
    "ended_at",
    "nodes",
    "switches",
    "gpu_indices",
    "exit_code",
    "last_error",
    "submit_lease_until",
    "expected_start_at",
    "updated_at",
]


class _SwitchMap(Mapping[str, str]):
    """The cluster's node -> switch map, read (in one query) only when a job of the sync got new nodes."""

    def __init__(self, *, cluster_id: int) -> None:
        self.cluster_id = cluster_id
        self._loaded: dict[str, str] | None = None

    def _map(self) -> dict[str, str]:
        if self._loaded is None:
            self._loaded = node_switch_map(cluster_id=self.cluster_id)
        return self._loaded

    def __getitem__(self, node: str) -> str:
        return self._map()[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map())

    def __len__(self) -> int:
        return len(self._map())


def slurm_record_apply(
    *,
    job: Job,
    slurm_job: SlurmJob | AccountingRecord,
    now: datetime,
    requeue_cause: SlurmState | None = None,
    switch_of: Mapping[str, str] | None = None,
) -> list[JobTransition] | None:
    """Set the job's fields from Slurm's; the transitions to record, or None when nothing changed.

    `requeue_cause` is how the interrupted run of a requeued job ended in accounting (NODE_FAIL, PREEMPTED),
    when the caller looked it up.
    """
    if job.slurm_job_id is None and job.is_final and slurm_job.state.is_finished:
        # Ended before reaching Slurm (e.g. rejected), and so did Slurm's record: 22.05 keeps a submission it
        # refused (error 2014) as a FAILED job. That is the refusal, not a lost submission: keep last_error.
        return None
    before = {field: getattr(job, field) for field in _SYNCED_FIELDS}
    new_state = SLURM_TO_PORTAL_STATE.get(slurm_job.state)
    reason = getattr(slurm_job, "state_reason", "")
    transitions: list[JobTransition] = []
    if job.slurm_job_id is None:  # adopted: submitted, but the reply was lost
        job.slurm_job_id = slurm_job.job_id
        job.submitted_at = slurm_job.submit_time or now
        job.submit_lease_until = None
        job.last_error = ""
    if new_state is not None and is_requeued(job=job, slurm_job=slurm_job):
        # Back in the queue after its run was cut short: the job goes on (as a new attempt), it did not fail.
        detail = _requeue_detail(job=job, slurm_job=slurm_job, cause=requeue_cause)
        at = slurm_job.submit_time if isinstance(slurm_job, SlurmJob) and slurm_job.submit_time else now
        transitions.append(job_transition(job=job, to_state=JobState.PENDING, detail=detail, at=min(at, now)))
        job.nodes = ""  # the cut-short run's; the next attempt's are not known until Slurm lists them
        job.switches = []
    nodes = getattr(slurm_job, "nodes", job.nodes)
    if new_state is not None and new_state != job.state and not job.is_final:
        if job.state == JobState.QUEUED and new_state != JobState.PENDING:
            transitions.append(job_transition(job=job, to_state=JobState.PENDING, detail="found in Slurm", at=now))
        # Accounting has no node list: a record with elapsed time ran (and is charged for it).
        ran = new_state == JobState.RUNNING or bool(nodes) or getattr(slurm_job, "elapsed_seconds", 0) > 0
        if job.state in (JobState.QUEUED, JobState.PENDING) and new_state in FINAL_AFTER_RUN and ran:
            at = slurm_job.start_time or now
            transitions.append(job_transition(job=job, to_state=JobState.RUNNING, detail=nodes, at=at))
        detail = _transition_detail(new_state=new_state, slurm_job=slurm_job, reason=reason)
        at = (slurm_job.end_time if new_state in FINAL_AFTER_RUN else slurm_job.start_time) or now
        if new_state == JobState.PENDING:
            at = now
        transitions.append(job_transition(job=job, to_state=new_state, detail=detail, at=min(at, now)))
    job.slurm_state = slurm_job.state.value
    job.state_reason = "" if reason == "None" else reason[:200]
    if nodes and nodes[:500] != job.nodes:
        job.nodes = nodes[:500]
        # Where the run's nodes hang in the network, as the inventory sync last saw the nodes; once per run.
        job.switches = node_switches_of(cluster_id=job.cluster_id, nodes=job.nodes, switch_of=switch_of)
    if isinstance(slurm_job, SlurmJob) and slurm_job.gpu_indices:
        # Slurm says which devices only while the job holds them; the last known stay where it ran.
        job.gpu_indices = {node: list(indices) for node, indices in slurm_job.gpu_indices}
    ran_by_accounting = getattr(slurm_job, "elapsed_seconds", 0) > 0
    if job.state == JobState.RUNNING or (job.is_final and (job.nodes or ran_by_accounting)):
        job.started_at = slurm_job.start_time or job.started_at
    if job.is_final:
        job.ended_at = slurm_job.end_time or job.ended_at or now
        job.exit_code = slurm_job.exit_code
    # Accounting records carry no estimate: they leave a pending job's last one as it was.
    if job.state != JobState.PENDING:
        job.expected_start_at = None
    elif isinstance(slurm_job, SlurmJob):
        job.expected_start_at = slurm_job.expected_start_time
    after = {field: getattr(job, field) for field in _SYNCED_FIELDS}
    if after == before:
        return None
    job.updated_at = now
    return transitions


FINAL_AFTER_RUN = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL}
)

# A new attempt starts at least Slurm's requeue delay (its credential lifetime, 2 minutes by default) after
# the interrupted one ended; a start this close to the recorded one is the same run.
RESTART_TOLERANCE = timedelta(seconds=5)


def is_requeued(*, job: Job, slurm_job: SlurmJob | AccountingRecord) -> bool:
    """Whether Slurm put this running job back in the queue since the portal last looked.

    Slurm requeues a running batch job when its node fails (JobRequeue=1, the default) or it is preempted:
    the run ends, and the same job id waits for its next attempt. Seen either as pending again, or, when
    the next attempt already began between two looks, as running (or ended) with a later start.
    """
    if job.state != JobState.RUNNING:
        return False
    if slurm_job.state == SlurmState.PENDING:
        return True
    started = slurm_job.start_time
    return started is not None and job.started_at is not None and started > job.started_at + RESTART_TOLERANCE


def _requeue_detail(*, job: Job, slurm_job: SlurmJob | AccountingRecord, cause: SlurmState | None) -> str:
    """`Requeued by Slurm after node gpu01 failed; attempt 2`, from what the portal knows of the cut-short run."""
    nodes = job.nodes or "its node"
    if cause == SlurmState.NODE_FAIL:
        why = f"after node {nodes} failed"
    elif cause == SlurmState.PREEMPTED:
        why = f"after it was preempted on {nodes}"
    else:
        why = f"after its run on {nodes} was cut short"
    restarts = getattr(slurm_job, "restart_count", 0)
    return f"Requeued by Slurm {why}; attempt {restarts + 1}" if restarts else f"Requeued by Slurm {why}"


def _transition_detail(*, new_state: JobState, slurm_job: SlurmJob | AccountingRecord, reason: str) -> str:
    if new_state == JobState.RUNNING:
        return f"on {getattr(slurm_job, 'nodes', '')}".strip()
    if new_state == JobState.PENDING:
        return reason if reason and reason != "None" else ""
    if new_state == JobState.NODE_FAIL:
        # Not requeued (--no-requeue, or JobRequeue=0): the job ends here, charged for what ran.
        nodes = getattr(slurm_job, "nodes", "")
        where = f" on {nodes}" if nodes else ""
        because = f" ({reason})" if reason and reason != "None" else ""
        return f"{slurm_job.state.value}{where}{because}: Slurm lost the node while the job ran and did not requeue it"
    if new_state in FINAL_AFTER_RUN:
        parts = [slurm_job.state.value]
        if slurm_job.exit_code is not None:
            parts.append(f"exit code {slurm_job.exit_code}")
        return ", ".join(parts)
    return ""


def requeue_causes_find(
    *, client: SlurmClient, requeued: Mapping[uuid.UUID, tuple[Job, SlurmJob]]
) -> dict[uuid.UUID, SlurmState]:
    """How the interrupted run of each requeued job ended, from its accounting records (one request per job).

    Slurm records the cut-short run as ended (NODE_FAIL after a node failure, PREEMPTED) under the job's id
    before the next attempt starts. A job whose record is not there yet, or cannot be read, is left out:
    its requeue is recorded all the same, in plainer words.
    """
    causes: dict[uuid.UUID, SlurmState] = {}
    for job_id, (job, slurm_job) in requeued.items():
        try:
            records = client.accounting_job_records(job_id=slurm_job.job_id)
        except SlurmError as exc:
            logger.info("job %s: accounting of its requeued Slurm job not available: %s", job_id, exc)
            continue
        cause = interrupted_run_state(job=job, records=records, current_start=slurm_job.start_time)
        if cause is not None:
            causes[job_id] = cause
    return causes


def interrupted_run_state(
    *, job: Job, records: list[AccountingRecord], current_start: datetime | None
) -> SlurmState | None:
    """The state of the job's last run that ended before its current attempt (started at `current_start`)."""
    ended = [
        (record.end_time, record.state)
        for record in records
        if record.comment == job.slurm_comment
        and record.state.is_finished
        and record.end_time is not None
        and (current_start is None or record.end_time <= current_start)
    ]
    return max(ended)[1] if ended else None


def _apply_accounting(*, cluster: Cluster, client: SlurmClient, job: Job) -> int:
    """Finish a job slurmctld forgot, from accounting; 1 when it changed."""
    assert job.slurm_job_id is not None
    try:
        records = client.accounting_job_records(job_id=job.slurm_job_id)
    except SlurmNotFound:
        return 0
    except SlurmError as exc:
        logger.warning("job %s: accounting lookup failed: %s", job.pk, exc)
        return 0
    # The newest of the job's own records is its last attempt (a requeued job has one per run); records of
    # another job can share the id after Slurm's state was reset.
    own = [
        record
        for record in records
        if record.comment == job.slurm_comment or (job.is_external and record.submit_time == job.slurm_submit_time)
    ]
    record = own[-1] if own else records[-1]
    tag_matches = bool(own)
    if not tag_matches and record.comment:
        # Slurm reused the id after its state was reset: this record is another job's.
        return 0
    now = timezone.now()
    with transaction.atomic():
        locked = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
        cause = interrupted_run_state(job=locked, records=records, current_start=record.start_time)
        transitions = slurm_record_apply(job=locked, slurm_job=record, now=now, requeue_cause=cause)
        if transitions is None:
            return 0
        locked.save(update_fields=[*_SYNCED_FIELDS])
        JobTransition.objects.bulk_create(transitions)
        transaction.on_commit(lambda: jobs_push([locked.pk]))
    return 1
