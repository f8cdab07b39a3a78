"""Browser pages of the jobs area: submit (with a live cost estimate), the live list of jobs, and a job's page
with its timeline, cancel button and live log viewer.

Views parse input, call the jobs and billing selectors and services, and render. The rules (what a job may ask
for, who may cancel it, what it costs) stay in those services."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import F, QuerySet, Value
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from rest_framework.exceptions import ValidationError as DrfValidationError

from billing.efficiency import job_waste_for
from billing.estimates import Estimate, estimate_for_request, job_estimate
from billing.job_costs import job_cost, job_costs, jobs_with_cost
from billing.selectors import job_usage
from clusters.models import Cluster
from clusters.selectors import cluster_list_active, cluster_list_for_user, submission_target_get
from jobs.end_watches import job_end_watch_set, job_end_watching, pipeline_end_watch_set, pipeline_end_watching
from jobs.fitting import CoveredShape, covered_shape_choose, free_alternatives
from jobs.job_services import (
    CANCEL_REASON_MAX_LENGTH,
    JobRequest,
    environment_variable_problems,
    job_cancel,
    job_submission_problems,
    job_submit,
    job_template_resolve,
)
from jobs.log_apis import job_log_download
from jobs.models import ACTIVE_JOB_STATES, DependencyCondition, Job, JobArrayTask, JobState
from jobs.pipelines import DependencyRequest, Edge, Pipeline, cancel_effects, pipeline_of
from jobs.reasons import pending_reason_text
from jobs.reruns import job_rerun
from jobs.selectors import (
    JOB_SEARCH_SPAN,
    JobAction,
    job_action_allowed,
    job_array_task_list,
    job_get_for_user,
    job_is_gpu_idle,
    job_list_filtered_for_user,
    job_list_window,
    job_pipeline_parent_choices,
    job_reruns_list,
    job_template_list_for_user,
    project_list_submittable_for_user,
)
from jobs.templates import BUILTIN_TEMPLATES, BuiltinTemplate
from portal.errors import Conflict
from portal.keyset import (
    BoundedCount,
    CursorInvalid,
    KeysetPage,
    WindowedPage,
    bounded_count,
    keyset_page,
    windowed_keyset_page,
)
from tenants.models import Project
from tenants.selectors import ProjectAction, project_get_by_label_for_user, project_list_for_user

JOBS_PER_PAGE = 25
# Live updates of the list: one WebSocket per project shown, up to this many.
MAX_WATCHED_PROJECTS = 30

DEFAULT_SCRIPT = """#!/bin/bash
# Runs in the job's own directory on the cluster; its output appears live on the job's page.
echo "job ${SLURM_JOB_ID} on $(hostname) with GPUs ${CUDA_VISIBLE_DEVICES:-none}"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
"""


def _label(project: Project) -> str:
    return f"{project.tenant.slug}/{project.slug}"


# Submit ------------------------------------------------------------------------------------------------


class JobForm(forms.Form):
    """Parses the submit form's fields into types; what a job may ask for is `job_submit`'s to decide."""

    project = forms.CharField(max_length=200, error_messages={"required": "Choose a project."})
    cluster = forms.CharField(max_length=100, error_messages={"required": "Choose a cluster."})
    template = forms.CharField(max_length=64, required=False)
    partition = forms.CharField(max_length=64, required=False)
    gpu_type = forms.CharField(max_length=64, required=False)
    gpus = forms.IntegerField(required=False, min_value=-1000, max_value=100_000)
    nodes = forms.IntegerField(required=False, min_value=-1000, max_value=100_000)
    switches = forms.IntegerField(required=False, min_value=-1000, max_value=100_000)
    switch_wait_minutes = forms.IntegerField(required=False, min_value=-1000, max_value=100_000)
    time_limit_minutes = forms.IntegerField(required=False, min_value=-1000, max_value=10_000_000)
    cpus = forms.IntegerField(required=False, min_value=-1000, max_value=100_000)
    memory_gb = forms.IntegerField(required=False, min_value=-1000, max_value=1_000_000)
    name = forms.CharField(max_length=1000, required=False, strip=False)
    script = forms.CharField(max_length=10_000_000, required=False, strip=False)
    environment = forms.CharField(max_length=1_000_000, required=False, strip=False)
    array = forms.CharField(max_length=1000, required=False)
    # The jobs it waits for: ids ticked in `depends_on`, each with its condition in `condition_<id>` (read from
    # the POST by `depends_on_from`, since their names depend on the jobs offered).
    depends_on = forms.CharField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dependencies: tuple[DependencyRequest, ...] = ()

    def depends_on_from(self, post: Any) -> None:
        """Read the ticked parents and their conditions; a malformed one is a form error of `depends_on`."""
        chosen = []
        for raw in post.getlist("depends_on"):
            try:
                job_id = UUID(raw)
            except ValueError:
                self.add_error("depends_on", f"'{raw[:40]}' is not a job id.")
                continue
            condition = post.get(f"condition_{raw}", DependencyCondition.AFTER_OK)
            if condition not in DependencyCondition.values:
                self.add_error(
                    "depends_on", f"'{condition[:40]}' is not a condition; use afterok, afterany or afternotok."
                )
                continue
            chosen.append(DependencyRequest(job=job_id, condition=condition))
        self.dependencies = tuple(chosen)

    def clean_script(self) -> str:
        # Browsers send a textarea's line breaks as CRLF; "#!/bin/bash\r" would be a bad interpreter in Slurm.
        return str(self.cleaned_data["script"]).replace("\r\n", "\n")

    def clean_environment(self) -> dict[str, str]:
        """One `NAME=value` per line; blank lines and lines starting with # are skipped. Every bad line is named
        by its number, checked by the same rule the API applies to each variable."""
        variables: dict[str, str] = {}
        problems = []
        for number, line in enumerate(self.cleaned_data["environment"].splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, equals, value = line.partition("=")
            if not equals:
                problems.append(f"Line {number}: write NAME=value.")
                continue
            key = key.strip()
            problems += [f"Line {number}: {trouble}" for trouble in environment_variable_problems(key, value)]
            variables[key] = value
        if problems:
            raise ValidationError(problems)
        return variables

    def job_request(self) -> JobRequest:
        """The request as parsed; a field that did not parse is left out (None), for `job_submission_problems`
        to check the others."""
        data = {field: None for field in self.fields} | self.cleaned_data
        return JobRequest(
            cluster=data["cluster"],
            partition=data["partition"] or None,
            gpu_type=data["gpu_type"] or None,
            gpus=data["gpus"],
            node_count=data["nodes"],
            max_switches=data["switches"],
            switch_wait_minutes=data["switch_wait_minutes"],
            time_limit_minutes=data["time_limit_minutes"],
            cpus=data["cpus"],
            memory_gb=data["memory_gb"],
            name=data["name"] or None,
            script=data["script"] or None,
            environment=data["environment"],
            template=data["template"] or None,
            array=data["array"] or None,
            depends_on=self.dependencies,
        )

    def rerun_overrides(self) -> dict[str, Any]:
        """The fields of an "edit and run again" form, as changes to the job it runs again."""
        request = self.job_request()
        fields = (
            "cluster",
            "partition",
            "gpu_type",
            "gpus",
            "node_count",
            "max_switches",
            "switch_wait_minutes",
            "time_limit_minutes",
            "cpus",
            "memory_gb",
            "name",
            "script",
            "environment",
            "array",
        )
        return {field: getattr(request, field) for field in fields}


@dataclass
class SubmitChoices:
    """What the submit form offers: projects the user may submit to, clusters, and the chosen ones."""

    projects: list[Project]
    clusters: list[Cluster]
    project: Project | None
    cluster: Cluster | None
    # Where the form starts: a shape on `cluster` that the project's open allocations cover, if any.
    covered: CoveredShape | None = None


def _choices(request: HttpRequest, *, project_label: str, cluster_name: str) -> SubmitChoices:
    projects = list(project_list_submittable_for_user(user=request.user))
    clusters = list(cluster_list_for_user(user=request.user))
    project = next((p for p in projects if _label(p) == project_label), projects[0] if projects else None)
    cluster = next((c for c in clusters if c.name == cluster_name), None)
    # Without a cluster chosen, the first one the project has GPU-hours on; on a chosen one, what they cover there.
    covered = covered_shape_choose(project=project, clusters=[cluster] if cluster else clusters) if project else None
    if cluster is None:
        cluster = covered.cluster if covered else (clusters[0] if clusters else None)
    return SubmitChoices(projects=projects, clusters=clusters, project=project, cluster=cluster, covered=covered)


def _environment_text(environment: dict[str, str]) -> str:
    return "\n".join(f"{key}={value}" for key, value in environment.items())


def _initial_values(choices: SubmitChoices, template: Any) -> dict[str, Any]:
    """The form's values on first display: the template's, else the cluster's defaults and a starter script."""
    partitions = list(choices.cluster.partitions.all()) if choices.cluster else []
    default = next((p for p in partitions if p.is_default), partitions[0] if partitions else None)
    covered = choices.covered
    if covered is not None:
        default = next((p for p in partitions if p.name == covered.partition), default)
    values: dict[str, Any] = {
        "partition": default.name if default else "",
        "gpu_type": covered.gpu_type if covered else "",
        "gpus": 1,
        "nodes": 1,
        "switches": None,
        "switch_wait_minutes": None,
        "time_limit_minutes": (default.default_time_minutes if default else None) or 60,
        "cpus": None,
        "memory_gb": None,
        "name": "",
        "script": DEFAULT_SCRIPT,
        "environment": "",
        "template": "",
        "array": "",
    }
    if template is not None:
        values.update(
            template=template.id if isinstance(template, BuiltinTemplate) else str(template.pk),
            partition=template.partition or values["partition"],
            gpu_type=template.gpu_type or _covered_type_on(partitions, template.partition, values),
            gpus=template.gpus,
            nodes=template.node_count,
            time_limit_minutes=template.time_limit_minutes,
            cpus=template.cpus,
            memory_gb=template.memory_gb,
            name=template.name,
            script=template.script,
            environment=_environment_text(dict(template.environment)),
            array=template.array,
        )
    return values


