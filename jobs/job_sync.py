"""Worker-side job services: deliver a submission to Slurm exactly once, cancel in Slurm, follow Slurm's state.

Only Celery tasks call these: they build Slurm clients, which read the cluster's key.

Exactly once: a job goes to Slurm tagged with its portal id (the comment). Before any attempt after the
first, the worker looks for that tag in slurmctld and in accounting, so a lost reply, a killed worker or a
redelivered message finds the job instead of submitting it again. A lease on the job row keeps two
workers from submitting at the same time, and the periodic sync adopts any tagged job whose submission
was never recorded, and cancels a second Slurm job carrying the same tag should one ever appear.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters import accounts
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount
from clusters.services import cluster_unreachable_record
from clusters.slurm import SlurmClient, SlurmError, SlurmNotFound, SlurmRetryableError, SlurmTerminalError, SlurmTimeout
from clusters.slurm.types import AccountingRecord, JobSubmission, SlurmJob
from clusters.slurm.types import JobState as SlurmState
from jobs.job_services import cancelled_before_slurm, job_transition, jobs_push
from jobs.models import JOB_COMMENT_PREFIX, Job, JobState, JobTransition
from jobs.paths import JobDirectoryError, job_directory_prepare
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


@dataclass(frozen=True)
class Delivery:
    """What became of one delivery attempt; `retry_in` seconds when it should be tried again."""

    outcome: str
    retry_in: float | None = None


def job_deliver(*, job_id: uuid.UUID) -> Delivery:
    """Submit a queued job to Slurm, unless an earlier attempt already did; safe to call any number of times."""
    now = timezone.now()
    with transaction.atomic():
        # Lock the job row only ("self"): locking the joined project and cluster rows too would deadlock with
        # a concurrent submission, whose foreign-key checks take a share lock on those rows.
        jobs = Job.objects.select_for_update(of=("self",), no_key=True).select_related("cluster", "project__tenant")
        job = jobs.filter(pk=job_id).first()
        if job is None or job.state != JobState.QUEUED:
            return Delivery("nothing to do")
        if job.submit_lease_until is not None and job.submit_lease_until > now:
            return Delivery("another worker holds it")
        if job.cancel_requested_at is not None and job.submit_attempts == 0:
            _cancel_unsubmitted(job, now=now)
            return Delivery("cancelled before submission")
        if now - job.created_at > timedelta(hours=settings.JOB_SUBMIT_GIVE_UP_HOURS):
            _reject(job, f"Slurm could not be reached for {settings.JOB_SUBMIT_GIVE_UP_HOURS} hours: {job.last_error}")
            return Delivery("gave up")
        job.submit_attempts += 1
        job.submit_lease_until = now + timedelta(seconds=settings.JOB_SUBMIT_LEASE_SECONDS)
        job.save(update_fields=["submit_attempts", "submit_lease_until"])
    client = slurm_client_for(job.cluster)
    try:
        if job.submit_attempts > 1:
            found = _find_tagged(client=client, job=job)
            if found is not None:
                _record_submitted(job_id=job.id, slurm_job_id=found, detail="found in Slurm after a lost reply")
                return Delivery("found in Slurm")
        if job.cancel_requested_at is not None:
            with transaction.atomic():
                locked = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
                if locked.state == JobState.QUEUED:
                    _cancel_unsubmitted(locked, now=timezone.now())
            return Delivery("cancelled before submission")
        job_directory_prepare(
            log_root=job.cluster.log_root, working_directory=job.working_directory, username=job.cluster_username
        )
        result = client.submit_job(user=job.cluster_username, submission=_submission(job))
    except JobDirectoryError as exc:
        _reject_by_id(job.id, str(exc))
        return Delivery("rejected")
    except SlurmRetryableError as exc:
        return _retry_later(job, exc)
    except SlurmTerminalError as exc:
        if _is_invalid_account(exc) and job.submit_attempts <= 2:
            # The member or the project may be newer than the last account sync: sync now, then try again.
            return _sync_account_then_retry(job, exc)
        _reject_by_id(job.id, _slurm_words(exc))
        return Delivery("rejected")
    _record_submitted(job_id=job.id, slurm_job_id=result.job_id, detail=f"Slurm job {result.job_id}")
    return Delivery("submitted")


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
    )


def _find_tagged(*, client: SlurmClient, job: Job) -> int | None:
    """The Slurm job id carrying this job's tag, in slurmctld or (for a job that already ended) accounting."""
    tag = job.slurm_comment
    listing = client.list_jobs()
    for slurm_job in listing.jobs if listing else ():
        if slurm_job.comment == tag:
            return slurm_job.job_id
    since = job.created_at - timedelta(minutes=1)
    for record in client.accounting_jobs(account=job.project.slurm_account, start_time=since):
        if record.comment == tag:
            return record.job_id
    return None


