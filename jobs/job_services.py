"""Writes for jobs on the web side: accept a submission, request a cancel, save templates, push changes.

Nothing here calls Slurm: accepted work is handed to the workers with `transaction.on_commit`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.http import Http404
from django.utils import timezone

from clusters.models import Cluster, Partition
from clusters.selectors import SubmissionTarget, cluster_list_active, submission_target_get
from jobs.arrays import ArrayExpressionError, ArraySpec, array_parse, array_tasks_end_before_slurm
from jobs.models import Job, JobArrayTask, JobState, JobTemplate, JobTransition
from jobs.paths import JobPaths, job_paths
from jobs.pipelines import DependencyRequest, dependencies_create, dependencies_validate, dependents_wake
from jobs.reasons import pending_reason_text
from jobs.sync_schedule import delivery_wake_needed
from jobs.templates import BUILTIN_TEMPLATES
from portal import metrics
from portal.channel_sends import group_send_all
from portal.db import insert_prepared, prepared_cursor
from portal.errors import Conflict
from portal.queue import task_enqueue_on_commit
from portal.request_ids import current_request_id
from quotas.services import Reservation, quota_release, quota_reserve, quota_reserve_batch
from tenants.models import Project
from tenants.services import audit_record, audit_record_many

logger = logging.getLogger(__name__)

# Slurm takes a job name up to 200 characters (longer ones are cut); control characters would corrupt
# squeue's output and our logs.
JOB_NAME_MAX_LENGTH = 200
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
_ENVIRONMENT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Slurm sets these itself; a value from the user would be overwritten or would confuse the job.
_RESERVED_ENVIRONMENT_PREFIXES = ("SLURM_", "SBATCH_")
MAX_ENVIRONMENT_ENTRIES = 200


# Channel groups ----------------------------------------------------------------------------------------


def project_jobs_group(project_id: int) -> str:
    return f"jobs.project.{project_id}"


def job_group(job_id: uuid.UUID | str) -> str:
    return f"jobs.job.{job_id}"


def job_event(job: Job) -> dict[str, Any]:
    """What watchers of a project or a job receive on each change (no script, no environment)."""
    return {
        "id": str(job.id),
        "project": f"{job.project.tenant.slug}/{job.project.slug}",
        "cluster": job.cluster.name,
        "name": job.name,
        "user": job.user.username if job.user else None,
        "cluster_username": job.cluster_username,
        "is_external": job.is_external,
        "state": job.state,
        "slurm_state": job.slurm_state,
        "state_reason": job.state_reason,
        "pending_reason": pending_reason_text(job.state_reason) if job.state == JobState.PENDING else "",
        "last_error": job.last_error,
        "slurm_job_id": job.slurm_job_id,
        "nodes": job.nodes,
        "exit_code": job.exit_code,
        "gpus": job.gpus,
        "node_count": job.node_count,
        "total_gpus": job.total_gpus,
        "switches": job.switches,
        "gpu_type": job.gpu_type,
        "started_at": _iso(job.started_at),
        "ended_at": _iso(job.ended_at),
        "updated_at": _iso(job.updated_at),
        # A job array's tasks by state ({pending, running, completed, failed, cancelled}); null for a plain job.
        "array_progress": job.array_progress if job.is_array else None,
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def jobs_push(job_ids: Iterable[uuid.UUID]) -> None:
    """Send the current state of these jobs to their project's and their own watchers.

    Called after commit. A lost push only delays what watchers see: the database holds the truth, and
    pages and streams re-read it when they connect.
    """
    ids = list(job_ids)
    if ids:
        jobs_push_loaded(Job.objects.filter(pk__in=ids).select_related("project__tenant", "cluster", "user"))


def jobs_push_loaded(jobs: Iterable[Job]) -> None:
    """`jobs_push` for jobs in hand, as just stored with their project, tenant, cluster and user. The watchers
    of a job's pipeline neighbours (its parents and children) are told too, so their pages redraw its graph."""
    sends: list[tuple[str, dict[str, Any]]] = []
    changed = {job.pk: job for job in jobs}
    for job in changed.values():
        message = {"type": "job.update", "job": job_event(job)}
        sends += [(project_jobs_group(job.project_id), message), (job_group(job.id), message)]
    try:
        sends += _pipeline_sends(changed)
        group_send_all(sends)
    except Exception:  # Redis down must not fail the write that has already committed.
        logger.warning("could not push job changes to watchers", exc_info=True)


# Prepared (portal/db.py): every delivery and sync that changes a job runs it, and it almost always finds nothing.
_NEIGHBOURS = "SELECT child_id, parent_id FROM jobs_jobdependency WHERE child_id = ANY(%s) OR parent_id = ANY(%s)"


def _pipeline_sends(changed: dict[uuid.UUID, Job]) -> list[tuple[str, dict[str, Any]]]:
    """`pipeline.update` for each neighbour of a changed job (one query): the step's id and state only. A
    neighbour is in the same project, so whoever may watch it may see the step."""
    if not changed:
        return []
    sends: dict[tuple[str, str], dict[str, Any]] = {}
    with prepared_cursor() as cursor:
        cursor.execute(_NEIGHBOURS, [list(changed), list(changed)])
        edges = cursor.fetchall()
    for child_id, parent_id in edges:
        for step_id, neighbour_id in ((child_id, parent_id), (parent_id, child_id)):
            step = changed.get(step_id)
            if step is not None:
                sends[(str(neighbour_id), str(step_id))] = {
                    "type": "pipeline.update",
                    "step": {"id": str(step.pk), "state": step.state, "updated_at": _iso(step.updated_at)},
                }
    return [(job_group(neighbour_id), message) for (neighbour_id, _), message in sends.items()]


