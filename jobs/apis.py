"""REST API (read-only) for projects' Slurm accounts and the clusters' drift reports (under /api/v1/).

Both read what the workers recorded: web requests never call Slurm.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import ProjectSlurmAccount, SlurmDriftKind
from jobs.selectors import project_slurm_account_list, slurm_drift_report_list
from portal.api_errors import ERRORS
from portal.api_pagination import PagePagination
from tenants.selectors import ProjectAction, is_portal_admin, project_get_for_user


class ProjectSlurmAccountSerializer(serializers.Serializer[Any]):
    cluster = serializers.CharField(source="cluster.name")
    account = serializers.CharField(source="project.slurm_account", help_text="The project's Slurm account name")
    state = serializers.ChoiceField(choices=ProjectSlurmAccount.State.choices)
    last_error = serializers.CharField(
        help_text="What is not in line yet, one problem per line; may be set while the state is ready"
    )
    synced_at = serializers.DateTimeField(allow_null=True, help_text="When a worker last brought it in line")


class SlurmDriftFindingSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=SlurmDriftKind.choices)
    account = serializers.CharField()
    user = serializers.CharField(help_text="Empty for findings about an account")
    detail = serializers.CharField()
    repaired = serializers.BooleanField()


class SlurmDriftReportSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    cluster = serializers.CharField(source="cluster.name")
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True, help_text="Empty while running, or if the run died")
    error = serializers.CharField(help_text="Why the run stopped early; empty when it completed")
    findings = SlurmDriftFindingSerializer(many=True)


class SlurmDriftReportFilterSerializer(serializers.Serializer[Any]):
    cluster = serializers.CharField(required=False, help_text="Only this cluster's reports (its name)")


class ProjectSlurmAccountListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="project_slurm_accounts_list",
        summary="The project's Slurm account on each cluster",
        responses={200: ProjectSlurmAccountSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request, tenant: str, project: str) -> Response:
        found = project_get_for_user(
            user=request.user, tenant_slug=tenant, project_slug=project, action=ProjectAction.VIEW
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(project_slurm_account_list(project=found), request, view=self)
        return paginator.get_paginated_response(ProjectSlurmAccountSerializer(page, many=True).data)


class SlurmDriftReportListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="slurm_drift_reports_list",
        summary="Reconcile runs of the clusters' Slurm accounts, newest first (portal admins only)",
        parameters=[SlurmDriftReportFilterSerializer],
        responses={200: SlurmDriftReportSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        if not is_portal_admin(request.user):
            raise PermissionDenied("Slurm drift reports need a portal admin; ask one of the portal's admins.")
        filters = SlurmDriftReportFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        reports = slurm_drift_report_list(cluster_name=filters.validated_data.get("cluster"))
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(reports, request, view=self)
        return paginator.get_paginated_response(SlurmDriftReportSerializer(page, many=True).data)