def _retry_later(job: Job, exc: SlurmError) -> Delivery:
    # 5 s, 10 s, 20 s ... up to the cap, jittered so a returning cluster is not hit by every job at once.
    delay = min(5 * 2 ** max(job.submit_attempts - 1, 0), settings.JOB_SUBMIT_RETRY_MAX_SECONDS)
    delay = delay * random.uniform(0.8, 1.2)  # noqa: S311 -- jitter, not security
    ambiguous = isinstance(exc, SlurmTimeout)
    message = f"Slurm is not answering (attempt {job.submit_attempts}): {exc}; the portal will try again"
    if ambiguous:
        message += " and check first whether the earlier attempt arrived"
    Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
        last_error=message + ".",
        submit_lease_until=None,
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
        updated_at=timezone.now(),
    )
    if exc.retryable:
        cluster_unreachable_record(cluster_id=job.cluster_id, error=str(exc))
    jobs_push([job.pk])
    return Delivery("retry", retry_in=delay)


def _sync_account_then_retry(job: Job, exc: SlurmError) -> Delivery:
    try:
        accounts.project_slurm_sync(project_id=job.project_id)
    except SlurmError as sync_error:
        return _retry_later(job, sync_error)
    Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
        last_error=f"Slurm did not know the project's account yet ({_slurm_words(exc)}); synced it, retrying.",
        submit_lease_until=None,
        next_attempt_at=timezone.now(),
    )
    return Delivery("retry after account sync", retry_in=0)


def _is_invalid_account(exc: SlurmError) -> bool:
    return any(message.error_number == INVALID_ACCOUNT_ERROR for message in exc.messages)


def _slurm_words(exc: SlurmError) -> str:
    words = "; ".join(str(message) for message in exc.messages)
    return words or str(exc)


def _record_submitted(*, job_id: uuid.UUID, slurm_job_id: int, detail: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job_id)
        if job.slurm_job_id is not None:
            if job.slurm_job_id != slurm_job_id:  # the sync adopted another copy first; keep one
                logger.error("job %s: Slurm jobs %s and %s carry its tag", job.pk, job.slurm_job_id, slurm_job_id)
            return
        job.slurm_job_id = slurm_job_id
        job.submitted_at = now
        job.submit_lease_until = None
        job.last_error = ""
        job.updated_at = now
        fields = ["slurm_job_id", "submitted_at", "submit_lease_until", "last_error", "updated_at"]
        if job.state == JobState.QUEUED:
            job_transition(job=job, to_state=JobState.PENDING, detail=detail, at=now).save()
            fields.append("state")
        job.save(update_fields=fields)
        if job.cancel_requested_at is not None:
            task_enqueue_on_commit("jobs.tasks.job_cancel", str(job_id), fallback="the next job sync cancels it")
        transaction.on_commit(lambda: jobs_push([job_id]))


def _cancel_unsubmitted(job: Job, *, now: datetime) -> None:
    requester = job.cancel_requested_by.username if job.cancel_requested_by else "a user"
    job_transition(job=job, to_state=JobState.CANCELLED, detail=cancelled_before_slurm(requester), at=now).save()
    job.ended_at = now
    job.submit_lease_until = None
    job.updated_at = now
    job.save(update_fields=["state", "ended_at", "submit_lease_until", "updated_at"])
    transaction.on_commit(lambda: jobs_push([job.pk]))


def _reject(job: Job, message: str) -> None:
    now = timezone.now()
    job_transition(job=job, to_state=JobState.REJECTED, detail=message[:500], at=now).save()
    job.last_error = message
    job.ended_at = now
    job.submit_lease_until = None
    job.updated_at = now
    job.save(update_fields=["state", "last_error", "ended_at", "submit_lease_until", "updated_at"])
    transaction.on_commit(lambda: jobs_push([job.pk]))