def jobs_tasks_push(job_ids: Iterable[uuid.UUID]) -> None:
    """Tell the watchers of these arrays that some of their tasks changed while the array's own row did not
    (a task's nodes, its own Slurm id): `job.tasks`, with the array's id only. Called after commit."""
    try:
        group_send_all([(job_group(job_id), {"type": "job.tasks", "job": {"id": str(job_id)}}) for job_id in job_ids])
    except Exception:
        logger.warning("could not push task changes to watchers", exc_info=True)


def job_transition(*, job: Job, to_state: JobState, detail: str = "", at: datetime | None = None) -> JobTransition:
    """Record a change of state on `job` (the caller saves the job in the same transaction)."""
    transition = JobTransition(job=job, from_state=job.state, to_state=to_state, at=at or timezone.now(), detail=detail)
    job.state = to_state
    return transition


# Submit ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRequest:
    """A submission as the API or a page received it; None means "not given" (a template or default fills it)."""

    cluster: str
    partition: str | None = None
    gpus: int | None = None  # on each node
    node_count: int | None = None
    max_switches: int | None = None  # all nodes under at most this many leaf switches (`--switches`)
    switch_wait_minutes: int | None = None  # the longest to wait for that
    gpu_type: str | None = None
    time_limit_minutes: int | None = None
    name: str | None = None
    script: str | None = None
    environment: Mapping[str, str] | None = None
    cpus: int | None = None
    memory_gb: int | None = None
    template: str | None = None
    array: str | None = None  # a job array's indexes ("0-99%10"); None or "": a plain job
    idempotency_key: str = ""
    rerun_of: uuid.UUID | None = None  # the job this one runs again (jobs/reruns.py)
    depends_on: tuple[DependencyRequest, ...] = ()  # the jobs it waits for (jobs/pipelines.py)


@dataclass(frozen=True)
class Accepted:
    """A submission's outcome: the job; whether this request created it (False: a retry with the same key got the
    job the first request created); and, when it did, what it stored with it, for a reply without reading back."""

    job: Job
    created: bool
    transitions: list[JobTransition] = field(default_factory=list)
    reservation: Reservation | None = None
    quota_gpu_type: str | None = None
    parents: list[tuple[Job, str]] = field(default_factory=list)  # the jobs it waits for, with each condition


def job_submit(*, user: User, project: Project, request: JobRequest) -> tuple[Job, bool]:
    """`job_submit_accepted`, answering the job and whether it is new."""
    accepted = job_submit_accepted(user=user, project=project, request=request)
    return accepted.job, accepted.created


def job_submit_accepted(
    *, user: User, project: Project, request: JobRequest, target: SubmissionTarget | None = None
) -> Accepted:
    """Validate a submission against the cluster as last synced, store it `queued` and hand it to a worker.

    The caller has checked that `user` may submit to `project`, and may pass the cluster as it read it
    (`jobs.selectors.submission_project_get` reads both in one query). Every problem is
    reported at once, per field, with what to change. A repeated `idempotency_key` from the same user returns
    the job the first request created.
    """
    values = _with_template_defaults(project=project, request=request)
    if target is None:
        target = submission_target_get(cluster_name=values["cluster"], user=user)
    problems = _validated(target=target, values=values)
    parents: list[tuple[Job, str]] = []
    if request.depends_on:  # a query only for a job of a pipeline
        parents, dependency_problems = dependencies_validate(
            project=project, cluster=target.cluster if target else None, requested=request.depends_on
        )
        if dependency_problems:
            problems["depends_on"] = dependency_problems
    if problems:
        earlier = _earlier(user=user, idempotency_key=request.idempotency_key)
        if earlier is not None:  # a retry of a request that was accepted, whatever has changed since
            return Accepted(job=earlier, created=False)
        # The cluster as known: a name the user made up must not become a label.
        metrics.job_refused(cluster=target.cluster.name if target else "", reason="invalid")
        raise ValidationError(problems)
    assert target is not None
    cluster = target.cluster
    job_id = uuid.uuid4()
    paths = job_paths(
        log_root=cluster.log_root,
        tenant_slug=project.tenant.slug,
        project_slug=project.slug,
        job_id=job_id,
        is_array=values["array_spec"] is not None,
    )
    now = timezone.now()
    try:
        with transaction.atomic():
            job = _job_new(
                job_id=job_id,
                user=user,
                project=project,
                cluster=cluster,
                username=target.username or "",
                values=values,
                paths=paths,
                now=now,
                idempotency_key=request.idempotency_key,
                rerun_of=request.rerun_of,
            )
            accepted = _job_create(job, values=values, now=now, parents=parents)
    except IntegrityError:
        # The key was used before (a retry), or raced in from a parallel request: the first one won. The unique
        # constraint answers this, so a new key costs no lookup.
        earlier = _earlier(user=user, idempotency_key=request.idempotency_key)
        if earlier is None:
            raise
        return Accepted(job=earlier, created=False)
    except Conflict as exc:  # no GPU-hours for it: quota_exceeded, no_allocation
        metrics.job_refused(cluster=cluster.name, reason=exc.code)
        raise
    metrics.job_accepted(cluster=cluster.name)
    # The first line of the job's way through the logs (README, "Logs and tracing a job"), with the request's id.
    logger.info(
        "job accepted",
        extra={**job_log_fields(accepted.job, cluster=cluster.name), "project": str(project), "user": user.username},
    )
    return accepted


