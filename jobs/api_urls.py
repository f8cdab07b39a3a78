"""REST API routes of the jobs app (under /api/v1/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs.apis import ProjectSlurmAccountListApi, SlurmDriftReportListApi
from jobs.job_apis import (
    ClusterDetailApi,
    ClusterListApi,
    JobCancelApi,
    JobDetailApi,
    JobListApi,
    JobTemplateDetailApi,
    JobTemplateListApi,
)
from jobs.log_apis import JobLogDownloadApi

urlpatterns: list[URLPattern] = [
    path(
        "tenants/<str:tenant>/projects/<str:project>/slurm-accounts/",
        ProjectSlurmAccountListApi.as_view(),
        name="api-project-slurm-accounts",
    ),
    path("slurm-drift-reports/", SlurmDriftReportListApi.as_view(), name="api-slurm-drift-reports"),
    path("clusters/", ClusterListApi.as_view(), name="api-clusters"),
    path("clusters/<str:cluster>/", ClusterDetailApi.as_view(), name="api-cluster"),
    path("jobs/", JobListApi.as_view(), name="api-jobs"),
    path("jobs/<uuid:job_id>/", JobDetailApi.as_view(), name="api-job"),
    path("jobs/<uuid:job_id>/cancel/", JobCancelApi.as_view(), name="api-job-cancel"),
    path("jobs/<uuid:job_id>/log/", JobLogDownloadApi.as_view(), name="api-job-log"),
    path("job-templates/", JobTemplateListApi.as_view(), name="api-job-templates"),
    path("job-templates/<str:template_id>/", JobTemplateDetailApi.as_view(), name="api-job-template"),
]
