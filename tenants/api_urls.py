"""REST API routes for tenants, projects, members, tokens and the audit log (under /api/v1/)."""

from __future__ import annotations

from django.urls import path

from tenants import apis, invitation_apis

urlpatterns = [
    path("tenants/", apis.TenantListApi.as_view(), name="api-tenant-list"),
    path("tenants/<str:tenant>/", apis.TenantDetailApi.as_view(), name="api-tenant-detail"),
    path("tenants/<str:tenant>/members/", apis.TenantMemberListApi.as_view(), name="api-tenant-member-list"),
    path(
        "tenants/<str:tenant>/members/<str:username>/",
        apis.TenantMemberDetailApi.as_view(),
        name="api-tenant-member-detail",
    ),
    path(
        "tenants/<str:tenant>/invitations/",
        invitation_apis.TenantInvitationListApi.as_view(),
        name="api-tenant-invitation-list",
    ),
    path(
        "tenants/<str:tenant>/invitations/<int:invitation_id>/",
        invitation_apis.TenantInvitationDetailApi.as_view(),
        name="api-tenant-invitation-detail",
    ),
    path(
        "tenants/<str:tenant>/projects/<str:project>/invitations/",
        invitation_apis.ProjectInvitationListApi.as_view(),
        name="api-project-invitation-list",
    ),
    path(
        "tenants/<str:tenant>/projects/<str:project>/invitations/<int:invitation_id>/",
        invitation_apis.ProjectInvitationDetailApi.as_view(),
        name="api-project-invitation-detail",
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