def job_submission_problems(*, user: User, project: Project, request: JobRequest) -> dict[str, list[str]]:
    """Every problem `job_submit` would find with `request`, per field, without storing anything: for a form
    whose own parsing failed on some fields (left out of `request`), so that it shows all its errors at once."""
    try:
        values = _with_template_defaults(project=project, request=request)
    except ValidationError as error:
        return dict(error.message_dict)
    target = submission_target_get(cluster_name=values["cluster"], user=user)
    problems = _validated(target=target, values=values)
    if request.depends_on:
        _, dependency_problems = dependencies_validate(
            project=project, cluster=target.cluster if target else None, requested=request.depends_on
        )
        if dependency_problems:
            problems["depends_on"] = dependency_problems
    return problems


def job_log_fields(job: Job, *, cluster: str) -> dict[str, str]:
    """What a log line about `job` carries to be found by its id (`cluster`: its name, which the caller has loaded)."""
    return {"job_id": str(job.pk), "request_id": job.request_id, "cluster": cluster}


def _earlier(*, user: User, idempotency_key: str) -> Job | None:
    if not idempotency_key:
        return None
    return Job.objects.filter(user=user, idempotency_key=idempotency_key).first()


# Batches -----------------------------------------------------------------------------------------------

# The most jobs one `POST /api/v1/jobs/batch/` may carry: its jobs are validated, stored and reserved in one
# transaction, and a reply of 1,000 jobs is about 1 MB.
BATCH_MAX_JOBS = 1000


@dataclass(frozen=True)
class BatchAccepted:
    """A batch's outcome: its jobs in the order submitted, and whether this request created them (False: a retry
    with the same key got the jobs the first request created)."""

    jobs: list[Job]
    created: bool


def job_submit_batch(
    *,
    user: User,
    project: Project,
    requests: list[JobRequest],
    target: SubmissionTarget | None,
    idempotency_key: str = "",
) -> BatchAccepted:
    """Accept many jobs for one project and one cluster, all or none: each is validated as `job_submit_accepted`
    validates one, and every problem is reported under `jobs.<index>.<field>`; their GPU-hours are reserved
    together (`quota_reserve_batch`); they are stored with one insert per table and handed to the workers'
    batched delivery with at most one message. The queries are a constant few, whatever the number of jobs.

    The caller has checked that `user` may submit to `project` and passes the cluster as it read it (`target`,
    the cluster every request names). A repeated `idempotency_key` from the same user returns the batch the
    first request created."""
    keys = _batch_idempotency_keys(idempotency_key, len(requests))
    templates: dict[str, Any] = {}
    problems: dict[str, list[str]] = {}
    unknown_cluster: dict[str, list[str]] = {}
    all_values: list[dict[str, Any]] = []
    for index, request in enumerate(requests):
        try:
            values = _with_template_defaults(project=project, request=request, templates=templates)
        except ValidationError as exc:
            for name, messages in exc.message_dict.items():
                problems[f"jobs.{index}.{name}"] = messages
            continue
        if target is None:
            # The same unknown cluster for every job: said for each, the list of clusters read once.
            unknown_cluster = unknown_cluster or _validated(target=None, values=values)
            item_problems = unknown_cluster
        else:
            item_problems = _validated(target=target, values=values)
        for name, messages in item_problems.items():
            problems[f"jobs.{index}.{name}"] = messages
        if request.depends_on:
            problems[f"jobs.{index}.depends_on"] = [
                "A batch does not carry pipeline steps: submit a job that waits for other jobs on its own, with "
                "POST /api/v1/jobs/."
            ]
        all_values.append(values)
    if problems:
        earlier = _earlier_batch(user=user, keys=keys)
        if earlier:  # a retry of a batch that was accepted, whatever has changed since
            return BatchAccepted(jobs=earlier, created=False)
        metrics.job_refused(cluster=target.cluster.name if target else "", reason="invalid")
        raise ValidationError(problems)
    assert target is not None
    cluster = target.cluster
    now = timezone.now()
    jobs = []
    for values, key in zip(all_values, keys, strict=True):
        job_id = uuid.uuid4()
        paths = job_paths(
            log_root=cluster.log_root,
            tenant_slug=project.tenant.slug,
            project_slug=project.slug,
            job_id=job_id,
            is_array=values["array_spec"] is not None,
        )
        jobs.append(
            _job_new(
                job_id=job_id,
                user=user,
                project=project,
                cluster=cluster,
                username=target.username or "",
                values=values,
                paths=paths,
                now=now,
                idempotency_key=key,
            )
        )
    try:
        with transaction.atomic():
            _jobs_create(jobs=jobs, all_values=all_values, user=user, project=project, cluster=cluster, now=now)
    except IntegrityError:
        earlier = _earlier_batch(user=user, keys=keys)
        if not earlier:
            raise
        return BatchAccepted(jobs=earlier, created=False)
    except Conflict as exc:  # no GPU-hours for them: quota_exceeded, no_allocation
        metrics.job_refused(cluster=cluster.name, reason=exc.code)
        raise
    metrics.job_accepted(cluster=cluster.name, count=len(jobs))
    logger.info(
        "job batch accepted",
        extra={
            "request_id": current_request_id(),
            "cluster": cluster.name,
            "project": str(project),
            "user": user.username,
            "jobs": len(jobs),
            "first_job_id": str(jobs[0].pk),
        },
    )
    return BatchAccepted(jobs=jobs, created=True)


