"""REST API routes of the jobs app (under /api/v1/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs.apis import ProjectSlurmAccountListApi, SlurmDriftReportListApi

urlpatterns: list[URLPattern] = [
    path(
        "tenants/<str:tenant>/projects/<str:project>/slurm-accounts/",
        ProjectSlurmAccountListApi.as_view(),
        name="api-project-slurm-accounts",
    ),
    path("slurm-drift-reports/", SlurmDriftReportListApi.as_view(), name="api-slurm-drift-reports"),
]
