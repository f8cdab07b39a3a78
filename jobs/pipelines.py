"""Pipelines: jobs that wait for other jobs of their project (Slurm's `--dependency`), checked, delivered and shown.

A child names its parents and a condition for each (`afterok`, `afterany`, `afternotok`; on an array parent
Slurm reads them over every task). The worker sends the child to Slurm with the parents' Slurm job ids; until
every parent has one, the child stays queued in the portal and is not attempted, so nothing about its own
exactly-once delivery changes. A parent that already ended is judged here, from the portal's record: a condition
it met is left out of what Slurm is sent, one it can no longer meet ends the child before Slurm (cancelled, with
Slurm's own reason `DependencyNeverSatisfied` and the portal's words). In Slurm, a child whose parent ended the
wrong way stays pending with that reason (or is cancelled, where `kill_invalid_depend` is set); both are shown
as "will never run".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import models

from clusters.models import Cluster
from jobs.models import FINAL_JOB_STATES, DependencyCondition, Job, JobDependency, JobState
from portal.db import RelatedRows, prepared_cursor
from portal.queue import task_enqueue_on_commit
from tenants.models import Project

# Slurm's reason for a job whose dependency can never be satisfied; the portal gives it too, to a child it ends.
NEVER_SATISFIED_REASON = "DependencyNeverSatisfied"
MAX_PARENTS = 20
# A child whose parents are not in Slurm yet is looked at again after this long at the latest (their delivery
# wakes it at once; this is the fallback should that message be lost).
WAIT_RECHECK = timedelta(seconds=30)

CONDITION_WORDS = {
    DependencyCondition.AFTER_OK: "after it succeeds",
    DependencyCondition.AFTER_ANY: "after it ends, however it ends",
    DependencyCondition.AFTER_NOT_OK: "after it fails",
}
ARRAY_CONDITION_WORDS = {
    DependencyCondition.AFTER_OK: "after every task succeeds",
    DependencyCondition.AFTER_ANY: "after every task ends",
    DependencyCondition.AFTER_NOT_OK: "after a task fails",
}


def condition_words(condition: str, *, array: bool) -> str:
    words = ARRAY_CONDITION_WORDS if array else CONDITION_WORDS
    return words.get(DependencyCondition(condition), condition)


@dataclass(frozen=True)
class DependencyRequest:
    """One parent as a submission names it."""

    job: uuid.UUID
    condition: str


# Judging a condition -------------------------------------------------------------------------------------


def condition_outcome(condition: str, parent: Job) -> str:
    """ "met", "never" or "waiting": what the parent's portal state says of the condition (Slurm's rules: a job
    is ok when it completed with exit code 0, an array when every task did; cancelled or rejected is not ok)."""
    if parent.state not in FINAL_JOB_STATES:
        return "waiting"
    ok = parent.state == JobState.COMPLETED
    if condition == DependencyCondition.AFTER_ANY:
        return "met"
    if condition == DependencyCondition.AFTER_OK:
        return "met" if ok else "never"
    return "never" if ok else "met"


def never_words(*, parent: Job, condition: str) -> str:
    """Why a child can never run because of this parent, in plain words."""
    how = parent.get_state_display().lower()
    wanted = condition_words(condition, array=parent.is_array)
    return f"job “{parent.name}” ({parent.pk}) ended {how}, and this job was to run only {wanted}"


# Submission -----------------------------------------------------------------------------------------------


def dependencies_validate(
    *, project: Project, cluster: Cluster | None, requested: Sequence[DependencyRequest]
) -> tuple[list[tuple[Job, str]], list[str]]:
    """The parents a submission names, checked: each a job of the same project (any other is "not found", whether
    it exists elsewhere or not), on the same cluster, named once, with a condition it can still meet. Returns the
    parents with their conditions, and the problems (for the field `depends_on`)."""
    problems: list[str] = []
    if not requested:
        return [], problems
    if len(requested) > MAX_PARENTS:
        return [], [f"A job can wait for at most {MAX_PARENTS} jobs; this one names {len(requested)}."]
    seen: set[uuid.UUID] = set()
    for each in requested:
        if each.job in seen:
            problems.append(f"Job {each.job} is named twice; name each job once, with one condition.")
        seen.add(each.job)
    parents = {
        job.pk: job
        for job in Job.objects.filter(project=project, pk__in=list(seen))
        .select_related("cluster")
        # The array fields, for the words; the rest is what judging needs.
        .only("id", "name", "state", "cluster", "cluster__name", "array", "slurm_job_id", "project")
    }
    chosen: list[tuple[Job, str]] = []
    for each in requested:
        parent = parents.get(each.job)
        if parent is None:
            problems.append(
                f"No job '{each.job}' exists in project '{project}' among the jobs you can see; a job can only "
                "wait for jobs of its own project."
            )
            continue
        if cluster is not None and parent.cluster_id != cluster.pk:
            problems.append(
                f"Job “{parent.name}” ({parent.pk}) runs on cluster '{parent.cluster.name}', not '{cluster.name}': "
                "Slurm dependencies do not cross clusters; run the whole pipeline on one cluster."
            )
            continue
        if condition_outcome(each.condition, parent) == "never":
            problems.append(f"It could never run: {never_words(parent=parent, condition=each.condition)}.")
            continue
        chosen.append((parent, each.condition))
    return chosen, problems


def dependencies_create(*, child: Job, parents: Sequence[tuple[Job, str]]) -> list[JobDependency]:
    """Store the edges of a new job (in its submission's transaction)."""
    return JobDependency.objects.bulk_create(
        [JobDependency(child=child, parent=parent, condition=condition) for parent, condition in parents]
    )


# Delivery -----------------------------------------------------------------------------------------------


@dataclass
class Resolution:
    """What a queued child's dependencies allow now: wait (some parent is not in Slurm yet), never run (with why),
    or go to Slurm with `slurm_dependency` (empty: every parent already met its condition)."""

    waiting_for: list[Job] = field(default_factory=list)
    never: str = ""
    slurm_dependency: str = ""


# A delivery's and a parent's reading of the edges, as prepared statements (portal/db.py): every delivery batch
# runs them, and almost always finds nothing, so the ORM's building of the query was most of their cost.
_EDGES = RelatedRows(
    JobDependency,
    "parent",
    alias="edge",
    only=("child", "condition", "parent", "parent__name", "parent__state", "parent__slurm_job_id", "parent__array"),
)
_EDGES_OF_CHILDREN = f"{_EDGES.select} WHERE edge.child_id = ANY(%s) ORDER BY edge.id"
_WAITING_CHILDREN = (
    "SELECT DISTINCT job.id FROM jobs_job job JOIN jobs_jobdependency edge ON edge.child_id = job.id "
    "WHERE edge.parent_id = ANY(%s) AND job.state = %s AND job.next_attempt_at > %s"
)


def dependencies_resolve(jobs: Iterable[Job]) -> dict[uuid.UUID, Resolution]:
    """For each of these queued jobs that has parents, what they allow now (one query for them all)."""
    edges = _EDGES.fetch(_EDGES_OF_CHILDREN, [[job.pk for job in jobs]])
    by_child: dict[uuid.UUID, list[JobDependency]] = {}
    for edge in edges:
        by_child.setdefault(edge.child_id, []).append(edge)
    return {child_id: _resolve(child_edges) for child_id, child_edges in by_child.items()}


def _resolve(edges: Sequence[JobDependency]) -> Resolution:
    resolution = Resolution()
    in_slurm: dict[str, list[int]] = {}
    for edge in edges:
        parent = edge.parent
        outcome = condition_outcome(edge.condition, parent)
        if outcome == "never":
            resolution.never = never_words(parent=parent, condition=edge.condition)
            return resolution
        if outcome == "met":
            continue
        if parent.slurm_job_id is None:
            resolution.waiting_for.append(parent)
        else:
            in_slurm.setdefault(edge.condition, []).append(parent.slurm_job_id)
    # Slurm's syntax: `type:id[:id...]`, several types joined by "," (all must hold).
    resolution.slurm_dependency = ",".join(
        f"{condition}:{':'.join(str(job_id) for job_id in job_ids)}" for condition, job_ids in in_slurm.items()
    )
    return resolution


def recheck_at(now: datetime) -> datetime:
    """When a child waiting for its parents is looked at again should no delivery wake it first."""
    return now + WAIT_RECHECK


def waiting_words(parents: Sequence[Job]) -> str:
    names = ", ".join(f"“{parent.name}”" for parent in parents)
    there = "they are" if len(parents) > 1 else "it is"
    return f"Waiting for {names} to reach Slurm: this job is sent with its dependency once {there} there."


def dependents_wake(*, parent_ids: Iterable[uuid.UUID], now: datetime) -> int:
    """Make the queued children of these parents due now (a parent reached Slurm or ended before it), and send a
    delivery message for them after commit. Returns how many were woken."""
    ids = list(parent_ids)
    if not ids:
        return 0
    with prepared_cursor() as cursor:
        cursor.execute(_WAITING_CHILDREN, [ids, JobState.QUEUED.value, now])
        children = [child_id for (child_id,) in cursor.fetchall()]
    if not children:
        return 0
    Job.objects.filter(pk__in=children, state=JobState.QUEUED).update(next_attempt_at=now)
    task_enqueue_on_commit(
        "jobs.tasks.job_submit", str(children[0]), fallback="the workers' sweep delivers the waiting children"
    )
    return len(children)


# Reading ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """A parent or child of a job as pages and the API show it."""

    job: Job
    condition: str
    words: str  # the condition in plain words, as the parent's kind (job or array) reads it
    outcome: str  # "met", "never" or "waiting"


@dataclass(frozen=True)
class Pipeline:
    parents: list[Edge]
    children: list[Edge]
    never: str  # why this job will never run, in plain words; "" when it may


# A job's edges either way, with the job at each end as its page and API show it (one prepared statement).
_NEIGHBOUR_FIELDS = ("name", "state", "array", "slurm_job_id", "exit_code")
_NEIGHBOURS = RelatedRows(
    JobDependency,
    "parent",
    "child",
    alias="edge",
    only=(
        "condition",
        "child",
        "parent",
        *(f"parent__{name}" for name in _NEIGHBOUR_FIELDS),
        *(f"child__{name}" for name in _NEIGHBOUR_FIELDS),
    ),
)
_NEIGHBOURS_OF_JOB = f"{_NEIGHBOURS.select} WHERE edge.child_id = %(job)s OR edge.parent_id = %(job)s ORDER BY edge.id"


def pipeline_of(job: Job) -> Pipeline:
    """A job's parents and children (one query; they are in its project, so whoever sees it sees them)."""
    edges = _NEIGHBOURS.fetch(_NEIGHBOURS_OF_JOB, {"job": job.pk})
    parents = [
        Edge(
            job=edge.parent,
            condition=edge.condition,
            words=condition_words(edge.condition, array=edge.parent.is_array),
            outcome=condition_outcome(edge.condition, edge.parent),
        )
        for edge in edges
        if edge.child_id == job.pk
    ]
    children = [
        Edge(
            job=edge.child,
            condition=edge.condition,
            words=condition_words(edge.condition, array=job.is_array),
            outcome=condition_outcome(edge.condition, job),
        )
        for edge in edges
        if edge.parent_id == job.pk
    ]
    return Pipeline(parents=parents, children=children, never=never_reason(job, parents=parents))


def never_reason(job: Job, *, parents: Sequence[Edge]) -> str:
    """Why `job` will never run, when that is so: a parent ended the wrong way, or Slurm says so."""
    ended_so = job.state == JobState.CANCELLED and job.state_reason == NEVER_SATISFIED_REASON
    if job.state not in (JobState.QUEUED, JobState.PENDING) and not ended_so:
        return ""
    blocking = [edge for edge in parents if edge.outcome == "never"]
    if blocking:
        edge = blocking[0]
        return never_words(parent=edge.job, condition=edge.condition).capitalize()
    if job.state_reason == NEVER_SATISFIED_REASON:
        return "Slurm says the jobs it waits for can never satisfy its dependency"
    return ""


def is_never_satisfied(job: Job) -> bool:
    return job.state_reason == NEVER_SATISFIED_REASON


def cancel_effects(job: Job) -> list[dict[str, Any]]:
    """What cancelling `job` does to its children that have not ended: per child, whether it will still run."""
    effects = []
    for edge in JobDependency.objects.filter(parent=job).select_related("child").order_by("id"):
        child = edge.child
        if child.is_final:
            continue
        will_run = edge.condition != DependencyCondition.AFTER_OK
        effects.append(
            {
                "job": child,
                "condition": edge.condition,
                "will_run": will_run,
                "words": f"“{child.name}” "
                + (
                    "will still run: it waits for this job to end, however it ends"
                    if edge.condition == DependencyCondition.AFTER_ANY
                    else "will run: it waits for this job to fail, and a cancelled job has not succeeded"
                    if will_run
                    else "will never run: it waits for this job to succeed"
                ),
            }
        )
    return effects


def pipeline_position(job: Job) -> str:
    """The job's place in its pipeline as a sentence ("In its pipeline, it waited for “prepare”; “evaluate” waits
    for it."), or "" for a job with neither parents nor children: for the end notice (two queries)."""
    parents = [
        edge.parent.name for edge in JobDependency.objects.filter(child=job).select_related("parent").order_by("id")
    ]
    children = [
        edge.child.name for edge in JobDependency.objects.filter(parent=job).select_related("child").order_by("id")
    ]
    parts = []
    if parents:
        parts.append("it waited for " + _names(parents))
    if children:
        parts.append(_names(children) + (" wait" if len(children) > 1 else " waits") + " for it")
    return f"In its pipeline, {'; '.join(parts)}." if parts else ""


def _names(names: Sequence[str]) -> str:
    quoted = [f"“{name}”" for name in names[:3]]
    more = len(names) - len(quoted)
    return ", ".join(quoted) + (f" and {more} more" if more else "")


# A whole pipeline ----------------------------------------------------------------------------------------

# A pipeline is read whole only to tell when it ends; past this many steps the rest is not looked at.
MAX_PIPELINE_STEPS = 500


@dataclass(frozen=True)
class WholePipeline:
    """The jobs connected to one job by dependencies, whichever way (itself included), oldest first, and the
    edges between them as (child id, parent id, condition)."""

    steps: list[Job]
    edges: list[tuple[uuid.UUID, uuid.UUID, str]]


def pipeline_whole(job: Job) -> WholePipeline:
    """The pipeline `job` is a step of: one query per step of distance from it, one for the jobs. Dependencies
    stay in a project, so whoever sees `job` sees every step."""
    seen = {job.pk}
    frontier = {job.pk}
    edges: dict[int, tuple[uuid.UUID, uuid.UUID, str]] = {}
    while frontier and len(seen) < MAX_PIPELINE_STEPS:
        found = JobDependency.objects.filter(
            models.Q(child_id__in=frontier) | models.Q(parent_id__in=frontier)
        ).values_list("id", "child_id", "parent_id", "condition")
        frontier = set()
        for edge_id, child_id, parent_id, condition in found:
            edges[edge_id] = (child_id, parent_id, condition)
            for step in (child_id, parent_id):
                if step not in seen:
                    seen.add(step)
                    frontier.add(step)
    steps = list(
        Job.objects.filter(pk__in=seen).select_related("cluster", "project__tenant").order_by("created_at", "id")
    )
    return WholePipeline(steps=steps, edges=[edges[key] for key in sorted(edges)])


def pipeline_never_running(pipeline: WholePipeline) -> dict[uuid.UUID, str]:
    """The steps that have not ended and never will run, each with why in plain words: Slurm (or the portal)
    says their dependency can never be satisfied, a parent ended so that their condition cannot hold, or a
    parent is itself such a step (it never ends, so nothing waiting for it can start)."""
    jobs = {step.pk: step for step in pipeline.steps}
    parents: dict[uuid.UUID, list[tuple[uuid.UUID, str]]] = {}
    for child_id, parent_id, condition in pipeline.edges:
        parents.setdefault(child_id, []).append((parent_id, condition))
    never: dict[uuid.UUID, str] = {}
    waiting = [step for step in pipeline.steps if step.state in (JobState.QUEUED, JobState.PENDING)]
    changed = True
    while changed:
        changed = False
        for step in waiting:
            if step.pk in never:
                continue
            why = ""
            for parent_id, condition in parents.get(step.pk, []):
                parent = jobs.get(parent_id)
                if parent is None:
                    continue
                if parent_id in never:
                    why = f"it waits for “{parent.name}”, which will never run"
                elif condition_outcome(condition, parent) == "never":
                    why = never_words(parent=parent, condition=condition)
                if why:
                    break
            if not why and is_never_satisfied(step):
                why = "Slurm says the jobs it waits for can never satisfy its dependency"
            if why:
                never[step.pk] = why
                changed = True
    return never


def pipeline_has_ended(pipeline: WholePipeline, never: dict[uuid.UUID, str]) -> bool:
    """Whether every step has ended or will never run."""
    return all(step.is_final or step.pk in never for step in pipeline.steps)