def _covered_type_on(partitions: list[Any], partition_name: str, values: dict[str, Any]) -> str:
    """For a template that names no GPU type: the covered type, where the template's partition offers it."""
    if not partition_name or partition_name == values["partition"]:
        return str(values["gpu_type"])
    named = next((p for p in partitions if p.name == partition_name), None)
    return str(values["gpu_type"]) if named is not None and values["gpu_type"] in named.gpu_types else ""


def _templates(request: HttpRequest, project: Project | None) -> list[dict[str, str]]:
    """The built-in templates, then the project's saved ones, as links that prefill the form."""
    rows: list[dict[str, str]] = [
        {"id": template.id, "name": template.name, "description": template.description, "kind": "Built-in"}
        for template in BUILTIN_TEMPLATES.values()
    ]
    if project is not None:
        rows += [
            {"id": str(saved.pk), "name": saved.name, "description": saved.description, "kind": "Project"}
            for saved in job_template_list_for_user(user=request.user, project=project)
        ]
    return rows


def _render_submit(
    request: HttpRequest,
    *,
    choices: SubmitChoices,
    values: dict[str, Any],
    errors: dict[str, list[str]] | None = None,
    form_errors: list[str] | None = None,
    template_missing: str = "",
    status: int = 200,
    rerun_of: Job | None = None,
) -> HttpResponse:
    errors = dict(errors or {})
    if rerun_of is not None:  # a rerun stays in the original's project
        choices = replace(choices, projects=[rerun_of.project], project=rerun_of.project)
    # Errors that concern no single field go to the top of the form, with the service's conflicts.
    form_errors = [*(form_errors or []), *errors.pop("__all__", [])]
    partitions = list(choices.cluster.partitions.all()) if choices.cluster else []
    query = {
        "project": _label(choices.project) if choices.project else "",
        "cluster": choices.cluster.name if choices.cluster else "",
    }
    context = {
        "choices": choices,
        "project_label": query["project"],
        "values": values,
        "errors": errors,
        "form_errors": form_errors,
        "template_missing": template_missing,
        "templates": _templates(request, choices.project),
        "template_query": urlencode(query),
        "partitions": partitions,
        # Its nodes' CPUs and memory are the limits the form names beside those fields.
        "chosen_partition": next((p for p in partitions if p.name == values.get("partition")), None),
        # A pipeline's step waits for jobs of the same project on the same cluster (not offered for a rerun).
        "parent_choices": []
        if rerun_of is not None or choices.project is None
        else job_pipeline_parent_choices(
            project=choices.project, cluster_id=choices.cluster.pk if choices.cluster else None
        ),
        "conditions": DependencyCondition.choices,
        "chosen_parents": {
            value: request.POST.get(f"condition_{value}", "") for value in request.POST.getlist("depends_on")
        },
        "gpu_types": list(choices.cluster.gpu_types.all()) if choices.cluster else [],
        "rerun_of": rerun_of,
    }
    return render(request, "frontend/jobs/submit.html", context, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def job_submit_page(request: HttpRequest) -> HttpResponse:
    """GET: the form (`?project=&cluster=&template=` choose and prefill). POST: submit, then the job's page."""
    if request.method == "POST":
        return _submit(request)
    if request.GET.get("rerun"):
        return _rerun_form(request, job_id=request.GET["rerun"])
    choices = _choices(
        request, project_label=request.GET.get("project", ""), cluster_name=request.GET.get("cluster", "")
    )
    template_id = request.GET.get("template", "")
    template = (
        job_template_resolve(project=choices.project, template_id=template_id)
        if template_id and choices.project
        else None
    )
    values = _initial_values(choices, template)
    # htmx re-renders the shape fields when the cluster changes: keep what the user already wrote.
    for field in ("name", "script", "environment", "template"):
        if field in request.GET and not template_id:
            values[field] = request.GET[field]
    return _render_submit(
        request,
        choices=choices,
        values=values,
        template_missing=template_id if template_id and template is None else "",
    )


def _rerun_form(request: HttpRequest, *, job_id: str) -> HttpResponse:
    """Edit and run again: the form prefilled with the job's fields, submitting a rerun linked to it."""
    job = job_get_for_user(user=request.user, job_id=job_id, action=JobAction.RERUN)
    choices = _choices(request, project_label=_label(job.project), cluster_name=job.cluster.name)
    values = {
        **_initial_values(choices, None),
        "partition": job.partition,
        "gpu_type": job.gpu_type,
        "gpus": job.gpus,
        "nodes": job.node_count,
        "switches": job.max_switches,
        "switch_wait_minutes": job.switch_wait_minutes,
        "time_limit_minutes": job.time_limit_minutes,
        "cpus": job.cpus,
        "memory_gb": job.memory_gb,
        "name": job.name,
        "script": job.script,
        "environment": _environment_text(dict(job.environment)),
        "array": job.array,
    }
    return _render_submit(request, choices=choices, values=values, rerun_of=job)


def _submit(request: HttpRequest) -> HttpResponse:
    form = JobForm(request.POST)
    rerun_id = request.POST.get("rerun_of", "")
    original = job_get_for_user(user=request.user, job_id=rerun_id, action=JobAction.RERUN) if rerun_id else None
    choices = _choices(
        request,
        project_label=_label(original.project) if original else request.POST.get("project", ""),
        cluster_name=request.POST.get("cluster", ""),
    )
    values = {key: request.POST.get(key, "") for key in JobForm.base_fields}
    valid = form.is_valid()
    if original is None:
        form.depends_on_from(request.POST)
    if not valid or form.errors:
        errors = _every_error(request, form=form, original=original)
        return _render_submit(request, choices=choices, values=values, errors=errors, rerun_of=original)
    try:
        if original is not None:
            job = job_rerun(user=request.user, job=original, overrides=form.rerun_overrides()).job  # type: ignore[arg-type]
        else:
            project = project_get_by_label_for_user(
                user=request.user, label=form.cleaned_data["project"], action=ProjectAction.SUBMIT
            )
            job, _ = job_submit(user=request.user, project=project, request=form.job_request())  # type: ignore[arg-type]
    except ValidationError as error:
        return _render_submit(request, choices=choices, values=values, errors=_field_errors(error), rerun_of=original)
    except Conflict as error:
        return _render_submit(request, choices=choices, values=values, form_errors=[str(error)], rerun_of=original)
    messages.success(request, f"Job “{job.name}” was accepted; a worker is handing it to {job.cluster.name}.")
    # (A job of a pipeline waits in Slurm for its parents: its page shows them.)
    return redirect("job-detail", job_id=job.pk)


def _every_error(request: HttpRequest, *, form: JobForm, original: Job | None) -> dict[str, list[str]]:
    """The form's own errors, and what `job_submit` would say of the fields that did parse: one bad field (a
    bad line of the environment) must not hide the others' errors until the next try."""
    errors = {field: [str(text) for text in texts] for field, texts in form.errors.items()}
    project = original.project if original is not None else None
    if project is None and "project" in form.cleaned_data:
        project = project_get_by_label_for_user(
            user=request.user, label=form.cleaned_data["project"], action=ProjectAction.SUBMIT
        )
    if project is None or "cluster" not in form.cleaned_data:
        return errors
    problems = job_submission_problems(user=request.user, project=project, request=form.job_request())  # type: ignore[arg-type]
    for field, texts in problems.items():
        if field not in errors:  # a field the form could not parse was left out, so has only the form's errors
            errors[field] = list(texts)
    return errors


def _field_errors(error: ValidationError) -> dict[str, list[str]]:
    if hasattr(error, "error_dict"):
        return {field: list(texts) for field, texts in error.message_dict.items()}
    return {"__all__": list(error.messages)}


@require_POST
@login_required
def job_estimate_partial(request: HttpRequest) -> HttpResponse:
    """The cost estimate and quota left for the form as it stands (htmx posts here as the form changes)."""
    form = JobForm(request.POST)
    form.is_valid()
    data = form.cleaned_data
    context: dict[str, Any] = {"estimate": None, "problems": []}
    if not data.get("project") or not data.get("cluster"):
        context["problems"] = ["Choose a project and a cluster to see what the job would cost."]
        return render(request, "frontend/jobs/_estimate.html", context)
    project = project_get_by_label_for_user(user=request.user, label=data["project"], action=ProjectAction.VIEW)
    # The form's own problems, and (checked on the fields that parsed) the shape's: all of them at once.
    problems = [str(text) for texts in form.errors.values() for text in texts]
    estimate: Estimate | None = None
    try:
        estimate = estimate_for_request(project=project, request=form.job_request())
    except ValidationError as error:
        shape_problems = _field_errors(error)
        problems += [text for field, texts in shape_problems.items() if field not in form.errors for text in texts]
    if problems or estimate is None:
        context["problems"] = problems
    else:
        context["estimate"] = estimate
        # With the chosen partition's limits: the form's hints name those of the partition it was drawn with.
        target = submission_target_get(cluster_name=estimate.cluster_name, user=request.user)
        context["resources"] = {
            "cpus": data["cpus"],
            "memory_gb": data["memory_gb"],
            "partition": target.partitions.get(estimate.partition) if target else None,
        }
    return render(request, "frontend/jobs/_estimate.html", context)


# The list ------------------------------------------------------------------------------------------------


DATE_FORMAT_ERROR = "Write the date as YYYY-MM-DD, e.g. 2026-11-01."
FILTER_FIELDS = ("project", "state", "owner", "cluster", "search", "submitted_from", "submitted_to")
# The list's sorts: `?sort=name` ascending, `?sort=-name` descending; newest submitted first by default.
SORTS = {
    "submitted": "Submitted",
    "duration": "Duration",
    "cost": "Cost",
    "gpus": "GPUs",
    "owner": "Owner",
    "exit_code": "Exit code",
}
DEFAULT_SORT = "-submitted"
# An order by a value no index keeps (duration, cost, GPUs, owner, exit code) sorts the newest SORT_LIMIT jobs of
# the list: sorting every job of a long history reads them all (seconds at 1M jobs, bench/history.py). The page
# says so, and the filters (a project, a state, a range of dates) narrow what is sorted.
SORT_LIMIT = 1000
SORT_CHOICES = [
    ("-submitted", "Newest first"),
    ("submitted", "Oldest first"),
    ("-duration", "Longest running"),
    ("duration", "Shortest running"),
    ("-cost", "Costliest"),
    ("cost", "Cheapest"),
    ("-gpus", "Most GPUs"),
    ("gpus", "Fewest GPUs"),
    ("owner", "Owner A to Z"),
    ("-owner", "Owner Z to A"),
    ("exit_code", "Exit code, lowest first"),
    ("-exit_code", "Exit code, highest first"),
]


class JobFilterForm(forms.Form):
    """The list's filters and sort, as the URL's query carries them; a value it cannot read is an error shown
    beside its field, never a silently wider list."""

    project = forms.CharField(required=False, max_length=200)
    state = forms.CharField(required=False, max_length=32)
    cluster = forms.CharField(required=False, max_length=100)
    search = forms.CharField(required=False, max_length=200)
    owner = forms.CharField(required=False, max_length=150)
    submitted_from = forms.DateField(
        required=False, input_formats=["%Y-%m-%d"], error_messages={"invalid": DATE_FORMAT_ERROR}
    )
    submitted_to = forms.DateField(
        required=False, input_formats=["%Y-%m-%d"], error_messages={"invalid": DATE_FORMAT_ERROR}
    )
    sort = forms.CharField(required=False, max_length=32)

    def clean_state(self) -> str:
        state = str(self.cleaned_data["state"])
        if state and state != "active" and state not in JobState.values:
            raise ValidationError(f"'{state[:40]}' is not a state; choose one from the list.")
        return state

    def clean_sort(self) -> str:
        sort = str(self.cleaned_data["sort"]) or DEFAULT_SORT
        if sort.removeprefix("-") not in SORTS:
            known = ", ".join(SORTS)
            raise ValidationError(f"'{sort[:40]}' is not a sort; sort by {known} (a leading - for descending).")
        return sort

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("submitted_from"), data.get("submitted_to")
        if start and end and start > end:
            self.add_error("submitted_to", "The end of the range is before its start.")
        return data

    def states(self) -> list[str]:
        state = self.cleaned_data["state"]
        if state == "active":
            return [str(value) for value in ACTIVE_JOB_STATES]
        return [state] if state else []

    def submitted_range(self) -> tuple[datetime | None, datetime | None]:
        """The days chosen, in the reader's time zone, as moments: from the first day's start to the end of the
        last (excluded)."""
        start, end = self.cleaned_data["submitted_from"], self.cleaned_data["submitted_to"]
        zone = timezone.get_current_timezone()
        return (
            datetime.combine(start, time.min, tzinfo=zone) if start else None,
            datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone) if end else None,
        )