def _jobs_create(
    *, jobs: list[Job], all_values: list[dict[str, Any]], user: User, project: Project, cluster: Cluster, now: datetime
) -> None:
    """Store a batch's jobs, their array tasks, first transitions, audit events and reservations: one insert per
    table (array tasks 5,000 rows per insert), whatever the number of jobs."""
    Job.objects.bulk_create(jobs)
    tasks = []
    for job, values in zip(jobs, all_values, strict=True):
        spec: ArraySpec | None = values["array_spec"]
        if spec is not None:
            tasks += [JobArrayTask(job=job, index=index, updated_at=now) for index in spec.indexes]
            job.array_indexes = list(spec.indexes)  # type: ignore[attr-defined]  # the reservation's tasks, unread
    if tasks:
        JobArrayTask.objects.bulk_create(tasks, batch_size=5000)
    JobTransition.objects.bulk_create(
        [JobTransition(job=job, from_state="", to_state=JobState.QUEUED, at=now, detail="accepted") for job in jobs]
    )
    audit_record_many(
        actor=user,
        action="job.submit",
        targets=[(job, _submit_audit_after(job, cluster=cluster)) for job in jobs],
        tenant=project.tenant,
    )
    # Last, as for one job: the allocations' row locks are held only until the commit that follows.
    quota_reserve_batch(jobs=jobs, gpu_types=[values["quota_gpu_type"] for values in all_values], now=now)
    # One message at most for the whole batch: the run that takes it delivers every due job of the cluster.
    task_enqueue_on_commit(
        "jobs.tasks.job_submit",
        str(jobs[0].id),
        fallback="the workers' sweep submits the jobs",
        only_if=lambda: delivery_wake_needed(cluster.pk),
    )


def _batch_idempotency_keys(key: str, count: int) -> list[str]:
    """Each job of a batch sent with `Idempotency-Key: key` stores its own key, derived from the batch's and its
    place in it, so that the unique constraint on (user, key) makes a retry find the same batch; hashed to fit
    the column whatever the key's length, and prefixed so that it never meets a single submission's key."""
    if not key:
        return [""] * count
    digest = hashlib.sha256(key.encode()).hexdigest()[:40]
    return [f"batch:{digest}:{index}" for index in range(count)]


def _earlier_batch(*, user: User, keys: list[str]) -> list[Job]:
    if not keys or not keys[0]:
        return []
    found = {job.idempotency_key: job for job in Job.objects.filter(user=user, idempotency_key__in=keys)}
    return [found[key] for key in keys if key in found]


def _job_new(
    *,
    job_id: uuid.UUID,
    user: User,
    project: Project,
    cluster: Cluster,
    username: str,
    values: dict[str, Any],
    paths: JobPaths,
    now: datetime,
    idempotency_key: str,
    rerun_of: uuid.UUID | None = None,
) -> Job:
    """The job a validated submission stores (not saved yet)."""
    spec: ArraySpec | None = values["array_spec"]
    return Job(
        id=job_id,
        project=project,
        cluster=cluster,
        user=user,
        cluster_username=username,
        name=values["name"],
        partition=values["partition"],
        gpu_type=values["gpu_type"] or "",
        gpus=values["gpus"],
        node_count=values["node_count"],
        max_switches=values["max_switches"],
        switch_wait_minutes=values["switch_wait_minutes"],
        cpus=values["cpus"],
        memory_gb=values["memory_gb"],
        time_limit_minutes=values["time_limit_minutes"],
        script=values["script"],
        environment=dict(values["environment"]),
        template_id=values["template"] or "",
        array=spec.expression if spec else "",
        array_task_count=spec.task_count if spec else 0,
        array_max_running=spec.max_running if spec else None,
        array_progress={"pending": spec.task_count} if spec else {},
        idempotency_key=idempotency_key,
        rerun_of_id=rerun_of,
        request_id=current_request_id(),
        working_directory=paths.working_directory,
        stdout_path=paths.stdout,
        stderr_path=paths.stderr,
        state=JobState.QUEUED,
        created_at=now,
        updated_at=now,
        next_attempt_at=now,
    )


def _job_create(
    job: Job, *, values: dict[str, Any], now: datetime, parents: list[tuple[Job, str]] | None = None
) -> Accepted:
    """Store a job `_job_new` built, with its array tasks, dependencies, first transition, audit event and
    reservation, and hand it to the workers."""
    user, project, cluster = job.user, job.project, job.cluster
    spec: ArraySpec | None = values["array_spec"]
    insert_prepared(job)
    if spec is not None:
        JobArrayTask.objects.bulk_create(
            [JobArrayTask(job=job, index=index, updated_at=now) for index in spec.indexes], batch_size=1000
        )
        job.array_indexes = list(spec.indexes)  # type: ignore[attr-defined]  # the reservation's tasks, unread
    if parents:
        dependencies_create(child=job, parents=parents)
    accepted = JobTransition(job=job, from_state="", to_state=JobState.QUEUED, at=now, detail="accepted")
    insert_prepared(accepted)
    audit_record(
        actor=user,
        action="job.submit",
        target=job,
        tenant=project.tenant,
        before=None,
        after=_submit_audit_after(job, cluster=cluster, parents=parents),
    )
    # Last, so that the allocation's row lock is held only until the commit that follows. Refused for want of
    # GPU-hours, this raises and the transaction stores nothing.
    reservation = quota_reserve(job=job, gpu_type=values["quota_gpu_type"], now=now)
    # Watchers of the project learn of the job from the worker that delivers it (`_record` pushes it), moments
    # later: a push from here would cost the request a hop into an event loop. While an earlier message for the
    # cluster waits for a worker, the run that takes it delivers this job too, and none is sent.
    task_enqueue_on_commit(
        "jobs.tasks.job_submit",
        str(job.id),
        fallback="the workers' sweep submits the job",
        only_if=lambda: delivery_wake_needed(cluster.pk),
    )
    return Accepted(
        job=job,
        created=True,
        transitions=[accepted],
        reservation=reservation,
        quota_gpu_type=values["quota_gpu_type"],
        parents=list(parents or []),
    )


