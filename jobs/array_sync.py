"""Job arrays on the worker side: each task's state from Slurm's records, in bulk, the array's overall state and
progress from its tasks, and the cancel of one task in Slurm.

Slurm lists an array as one record per task it has started or finished (with the task's own job id) plus one
record for the tasks still waiting (`array_task_string` "2-19%4"). A sync reads every task of the arrays it
touches in one query and writes the changed ones in one statement, whatever the number of tasks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from django.db import transaction
from django.utils import timezone
from fast_update.query import FastUpdateQuerySet

from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.slurm import SlurmTerminalError
from clusters.slurm.types import AccountingRecord, SlurmJob
from jobs.arrays import ArrayExpressionError, array_parse, array_progress
from jobs.job_services import job_transition, jobs_push, jobs_tasks_push
from jobs.models import FINAL_JOB_STATES, Job, JobArrayTask, JobState, JobTransition

logger = logging.getLogger(__name__)

SlurmRecord = SlurmJob | AccountingRecord

# The task fields a sync writes.
_TASK_FIELDS = [
    "state",
    "slurm_state",
    "state_reason",
    "slurm_job_id",
    "nodes",
    "exit_code",
    "started_at",
    "ended_at",
    "updated_at",
]
# The array job's fields a sync writes.
_ARRAY_FIELDS = [
    "state",
    "slurm_state",
    "state_reason",
    "slurm_job_id",
    "submitted_at",
    "started_at",
    "ended_at",
    "exit_code",
    "array_progress",
    "last_error",
    "submit_lease_until",
    "updated_at",
]
# Tasks of a waiting record can be named with Slurm's largest index; the portal's own limit checked the submission.
_ANY_INDEX = 2**31


def waiting_indexes(task_string: str) -> tuple[int, ...]:
    """The task indexes a waiting record names ("2-19%4", "3,5-7"); () when Slurm wrote something unexpected."""
    try:
        return array_parse(task_string, max_array_size=_ANY_INDEX).indexes
    except ArrayExpressionError:
        logger.warning("unreadable array task string %r", task_string)
        return ()


def array_records_of(job: Job, copies: Sequence[SlurmJob]) -> tuple[list[SlurmJob], list[SlurmJob]]:
    """Split the records carrying an array job's tag into its own (the array it was submitted as) and those of any
    other submission with the same tag (a duplicate, to cancel)."""
    array_ids = {copy.array_job_id or copy.job_id for copy in copies}
    own_id = job.slurm_job_id if job.slurm_job_id in array_ids else min(array_ids)
    own = [copy for copy in copies if (copy.array_job_id or copy.job_id) == own_id]
    return own, [copy for copy in copies if (copy.array_job_id or copy.job_id) != own_id]


def arrays_apply_slurm_state(
    *,
    cluster: Cluster,
    updates: Mapping[uuid.UUID, Sequence[SlurmRecord]],
    forgotten: set[uuid.UUID] | None = None,
) -> int:
    """Bring these arrays' tasks, and the arrays, in line with Slurm's records of them; returns how many arrays
    changed. One query reads all their tasks and one statement writes the changed ones. Pushes the changes.

    `forgotten` collects the arrays with a running task that no record names: slurmctld forgot it after it
    ended (MinJobAge) before a sync saw the end, so its end is in accounting."""
    if not updates:
        return 0
    now = timezone.now()
    changed_jobs: list[Job] = []
    changed_tasks: list[JobArrayTask] = []
    transitions: list[JobTransition] = []
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update(of=("self",), no_key=True).filter(cluster=cluster, pk__in=list(updates))
        )
        tasks_of: dict[uuid.UUID, list[JobArrayTask]] = {job.pk: [] for job in jobs}
        for task in JobArrayTask.objects.filter(job_id__in=list(tasks_of)):
            tasks_of[task.job_id].append(task)
        for job in jobs:
            tasks = tasks_of[job.pk]
            changed, named = _tasks_apply(tasks=tasks, records=updates[job.pk], now=now)
            changed_tasks += changed
            if forgotten is not None and any(
                task.state == JobState.RUNNING and task.index not in named for task in tasks
            ):
                forgotten.add(job.pk)
            new_transitions = _array_apply(job=job, tasks=tasks, records=updates[job.pk], now=now)
            if new_transitions is not None:
                changed_jobs.append(job)
                transitions += new_transitions
        if changed_tasks:
            FastUpdateQuerySet(model=JobArrayTask).fast_update(changed_tasks, _TASK_FIELDS, unfiltered=True)
        if changed_jobs:
            FastUpdateQuerySet(model=Job).fast_update(changed_jobs, _ARRAY_FIELDS, unfiltered=True)
        JobTransition.objects.bulk_create(transitions)
        changed_ids = [job.pk for job in changed_jobs]
        transaction.on_commit(lambda: jobs_push(changed_ids))
        # Tasks that changed in an array whose own row did not: its page redraws its task table.
        tasks_only = {task.job_id for task in changed_tasks} - set(changed_ids)
        if tasks_only:
            transaction.on_commit(lambda: jobs_tasks_push(tasks_only))
    return len(changed_jobs)


def array_rebuilt_apply(
    *, job: Job, tasks: list[JobArrayTask], records: Sequence[SlurmRecord], now: datetime
) -> list[JobTransition]:
    """Set a rebuilt array's tasks (not stored yet) and the array itself from Slurm's records of it, as a sync
    would; the array's transitions (jobs.job_recovery)."""
    _tasks_apply(tasks=tasks, records=records, now=now)
    return _array_apply(job=job, tasks=tasks, records=records, now=now) or []


