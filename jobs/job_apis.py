"""REST API for jobs, the clusters one may submit to, and job templates (under /api/v1/).

Submitting answers 202 at once: the job is stored `queued`, and a worker delivers it to Slurm. Reads come
from the database as the workers last synced it; web requests never call Slurm.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any

import django_filters
from django.conf import settings
from django.db.models import Q, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import job_services
from jobs.arrays import PROGRESS_KEYS
from jobs.end_watches import job_end_watch_set, pipeline_end_watch_set
from jobs.job_services import JobRequest
from jobs.models import (
    DependencyCondition,
    Job,
    JobArrayTask,
    JobEfficiency,
    JobState,
    JobTemplate,
    JobTransition,
    JobTransitionArchive,
)
from jobs.pipelines import MAX_PARENTS, DependencyRequest, Edge, Pipeline, cancel_effects, condition_words, pipeline_of
from jobs.reasons import pending_reason_text
from jobs.reruns import RERUN_FIELDS, job_rerun
from jobs.selectors import (
    JobAction,
    job_array_task_list,
    job_detail_load,
    job_efficiency_of,
    job_get_for_user,
    job_is_gpu_idle,
    job_list_for_user,
    job_template_get_for_user,
    job_template_list_for_user,
    submission_project_get,
)
from jobs.templates import BUILTIN_TEMPLATES, BuiltinTemplate
from portal.api_errors import ERRORS, ERRORS_WITH_CONFLICT
from portal.api_inputs import BodyInput
from portal.api_pagination import KeysetPagination, PagePagination
from portal.errors import Conflict
from tenants.models import Project
from tenants.selectors import ProjectAction, project_get_by_label_for_user


def _project_from_label(*, user: Any, label: str, action: ProjectAction) -> Project:
    return project_get_by_label_for_user(user=user, label=label, action=action)


# Clusters ----------------------------------------------------------------------------------------------


# Jobs --------------------------------------------------------------------------------------------------


class JobTransitionOutput(serializers.Serializer[Any]):
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    at = serializers.DateTimeField()
    detail = serializers.CharField()


class JobGpuUsageOutput(serializers.Serializer[Any]):
    node = serializers.CharField()
    gpu_index = serializers.IntegerField(help_text="The device's index on its node, as Slurm and DCGM number it")
    gpu_uuid = serializers.CharField()
    mean_utilisation_percent = serializers.SerializerMethodField()
    last_utilisation_percent = serializers.FloatField()
    peak_memory_mib = serializers.IntegerField()
    idle_seconds = serializers.IntegerField()
    idle_since = serializers.DateTimeField(allow_null=True)

    def get_mean_utilisation_percent(self, usage: Any) -> float | None:
        return round(usage.utilisation_percent_seconds / usage.observed_seconds, 1) if usage.observed_seconds else None


class JobEfficiencyOutput(serializers.Serializer[Any]):
    utilisation_source = serializers.CharField(
        source="source", help_text="dcgm (DCGM exporter via Prometheus) or slurm (Slurm's accounting)"
    )
    mean_utilisation_percent = serializers.SerializerMethodField()
    peak_memory_mib = serializers.IntegerField(allow_null=True)
    observed_gpu_seconds = serializers.IntegerField()
    idle_gpu_seconds = serializers.IntegerField(help_text="GPU-seconds under the cluster's idle threshold")
    idle_gpus = serializers.IntegerField(help_text="GPUs idle at the last reading")
    idle_since = serializers.DateTimeField(allow_null=True)
    flagged_at = serializers.DateTimeField(allow_null=True, help_text="When a GPU had been idle for the limit")
    notified_at = serializers.DateTimeField(allow_null=True)
    warned_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True, help_text="When the project's idle policy ended it")

    def get_mean_utilisation_percent(self, efficiency: JobEfficiency) -> float | None:
        mean = efficiency.mean_utilisation_percent
        return None if mean is None else round(mean, 1)


class JobOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    project = serializers.SerializerMethodField(help_text="tenant/project")
    cluster = serializers.CharField(source="cluster.name")
    name = serializers.CharField()
    user = serializers.SerializerMethodField(help_text="The portal user who submitted it; null for unknown")
    cluster_username = serializers.CharField(help_text="The POSIX user it runs as")
    is_external = serializers.BooleanField(help_text="Submitted outside the portal; read-only here")
    state = serializers.ChoiceField(choices=JobState.choices)
    slurm_state = serializers.CharField(help_text="Slurm's own state, e.g. OUT_OF_MEMORY")
    state_reason = serializers.CharField(help_text="Slurm's reason code, e.g. Priority")
    pending_reason = serializers.SerializerMethodField(help_text="Why it waits, in plain words")
    expected_start_at = serializers.DateTimeField(
        allow_null=True, help_text="While pending: when Slurm's backfill scheduler expects it to start; null: none"
    )
    last_error = serializers.CharField(help_text="Why it is not in Slurm yet, or why it was rejected")
    cancel_requested = serializers.SerializerMethodField()
    slurm_job_id = serializers.IntegerField(allow_null=True)
    partition = serializers.CharField()
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField(help_text="GPUs on each node")
    node_count = serializers.IntegerField(help_text="How many nodes each run has (`nodes` when submitting)")
    total_gpus = serializers.IntegerField(help_text="gpus x node_count: what a run holds, reserves and is charged for")
    max_switches = serializers.IntegerField(
        allow_null=True, help_text="The most leaf switches its nodes may span (`switches` when submitting); null: any"
    )
    switch_wait_minutes = serializers.IntegerField(
        allow_null=True, help_text="The longest it waits for that; null: the cluster's default"
    )
    cpus = serializers.IntegerField(allow_null=True)
    memory_gb = serializers.IntegerField(allow_null=True)
    time_limit_minutes = serializers.IntegerField()
    nodes = serializers.CharField(help_text="The nodes its run has or had, as Slurm lists them (e.g. gpu[01-02])")
    switches = serializers.ListField(
        child=serializers.CharField(), help_text='The leaf switches those nodes hang under, e.g. ["leaf1"]'
    )
    exit_code = serializers.IntegerField(allow_null=True)
    submit_attempts = serializers.IntegerField()
    created_at = serializers.DateTimeField(help_text="When the portal accepted it")
    submitted_at = serializers.DateTimeField(allow_null=True, help_text="When Slurm accepted it")
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField()
    gpu_idle = serializers.SerializerMethodField(help_text="Running with a GPU idle for its cluster's limit")
    rerun_of = serializers.UUIDField(source="rerun_of_id", allow_null=True, help_text="The job this one runs again")
    array = serializers.CharField(help_text="A job array's indexes as submitted (e.g. 0-99%10); empty: a plain job")
    array_tasks = serializers.IntegerField(source="array_task_count", help_text="A job array's number of tasks")
    array_max_running = serializers.IntegerField(allow_null=True, help_text="The `%N` cap of a job array")
    array_progress = serializers.SerializerMethodField(
        help_text="A job array's tasks counted by state: pending, running, completed, failed, cancelled; null: no array"
    )
    links = serializers.SerializerMethodField()

    def to_representation(self, job: Job) -> dict[str, Any]:
        # The fields above as `_job_data` reads them, without DRF's lookup, None check and conversion per field
        # (a third of the CPU of a list page of 50 jobs); tests/jobs/test_job_output.py holds it equal to DRF's.
        # A subclass with fields of its own renders DRF's way.
        if type(self) is not JobOutput:
            return super().to_representation(job)
        return _job_data(job, gpu_idle=job_is_gpu_idle(job))

    def get_gpu_idle(self, job: Job) -> bool:
        return job_is_gpu_idle(job)

    def get_array_progress(self, job: Job) -> dict[str, int] | None:
        if not job.is_array:
            return None
        return {key: int(job.array_progress.get(key, 0)) for key in PROGRESS_KEYS}

    def get_project(self, job: Job) -> str:
        return f"{job.project.tenant.slug}/{job.project.slug}"

    def get_user(self, job: Job) -> str | None:
        return job.user.username if job.user else None

    def get_pending_reason(self, job: Job) -> str:
        return pending_reason_text(job.state_reason) if job.state == JobState.PENDING else ""

    def get_cancel_requested(self, job: Job) -> bool:
        return job.cancel_requested_at is not None

    def get_links(self, job: Job) -> dict[str, str]:
        return _job_links(job)


_LINK_PLACEHOLDER = str(uuid.UUID(int=0))


def _job_links(job: Job) -> dict[str, str]:
    job_id = str(job.pk)
    return {
        name: template.replace(_LINK_PLACEHOLDER, job_id)
        for name, template in _job_link_templates().items()
        if name != "tasks" or job.is_array  # a task's log: add ?task=N to `log` and `log_socket`
    }


@functools.cache
def _job_link_templates() -> dict[str, str]:
    """A job's links with a placeholder for its id: reversed once per process, since `reverse` costs tens of
    microseconds and a page of the job list has 50 jobs of 5 links each."""
    links = {
        name: reverse(route, args=[_LINK_PLACEHOLDER])
        for name, route in (
            ("self", "api-job"),
            ("cancel", "api-job-cancel"),
            ("rerun", "api-job-rerun"),
            ("watch", "api-job-watch"),
        )
    }
    links |= {
        "log": f"/api/v1/jobs/{_LINK_PLACEHOLDER}/log/",
        "log_socket": f"/ws/jobs/{_LINK_PLACEHOLDER}/log/",
        "state_socket": f"/ws/jobs/{_LINK_PLACEHOLDER}/",
        "tasks": reverse("api-job-tasks", args=[_LINK_PLACEHOLDER]),
    }
    return links


class JobEdgeOutput(serializers.Serializer[Any]):
    job = serializers.UUIDField(source="job.pk")
    name = serializers.CharField(source="job.name")
    state = serializers.ChoiceField(source="job.state", choices=JobState.choices)
    slurm_job_id = serializers.IntegerField(source="job.slurm_job_id", allow_null=True)
    condition = serializers.ChoiceField(choices=DependencyCondition.choices, help_text="afterok, afterany, afternotok")
    condition_words = serializers.CharField(source="words", help_text="The condition in plain words")
    outcome = serializers.ChoiceField(
        choices=["waiting", "met", "never"], help_text="What the parent's state says of the condition so far"
    )


def _edges(edges: list[Edge]) -> list[dict[str, Any]]:
    return list(JobEdgeOutput(edges, many=True).data)


class JobDetailOutput(JobOutput):
    cancelled_by = serializers.CharField(
        help_text='Who cancelled it: a username, "the portal" (e.g. its idle-GPU policy) or "Slurm"; empty: not '
        "cancelled"
    )
    cancel_reason = serializers.CharField(help_text="Why, as the canceller gave it (optional); empty: none given")
    script = serializers.CharField()
    environment = serializers.DictField(child=serializers.CharField())
    template = serializers.CharField(source="template_id")
    working_directory = serializers.CharField()
    stdout_path = serializers.CharField()
    stderr_path = serializers.CharField()
    transitions = JobTransitionOutput(source="timeline", many=True, help_text="Archived ones included, in order")
    gpu_indices = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()), help_text='GPU devices per node: {"gpu01": [0]}'
    )
    efficiency = serializers.SerializerMethodField(help_text="GPU utilisation and idle time; null: not measured")
    gpus_used = JobGpuUsageOutput(source="gpu_usage", many=True, help_text="Each GPU as DCGM read it")

    @extend_schema_field(JobEfficiencyOutput(allow_null=True))
    def get_efficiency(self, job: Job) -> dict[str, Any] | None:
        efficiency = job_efficiency_of(job)
        return None if efficiency is None else dict(JobEfficiencyOutput(efficiency).data)

    reruns = serializers.SerializerMethodField(help_text="The jobs that run this one again, oldest first")

    def get_reruns(self, job: Job) -> list[str]:
        return [str(rerun_id) for rerun_id in job.reruns.order_by("created_at", "id").values_list("pk", flat=True)]

    depends_on = serializers.SerializerMethodField(help_text="The jobs it waits for (its pipeline's parents)")
    dependents = serializers.SerializerMethodField(help_text="The jobs that wait for it (its pipeline's children)")
    never_runs = serializers.SerializerMethodField(
        help_text="Why it will never run (a parent ended the wrong way; Slurm's DependencyNeverSatisfied); "
        "empty when it may run"
    )

    def _pipeline(self, job: Job) -> Pipeline:
        # Read once for both fields (two queries), kept on the serializer for the job it serializes.
        cached: tuple[Any, Pipeline] | None = getattr(self, "_pipeline_read", None)
        if cached is None or cached[0] != job.pk:
            cached = (job.pk, pipeline_of(job))
            self._pipeline_read = cached
        return cached[1]

    @extend_schema_field(JobEdgeOutput(many=True))
    def get_depends_on(self, job: Job) -> list[dict[str, Any]]:
        return _edges(self._pipeline(job).parents)

    @extend_schema_field(JobEdgeOutput(many=True))
    def get_dependents(self, job: Job) -> list[dict[str, Any]]:
        return _edges(self._pipeline(job).children)

    def get_never_runs(self, job: Job) -> str:
        return self._pipeline(job).never


class JobSubmitOutput(JobDetailOutput):
    transitions = serializers.SerializerMethodField()  # type: ignore[assignment]  # from memory, see post()
    gpus_used = serializers.SerializerMethodField()  # type: ignore[assignment]
    estimate = serializers.SerializerMethodField(
        help_text="The most the job can cost and what it leaves of the allocation, as POST /api/v1/estimates/ "
        "answers it (EstimateOutput); null when the portal bills nothing"
    )

    def get_gpu_idle(self, job: Job) -> bool:
        return False  # just accepted: nothing measured yet, and no query spent on it

    def get_efficiency(self, job: Job) -> dict[str, Any] | None:
        return None

    def get_gpus_used(self, job: Job) -> list[dict[str, Any]]:
        return []

    def get_estimate(self, job: Job) -> dict[str, Any] | None:
        estimate: dict[str, Any] | None = self.context.get("estimate")
        return estimate

    def get_reruns(self, job: Job) -> list[str]:
        return []  # just accepted: nothing runs it again yet (and the reply reads nothing back)

    @extend_schema_field(JobTransitionOutput(many=True))
    def get_transitions(self, job: Job) -> list[dict[str, Any]]:
        return list(JobTransitionOutput(self.context["transitions"], many=True).data)


class DependencyInput(BodyInput):
    job = serializers.UUIDField(help_text="A job of the same project and cluster, by its portal id")
    condition = serializers.ChoiceField(
        choices=DependencyCondition.choices,
        help_text="afterok: after it succeeds (an array: every task); afterany: after it ends, however; "
        "afternotok: after it fails (an array: a task)",
        error_messages={
            "invalid_choice": "'{input}' is not a condition; use afterok (after it succeeds; for an array, every "
            "task), afterany (after it ends, however it ends) or afternotok (after it fails)."
        },
    )


# The submit replies and the job list as plain dicts: what JobSubmitOutput and JobOutput render for a job, without a
# serializer's per-request copy of its fields (a fifth of a submission's CPU) and per-field work. Tests hold them
# equal.
def _datetime(value: datetime | None) -> str | None:
    """`serializers.DateTimeField`'s rendering of a stored (aware) moment: ISO 8601 in the current zone (the API's
    is UTC), "Z" for UTC."""
    if not value:
        return None
    text = value.astimezone(timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# The columns `_job_data` and `job_is_gpu_idle` read, of the job and of the rows joined to it: the list API reads
# these only, not the script, its environment or the cluster's settings (a page of 50 costs 5-8 % less CPU).
JOB_OUTPUT_COLUMNS = (
    "name",
    "cluster_username",
    "is_external",
    "state",
    "slurm_state",
    "state_reason",
    "expected_start_at",
    "last_error",
    "cancel_requested_at",
    "slurm_job_id",
    "partition",
    "gpu_type",
    "gpus",
    "node_count",
    "max_switches",
    "switch_wait_minutes",
    "cpus",
    "memory_gb",
    "time_limit_minutes",
    "nodes",
    "switches",
    "exit_code",
    "submit_attempts",
    "created_at",
    "submitted_at",
    "started_at",
    "ended_at",
    "updated_at",
    "rerun_of",
    "array",
    "array_task_count",
    "array_max_running",
    "array_progress",
    "project__slug",
    "project__tenant__slug",
    "cluster__name",
    "user__username",
    "efficiency__flagged_at",
)


def _job_data(job: Job, *, gpu_idle: bool) -> dict[str, Any]:
    """JobOutput's rendering of a job whose project, tenant, cluster and user are in hand."""
    return {
        "id": str(job.pk),
        "project": f"{job.project.tenant.slug}/{job.project.slug}",
        "cluster": job.cluster.name,
        "name": job.name,
        "user": job.user.username if job.user else None,
        "cluster_username": job.cluster_username,
        "is_external": job.is_external,
        "state": str(job.state),
        "slurm_state": job.slurm_state,
        "state_reason": job.state_reason,
        "pending_reason": pending_reason_text(job.state_reason) if job.state == JobState.PENDING else "",
        "expected_start_at": _datetime(job.expected_start_at),
        "last_error": job.last_error,
        "cancel_requested": job.cancel_requested_at is not None,
        "slurm_job_id": job.slurm_job_id,
        "partition": job.partition,
        "gpu_type": job.gpu_type,
        "gpus": job.gpus,
        "node_count": job.node_count,
        "total_gpus": job.total_gpus,
        "max_switches": job.max_switches,
        "switch_wait_minutes": job.switch_wait_minutes,
        "cpus": job.cpus,
        "memory_gb": job.memory_gb,
        "time_limit_minutes": job.time_limit_minutes,
        "nodes": job.nodes,
        "switches": [str(switch) for switch in job.switches],
        "exit_code": job.exit_code,
        "submit_attempts": job.submit_attempts,
        "created_at": _datetime(job.created_at),
        "submitted_at": _datetime(job.submitted_at),
        "started_at": _datetime(job.started_at),
        "ended_at": _datetime(job.ended_at),
        "updated_at": _datetime(job.updated_at),
        "gpu_idle": gpu_idle,
        "rerun_of": str(job.rerun_of_id) if job.rerun_of_id else None,
        "array": job.array,
        "array_tasks": job.array_task_count,
        "array_max_running": job.array_max_running,
        "array_progress": (
            {key: int(job.array_progress.get(key, 0)) for key in PROGRESS_KEYS} if job.is_array else None
        ),
        "links": _job_links(job),
    }


