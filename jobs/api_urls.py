"""REST API routes of the jobs app (under /api/v1/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs.efficiency_policy_apis import ProjectEfficiencyPolicyApi
from jobs.history_apis import ArchivedTransitionsExportApi
from jobs.job_apis import (
    JobArrayTaskCancelApi,
    JobArrayTaskListApi,
    JobBatchApi,
    JobCancelApi,
    JobDetailApi,
    JobListApi,
    JobRerunApi,
    JobTemplateDetailApi,
    JobTemplateListApi,
    JobWatchApi,
    PipelineWatchApi,
)
from jobs.log_apis import JobLogDownloadApi

urlpatterns: list[URLPattern] = [
    path("jobs/", JobListApi.as_view(), name="api-jobs"),
    path("jobs/batch/", JobBatchApi.as_view(), name="api-jobs-batch"),
    path("jobs/<uuid:job_id>/", JobDetailApi.as_view(), name="api-job"),
    path("jobs/<uuid:job_id>/cancel/", JobCancelApi.as_view(), name="api-job-cancel"),
    path("jobs/<uuid:job_id>/rerun/", JobRerunApi.as_view(), name="api-job-rerun"),
    path("jobs/<uuid:job_id>/watch/", JobWatchApi.as_view(), name="api-job-watch"),
    path("jobs/<uuid:job_id>/pipeline/watch/", PipelineWatchApi.as_view(), name="api-job-pipeline-watch"),
    path("jobs/<uuid:job_id>/log/", JobLogDownloadApi.as_view(), name="api-job-log"),
    path("jobs/<uuid:job_id>/tasks/", JobArrayTaskListApi.as_view(), name="api-job-tasks"),
    path("jobs/<uuid:job_id>/tasks/<int:index>/cancel/", JobArrayTaskCancelApi.as_view(), name="api-job-task-cancel"),
    path("job-templates/", JobTemplateListApi.as_view(), name="api-job-templates"),
    path("job-templates/<str:template_id>/", JobTemplateDetailApi.as_view(), name="api-job-template"),
    path(
        "tenants/<str:tenant>/archived-transitions/",
        ArchivedTransitionsExportApi.as_view(),
        name="api-tenant-archived-transitions",
    ),
    path(
        "tenants/<str:tenant>/projects/<str:project>/efficiency-policy/",
        ProjectEfficiencyPolicyApi.as_view(),
        name="api-project-efficiency-policy",
    ),
]