def _sorted(jobs: QuerySet[Job], sort: str, *, now: datetime) -> QuerySet[Job]:
    """`jobs` in the order `sort` names; ties (and jobs without the value, last) newest first."""
    key = sort.removeprefix("-")
    descending = sort.startswith("-")
    if key == "duration":
        jobs = jobs.annotate(duration=Coalesce("ended_at", Value(now)) - F("started_at"))
        field: Any = F("duration")
    elif key == "cost":
        jobs = jobs_with_cost(jobs, now=now)
        field = F("cost_for_sorting")
    elif key == "gpus":
        jobs = jobs.annotate(all_gpus=F("gpus") * F("node_count"))
        field = F("all_gpus")
    else:
        field = F({"submitted": "created_at", "owner": "user__username", "exit_code": "exit_code"}[key])
    first = field.desc(nulls_last=True) if descending else field.asc(nulls_last=True)
    return jobs.order_by(first, "-created_at", "-id")


@dataclass
class ListPage:
    """One page of the list, whichever way it is paged: by cursor in the default order, else by number."""

    rows: list[Job]
    is_first: bool
    first: str  # the query of the first page, "" when this is it
    previous: str
    next: str
    # Newest first, the pages are newer and older ones; in another order, previous and next.
    words: tuple[str, str, str] = ("« First", "← Previous", "Next →")
    # How many jobs the list has, where the page tells without counting: None, count them (bounded_count).
    count: BoundedCount | None = None