def _accepted_submit_data(
    job: Job, *, transitions: list[JobTransition], estimate: dict[str, Any] | None, parents: list[tuple[Job, str]]
) -> dict[str, Any]:
    """JobSubmitOutput's rendering of a job just accepted, with the transitions stored with it."""
    return {
        **_job_data(job, gpu_idle=False),  # just accepted: nothing measured yet
        "cancelled_by": "",  # just accepted: nobody has cancelled it
        "cancel_reason": "",
        "script": job.script,
        "environment": {str(key): str(value) for key, value in job.environment.items()},
        "template": job.template_id,
        "working_directory": job.working_directory,
        "stdout_path": job.stdout_path,
        "stderr_path": job.stderr_path,
        "transitions": [
            {
                "from_state": transition.from_state,
                "to_state": str(transition.to_state),
                "at": _datetime(transition.at),
                "detail": transition.detail,
            }
            for transition in transitions
        ],
        "gpu_indices": {str(node): [int(index) for index in indexes] for node, indexes in job.gpu_indices.items()},
        "efficiency": None,
        "gpus_used": [],
        "reruns": [],
        # The jobs it waits for, none of which has met its condition yet as far as this request knows.
        "depends_on": _edges(
            [
                Edge(
                    job=parent,
                    condition=condition,
                    words=condition_words(condition, array=parent.is_array),
                    outcome="waiting",
                )
                for parent, condition in parents
            ]
        ),
        "dependents": [],
        "never_runs": "",
        "estimate": estimate,
    }


