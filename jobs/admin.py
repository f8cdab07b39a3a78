"""Django admin for jobs and job templates: read-only, as the workers recorded them; jobs can be cancelled."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from clusters.admin import ReadOnlyAdmin, ReadOnlyInline
from jobs.job_services import job_cancel
from jobs.models import (
    Job,
    JobEfficiency,
    JobGpuUsage,
    JobTemplate,
    JobTransition,
    JobTransitionArchive,
    ProjectEfficiencyPolicy,
)
from portal.errors import Conflict

# Jobs ----------------------------------------------------------------------------------------------------


class JobTransitionInline(ReadOnlyInline):
    model = JobTransition
    fields = ("from_state", "to_state", "at", "detail")
    readonly_fields = fields


class JobTransitionArchiveInline(JobTransitionInline):
    model = JobTransitionArchive  # type: ignore[assignment]
    verbose_name_plural = "archived transitions (older than HISTORY_ARCHIVE_AFTER_MONTHS)"


class JobEfficiencyInline(ReadOnlyInline):
    model = JobEfficiency
    fields = (
        "source",
        "observed_gpu_seconds",
        "idle_gpu_seconds",
        "peak_memory_mib",
        "idle_gpus",
        "idle_since",
        "flagged_at",
        "notified_at",
        "warned_at",
        "ended_at",
    )
    readonly_fields = fields


class JobGpuUsageInline(ReadOnlyInline):
    model = JobGpuUsage
    fields = (
        "node",
        "gpu_index",
        "gpu_uuid",
        "last_utilisation_percent",
        "peak_memory_mib",
        "idle_seconds",
        "idle_since",
    )
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs are written by the submission path and the sync only; admins read them and may cancel."""

    list_display = ("name", "project", "cluster", "user", "state", "slurm_job_id", "is_external", "created_at")
    list_filter = ("state", "is_external", "cluster")
    search_fields = (
        "id",
        "name",
        "slurm_job_id",
        "request_id",
        "user__username",
        "project__slug",
        "project__tenant__slug",
    )
    list_select_related = ("project__tenant", "cluster", "user")
    date_hierarchy = "created_at"
    inlines = (JobEfficiencyInline, JobGpuUsageInline, JobTransitionArchiveInline, JobTransitionInline)
    actions = ("cancel_jobs",)

    @admin.action(description="Cancel the selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        cancelled, refused = 0, []
        for job in queryset.select_related("project__tenant"):
            try:
                job_cancel(user=request.user, job=job)  # type: ignore[arg-type]
                cancelled += 1
            except Conflict as exc:
                refused.append(f"{job.name}: {exc}")
        if cancelled:
            self.message_user(request, f"Cancelling {cancelled} job(s).", messages.SUCCESS)
        for message in refused:
            self.message_user(request, message, messages.WARNING)


@admin.register(JobTemplate)
class JobTemplateAdmin(ReadOnlyAdmin):
    """Projects' saved templates; their members edit them through the API and the portal."""

    list_display = ("name", "project", "gpus", "gpu_type", "time_limit_minutes", "created_by", "updated_at")
    search_fields = ("name", "project__slug", "project__tenant__slug")
    list_select_related = ("project__tenant", "created_by")


@admin.register(ProjectEfficiencyPolicy)
class ProjectEfficiencyPolicyAdmin(ReadOnlyAdmin):
    """A project's choices about idle GPUs: whether its managers hear of idle jobs, whether idle jobs are ended.
    Read-only here: its editors change it on the project page ("Idle GPUs") or with
    PATCH /api/v1/tenants/<t>/projects/<p>/efficiency-policy/, which check the bounds and write the audit event."""

    list_display = ("project", "notify_managers", "end_idle_jobs", "end_after_idle_seconds", "warning_seconds")
    list_filter = ("notify_managers", "end_idle_jobs")
    search_fields = ("project__slug", "project__tenant__slug")
    list_select_related = ("project__tenant",)