def _page(
    request: HttpRequest, jobs: QuerySet[Job], *, sort: str, query: dict[str, str], search: bool = False
) -> ListPage:
    """Newest or oldest first pages by cursor (cheap however deep; a name search, newest first, looks within the
    last weeks first); another order pages by number (`?page=`) through the newest SORT_LIMIT jobs."""
    if sort.removeprefix("-") == "submitted":
        oldest_first = sort == "submitted"

        def keyset_at(cursor: str | None) -> KeysetPage[Job]:
            if search and not oldest_first:
                return windowed_keyset_page(
                    jobs, cursor=cursor, size=JOBS_PER_PAGE, window=job_list_window, span=JOB_SEARCH_SPAN
                )
            return keyset_page(jobs, cursor=cursor, size=JOBS_PER_PAGE, oldest_first=oldest_first)

        try:
            keyset = keyset_at(request.GET.get("cursor") or None)
        except CursorInvalid:  # a link cut short, or from another list: its first page
            keyset = keyset_at(None)
        count = None
        if keyset.is_first and keyset.older is None:  # the first page holds them all
            count = BoundedCount(count=len(keyset.rows), exact=True)
        elif isinstance(keyset, WindowedPage) and keyset.span is not None:  # counting would read every match
            # The first page says how many are within its window; a later one, that there are more than a page.
            count = keyset.in_window or BoundedCount(count=JOBS_PER_PAGE, exact=False)
        return ListPage(
            rows=keyset.rows,
            is_first=keyset.is_first,
            first=urlencode(query) if not keyset.is_first else "",
            previous=urlencode({**query, "cursor": keyset.newer}) if keyset.newer else "",
            next=urlencode({**query, "cursor": keyset.older}) if keyset.older else "",
            words=("« Oldest", "← Older", "Newer →") if oldest_first else ("« Newest", "← Newer", "Older →"),
            count=count,
        )
    # Another order sorts at most SORT_LIMIT jobs (job_list_page): their keys are read in that order in one query,
    # which also counts them, and only the page's rows are read whole. Sorting whole rows (their project, tenant,
    # cluster and user joined) and counting them apart cost 30 ms at 1,000 jobs.
    numbered = Paginator(list(jobs.values_list("pk", flat=True)[:SORT_LIMIT]), JOBS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    number = numbered.number
    keys = list(numbered.object_list)
    by_key = jobs.order_by().in_bulk(keys)
    return ListPage(
        rows=[by_key[key] for key in keys if key in by_key],
        is_first=number == 1,
        first=urlencode(query) if number > 1 else "",
        previous=urlencode({**query, "page": number - 1}) if numbered.has_previous() else "",
        next=urlencode({**query, "page": number + 1}) if numbered.has_next() else "",
    )


def _sort_links(sort: str, query: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each sortable column's link (a second click reverses it) and its `aria-sort` while it is the sort."""
    links = {}
    for key in SORTS:
        current = sort.removeprefix("-") == key
        descending = sort.startswith("-")
        # Amounts and times read largest or newest first; names A to Z.
        first = key if key in ("owner", "exit_code") else f"-{key}"
        target = (key if descending else f"-{key}") if current else first
        links[key] = {
            "href": "?" + urlencode({**query, "sort": target} if target != DEFAULT_SORT else query),
            "aria_sort": ("descending" if descending else "ascending") if current else "",
        }
    return links


def _filter_project(request: HttpRequest, form: JobFilterForm) -> Project | None:
    """The project the filter names, if the user may see it; else an error beside the field (the same words
    whether it exists or not)."""
    label = form.cleaned_data["project"]
    if not label:
        return None
    try:
        return project_get_by_label_for_user(user=request.user, label=label, action=ProjectAction.VIEW)
    except (ValidationError, Http404):
        form.add_error("project", f"You have no project '{label[:60]}'; choose one from the list.")
        return None


@require_safe
@login_required
def job_list_page(request: HttpRequest) -> HttpResponse:
    """The jobs the user may see, filtered and sorted as the URL says, paginated; rows update live over
    WebSockets, and running jobs' duration and cost count up in the page."""
    visible_projects = list(project_list_for_user(user=request.user))
    form = JobFilterForm(request.GET)
    valid = form.is_valid()
    data = form.cleaned_data
    project = _filter_project(request, form) if valid else None
    valid = valid and not form.errors
    filters = {field: str(request.GET.get(field, "")).strip() for field in FILTER_FIELDS}
    sort = data.get("sort") or DEFAULT_SORT
    query = {key: value for key, value in filters.items() if value}
    if sort != DEFAULT_SORT:
        query["sort"] = sort
    context: dict[str, Any] = {
        "filters": filters,
        "filtered": any(filters.values()),
        "filter_errors": {},
        "sort": sort,
        "sort_choices": SORT_CHOICES,
        "sort_label": dict(SORT_CHOICES).get(sort, "newest first").lower(),
        "sort_links": _sort_links(sort, {key: value for key, value in query.items() if key != "sort"}),
        "projects": visible_projects,
        "clusters": cluster_list_active(),
        "states": JobState.choices,
        "state_labels": dict(JobState.choices),
    }
    if not valid:  # show what to fix, not a list the filters did not choose
        context.update(page=None, rows=[], count=None, live=None, costs={}, filter_errors=form.errors)
        return render(request, "frontend/jobs/list.html", context, status=400)
    states = form.states()
    submitted_from, submitted_until = form.submitted_range()
    jobs = job_list_filtered_for_user(
        user=request.user,
        project=project,
        states=states,
        cluster_name=data["cluster"],
        search=data["search"],
        owner=data["owner"],
        submitted_from=submitted_from,
        submitted_until=submitted_until,
    )
    now = timezone.now()
    sortable = jobs
    if sort.removeprefix("-") != "submitted":
        sortable = jobs.filter(pk__in=jobs.order_by("-created_at", "-id").values("pk")[:SORT_LIMIT])
    page = _page(request, _sorted(sortable, sort, now=now), sort=sort, query=query, search=bool(data["search"]))
    rows = page.rows

    # Watch the projects of the rows shown; on the first page also every project where new jobs may appear.
    watched: dict[str, Project] = {}
    for job in rows:
        watched.setdefault(_label(job.project), job.project)
    if page.is_first:
        for candidate in [project] if project else visible_projects:
            watched.setdefault(_label(candidate), candidate)
    # New jobs are inserted at the top only where they belong there: newest first, and inside the date range.
    insert_new = page.is_first and sort == DEFAULT_SORT and submitted_until is None
    known_active = (
        [str(job_id) for job_id in jobs.filter(state__in=list(ACTIVE_JOB_STATES)).values_list("pk", flat=True)[:500]]
        if insert_new
        else []
    )
    count = page.count or bounded_count(jobs)
    context.update(
        page=page,
        count=count,
        # Sorted among the newest SORT_LIMIT only, when the list has more.
        sorted_among=f"{SORT_LIMIT:,}" if sortable is not jobs and not count.exact else None,
        rows=rows,
        costs=job_costs(rows, now=now),
        live={
            "projects": [
                f"/ws/projects/{item.tenant.slug}/{item.slug}/jobs/"
                for item in list(watched.values())[:MAX_WATCHED_PROJECTS]
            ],
            "insert_new": insert_new,
            "filters": {
                "project": data["project"],
                "states": states,
                "cluster": data["cluster"],
                "search": data["search"],
                "owner": data["owner"],
            },
            "known": known_active,
        },
    )
    return render(request, "frontend/jobs/list.html", context)


# One job -------------------------------------------------------------------------------------------------


def _allowed(request: HttpRequest, job: Job, action: JobAction) -> bool:
    return job_action_allowed(user=request.user, job=job, action=action)


def _may_cancel(request: HttpRequest, job: Job) -> bool:
    if job.is_external or job.is_final or job.cancel_requested_at is not None:
        return False
    return _allowed(request, job, JobAction.CANCEL)


def _may_rerun(request: HttpRequest, job: Job) -> bool:
    return not job.is_external and bool(job.script) and _allowed(request, job, JobAction.RERUN)


def _waiting(request: HttpRequest, job: Job, pipeline: Pipeline) -> dict[str, Any] | None:
    """For a pending job: why it waits in plain words, when Slurm expects it to start, and where it could start
    now instead (offered to those who may both cancel it and run it again)."""
    if job.state != JobState.PENDING:
        return None
    # A pipeline's step waits for its parents, not for GPUs: run elsewhere now, it would run before them.
    movable = not pipeline.parents and _may_cancel(request, job) and _may_rerun(request, job)
    return {
        "reason": pending_reason_text(job.state_reason),
        "expected_start_at": job.expected_start_at,
        "overdue": job.expected_start_at is not None and job.expected_start_at <= timezone.now(),
        "alternatives": free_alternatives(job=job) if movable else [],
    }


@require_safe
@login_required
def job_detail_page(request: HttpRequest, job_id: UUID) -> HttpResponse:
    """A job: facts, timeline, cost, the cancel button where allowed, and its live log."""
    job = job_get_for_user(user=request.user, job_id=job_id)
    usage = job_usage(job=job) if job.is_final else None
    now = timezone.now()
    pipeline = pipeline_of(job)
    tasks, task = _array_tasks_shown(request, job)
    log_query = f"?task={task}" if task is not None else ""
    context = {
        "job": job,
        "gpu_idle": job_is_gpu_idle(job),
        "waste": job_waste_for(job),
        "gpus_used": list(job.gpu_usage.all()),
        "transitions": job.timeline,
        "estimate": job_estimate(job=job),
        # An array's is the sum of its tasks', rounded by billing's one rule as the invoice rounds it.
        "usage": usage,
        # While it runs: its cost so far, counted up in the page at its rate (billing.job_costs).
        "cost": None if job.is_final else job_cost(job, now=now),
        "environment": sorted(dict(job.environment).items()),
        "cancel_reason_max_length": CANCEL_REASON_MAX_LENGTH,
        "may_cancel": _may_cancel(request, job),
        "may_rerun": job.is_final and _may_rerun(request, job),
        "reruns": job_reruns_list(job=job),
        "pipeline": pipeline,
        "pipeline_graph": _pipeline_graph(job, pipeline),
        "cancel_effects": cancel_effects(job) if _may_cancel(request, job) else [],
        "waiting": _waiting(request, job, pipeline),
        "watching": job_end_watching(user=request.user, job=job),  # type: ignore[arg-type]
        # Offered on a step of a pipeline (its graph is drawn) while the step itself has not ended.
        "watching_pipeline": bool(pipeline.parents or pipeline.children)
        and pipeline_end_watching(
            user=request.user,  # type: ignore[arg-type]
            job=job,
            step_ids=[edge.job.pk for edge in (*pipeline.parents, *pipeline.children)],
        ),
        "project_label": _label(job.project),
        "tasks": tasks,
        "task": task,
        "log": {
            "socket": f"/ws/jobs/{job.pk}/log/{log_query}",
            "state_socket": f"/ws/jobs/{job.pk}/",
            "state": job.state,
            "updated_at": job.updated_at.isoformat(),
        },
        # The page's own downloads: a file not written yet is a message on this page, not the API's JSON.
        "download": {
            stream: reverse("job-log-download", args=[job.pk, stream]) + log_query for stream in ("stdout", "stderr")
        },
    }
    return render(request, "frontend/jobs/detail.html", context)


# The pipeline graph: one box per job, parents in the left column, the job in the middle, children on the right.
_BOX_WIDTH, _BOX_HEIGHT, _COLUMN_GAP, _ROW_GAP = 200, 44, 90, 14


def _pipeline_graph(job: Job, pipeline: Pipeline) -> dict[str, Any] | None:
    """Boxes and arrows of the job's pipeline as SVG coordinates (server-rendered; no script); None: no pipeline."""
    if not pipeline.parents and not pipeline.children:
        return None
    rows = max(len(pipeline.parents), len(pipeline.children), 1)
    height = rows * (_BOX_HEIGHT + _ROW_GAP) + _ROW_GAP

    def column(edges: list[Edge], x: int) -> list[dict[str, Any]]:
        top = (height - len(edges) * (_BOX_HEIGHT + _ROW_GAP) + _ROW_GAP) // 2
        return [
            {
                "x": x,
                "y": top + index * (_BOX_HEIGHT + _ROW_GAP),
                "job": edge.job,
                "condition": edge.condition,
                "words": edge.words,
                "outcome": edge.outcome,
            }
            for index, edge in enumerate(edges)
        ]

    parents_x = 0
    middle_x = _BOX_WIDTH + _COLUMN_GAP if pipeline.parents else 0
    children_x = middle_x + _BOX_WIDTH + _COLUMN_GAP
    centre_y = (height - _BOX_HEIGHT) // 2
    centre = {"x": middle_x, "y": centre_y, "job": job}
    parents = column(pipeline.parents, parents_x)
    children = column(pipeline.children, children_x)
    arrows = [
        {
            "x1": box["x"] + _BOX_WIDTH,
            "y1": box["y"] + _BOX_HEIGHT // 2,
            "x2": middle_x,
            "y2": centre_y + _BOX_HEIGHT // 2,
            **box,
        }
        for box in parents
    ] + [
        {
            "x1": middle_x + _BOX_WIDTH,
            "y1": centre_y + _BOX_HEIGHT // 2,
            "x2": box["x"],
            "y2": box["y"] + _BOX_HEIGHT // 2,
            **box,
        }
        for box in children
    ]
    for arrow in arrows:
        arrow["label_x"] = (arrow["x1"] + arrow["x2"]) // 2
        arrow["label_y"] = (arrow["y1"] + arrow["y2"]) // 2 - 4
    return {
        "width": (children_x + _BOX_WIDTH) if pipeline.children else (middle_x + _BOX_WIDTH),
        "height": height,
        "box_width": _BOX_WIDTH,
        "box_height": _BOX_HEIGHT,
        "centre": centre,
        "boxes": parents + children,
        "arrows": arrows,
    }


ARRAY_TASKS_PER_PAGE = 50


def _array_tasks_shown(request: HttpRequest, job: Job) -> tuple[Page[JobArrayTask] | None, int | None]:
    """An array's page of tasks (`?tasks_page=`) and the task whose log the page shows (`?task=`, else the first)."""
    if not job.is_array:
        return None, None
    tasks = Paginator(job_array_task_list(job=job), ARRAY_TASKS_PER_PAGE).get_page(request.GET.get("tasks_page"))
    asked = request.GET.get("task", "")
    if asked.isdigit():
        return tasks, int(asked)
    first = tasks.object_list[0] if tasks.object_list else None
    return tasks, first.index if first is not None else None


@require_POST
@login_required
def job_cancel_page(request: HttpRequest, job_id: UUID) -> HttpResponse:
    """Cancel the job (its owner, the project's managers, the tenant's admins), then back to its page."""
    job = job_get_for_user(user=request.user, job_id=job_id, action=JobAction.CANCEL)
    reason = request.POST.get("reason", "").strip()
    if len(reason) > CANCEL_REASON_MAX_LENGTH:
        messages.error(
            request, f"The reason is {len(reason)} characters long; write at most {CANCEL_REASON_MAX_LENGTH}."
        )
        return redirect("job-detail", job_id=job.pk)
    effects = cancel_effects(job)
    try:
        cancelled = job_cancel(user=request.user, job=job, reason=reason)  # type: ignore[arg-type]
    except Conflict as error:
        messages.error(request, str(error))
    else:
        children = "".join(f" {effect['words']}." for effect in effects)
        if cancelled.state == JobState.CANCELLED:
            messages.success(request, f"The job was cancelled before it reached Slurm.{children}")
        else:
            messages.success(request, f"Cancel requested: a worker is cancelling the job in Slurm.{children}")
    return redirect("job-detail", job_id=job.pk)


@require_safe
@login_required
def job_log_download_page(request: HttpRequest, job_id: UUID, stream: str) -> HttpResponseBase:
    """The job's stdout or stderr file as a download; when there is none to send, its page says why."""
    job = job_get_for_user(user=request.user, job_id=job_id)
    if stream not in ("stdout", "stderr"):
        raise Http404(f"A job writes stdout and stderr; '{stream[:20]}' is neither.")
    asked = request.GET.get("task", "")
    task = int(asked) if asked.isdigit() else None
    try:
        return job_log_download(job=job, stream="stderr" if stream == "stderr" else "stdout", task=task)
    except (Http404, PermissionDenied) as error:
        messages.error(request, str(error))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    except DrfValidationError as error:
        detail = error.detail
        texts = [text for field in detail.values() for text in field] if isinstance(detail, dict) else detail
        messages.error(request, " ".join(str(text) for text in texts))
    target = reverse("job-detail", args=[job.pk]) + (f"?task={task}" if task is not None else "")
    return redirect(target + "#log-viewer")


@require_POST
@login_required
def job_rerun_page(request: HttpRequest, job_id: UUID) -> HttpResponse:
    """Run the job again as it was (or, with `partition`/`gpu_type` and `replace`, run a waiting job there
    instead); then the new job's page. Refusals go back to the original's page with the reason."""
    job = job_get_for_user(user=request.user, job_id=job_id, action=JobAction.RERUN)
    instead = request.POST.get("replace") == "1"
    if instead:
        job_get_for_user(user=request.user, job_id=job_id, action=JobAction.CANCEL)
    overrides = {field: request.POST[field] for field in ("partition", "gpu_type") if field in request.POST}
    try:
        accepted = job_rerun(user=request.user, job=job, overrides=overrides, replace=instead)  # type: ignore[arg-type]
    except ValidationError as error:
        messages.error(request, " ".join(text for texts in _field_errors(error).values() for text in texts))
        return redirect("job-detail", job_id=job.pk)
    except Conflict as error:
        messages.error(request, str(error))
        return redirect("job-detail", job_id=job.pk)
    where = f" on partition {accepted.job.partition}" if instead else ""
    messages.success(request, f"“{job.name}” runs again{where} as this job; a worker is handing it to Slurm.")
    return redirect("job-detail", job_id=accepted.job.pk)


@require_POST
@login_required
def job_watch_page(request: HttpRequest, job_id: UUID) -> HttpResponse:
    """Ask to be told when the job ends (`watch=1`), or stop asking (`watch=0`); with `scope=pipeline`, when the
    whole pipeline it is a step of ends. Then back to its page."""
    job = job_get_for_user(user=request.user, job_id=job_id)
    pipeline = request.POST.get("scope") == "pipeline"
    what = "the pipeline" if pipeline else "the job"
    set_watch = pipeline_end_watch_set if pipeline else job_end_watch_set
    try:
        watching = set_watch(user=request.user, job=job, watching=request.POST.get("watch") == "1")  # type: ignore[arg-type]
    except Conflict as error:
        messages.error(request, str(error))
    else:
        if watching:
            messages.success(
                request,
                f"You will be told when {what} ends, with "
                + ("each job's outcome and the total cost" if pipeline else "its outcome and cost")
                + ", here and by e-mail.",
            )
        else:
            messages.success(request, f"You will not be told when {what} ends.")
    return redirect("job-detail", job_id=job.pk)


urlpatterns: list[URLPattern] = [
    path("jobs/", job_list_page, name="job-list"),
    path("jobs/new/", job_submit_page, name="job-submit"),
    path("jobs/new/estimates/", job_estimate_partial, name="job-estimate"),
    path("jobs/<uuid:job_id>/", job_detail_page, name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", job_cancel_page, name="job-cancel"),
    path("jobs/<uuid:job_id>/output/<str:stream>/", job_log_download_page, name="job-log-download"),
    path("jobs/<uuid:job_id>/rerun/", job_rerun_page, name="job-rerun"),
    path("jobs/<uuid:job_id>/watch/", job_watch_page, name="job-watch"),
]