def _submit_audit_after(job: Job, *, cluster: Cluster, parents: list[tuple[Job, str]] | None = None) -> dict[str, Any]:
    return {
        "cluster": cluster.name,
        "partition": job.partition,
        "gpus": job.gpus,
        "gpu_type": job.gpu_type,
        **({"nodes": job.node_count} if job.node_count > 1 else {}),
        **({"array": job.array} if job.array else {}),
        **(
            {"depends_on": [{"job": str(parent.pk), "condition": condition} for parent, condition in parents]}
            if parents
            else {}
        ),
    }


def _with_template_defaults(
    *, project: Project, request: JobRequest, templates: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The request's values with its template's filling what it leaves out; `templates` (id -> template or None)
    spares a batch a lookup per job of the templates it has met."""
    given = {
        "cluster": request.cluster,
        "partition": request.partition,
        "gpus": request.gpus,
        "node_count": request.node_count,
        "max_switches": request.max_switches,
        "switch_wait_minutes": request.switch_wait_minutes,
        "gpu_type": request.gpu_type,
        "time_limit_minutes": request.time_limit_minutes,
        "name": request.name,
        "script": request.script,
        "environment": request.environment,
        "cpus": request.cpus,
        "memory_gb": request.memory_gb,
        "template": request.template,
        "array": request.array,
    }
    if not request.template:
        return given
    if templates is None:
        template = job_template_resolve(project=project, template_id=request.template)
    else:
        if request.template not in templates:
            templates[request.template] = job_template_resolve(project=project, template_id=request.template)
        template = templates[request.template]
    if template is None:
        raise ValidationError(
            {
                "template": [
                    f"No template '{request.template}' exists for project '{project}'; see GET /api/v1/job-templates/."
                ]
            }
        )
    for key in ("partition", "gpus", "node_count", "gpu_type", "time_limit_minutes", "script", "cpus", "memory_gb"):
        if given[key] is None:
            given[key] = getattr(template, key) or None
    if given["array"] is None:
        given["array"] = getattr(template, "array", "") or None
    if given["name"] is None:
        given["name"] = template.name
    if given["environment"] is None:
        given["environment"] = dict(template.environment)
    return given


def _validated(*, target: SubmissionTarget | None, values: dict[str, Any]) -> dict[str, list[str]]:
    """Fill defaults into `values` and return every problem found, per field."""
    problems: dict[str, list[str]] = {}

    def problem(field: str, message: str) -> None:
        problems.setdefault(field, []).append(message)

    if target is None:
        _no_such_cluster(values, problem)
        return problems
    if target.username is None:
        problem(
            "cluster",
            f"You have no username on cluster '{target.cluster.name}', so your jobs cannot run there; "
            "ask a portal admin to add your cluster account.",
        )
    partition = _validate_shape(values, target, problem)
    _validate_resources(values, partition, problem)
    _validate_name(values, problem)
    _validate_script(values, problem)
    _validate_environment(values, problem)
    _validate_array(values, problem)
    return problems


def _no_such_cluster(values: dict[str, Any], problem: Any) -> None:
    names = ", ".join(cluster_list_active().values_list("name", flat=True)) or "none yet"
    problem("cluster", f"There is no active cluster '{values['cluster']}'; choose one of: {names}.")


def _validate_shape(values: dict[str, Any], target: SubmissionTarget, problem: Any) -> Partition | None:
    """Fill and check the partition, GPUs and time limit: what a job may use, so what it reserves and costs."""
    partition = _partition_for(values, target.partitions, problem, target.cluster)
    _validate_gpus(values, partition, problem)
    _validate_nodes(values, partition, target, problem)
    values["quota_gpu_type"] = expected_gpu_type(gpu_type=values["gpu_type"], partition=partition)
    _validate_time_limit(values, partition, problem)
    return partition


def expected_gpu_type(*, gpu_type: str | None, partition: Partition | None) -> str | None:
    """The type a job's GPUs will have, which picks the allocation it draws on and its price: its own, or its
    partition's only one; None when GPUs of any type may come."""
    offered = partition.gpu_types if partition is not None else []
    return gpu_type or (offered[0] if len(offered) == 1 else None)


@dataclass(frozen=True)
class JobShape:
    """What a submission would ask of a cluster, with the defaults filled in as `job_submit` fills them."""

    cluster: Cluster
    partition: str
    gpu_type: str  # as asked; empty: any type
    expected_gpu_type: str | None  # see `expected_gpu_type`
    gpus: int  # on each node
    time_limit_minutes: int
    array_task_count: int = 0  # 0: a plain job
    node_count: int = 1
    cpus: int | None = None  # on each node; None: the partition's default
    memory_gb: int | None = None  # on each node; None: the partition's default


def job_shape_resolve(*, project: Project, request: JobRequest) -> JobShape:
    """The cluster, partition, GPUs and time limit `request` would get, checked as `job_submit` checks them
    (template, defaults and limits), without storing anything: for a cost estimate before submitting.
    Raises ValidationError naming every problem of those fields."""
    values = _with_template_defaults(project=project, request=request)
    problems: dict[str, list[str]] = {}

    def problem(field: str, message: str) -> None:
        problems.setdefault(field, []).append(message)

    target = submission_target_get(cluster_name=values["cluster"], user=AnonymousUser())
    if target is None:
        _no_such_cluster(values, problem)
    partition = _validate_shape(values, target, problem) if target is not None else None
    _validate_resources(values, partition, problem)
    _validate_array(values, problem)
    if problems:
        raise ValidationError(problems)
    assert target is not None
    assert partition is not None
    return JobShape(
        cluster=target.cluster,
        partition=partition.name,
        gpu_type=values["gpu_type"] or "",
        expected_gpu_type=values["quota_gpu_type"],
        gpus=values["gpus"],
        time_limit_minutes=values["time_limit_minutes"],
        array_task_count=values["array_spec"].task_count if values["array_spec"] else 0,
        node_count=values["node_count"],
        cpus=values["cpus"],
        memory_gb=values["memory_gb"],
    )


def _partition_for(
    values: dict[str, Any], partitions: dict[str, Partition], problem: Any, cluster: Cluster
) -> Partition | None:
    if not partitions:
        problem("partition", f"Cluster '{cluster.name}' has not been synced yet; try again in a minute.")
        return None
    name = values["partition"]
    if not name:
        default = next((p for p in partitions.values() if p.is_default), None)
        if default is None:
            problem("partition", f"Choose a partition: {', '.join(sorted(partitions))}.")
            return None
        values["partition"] = default.name
        return default
    if name not in partitions:
        problem(
            "partition",
            f"Cluster '{cluster.name}' has no partition '{name}'; choose one of: {', '.join(sorted(partitions))}.",
        )
        return None
    return partitions[name]


def _validate_gpus(values: dict[str, Any], partition: Partition | None, problem: Any) -> None:
    gpu_type = values["gpu_type"] or None
    values["gpu_type"] = gpu_type
    if values["gpus"] is None:
        values["gpus"] = 1
    gpus = values["gpus"]
    if partition is None:
        return
    if gpu_type is not None and gpu_type not in partition.gpu_types:
        offered = ", ".join(partition.gpu_types) or "none"
        problem("gpu_type", f"Partition '{partition.name}' has no GPUs of type '{gpu_type}'; it offers: {offered}.")
        return
    per_node = partition.max_gpus_per_node
    if gpu_type is not None:
        per_node = min(per_node, partition.gpus_per_node_by_type.get(gpu_type, per_node))
    if gpus < 1:
        problem("gpus", "Ask for at least 1 GPU.")
    elif gpus > per_node:
        kind = f"{gpu_type} " if gpu_type else ""
        problem(
            "gpus",
            f"`gpus` counts the GPUs on each node, and the nodes of partition '{partition.name}' have at most "
            f"{per_node} {kind}GPUs; ask for {per_node} or fewer per node, and for more nodes (`nodes`) if you "
            "need more GPUs.",
        )


# API v0.0.38 (Slurm 22.05) refuses `required_switches` and `wait_for_switch`: one switch is asked for there as a
# constraint over the nodes' switch features, which cannot say how long to wait (clusters/slurm/types.py).
_NO_SWITCH_WAIT_API_VERSIONS = frozenset({"0.0.38"})


def _validate_nodes(
    values: dict[str, Any], partition: Partition | None, target: SubmissionTarget, problem: Any
) -> None:
    """Fill and check `node_count`, `max_switches` and `switch_wait_minutes` against the partition's nodes."""
    if values["node_count"] is None:
        values["node_count"] = 1
    nodes = values["node_count"]
    switches, wait = values["max_switches"], values["switch_wait_minutes"]
    if nodes < 1:
        problem("nodes", "Ask for at least 1 node.")
        return
    if wait is not None and switches is None:
        problem("switch_wait_minutes", "Give `switches` too: the wait is how long to wait for that many switches.")
    if partition is None:
        return
    cluster = target.cluster
    gpu_type = values["gpu_type"]
    available = len(partition.node_names)
    what = "nodes"
    if values["gpus"] and partition.gpu_nodes_by_type:
        available = (
            partition.gpu_nodes_by_type.get(gpu_type, 0) if gpu_type else sum(partition.gpu_nodes_by_type.values())
        )
        what = f"nodes with {gpu_type} GPUs" if gpu_type else "nodes with GPUs"
    if available and nodes > available:
        problem(
            "nodes",
            f"Partition '{partition.name}' has {available} {what}; ask for {available} or fewer nodes, or choose a "
            "partition with more.",
        )
        return
    if switches is None:
        return
    if switches < 1:
        problem("switches", "Ask for at least 1 switch, or leave `switches` out.")
        return
    if not partition.nodes_by_switch:
        problem(
            "switches",
            f"Cluster '{cluster.name}' describes no network switches for partition '{partition.name}', so the "
            "portal cannot ask for them; leave `switches` out.",
        )
        return
    version = cluster.api_version.removeprefix("v")
    if version in _NO_SWITCH_WAIT_API_VERSIONS:
        if switches != 1:
            problem(
                "switches",
                f"Cluster '{cluster.name}' runs Slurm 22.05, whose REST API can ask only for nodes under one "
                "switch; ask for 1 switch, or leave `switches` out.",
            )
        if wait is not None:
            problem(
                "switch_wait_minutes",
                f"Cluster '{cluster.name}' runs Slurm 22.05, whose REST API cannot limit the wait for a switch: "
                "leave `switch_wait_minutes` out, and the job waits until nodes under one switch are free.",
            )
    if switches == 1:
        largest = max(partition.nodes_by_switch.values())
        if nodes > largest:
            problem(
                "switches",
                f"No switch of partition '{partition.name}' has {nodes} nodes under it (at most {largest}): ask for "
                f"{largest} or fewer nodes, or for more switches, or leave `switches` out.",
            )


def _validate_time_limit(values: dict[str, Any], partition: Partition | None, problem: Any) -> None:
    if values["time_limit_minutes"] is None:
        default = partition.default_time_minutes if partition else None
        values["time_limit_minutes"] = min(default or 60, partition.max_time_minutes or 60) if partition else 60
    minutes = values["time_limit_minutes"]
    if minutes < 1:
        problem("time_limit_minutes", "The time limit must be at least 1 minute.")
    elif partition is not None and partition.max_time_minutes is not None and minutes > partition.max_time_minutes:
        problem(
            "time_limit_minutes",
            f"Partition '{partition.name}' allows at most {partition.max_time_minutes} minutes "
            f"({_duration(partition.max_time_minutes)}); ask for less or use another partition.",
        )


def _duration(minutes: int) -> str:
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{mins} min" if mins else ""]
    return " ".join(part for part in parts if part) or "0 min"


def _validate_resources(values: dict[str, Any], partition: Partition | None, problem: Any) -> None:
    """CPUs and memory on each node, against the largest node of the partition as last synced."""
    cpus, memory_gb = values["cpus"], values["memory_gb"]
    if cpus is not None and cpus < 1:
        problem("cpus", "Ask for at least 1 CPU, or leave the CPUs out for the partition's default.")
    if memory_gb is not None and memory_gb < 1:
        problem("memory_gb", "Ask for at least 1 GB of memory, or leave it out for the partition's default.")
    if partition is None:
        return
    max_cpus = partition.max_cpus_per_node
    if cpus is not None and max_cpus and cpus > max_cpus:
        problem(
            "cpus",
            f"The nodes of partition '{partition.name}' have at most {max_cpus} CPUs; ask for {max_cpus} or fewer "
            "per node, or choose a partition with larger nodes.",
        )
    max_memory_gb = partition.max_memory_gb_per_node
    if memory_gb is not None and max_memory_gb and memory_gb > max_memory_gb:
        problem(
            "memory_gb",
            f"The nodes of partition '{partition.name}' have at most {max_memory_gb} GB of memory; ask for "
            f"{max_memory_gb} GB or less per node, or choose a partition with larger nodes.",
        )


def _validate_array(values: dict[str, Any], problem: Any) -> None:
    """Read the array expression into `array_spec` (None: a plain job)."""
    values["array_spec"] = None
    expression = values.get("array")
    if not expression:
        return
    try:
        values["array_spec"] = array_parse(expression)
    except ArrayExpressionError as exc:
        problem("array", str(exc))


def _validate_name(values: dict[str, Any], problem: Any) -> None:
    name = values["name"]
    if name is None or not name.strip():
        values["name"] = "job"
        return
    if len(name) > JOB_NAME_MAX_LENGTH:
        problem("name", f"Use at most {JOB_NAME_MAX_LENGTH} characters; this name has {len(name)}.")
    if _CONTROL_CHARACTERS.search(name):
        problem("name", "Remove control characters (such as new lines or tabs) from the name.")


def _validate_script(values: dict[str, Any], problem: Any) -> None:
    script = values["script"]
    if not script:
        problem("script", "Give the batch script to run, starting with a line such as '#!/bin/bash'.")
        return
    if not script.startswith("#!"):
        problem("script", "Start the script with an interpreter line such as '#!/bin/bash': Slurm requires one.")
    size = len(script.encode())
    limit = settings.JOB_SCRIPT_MAX_BYTES
    if size > limit:
        problem(
            "script",
            f"The script is {size} bytes; the limit is {limit}. Keep large code in files the script runs.",
        )
    if "\x00" in script:
        problem("script", "Remove the NUL characters from the script.")


def _validate_environment(values: dict[str, Any], problem: Any) -> None:
    environment = values["environment"]
    if environment is None:
        values["environment"] = {}
        return
    if len(environment) > MAX_ENVIRONMENT_ENTRIES:
        problem("environment", f"Use at most {MAX_ENVIRONMENT_ENTRIES} variables; there are {len(environment)}.")
    size = 0
    for key, value in environment.items():
        size += len(key) + len(str(value).encode())
        for trouble in environment_variable_problems(key, str(value)):
            problem("environment", trouble)
    if size > settings.JOB_ENVIRONMENT_MAX_BYTES:
        problem("environment", f"The variables take {size} bytes; the limit is {settings.JOB_ENVIRONMENT_MAX_BYTES}.")


def environment_variable_problems(key: str, value: str) -> list[str]:
    """What is wrong with one variable of a job's environment: the one rule the API and the submit form's
    line-by-line check share."""
    problems = []
    if not _ENVIRONMENT_KEY.match(key):
        problems.append(
            f"'{key[:40]}' is not a valid variable name: use letters, digits and '_', not starting with a digit."
        )
    elif key.upper().startswith(_RESERVED_ENVIRONMENT_PREFIXES):
        problems.append(f"'{key}' is set by Slurm itself; choose another name.")
    if "\x00" in value:
        problems.append(f"The value of '{key[:40]}' contains a NUL character; remove it.")
    return problems


# Cancel ------------------------------------------------------------------------------------------------


def job_cancel(*, user: User, job: Job, reason: str = "") -> Job:
    """Cancel the job: at once when it has not reached Slurm, else by a worker in Slurm. `reason`, optional, is
    kept with who asked, for the job's page, its API and the audit log.

    The caller has checked that `user` may cancel it. A second request changes nothing (its reason included).
    """
    reason = reason.strip()[:CANCEL_REASON_MAX_LENGTH]
    now = timezone.now()
    with transaction.atomic():
        locked = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
        if locked.is_external:
            raise Conflict(
                "This job was submitted outside the portal and is read-only here; cancel it on the cluster "
                f"(scancel {locked.slurm_job_id}) as its owner."
            )
        if locked.is_final:
            raise Conflict(f"The job has already ended ({locked.get_state_display().lower()}); nothing to cancel.")
        if locked.cancel_requested_at is not None:
            return locked
        locked.cancel_requested_at = now
        locked.cancel_requested_by = user
        locked.cancel_reason = reason
        locked.updated_at = now
        fields = ["cancel_requested_at", "cancel_requested_by", "cancel_reason", "updated_at"]
        submitting = locked.submit_lease_until is not None and locked.submit_lease_until > now
        if locked.state == JobState.QUEUED and locked.slurm_job_id is None and not submitting:
            detail = cancelled_before_slurm(user.username)
            job_transition(job=locked, to_state=JobState.CANCELLED, detail=detail, at=now).save()
            quota_release(job=locked, note=detail)
            locked.ended_at = now
            fields += ["state", "ended_at"]
            array_tasks_end_before_slurm(job=locked, state=JobState.CANCELLED, now=now)
            fields.append("array_progress")
            dependents_wake(parent_ids=[locked.pk], now=now)  # its children waiting in the portal are judged now
        else:
            task_enqueue_on_commit("jobs.tasks.job_cancel", str(locked.id), fallback="the job sync cancels it")
        locked.save(update_fields=fields)
        audit_record(
            actor=user,
            action="job.cancel",
            target=locked,
            tenant=locked.project.tenant,
            before={"state": job.state},
            after={"state": locked.state, "cancel_requested": True, "reason": reason},
        )
        transaction.on_commit(lambda: jobs_push([locked.id]))
    return locked


def job_array_task_cancel(*, user: User, job: Job, index: int) -> JobArrayTask:
    """Cancel one task of an array in Slurm (a worker does it); the array's other tasks go on. The caller has
    checked that `user` may cancel the job. A second request changes nothing."""
    now = timezone.now()
    with transaction.atomic():
        locked = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
        if not locked.is_array:
            raise Conflict("This job is not an array; cancel it with POST /api/v1/jobs/{id}/cancel/.")
        task = JobArrayTask.objects.select_for_update(of=("self",)).filter(job=locked, index=index).first()
        if task is None:
            raise Http404(f"The array has no task {index}; its tasks are {locked.array}.")
        if task.is_final or locked.is_final:
            raise Conflict(f"Task {index} has already ended ({task.get_state_display().lower()}); nothing to cancel.")
        if locked.slurm_job_id is None:
            raise Conflict(
                "The array has not reached Slurm yet, so its tasks cannot be cancelled one by one; cancel the whole "
                "array, or wait until it is pending in Slurm."
            )
        if task.cancel_requested_at is not None:
            return task
        task.cancel_requested_at = now
        task.save(update_fields=["cancel_requested_at"])
        task_enqueue_on_commit(
            "jobs.tasks.job_array_task_cancel", str(locked.pk), index, fallback="cancel it again in a minute"
        )
        audit_record(
            actor=user,
            action="job.cancel_task",
            target=locked,
            tenant=locked.project.tenant,
            before={"task": index, "state": task.state},
            after={"task": index, "cancel_requested": True},
        )
    return task


# The longest reason a cancel keeps (Job.cancel_reason).
CANCEL_REASON_MAX_LENGTH = 500


def cancelled_before_slurm(username: str) -> str:
    """The timeline's words for a job cancelled while still in the portal's queue."""
    return f"cancelled by {username} before it reached Slurm"


# Templates ---------------------------------------------------------------------------------------------


def job_template_resolve(*, project: Project, template_id: str) -> Any:
    """A built-in template by its id, or one of the project's saved templates by its UUID; None if neither."""
    if template_id in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[template_id]
    try:
        saved_id = uuid.UUID(template_id)
    except ValueError:
        return None
    return JobTemplate.objects.filter(project=project, pk=saved_id).first()


TEMPLATE_FIELDS = (
    "array",
    "name",
    "description",
    "script",
    "partition",
    "gpu_type",
    "gpus",
    "node_count",
    "time_limit_minutes",
    "cpus",
    "memory_gb",
    "environment",
)


def job_template_save(
    *, user: User, project: Project, values: Mapping[str, Any], template: JobTemplate | None = None
) -> JobTemplate:
    """Create (template None) or update a project's template; names are unique within the project."""
    problems: dict[str, list[str]] = {}
    probe = {
        "name": values.get("name", template.name if template else None),
        "script": values.get("script", template.script if template else None),
        "environment": values.get("environment", template.environment if template else None),
        "array": values.get("array", template.array if template else None),
    }
    _validate_script(probe, lambda field, message: problems.setdefault(field, []).append(message))
    _validate_environment(probe, lambda field, message: problems.setdefault(field, []).append(message))
    _validate_array(probe, lambda field, message: problems.setdefault(field, []).append(message))
    name = (probe["name"] or "").strip()
    if not name:
        problems.setdefault("name", []).append("Give the template a name.")
    elif (
        JobTemplate.objects.filter(project=project, name=name)
        .exclude(pk=template.pk if template else uuid.UUID(int=0))
        .exists()
    ):
        problems.setdefault("name", []).append(f"Project '{project}' already has a template named '{name}'.")
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        before = {field: getattr(template, field) for field in TEMPLATE_FIELDS} if template else None
        saved = template or JobTemplate(project=project, created_by=user)
        for field in TEMPLATE_FIELDS:
            if field in values:
                setattr(saved, field, values[field] if values[field] is not None else _template_default(field))
        saved.name = name
        saved.save()
        audit_record(
            actor=user,
            action="job_template.update" if template else "job_template.create",
            target=saved,
            tenant=project.tenant,
            before=before,
            after={field: getattr(saved, field) for field in TEMPLATE_FIELDS},
        )
    return saved


def _template_default(field: str) -> Any:
    model_field = JobTemplate._meta.get_field(field)
    assert isinstance(model_field, models.Field)
    return model_field.get_default()


def job_template_delete(*, user: User, template: JobTemplate) -> None:
    with transaction.atomic():
        audit_record(
            actor=user,
            action="job_template.delete",
            target=template,
            tenant=template.project.tenant,
            before={"name": template.name},
            after=None,
        )
        template.delete()