class JobSubmitInput(BodyInput):
    project = serializers.CharField(help_text="tenant/project, e.g. acme/vision")
    cluster = serializers.CharField(help_text="A cluster from GET /api/v1/clusters/")
    partition = serializers.CharField(required=False, help_text="Default: the cluster's default partition")
    gpus = serializers.IntegerField(required=False, min_value=0, help_text="GPUs on each node; default 1")
    nodes = serializers.IntegerField(
        source="node_count",
        required=False,
        min_value=1,
        max_value=10_000,
        help_text="Nodes for a multi-node job (sbatch --nodes); default 1. Each gets `gpus` GPUs",
    )
    switches = serializers.IntegerField(
        source="max_switches",
        required=False,
        min_value=1,
        max_value=1000,
        help_text="The most leaf switches the nodes may span (sbatch --switches): 1 puts them all under one switch",
    )
    switch_wait_minutes = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=10_000,
        help_text="The longest to wait for `switches` before Slurm places the job anyway (capped by the cluster's "
        "max_switch_wait); default: the cluster's",
    )
    gpu_type = serializers.CharField(required=False, allow_blank=True, help_text="e.g. h100; default: any")
    time_limit_minutes = serializers.IntegerField(required=False, min_value=1, max_value=10_000_000)
    name = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=1000)
    script = serializers.CharField(required=False, trim_whitespace=False, allow_blank=True, max_length=10_000_000)
    environment = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=1_000_000),
        required=False,
        help_text='Variables for the job, e.g. {"EPOCHS": "10"}',
    )
    cpus = serializers.IntegerField(required=False, min_value=1, max_value=100_000)
    memory_gb = serializers.IntegerField(required=False, min_value=1, max_value=1_000_000)
    template = serializers.CharField(
        required=False, help_text="A template id from GET /api/v1/job-templates/; given fields override it"
    )
    array = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="Make it a job array: task indexes such as 0-99, 1,5,9 or 0-99:2, optionally with %N, the most "
        "tasks running at once (0-99%10); each task gets SLURM_ARRAY_TASK_ID",
    )
    depends_on = serializers.ListField(
        child=DependencyInput(),
        required=False,
        max_length=MAX_PARENTS,
        help_text='Jobs of the same project this one waits for: [{"job": "<id>", "condition": "afterok"}]; it '
        "starts only once each has ended as its condition asks",
    )


