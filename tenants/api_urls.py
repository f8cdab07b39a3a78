"""REST API routes for tenants, projects, members, tokens and the audit log (under /api/v1/)."""

from __future__ import annotations

from django.urls import path

from tenants import apis

urlpatterns = [
    path("tenants/", apis.TenantListApi.as_view(), name="api-tenant-list"),
    path("tenants/<str:tenant>/", apis.TenantDetailApi.as_view(), name="api-tenant-detail"),
    path("tenants/<str:tenant>/members/", apis.TenantMemberListApi.as_view(), name="api-tenant-member-list"),
    path(
        "tenants/<str:tenant>/members/<str:username>/",
        apis.TenantMemberDetailApi.as_view(),
        name="api-tenant-member-detail",
    ),
    path("tenants/<str:tenant>/projects/", apis.TenantProjectListApi.as_view(), name="api-tenant-project-list"),
    path("tenants/<str:tenant>/projects/<str:project>/", apis.ProjectDetailApi.as_view(), name="api-project-detail"),
    path(
        "tenants/<str:tenant>/projects/<str:project>/members/",
        apis.ProjectMemberListApi.as_view(),
        name="api-project-member-list",
    ),
    path(
        "tenants/<str:tenant>/projects/<str:project>/members/<str:username>/",
        apis.ProjectMemberDetailApi.as_view(),
        name="api-project-member-detail",
    ),
    path("projects/", apis.ProjectListApi.as_view(), name="api-project-list"),
    path("tokens/", apis.TokenListApi.as_view(), name="api-token-list"),
    path("tokens/<int:token_id>/", apis.TokenDetailApi.as_view(), name="api-token-detail"),
    path("audit-events/", apis.AuditEventListApi.as_view(), name="api-audit-event-list"),
]
