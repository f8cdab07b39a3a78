"""Reads for jobs and job templates, each through the one access rule for project data."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Collection
from datetime import UTC, datetime, timedelta

from django.core.exceptions import PermissionDenied
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Prefetch, Q, QuerySet
from django.db.models.functions import TruncDate
from django.http import Http404

from clusters.selectors import (
    SUBMISSION_TARGET_SQL,
    SubmissionTarget,
    submission_target_from,
    submission_target_parameters,
)
from jobs.models import (
    ACTIVE_JOB_STATES,
    FINAL_JOB_STATES,
    Job,
    JobArrayTask,
    JobEfficiency,
    JobGpuUsage,
    JobState,
    JobTemplate,
    JobTransition,
    JobTransitionArchive,
)
from portal.db import prepared_cursor
from tenants.models import SUBMITTING_PROJECT_ROLES, Project, ProjectMembership, Tenant
from tenants.selectors import (
    AnyUser,
    ProjectAction,
    is_portal_admin,
    project_access_check,
    project_get_by_id_for_user,
    project_label_parse,
    project_list_for_user,
    project_roles_check,
    visible_project_ids,
)

# Jobs --------------------------------------------------------------------------------------------------


class JobAction(enum.Enum):
    VIEW = "view"  # anyone who may view the project
    CANCEL = "cancel"  # the job's owner, project managers, tenant admins
    RERUN = "rerun"  # whoever may submit to its project: members and managers (a rerun runs as its requester)


def job_list_for_user(*, user: AnyUser) -> QuerySet[Job]:
    """Jobs in projects the user may view, newest first, with what a list row shows joined in."""
    if not user.is_authenticated:
        return Job.objects.none()
    jobs = Job.objects.select_related("project__tenant", "cluster", "user", "efficiency").order_by("-created_at", "-id")
    if is_portal_admin(user):
        return jobs
    # The project ids as values, not as a subquery: the planner then knows from its statistics how many jobs
    # they hold, and can use the (project, state, created_at) index for a few states (bench/history.py).
    return jobs.filter(project_id__in=visible_project_ids(user=user))


def _job_details() -> QuerySet[Job]:
    return Job.objects.select_related("project__tenant", "cluster", "user", "efficiency").prefetch_related(
        Prefetch("transitions", queryset=JobTransition.objects.order_by("id")),
        Prefetch("archived_transitions", queryset=JobTransitionArchive.objects.order_by("id")),
        Prefetch("gpu_usage", queryset=JobGpuUsage.objects.order_by("node", "gpu_index")),
    )


def job_detail_load(*, job_id: uuid.UUID) -> Job:
    """A job with what its detail view shows, for a caller that has already checked access (after a submit)."""
    return _job_details().get(pk=job_id)


def _job_not_found(job_id: object) -> Http404:
    return Http404(f"No job '{job_id}' exists among the ones you can see; check the id or ask for access.")


def job_get_for_user(*, user: AnyUser, job_id: uuid.UUID | str, action: JobAction = JobAction.VIEW) -> Job:
    """The job if `user` may do `action` on it: 404 for users who may not see its project, 403 otherwise."""
    try:
        job_uuid = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    except ValueError:
        raise _job_not_found(job_id) from None
    job = _job_details().filter(pk=job_uuid).first()
    if job is None:
        raise _job_not_found(job_id)
    try:
        project = project_get_by_id_for_user(user=user, project_id=job.project_id, action=ProjectAction.VIEW)
    except Http404:
        raise _job_not_found(job_id) from None
    # The project as read for this user, with their roles: `job_action_allowed` asks them again without a query.
    job._viewer_project = (user.pk, project)  # type: ignore[attr-defined]
    _job_action_check(user=user, job=job, action=action)
    return job


def job_action_allowed(*, user: AnyUser, job: Job, action: JobAction) -> bool:
    """Whether `user`, who sees `job` (from `job_get_for_user`), may also do `action` on it: the same rule, without
    loading the job again (a job's page asks for two actions)."""
    try:
        _job_action_check(user=user, job=job, action=action)
    except PermissionDenied:
        return False
    return True


def _job_action_check(*, user: AnyUser, job: Job, action: JobAction) -> None:
    is_owner = job.user_id is not None and job.user_id == user.pk
    if action is JobAction.CANCEL and not is_owner:
        refusal = f"Only the job's owner, the managers of project '{job.project}' and its tenant's admins may cancel "
        _project_action_check(user=user, job=job, action=ProjectAction.MANAGE, refusal=refusal + "this job.")
    if action is JobAction.RERUN:
        refusal = f"Only those who may submit to project '{job.project}' (its members and managers) may run its "
        _project_action_check(user=user, job=job, action=ProjectAction.SUBMIT, refusal=refusal + "jobs again.")


def _project_action_check(*, user: AnyUser, job: Job, action: ProjectAction, refusal: str) -> None:
    viewer, project = getattr(job, "_viewer_project", (None, None))
    try:
        if project is not None and viewer is not None and viewer == user.pk:
            project_roles_check(user=user, project=project, action=action)
        else:
            project_get_by_id_for_user(user=user, project_id=job.project_id, action=action)
    except PermissionDenied:
        raise PermissionDenied(refusal) from None


def job_reruns_list(*, job: Job) -> list[Job]:
    """The jobs that run `job` again, oldest first (they are in its project, so whoever sees it sees them)."""
    return list(job.reruns.order_by("created_at", "id").only("pk", "name", "state", "created_at"))


# The submit form offers this many of a project's recent jobs as parents of a pipeline step.
PIPELINE_PARENT_CHOICES = 15


def job_pipeline_parent_choices(*, project: Project, cluster_id: int | None) -> list[Job]:
    """The recent jobs of `project` on the cluster that a new job could wait for, newest first (the caller has
    checked that the user may submit to the project): those not ended, and those that ended in the last day."""
    if cluster_id is None:
        return []
    jobs = Job.objects.filter(project=project, cluster_id=cluster_id).order_by("-created_at", "-id")
    return list(jobs.only("pk", "name", "state", "array", "created_at", "slurm_job_id")[:PIPELINE_PARENT_CHOICES])


def job_array_task_list(*, job: Job, states: Collection[str] = ()) -> QuerySet[JobArrayTask]:
    """A job array's tasks by index (the caller has checked access to the job): one query per page."""
    tasks = JobArrayTask.objects.filter(job=job).order_by("index")
    return tasks.filter(state__in=list(states)) if states else tasks


# Submissions ---------------------------------------------------------------------------------------------


def submission_project_get(*, user: AnyUser, label: str, cluster_name: str) -> tuple[Project, SubmissionTarget | None]:
    """The project written 'tenant/project' if `user` may submit to it (the rule of `project_get_for_user`), and
    the cluster `cluster_name` as a submission checks against it (`submission_target_get`), in one query.

    The hottest read of the portal, written out in SQL: built with the ORM, it cost more CPU than the rest of
    a submission's queries together (bench/job_submission.py).
    """
    tenant_slug, project_slug = project_label_parse(label)
    with prepared_cursor() as cursor:
        cursor.execute(
            _SUBMISSION_PROJECT_SQL,
            {
                "tenant_slug": tenant_slug,
                "project_slug": project_slug,
                "user_id": user.pk if user.is_authenticated else None,
                **submission_target_parameters(cluster_name=cluster_name, user=user),
            },
        )
        row = cursor.fetchone()
    project = None
    if row is not None:
        tenant_values = row[_PROJECT_COLUMNS : _PROJECT_COLUMNS + _TENANT_COLUMNS]
        project = Project.from_db(DEFAULT_DB_ALIAS, _PROJECT_FIELDS, row[:_PROJECT_COLUMNS])
        project.tenant = Tenant.from_db(DEFAULT_DB_ALIAS, _TENANT_FIELDS, tenant_values)
    *_, tenant_role, project_role, target = row or (None, None, None)
    project_access_check(
        user=user,
        project=project,
        label=f"{tenant_slug}/{project_slug}",
        action=ProjectAction.SUBMIT,
        tenant_role=tenant_role,
        project_role=project_role,
    )
    assert project is not None
    return project, submission_target_from(target)


# The columns of the project and of its tenant that the query below reads, in its order.
_PROJECT_FIELDS = ["id", "tenant_id", "slug", "name", "description", "slurm_account", "created_at"]
_TENANT_FIELDS = ["id", "slug", "name", "description", "slurm_parent_account", "created_at"]
_PROJECT_COLUMNS, _TENANT_COLUMNS = len(_PROJECT_FIELDS), len(_TENANT_FIELDS)
# Two constants joined: every value is a parameter.
_SUBMISSION_PROJECT_SQL = (
    """
    SELECT p.id, p.tenant_id, p.slug, p.name, p.description, p.slurm_account, p.created_at,
        t.id, t.slug, t.name, t.description, t.slurm_parent_account, t.created_at,
        (SELECT m.role FROM tenants_tenantmembership m WHERE m.tenant_id = p.tenant_id AND m.user_id = %(user_id)s),
        (SELECT m.role FROM tenants_projectmembership m WHERE m.project_id = p.id AND m.user_id = %(user_id)s),
    """  # noqa: S608
    + SUBMISSION_TARGET_SQL
    + """
    FROM tenants_project p JOIN tenants_tenant t ON t.id = p.tenant_id
    WHERE t.slug = %(tenant_slug)s AND p.slug = %(project_slug)s
    """
)


# Templates -----------------------------------------------------------------------------------------------


def job_template_list_for_user(*, user: AnyUser, project: Project | None = None) -> QuerySet[JobTemplate]:
    """Saved templates of the projects the user may view (of `project` only, when given)."""
    templates = JobTemplate.objects.select_related("project__tenant", "created_by").order_by(
        "project__tenant__slug", "project__slug", "name"
    )
    if project is not None:
        return templates.filter(project=project)
    if is_portal_admin(user):
        return templates
    return templates.filter(project__in=project_list_for_user(user=user).values("pk"))


def job_template_get_for_user(*, user: AnyUser, template_id: str, change: bool = False) -> JobTemplate:
    """A saved template the user may view (404 otherwise); with `change`, also one they may edit or delete:
    its author while they may still submit to the project, or someone who may manage the project."""
    not_found = Http404(
        f"No template '{template_id}' exists among the ones you can see; see GET /api/v1/job-templates/."
    )
    try:
        template_uuid = uuid.UUID(template_id)
    except ValueError:
        raise not_found from None
    template = JobTemplate.objects.select_related("project__tenant", "created_by").filter(pk=template_uuid).first()
    if template is None:
        raise not_found
    try:
        project_get_by_id_for_user(user=user, project_id=template.project_id, action=ProjectAction.VIEW)
    except Http404:
        raise not_found from None
    if change:
        is_author = template.created_by_id is not None and template.created_by_id == user.pk
        action = ProjectAction.SUBMIT if is_author else ProjectAction.MANAGE
        try:
            project_get_by_id_for_user(user=user, project_id=template.project_id, action=action)
        except PermissionDenied:
            raise PermissionDenied(
                f"Only the template's author, the managers of project '{template.project}' and its tenant's "
                "admins may change this template."
            ) from None
    return template


# Browser pages: the jobs area (frontend/job_views.py) ------------------------------------------------------


def project_list_submittable_for_user(*, user: AnyUser) -> QuerySet[Project]:
    """Projects the user may submit jobs to: where they hold a submitting project role (every project for
    portal admins), ordered by tenant and project slug."""
    projects = project_list_for_user(user=user)
    if is_portal_admin(user):
        return projects
    return projects.filter(
        pk__in=ProjectMembership.objects.filter(user=user.pk, role__in=SUBMITTING_PROJECT_ROLES).values("project")
    )


def job_list_filtered_for_user(
    *,
    user: AnyUser,
    project: Project | None = None,
    states: Collection[str] = (),
    cluster_name: str = "",
    search: str = "",
    owner: str = "",
    submitted_from: datetime | None = None,
    submitted_until: datetime | None = None,
) -> QuerySet[Job]:
    """`job_list_for_user` narrowed by the jobs page's filters: a project, states, a cluster, a part of the
    name (or a Slurm job id), the username of who submitted it, and when the portal accepted it (from included,
    until excluded). Only ever narrows: an owner of another tenant finds nothing of theirs."""
    jobs = job_list_for_user(user=user)
    if owner:
        jobs = jobs.filter(user__username__iexact=owner)
    if submitted_from is not None:
        jobs = jobs.filter(created_at__gte=submitted_from)
    if submitted_until is not None:
        jobs = jobs.filter(created_at__lt=submitted_until)
    if project is not None:
        jobs = jobs.filter(project=project)
    if states:
        jobs = jobs.filter(state__in=list(states))
    if cluster_name:
        jobs = jobs.filter(cluster__name=cluster_name)
    if search:
        condition = Q(name__icontains=search)
        if search.isdigit():
            condition |= Q(slurm_job_id=int(search))
        jobs = jobs.filter(condition)
    return jobs


# A name search reads every match from its trigram index, however old, to find the newest: it looks within this
# span of the page's start first (job_list_window, portal.keyset.windowed_keyset_page).
JOB_SEARCH_SPAN = timedelta(days=7)


def job_list_window(jobs: QuerySet[Job], since: datetime | None, until: datetime | None) -> QuerySet[Job]:
    """`jobs` created since `since` and until `until` (either None: no bound), said also by the UTC day of their
    creation, which the name search's index (job_name_search_by_day) holds beside the name's trigrams: the
    index then reads the matches of those days only."""
    jobs = jobs.alias(created_day=TruncDate("created_at", tzinfo=UTC))
    if since is not None:
        jobs = jobs.filter(created_at__gte=since, created_day__gte=since.astimezone(UTC).date())
    if until is not None:
        jobs = jobs.filter(created_at__lte=until, created_day__lte=until.astimezone(UTC).date())
    return jobs


# The dashboard ---------------------------------------------------------------------------------------------


def job_list_own_for_user(*, user: AnyUser, active: bool) -> QuerySet[Job]:
    """The jobs the user submitted (or that run as them), newest first: the active ones, or the ended ones."""
    jobs = job_list_for_user(user=user).filter(user=user.pk)
    # A list of states either way, not an exclusion: an index can serve it.
    return jobs.filter(state__in=list(ACTIVE_JOB_STATES if active else FINAL_JOB_STATES))


# GPU efficiency -----------------------------------------------------------------------------------------


def job_efficiency_of(job: Job) -> JobEfficiency | None:
    """The job's GPU efficiency figures, if anything measured it (from `select_related("efficiency")`)."""
    try:
        return job.efficiency
    except JobEfficiency.DoesNotExist:
        return None


def job_is_gpu_idle(job: Job) -> bool:
    """Flagged now: running, with a GPU idle for its cluster's limit."""
    efficiency = job_efficiency_of(job)
    return job.state == JobState.RUNNING and efficiency is not None and efficiency.flagged_at is not None