class JobFilter(django_filters.FilterSet):  # type: ignore[misc]
    project = django_filters.CharFilter(method="filter_project", help_text="tenant/project")
    # Not DISTINCT (django-filter's default for a multiple choice): a job has one state, so no row repeats, and
    # DISTINCT over every column made the database sort a whole project's jobs for each page and its count.
    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices, distinct=False, help_text="Repeat for several states"
    )
    cluster = django_filters.CharFilter(field_name="cluster__name")
    user = django_filters.CharFilter(field_name="user__username", help_text="The submitter's username")
    external = django_filters.BooleanFilter(field_name="is_external")
    active = django_filters.BooleanFilter(method="filter_active", help_text="true: not ended yet")
    search = django_filters.CharFilter(method="filter_search", help_text="Part of the name, or a Slurm job id")

    class Meta:
        model = Job
        fields: list[str] = []

    def filter_project(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        project = _project_from_label(user=self.request.user, label=value, action=ProjectAction.VIEW)
        return queryset.filter(project=project)

    def filter_active(self, queryset: QuerySet[Job], name: str, value: bool) -> QuerySet[Job]:
        # Both as a list of states (not an exclusion), which the project-and-state index serves.
        final = [state.value for state in JobState if state not in _ACTIVE]
        return queryset.filter(state__in=[state.value for state in _ACTIVE] if value else final)

    def filter_search(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        condition = Q(name__icontains=value)
        if value.isdigit():
            condition |= Q(slurm_job_id=int(value))
        return queryset.filter(condition)


_ACTIVE = {JobState.QUEUED, JobState.PENDING, JobState.RUNNING}


IDEMPOTENCY_KEY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Send the same key when retrying: the job is created once, and the retry gets it back",
)


@extend_schema_view(
    get=extend_schema(summary="Jobs you may see, newest first", responses=JobOutput),
    post=extend_schema(
        summary="Submit a job: answers 202 at once with the job `queued`; a worker delivers it to Slurm",
        request=JobSubmitInput,
        parameters=[IDEMPOTENCY_KEY_HEADER],
        # 409: the quota refusals (`quota_exceeded`, `no_allocation`), the most important answer to parse.
        responses={202: JobSubmitOutput, 200: JobSubmitOutput, **ERRORS_WITH_CONFLICT},
    ),
)
class JobListApi(generics.ListAPIView):  # type: ignore[type-arg]
    queryset = Job.objects.none()
    serializer_class = JobOutput
    filterset_class = JobFilter
    pagination_class = KeysetPagination

    def get_queryset(self) -> QuerySet[Job]:
        return job_list_for_user(user=self.request.user).only(*JOB_OUTPUT_COLUMNS)

    def post(self, request: Request) -> Response:
        """Few queries, by design (a test holds the bound): the project, the user's roles in it and the cluster
        as last synced come in one query; the job, its first transition, its audit event and its reservation
        are written in one transaction; the reply is built from what was written, not read back."""
        serializer = JobSubmitInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        key = _idempotency_key(request)
        project, target = submission_project_get(
            user=request.user, label=data.pop("project"), cluster_name=data["cluster"]
        )
        depends_on = tuple(
            DependencyRequest(job=each["job"], condition=each["condition"]) for each in data.pop("depends_on", [])
        )
        accepted = job_services.job_submit_accepted(
            user=request.user,  # type: ignore[arg-type]
            project=project,
            request=JobRequest(**data, idempotency_key=key, depends_on=depends_on),
            target=target,
        )
        return _accepted_reply(accepted)


def _idempotency_key(request: Request) -> str:
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 100:
        raise serializers.ValidationError({"Idempotency-Key": ["Use a key of at most 100 characters."]})
    return key


def _accepted_reply(accepted: job_services.Accepted) -> Response:
    """202 with the new job and its estimate; 200 with the job an earlier request with the same key created."""
    if accepted.created:
        job = accepted.job
        # Billing depends on jobs, so its estimate is found by name rather than imported.
        estimator = settings.JOB_ESTIMATE_FUNCTION
        estimate = import_string(estimator)(accepted) if estimator else None
        reply = _accepted_submit_data(
            job, transitions=accepted.transitions, estimate=estimate, parents=accepted.parents
        )
    else:
        job = job_detail_load(job_id=accepted.job.pk)  # access was checked on the project or job
        transitions: list[JobTransition | JobTransitionArchive] = job.timeline
        reply = JobSubmitOutput(job, context={"estimate": None, "transitions": transitions}).data
    code = status.HTTP_202_ACCEPTED if accepted.created else status.HTTP_200_OK
    return Response(reply, status=code, headers={"Location": reverse("api-job", args=[job.pk])})


class JobBatchSubmitInput(BodyInput):
    jobs = serializers.ListField(
        child=JobSubmitInput(),
        min_length=1,
        max_length=job_services.BATCH_MAX_JOBS,
        error_messages={
            "min_length": "Send at least one job.",
            "max_length": "A batch carries at most {max_length} jobs; send the others in further batches.",
        },
        help_text=f"1 to {job_services.BATCH_MAX_JOBS} jobs, each as POST /api/v1/jobs/ takes it, all for the same "
        "project and cluster",
    )


class JobBatchSubmitOutput(serializers.Serializer[Any]):
    jobs = JobOutput(many=True, help_text="The jobs, in the order sent")


def _batch_job_request(item: dict[str, Any]) -> JobRequest:
    depends_on = tuple(
        DependencyRequest(job=each["job"], condition=each["condition"]) for each in item.pop("depends_on", [])
    )
    return JobRequest(**{name: value for name, value in item.items() if name != "project"}, depends_on=depends_on)


class JobBatchApi(APIView):
    @extend_schema(
        operation_id="jobs_batch_create",
        summary="Submit many jobs at once, all or none (a sweep): answers 202 with every job `queued`; one "
        "problem anywhere refuses the whole batch, each named by `jobs.<index>.<field>`",
        request=JobBatchSubmitInput,
        parameters=[IDEMPOTENCY_KEY_HEADER],
        responses={202: JobBatchSubmitOutput, 200: JobBatchSubmitOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request) -> Response:
        """As POST /api/v1/jobs/ for each job, in a constant few queries whatever their number (a test holds it):
        the project, roles and cluster read once, each table written with one insert, the GPU-hours reserved at
        once (a refusal says how many of the jobs fit)."""
        serializer = JobBatchSubmitInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        items = [dict(item) for item in serializer.validated_data["jobs"]]
        key = _idempotency_key(request)
        label, cluster_name = items[0]["project"], items[0]["cluster"]
        problems: dict[str, list[str]] = {}
        for index, item in enumerate(items):
            for name, first in (("project", label), ("cluster", cluster_name)):
                if item[name] != first:
                    problems[f"jobs.{index}.{name}"] = [
                        f"A batch goes to one project and cluster: the first job names {name} '{first}'; "
                        "send this one in another batch."
                    ]
        if problems:
            raise serializers.ValidationError(problems)
        project, target = submission_project_get(user=request.user, label=label, cluster_name=cluster_name)
        accepted = job_services.job_submit_batch(
            user=request.user,  # type: ignore[arg-type]
            project=project,
            requests=[_batch_job_request(item) for item in items],
            target=target,
            idempotency_key=key,
        )
        if accepted.created:
            return Response(
                {"jobs": [_job_data(job, gpu_idle=False) for job in accepted.jobs]}, status=status.HTTP_202_ACCEPTED
            )
        # A retry: the jobs the first request created, as a read of them says now.
        ids = [job.pk for job in accepted.jobs]
        earlier = {job.pk: job for job in job_list_for_user(user=request.user).filter(pk__in=ids)}
        return Response({"jobs": JobOutput([earlier[pk] for pk in ids if pk in earlier], many=True).data})


class JobDetailApi(APIView):
    @extend_schema(
        operation_id="jobs_retrieve",
        summary="A job with its script, environment and timeline",
        responses={200: JobDetailOutput, **ERRORS},
    )
    def get(self, request: Request, job_id: str) -> Response:
        return Response(JobDetailOutput(job_get_for_user(user=request.user, job_id=job_id)).data)


class JobCancelEffectOutput(serializers.Serializer[Any]):
    job = serializers.UUIDField(source="job.pk")
    name = serializers.CharField(source="job.name")
    condition = serializers.ChoiceField(choices=DependencyCondition.choices)
    will_run = serializers.BooleanField(help_text="false: the child will never run (it waited for this job to succeed)")
    words = serializers.CharField(help_text="What happens to it, in plain words")


class JobCancelOutput(JobDetailOutput):
    children_after_cancel = serializers.SerializerMethodField(
        help_text="What the cancel does to the jobs waiting for this one: afterok children will never run, afterany "
        "and afternotok children will run"
    )

    @extend_schema_field(JobCancelEffectOutput(many=True))
    def get_children_after_cancel(self, job: Job) -> list[dict[str, Any]]:
        return list(JobCancelEffectOutput(self.context.get("cancel_effects", []), many=True).data)


class JobCancelInput(BodyInput):
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=job_services.CANCEL_REASON_MAX_LENGTH,
        help_text="Why, for the job's page and the audit log (optional)",
    )


class JobCancelApi(APIView):
    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job (its owner, project managers, tenant admins); a queued job never reaches Slurm",
        request=JobCancelInput,
        responses={202: JobCancelOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id, action=JobAction.CANCEL)
        data = JobCancelInput(data=request.data)
        data.is_valid(raise_exception=True)
        effects = cancel_effects(job)  # told before: a child that then ends is no longer "waiting"
        job_services.job_cancel(user=request.user, job=job, reason=data.validated_data.get("reason", ""))  # type: ignore[arg-type]
        job = job_get_for_user(user=request.user, job_id=job_id)
        reply = JobCancelOutput(job, context={"cancel_effects": effects}).data
        return Response(reply, status=status.HTTP_202_ACCEPTED)


class JobRerunInput(JobSubmitInput):
    """What a rerun may change (a submission's fields named in RERUN_FIELDS, checked alike); every field left
    out keeps the original job's value, and any other (`project`, `template`) is refused by name."""

    cluster = serializers.CharField(required=False, help_text="Default: the original job's cluster")
    keep_dependencies = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Wait for the original's parents with the same conditions (checked as depends_on is); default: "
        "run alone",
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields().items()
        return {
            name: field
            for name, field in fields
            if (field.source or name) in RERUN_FIELDS or name == "keep_dependencies"
        }


class JobRerunApi(APIView):
    @extend_schema(
        operation_id="jobs_rerun",
        summary="Run a job again (those who may submit to its project): its script, environment and shape, "
        "with the fields given changed; the new job's `rerun_of` names the original",
        request=JobRerunInput,
        parameters=[IDEMPOTENCY_KEY_HEADER],
        responses={202: JobSubmitOutput, 200: JobSubmitOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id, action=JobAction.RERUN)
        serializer = JobRerunInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        overrides = dict(serializer.validated_data)
        keep_dependencies = overrides.pop("keep_dependencies", False)
        accepted = job_rerun(
            user=request.user,  # type: ignore[arg-type]
            job=job,
            overrides=overrides,
            idempotency_key=_idempotency_key(request),
            keep_dependencies=keep_dependencies,
        )
        return _accepted_reply(accepted)


class JobWatchOutput(serializers.Serializer[Any]):
    watching = serializers.BooleanField(help_text="Whether you will be told when the job ends")


class JobWatchApi(APIView):
    @extend_schema(
        operation_id="jobs_watch",
        summary="Be told when the job ends, with its outcome and cost (a portal notification and an e-mail); "
        "anyone who may see the job",
        request=None,
        responses={200: JobWatchOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id)
        watching = job_end_watch_set(user=request.user, job=job, watching=True)  # type: ignore[arg-type]
        return Response(JobWatchOutput({"watching": watching}).data)

    @extend_schema(
        operation_id="jobs_unwatch",
        summary="Stop being told when the job ends",
        responses={200: JobWatchOutput, **ERRORS},
    )
    def delete(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id)
        watching = job_end_watch_set(user=request.user, job=job, watching=False)  # type: ignore[arg-type]
        return Response(JobWatchOutput({"watching": watching}).data)


class PipelineWatchApi(APIView):
    @extend_schema(
        operation_id="jobs_watch_pipeline",
        summary="Be told when the whole pipeline this job is a step of ends (every job connected to it by "
        "dependencies has ended or will never run), with each step's outcome and the total cost; anyone who may "
        "see the job",
        request=None,
        responses={200: JobWatchOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id)
        watching = pipeline_end_watch_set(user=request.user, job=job, watching=True)  # type: ignore[arg-type]
        return Response(JobWatchOutput({"watching": watching}).data)

    @extend_schema(
        operation_id="jobs_unwatch_pipeline",
        summary="Stop being told when the pipeline ends (asked from any of its steps)",
        responses={200: JobWatchOutput, **ERRORS},
    )
    def delete(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id)
        watching = pipeline_end_watch_set(user=request.user, job=job, watching=False)  # type: ignore[arg-type]
        return Response(JobWatchOutput({"watching": watching}).data)


# Array tasks -------------------------------------------------------------------------------------------


class JobArrayTaskOutput(serializers.Serializer[Any]):
    index = serializers.IntegerField(help_text="The task's index (SLURM_ARRAY_TASK_ID)")
    state = serializers.ChoiceField(choices=JobState.choices)
    slurm_state = serializers.CharField()
    state_reason = serializers.CharField()
    slurm_job_id = serializers.IntegerField(allow_null=True, help_text="The task's own Slurm job id, once it started")
    nodes = serializers.CharField()
    exit_code = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    cancel_requested = serializers.SerializerMethodField()
    links = serializers.SerializerMethodField()

    def get_cancel_requested(self, task: JobArrayTask) -> bool:
        return task.cancel_requested_at is not None

    def get_links(self, task: JobArrayTask) -> dict[str, str]:
        return {
            "cancel": reverse("api-job-task-cancel", args=[task.job_id, task.index]),
            "log": f"/api/v1/jobs/{task.job_id}/log/?task={task.index}",
            "log_socket": f"/ws/jobs/{task.job_id}/log/?task={task.index}",
        }


class JobArrayTaskFilterInput(serializers.Serializer[Any]):
    state = serializers.MultipleChoiceField(choices=JobState.choices, required=False, help_text="Repeat for several")


class JobArrayTaskListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="jobs_tasks_list",
        summary="A job array's tasks, by index, each with its state, times, exit code and nodes (paginated)",
        parameters=[JobArrayTaskFilterInput],
        responses={200: JobArrayTaskOutput(many=True), **ERRORS},
    )
    def get(self, request: Request, job_id: str) -> Response:
        filters = JobArrayTaskFilterInput(data={"state": request.query_params.getlist("state")})
        filters.is_valid(raise_exception=True)
        job = job_get_for_user(user=request.user, job_id=job_id)
        tasks = job_array_task_list(job=job, states=sorted(filters.validated_data.get("state") or ()))
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(tasks, request, view=self) or []
        return paginator.get_paginated_response(JobArrayTaskOutput(page, many=True).data)


class JobArrayTaskCancelApi(APIView):
    @extend_schema(
        operation_id="jobs_tasks_cancel",
        summary="Cancel one task of a job array (who may cancel the array); the other tasks go on",
        request=None,
        responses={202: JobArrayTaskOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, job_id: str, index: int) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id, action=JobAction.CANCEL)
        task = job_services.job_array_task_cancel(user=request.user, job=job, index=index)  # type: ignore[arg-type]
        return Response(JobArrayTaskOutput(task).data, status=status.HTTP_202_ACCEPTED)


# Templates ---------------------------------------------------------------------------------------------


class JobTemplateOutput(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="Pass as `template` when submitting")
    kind = serializers.ChoiceField(choices=["builtin", "project"])
    project = serializers.CharField(allow_null=True, help_text="tenant/project; null for built-in templates")
    name = serializers.CharField()
    description = serializers.CharField()
    script = serializers.CharField()
    partition = serializers.CharField()
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField(help_text="GPUs on each node")
    nodes = serializers.IntegerField(source="node_count")
    time_limit_minutes = serializers.IntegerField()
    cpus = serializers.IntegerField(allow_null=True)
    memory_gb = serializers.IntegerField(allow_null=True)
    environment = serializers.DictField(child=serializers.CharField())
    array = serializers.CharField(help_text="A job array's indexes; empty: plain jobs")
    created_by = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)


def _template_data(template: JobTemplate | BuiltinTemplate) -> dict[str, Any]:
    data = {field: getattr(template, field) for field in job_services.TEMPLATE_FIELDS}
    if isinstance(template, BuiltinTemplate):
        return {**data, "id": template.id, "kind": "builtin", "project": None, "created_by": None, "updated_at": None}
    return {
        **data,
        "id": str(template.pk),
        "kind": "project",
        "project": str(template.project),
        "created_by": template.created_by.username if template.created_by else None,
        "updated_at": template.updated_at,
    }


class JobTemplateInput(BodyInput):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, max_length=5000)
    script = serializers.CharField(trim_whitespace=False, max_length=10_000_000)
    partition = serializers.CharField(required=False, allow_blank=True, max_length=64)
    gpu_type = serializers.CharField(required=False, allow_blank=True, max_length=64)
    gpus = serializers.IntegerField(required=False, min_value=1, max_value=1000, help_text="GPUs on each node")
    nodes = serializers.IntegerField(source="node_count", required=False, min_value=1, max_value=10_000)
    time_limit_minutes = serializers.IntegerField(required=False, min_value=1, max_value=10_000_000)
    cpus = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=100_000)
    memory_gb = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1_000_000)
    environment = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False
    )
    array = serializers.CharField(required=False, allow_blank=True, max_length=200, help_text="e.g. 0-99%10")