def _tasks_apply(
    *, tasks: list[JobArrayTask], records: Sequence[SlurmRecord], now: datetime
) -> tuple[list[JobArrayTask], set[int]]:
    """Set each task's fields from its record; the tasks that changed, and the indexes the records name."""
    from jobs.job_sync import SLURM_TO_PORTAL_STATE

    by_index = {task.index: task for task in tasks}
    changed: dict[int, JobArrayTask] = {}
    named: set[int] = set()
    # The waiting record first: a task's own record, when Slurm lists both in one listing, is the newer word.
    ordered = sorted(records, key=lambda record: record.array_task_id is not None)
    for record in ordered:
        state = SLURM_TO_PORTAL_STATE.get(record.state)
        if state is None:
            continue
        if record.array_task_id is None:
            indexes = waiting_indexes(getattr(record, "array_task_string", ""))
        else:
            indexes = (record.array_task_id,)
        reason = getattr(record, "state_reason", "")
        named.update(indexes)
        for index in indexes:
            task = by_index.get(index)
            if task is None or task.is_final:
                continue
            before = [getattr(task, field) for field in _TASK_FIELDS]
            task.state = state
            task.slurm_state = record.state.value
            task.state_reason = "" if reason == "None" else reason[:200]
            if record.array_task_id is not None:
                task.slurm_job_id = record.job_id
                nodes = getattr(record, "nodes", "")
                task.nodes = nodes[:500] or task.nodes
                ran = bool(nodes) or getattr(record, "elapsed_seconds", 0) > 0
                if ran:
                    task.started_at = record.start_time or task.started_at or now
                if task.is_final:
                    task.ended_at = record.end_time or now
                    task.exit_code = record.exit_code
            elif task.is_final:  # cancelled while still waiting: it never ran
                task.ended_at = now
            if [getattr(task, field) for field in _TASK_FIELDS[:-1]] != before[:-1]:
                task.updated_at = now
                changed[index] = task
    if any(isinstance(record, SlurmJob) for record in records):
        # Slurm takes a waiting task that was cancelled on its own out of the waiting record and lists it no more.
        for task in tasks:
            if task.index not in named and not task.is_final and task.cancel_requested_at is not None:
                task.state, task.slurm_state, task.state_reason = JobState.CANCELLED, "CANCELLED", ""
                task.ended_at = task.updated_at = now
                changed[task.index] = task
    return list(changed.values()), named


def _array_apply(
    *, job: Job, tasks: list[JobArrayTask], records: Sequence[SlurmRecord], now: datetime
) -> list[JobTransition] | None:
    """Set the array's overall state, times and progress from its tasks; its transitions, or None if unchanged."""
    before = [getattr(job, field) for field in _ARRAY_FIELDS]
    if job.slurm_job_id is None and records:  # adopted: submitted, but the reply was lost
        first = records[0]
        job.slurm_job_id = first.array_job_id or first.job_id
        job.submitted_at = first.submit_time or now
        job.submit_lease_until = None
        job.last_error = ""
    job.array_progress = array_progress(task.state for task in tasks)
    started = [task.started_at for task in tasks if task.started_at is not None]
    job.started_at = min(started) if started else None
    new_state = array_state(tasks)
    waiting = next((record for record in records if record.array_task_id is None), None)
    job.slurm_state = waiting.state.value if waiting is not None else (records[-1].state.value if records else "")
    reason = getattr(waiting, "state_reason", "") if waiting is not None else ""
    job.state_reason = "" if reason == "None" else reason[:200]
    transitions: list[JobTransition] = []
    if new_state != job.state and not job.is_final:
        detail = _progress_words(job.array_progress)
        at = job.started_at if new_state == JobState.RUNNING and job.started_at else now
        transitions.append(job_transition(job=job, to_state=new_state, detail=detail, at=min(at, now)))
    if job.is_final:
        ended = [task.ended_at for task in tasks if task.ended_at is not None]
        job.ended_at = max(ended) if ended else now
        codes = [task.exit_code for task in tasks if task.exit_code is not None]
        job.exit_code = max(codes) if codes else None  # as Slurm reports an array: its highest exit code
    if [getattr(job, field) for field in _ARRAY_FIELDS] == before:
        return None
    job.updated_at = now
    return transitions


def array_state(tasks: Sequence[JobArrayTask]) -> JobState:
    """An array's overall state: running while any task runs or some have ended and others wait; once every
    task ended, completed if all did, failed if any failed (or timed out, or lost its node), else cancelled."""
    states = {task.state for task in tasks}
    if not states:
        return JobState.PENDING
    if states <= FINAL_JOB_STATES:
        if states == {JobState.COMPLETED}:
            return JobState.COMPLETED
        if states & {JobState.FAILED, JobState.TIMEOUT, JobState.NODE_FAIL}:
            return JobState.FAILED
        return JobState.CANCELLED
    if JobState.RUNNING in states or states & FINAL_JOB_STATES:
        return JobState.RUNNING
    return JobState.PENDING


def _progress_words(progress: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {key}" for key, count in progress.items() if count)


def array_task_cancel_in_slurm(*, job_id: uuid.UUID, index: int) -> None:
    """Cancel one task of an array in Slurm, as the job's owner; the sync records what Slurm reports next."""
    job = Job.objects.select_related("cluster").filter(pk=job_id).first()
    if job is None or job.is_final or job.slurm_job_id is None:
        return
    task = JobArrayTask.objects.filter(job=job, index=index).first()
    if task is None or task.is_final:
        return
    try:
        slurm_client_for(job.cluster).cancel_job(user=job.cluster_username, job_id=job.slurm_job_id, array_task=index)
    except SlurmTerminalError as exc:
        logger.info("job %s: cancel of task %s in Slurm answered %s", job.pk, index, exc)
