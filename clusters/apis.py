"""REST API (read-only) for clusters, projects' Slurm accounts and the clusters' drift reports (under /api/v1/).

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

from clusters.models import Cluster, ProjectSlurmAccount, SlurmDriftKind
from clusters.selectors import (
    cluster_get_for_user,
    cluster_list_for_user,
    project_slurm_account_list,
    slurm_drift_report_list,
)
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


class PartitionOutput(serializers.Serializer[Any]):
    name = serializers.CharField()
    state = serializers.CharField()
    is_default = serializers.BooleanField()
    max_time_minutes = serializers.IntegerField(allow_null=True, help_text="Null: no limit")
    default_time_minutes = serializers.IntegerField(allow_null=True)
    gpu_types = serializers.ListField(child=serializers.CharField())
    max_gpus_per_node = serializers.IntegerField(help_text="The most GPUs one job can ask for here")
    nodes = serializers.ListField(child=serializers.CharField(), source="node_names")
    gpus_total = serializers.IntegerField()
    gpus_free = serializers.IntegerField(help_text="GPUs idle on nodes that accept jobs, as of the last sync")


class GpuTypeOutput(serializers.Serializer[Any]):
    name = serializers.CharField()
    total = serializers.IntegerField(source="gpus_total")
    used = serializers.IntegerField(source="gpus_used")
    free = serializers.IntegerField()
    max_per_node = serializers.IntegerField(source="max_gpus_per_node")


class ClusterOutput(serializers.Serializer[Any]):
    name = serializers.CharField()
    ok = serializers.BooleanField(source="last_ping_ok", help_text="Whether the last health check succeeded")
    checked_at = serializers.DateTimeField(source="last_ping_at", allow_null=True)
    api_version = serializers.CharField()
    slurm_release = serializers.CharField()
    inventory_synced_at = serializers.DateTimeField(allow_null=True)
    my_username = serializers.CharField(allow_null=True, help_text="Your jobs run as this user on the cluster")
    partitions = PartitionOutput(many=True)
    gpu_types = GpuTypeOutput(many=True)


_PARTITION_FIELDS = (
    "name",
    "state",
    "is_default",
    "max_time_minutes",
    "default_time_minutes",
    "gpu_types",
    "max_gpus_per_node",
)


def _cluster_data(cluster: Cluster) -> dict[str, Any]:
    nodes = list(cluster.nodes.all())
    free_states = {"idle", "mixed"}
    partitions = []
    for partition in cluster.partitions.all():
        members = [node for node in nodes if node.name in partition.node_names]
        partitions.append(
            {
                **{field: getattr(partition, field) for field in _PARTITION_FIELDS},
                "node_names": partition.node_names,
                "gpus_total": sum(node.gpus_total for node in members),
                "gpus_free": sum(node.gpus_total - node.gpus_used for node in members if node.state in free_states),
            }
        )
    gpu_types = [
        {
            "name": gpu.name,
            "gpus_total": gpu.gpus_total,
            "gpus_used": gpu.gpus_used,
            "max_gpus_per_node": gpu.max_gpus_per_node,
            "free": sum(
                node.gpus_total - node.gpus_used
                for node in nodes
                if node.gpu_type == gpu.name and node.state in free_states
            ),
        }
        for gpu in cluster.gpu_types.all()
    ]
    accounts = getattr(cluster, "my_accounts", [])
    return {
        "name": cluster.name,
        "last_ping_ok": cluster.last_ping_ok,
        "last_ping_at": cluster.last_ping_at,
        "api_version": cluster.api_version,
        "slurm_release": cluster.slurm_release,
        "inventory_synced_at": cluster.inventory_synced_at,
        "my_username": accounts[0].username if accounts else None,
        "partitions": partitions,
        "gpu_types": gpu_types,
    }


class ClusterListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="clusters_list",
        summary="Clusters you can submit to, with partitions, GPU types, limits and free GPUs (as last synced)",
        responses={200: ClusterOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        clusters = cluster_list_for_user(user=request.user).prefetch_related("nodes")
        page = paginator.paginate_queryset(clusters, request, view=self) or []
        return paginator.get_paginated_response(ClusterOutput([_cluster_data(c) for c in page], many=True).data)


class ClusterDetailApi(APIView):
    @extend_schema(
        operation_id="clusters_retrieve",
        summary="One cluster you can submit to",
        responses={200: ClusterOutput, **ERRORS},
    )
    def get(self, request: Request, cluster: str) -> Response:
        found = cluster_get_for_user(user=request.user, name=cluster)
        clusters = cluster_list_for_user(user=request.user).prefetch_related("nodes").filter(pk=found.pk)
        return Response(ClusterOutput(_cluster_data(clusters.get())).data)
