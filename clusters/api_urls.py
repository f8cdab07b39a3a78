"""REST API routes of the clusters app (under /api/v1/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from clusters.apis import ClusterDetailApi, ClusterListApi, ProjectSlurmAccountListApi, SlurmDriftReportListApi

urlpatterns: list[URLPattern] = [
    path(
        "tenants/<str:tenant>/projects/<str:project>/slurm-accounts/",
        ProjectSlurmAccountListApi.as_view(),
        name="api-project-slurm-accounts",
    ),
    path("slurm-drift-reports/", SlurmDriftReportListApi.as_view(), name="api-slurm-drift-reports"),
    path("clusters/", ClusterListApi.as_view(), name="api-clusters"),
    path("clusters/<str:cluster>/", ClusterDetailApi.as_view(), name="api-cluster"),
]