class JobTemplateCreateInput(JobTemplateInput):
    project = serializers.CharField(help_text="tenant/project the template belongs to")


class JobTemplateUpdateInput(JobTemplateInput):
    name = serializers.CharField(max_length=100, required=False)
    script = serializers.CharField(trim_whitespace=False, max_length=10_000_000, required=False)


class JobTemplateFilterInput(serializers.Serializer[Any]):
    project = serializers.CharField(
        required=False, help_text="tenant/project: the built-in templates and that project's own"
    )


class JobTemplateListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="job_templates_list",
        summary="Built-in templates, then the saved templates of the projects you may see",
        parameters=[JobTemplateFilterInput],
        responses={200: JobTemplateOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = JobTemplateFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        label = filters.validated_data.get("project")
        project = _project_from_label(user=request.user, label=label, action=ProjectAction.VIEW) if label else None
        templates: list[JobTemplate | BuiltinTemplate] = [*BUILTIN_TEMPLATES.values()]
        templates += list(job_template_list_for_user(user=request.user, project=project))
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(templates, request, view=self) or []
        return paginator.get_paginated_response(JobTemplateOutput([_template_data(t) for t in page], many=True).data)

    @extend_schema(
        operation_id="job_templates_create",
        summary="Save a template for a project (its members and managers)",
        request=JobTemplateCreateInput,
        responses={201: JobTemplateOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        serializer = JobTemplateCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        project = _project_from_label(user=request.user, label=data.pop("project"), action=ProjectAction.SUBMIT)
        template = job_services.job_template_save(user=request.user, project=project, values=data)  # type: ignore[arg-type]
        return Response(JobTemplateOutput(_template_data(template)).data, status=status.HTTP_201_CREATED)


class JobTemplateDetailApi(APIView):
    def _saved(self, request: Request, template_id: str, *, change: bool) -> JobTemplate:
        if template_id in BUILTIN_TEMPLATES:
            raise Conflict(
                "Built-in templates are read-only; save a copy to your project with POST /api/v1/job-templates/."
            )
        return job_template_get_for_user(user=request.user, template_id=template_id, change=change)

    @extend_schema(
        operation_id="job_templates_retrieve", summary="One template", responses={200: JobTemplateOutput, **ERRORS}
    )
    def get(self, request: Request, template_id: str) -> Response:
        if template_id in BUILTIN_TEMPLATES:
            return Response(JobTemplateOutput(_template_data(BUILTIN_TEMPLATES[template_id])).data)
        return Response(JobTemplateOutput(_template_data(self._saved(request, template_id, change=False))).data)

    @extend_schema(
        operation_id="job_templates_partial_update",
        summary="Change a saved template (its author, project managers, tenant admins)",
        request=JobTemplateUpdateInput,
        responses={200: JobTemplateOutput, **ERRORS_WITH_CONFLICT},
    )
    def patch(self, request: Request, template_id: str) -> Response:
        template = self._saved(request, template_id, change=True)
        serializer = JobTemplateUpdateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        saved = job_services.job_template_save(
            user=request.user,  # type: ignore[arg-type]
            project=template.project,
            values=dict(serializer.validated_data),
            template=template,
        )
        return Response(JobTemplateOutput(_template_data(saved)).data)

    @extend_schema(
        operation_id="job_templates_destroy",
        summary="Delete a saved template (its author, project managers, tenant admins)",
        responses={204: None, **ERRORS_WITH_CONFLICT},
    )
    def delete(self, request: Request, template_id: str) -> Response:
        template = self._saved(request, template_id, change=True)
        job_services.job_template_delete(user=request.user, template=template)  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)