def _reject_by_id(job_id: uuid.UUID, message: str) -> None:
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job_id)
        if job.state == JobState.QUEUED and job.slurm_job_id is None:
            _reject(job, message)


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
    now = timezone.now()
    if listing is None:
        result.unchanged_listing = True
        Cluster.objects.filter(pk=cluster.pk).update(jobs_synced_at=now, jobs_sync_error="")
        return result
    result.listed = len(listing.jobs)

    tagged: dict[uuid.UUID, list[SlurmJob]] = {}
    untagged: list[SlurmJob] = []
    for slurm_job in listing.jobs:
        job_id = _tag_of(slurm_job.comment)
        if job_id is not None:
            tagged.setdefault(job_id, []).append(slurm_job)
        else:
            untagged.append(slurm_job)

    known = {
        job.pk: job
        for job in Job.objects.filter(cluster=cluster, pk__in=list(tagged)).only(
            "pk", "slurm_job_id", "state", "started_at"
        )
    }
    updates: dict[uuid.UUID, SlurmJob] = {}
    for job_id, copies in tagged.items():
        job = known.get(job_id)
        if job is None:
            continue  # another portal's job, or one whose record was deleted
        if job.slurm_job_id is None and job.is_final:
            # Cancelled or rejected in the portal while a lost submission reached Slurm after all: stop it.
            for orphan in copies:
                if not orphan.state.is_finished:
                    result.duplicates_cancelled += 1
                    result.requests += _cancel_duplicate(client=client, job_id=job_id, slurm_job=orphan)
            continue
        keep = next((copy for copy in copies if copy.job_id == job.slurm_job_id), None) or min(
            copies, key=lambda copy: copy.job_id
        )
        updates[job_id] = keep
        for extra in copies:
            if extra is not keep and not extra.state.is_finished:
                result.duplicates_cancelled += 1
                result.requests += _cancel_duplicate(client=client, job_id=job_id, slurm_job=extra)

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

    # Jobs the portal believes active but slurmctld no longer lists: their end is in accounting.
    listed_ids = {slurm_job.job_id for slurm_job in listing.jobs}
    vanished = Job.objects.filter(cluster=cluster, state__in=[JobState.PENDING, JobState.RUNNING]).exclude(
        slurm_job_id__in=listed_ids
    )
    for job in vanished.select_related("project")[:100]:
        result.requests += 1
        result.looked_up_in_accounting += 1
        result.changed += _apply_accounting(cluster=cluster, client=client, job=job)

    Cluster.objects.filter(pk=cluster.pk).update(
        jobs_listed_at=listing.last_update or now, jobs_synced_at=now, jobs_sync_error=""
    )
    return result


def _tag_of(comment: str) -> uuid.UUID | None:
    if not comment.startswith(JOB_COMMENT_PREFIX):
        return None
    try:
        return uuid.UUID(comment[len(JOB_COMMENT_PREFIX) :])
    except ValueError:
        return None


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
    with transaction.atomic():
        jobs = Job.objects.select_for_update(of=("self",), no_key=True).filter(cluster=cluster, pk__in=list(updates))
        for job in jobs:
            new_transitions = _apply(job=job, slurm_job=updates[job.pk], now=now, requeue_cause=causes.get(job.pk))
            if new_transitions is not None:
                changed.append(job)
                transitions.extend(new_transitions)
        Job.objects.bulk_update(changed, fields=_SYNCED_FIELDS, batch_size=500)
        JobTransition.objects.bulk_create(transitions, batch_size=500)
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
    "exit_code",
    "last_error",
    "submit_lease_until",
    "updated_at",
]


def _apply(
    *, job: Job, slurm_job: SlurmJob | AccountingRecord, now: datetime, requeue_cause: SlurmState | None = None
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
    if nodes:
        job.nodes = nodes[:500]
    ran_by_accounting = getattr(slurm_job, "elapsed_seconds", 0) > 0
    if job.state == JobState.RUNNING or (job.is_final and (job.nodes or ran_by_accounting)):
        job.started_at = slurm_job.start_time or job.started_at
    if job.is_final:
        job.ended_at = slurm_job.end_time or job.ended_at or now
        job.exit_code = slurm_job.exit_code
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
        transitions = _apply(job=locked, slurm_job=record, now=now, requeue_cause=cause)
        if transitions is None:
            return 0
        locked.save(update_fields=[*_SYNCED_FIELDS])
        JobTransition.objects.bulk_create(transitions)
        transaction.on_commit(lambda: jobs_push([locked.pk]))
    return 1
