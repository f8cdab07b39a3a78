"""REST API for GPU-hour allocations and their ledger (under /api/v1/): members read, portal admins grant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_errors import ERRORS, ERRORS_WITH_CONFLICT
from portal.api_inputs import BodyInput
from portal.api_pagination import PagePagination
from quotas import services
from quotas.models import Allocation, LedgerKind, QuotaLimitState
from quotas.selectors import allocation_get_for_user, allocation_ledger, allocation_list_for_user
from quotas.units import gpu_hours_to_seconds, gpu_seconds_to_hours
from tenants.selectors import is_portal_admin, project_get_by_label_for_user


def gpu_hours_field(help_text: str | None = None) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=14, decimal_places=2, help_text=help_text)


class AllocationBalanceOutput(serializers.Serializer[Any]):
    """An allocation and its balances, as every quota reply shows it."""

    id = serializers.IntegerField()
    project = serializers.CharField(help_text="tenant/project")
    cluster = serializers.CharField()
    gpu_type = serializers.CharField(help_text="Empty: GPUs of any type")
    starts_on = serializers.DateField()
    ends_on = serializers.DateField(help_text="The last day of the period")
    granted_gpu_hours = gpu_hours_field()
    used_gpu_hours = gpu_hours_field("Charged: what finished jobs really used")
    reserved_gpu_hours = gpu_hours_field("Held by jobs queued, pending or running")
    remaining_gpu_hours = gpu_hours_field("Granted - used - reserved; may be negative")
    granted_gpu_seconds = serializers.IntegerField()
    used_gpu_seconds = serializers.IntegerField()
    reserved_gpu_seconds = serializers.IntegerField()
    remaining_gpu_seconds = serializers.IntegerField()


def allocation_balance_data(allocation: Allocation) -> dict[str, Any]:
    return {
        "id": allocation.pk,
        "project": f"{allocation.project.tenant.slug}/{allocation.project.slug}",
        "cluster": allocation.cluster.name,
        "gpu_type": allocation.gpu_type,
        "starts_on": allocation.starts_on,
        "ends_on": allocation.ends_on,
        "granted_gpu_hours": gpu_seconds_to_hours(allocation.granted_gpu_seconds),
        "used_gpu_hours": gpu_seconds_to_hours(allocation.charged_gpu_seconds),
        "reserved_gpu_hours": gpu_seconds_to_hours(allocation.reserved_gpu_seconds),
        "remaining_gpu_hours": gpu_seconds_to_hours(allocation.remaining_gpu_seconds),
        "granted_gpu_seconds": allocation.granted_gpu_seconds,
        "used_gpu_seconds": allocation.charged_gpu_seconds,
        "reserved_gpu_seconds": allocation.reserved_gpu_seconds,
        "remaining_gpu_seconds": allocation.remaining_gpu_seconds,
    }


class AllocationOutput(AllocationBalanceOutput):
    is_current = serializers.BooleanField()
    percent_used = serializers.DecimalField(max_digits=7, decimal_places=1, help_text="(used + reserved) / granted")
    slurm_limit_gpu_minutes = serializers.IntegerField(
        allow_null=True, help_text="The account's GrpTRESMins=gres/gpu in Slurm as last written (cumulative)"
    )
    slurm_limit_applied_at = serializers.DateTimeField(allow_null=True)
    requests_url = serializers.CharField(help_text="Where to ask for more GPU-hours")
    usage_url = serializers.CharField(help_text="The burn-down series")


def allocation_data(allocation: Allocation, *, now: datetime, limit: QuotaLimitState | None) -> dict[str, Any]:
    granted = allocation.granted_gpu_seconds
    used = allocation.charged_gpu_seconds + allocation.reserved_gpu_seconds
    return {
        **allocation_balance_data(allocation),
        "is_current": allocation.is_current(now),
        "percent_used": round(used * 100 / granted, 1) if granted > 0 else 0,
        "slurm_limit_gpu_minutes": limit.applied_minutes if limit else None,
        "slurm_limit_applied_at": limit.applied_at if limit else None,
        "requests_url": services.allocation_requests_path(allocation),
        "usage_url": f"/api/v1/allocations/{allocation.pk}/usage/",
    }


def _limits_for(allocations: list[Allocation]) -> dict[tuple[int, int], QuotaLimitState]:
    pairs = {(allocation.project_id, allocation.cluster_id) for allocation in allocations}
    if not pairs:
        return {}
    states = QuotaLimitState.objects.filter(
        project_id__in={project for project, _ in pairs}, cluster_id__in={cluster for _, cluster in pairs}
    )
    return {(state.project_id, state.cluster_id): state for state in states}


def _render(allocations: list[Allocation]) -> list[dict[str, Any]]:
    now = timezone.now()
    limits = _limits_for(allocations)
    return [
        allocation_data(allocation, now=now, limit=limits.get((allocation.project_id, allocation.cluster_id)))
        for allocation in allocations
    ]


class AllocationFilterInput(serializers.Serializer[Any]):
    project = serializers.CharField(required=False, help_text="tenant/project")
    cluster = serializers.CharField(required=False)
    current = serializers.BooleanField(required=False, allow_null=True, default=None, help_text="Only open now")


class AllocationCreateInput(BodyInput):
    project = serializers.CharField(help_text="tenant/project, e.g. acme/vision")
    cluster = serializers.CharField()
    gpu_type = serializers.CharField(required=False, allow_blank=True, default="", help_text="Empty: any type")
    gpu_hours = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=0)
    starts_on = serializers.DateField()
    ends_on = serializers.DateField(help_text="The last day of the period (inclusive)")
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class AllocationGrantInput(BodyInput):
    gpu_hours = serializers.DecimalField(
        max_digits=12, decimal_places=2, help_text="Added to the allocation; negative takes unused hours back"
    )
    note = serializers.CharField(max_length=500, help_text="Why: kept in the ledger and the audit log")


class LedgerEntryOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=LedgerKind.choices)
    gpu_seconds = serializers.IntegerField()
    gpu_hours = gpu_hours_field()
    job = serializers.UUIDField(allow_null=True, source="job_id")
    slurm_job_id = serializers.IntegerField(allow_null=True)
    actor = serializers.CharField(allow_null=True)
    note = serializers.CharField()
    created_at = serializers.DateTimeField()


def _require_portal_admin(request: Request, doing: str) -> None:
    if not is_portal_admin(request.user):
        raise PermissionDenied(f"{doing} needs a portal admin; members ask for more with a quota request.")


class AllocationListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="allocations_list",
        summary="GPU-hour allocations of the projects you may see, with granted, used, reserved and remaining",
        parameters=[AllocationFilterInput],
        responses={200: AllocationOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = AllocationFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        allocations = allocation_list_for_user(user=request.user)
        label = filters.validated_data.get("project")
        if label:
            project = project_get_by_label_for_user(user=request.user, label=label)
            allocations = allocations.filter(project=project)
        if filters.validated_data.get("cluster"):
            allocations = allocations.filter(cluster__name=filters.validated_data["cluster"])
        current = filters.validated_data.get("current")
        if current is not None:
            today = timezone.now().date()
            open_now = {"starts_on__lte": today, "ends_on__gte": today}
            allocations = allocations.filter(**open_now) if current else allocations.exclude(**open_now)
        paginator = PagePagination()
        page = paginator.paginate_queryset(allocations, request, view=self) or []
        return paginator.get_paginated_response(AllocationOutput(_render(list(page)), many=True).data)

    @extend_schema(
        operation_id="allocations_create",
        summary="Give a project GPU-hours on a cluster for a period (portal admins)",
        request=AllocationCreateInput,
        responses={201: AllocationOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request) -> Response:
        _require_portal_admin(request, "Creating an allocation")
        given = AllocationCreateInput(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        project = project_get_by_label_for_user(user=request.user, label=data["project"])
        from clusters.models import Cluster

        cluster = Cluster.objects.filter(name=data["cluster"]).first()
        if cluster is None:
            names = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none yet"
            raise serializers.ValidationError(
                {"cluster": [f"There is no cluster '{data['cluster']}'; choose: {names}."]}
            )
        if data["gpu_type"] and not cluster.gpu_types.filter(name=data["gpu_type"]).exists():
            offered = ", ".join(cluster.gpu_types.values_list("name", flat=True)) or "none synced yet"
            raise serializers.ValidationError(
                {"gpu_type": [f"Cluster '{cluster.name}' has no GPUs of type '{data['gpu_type']}'; it has: {offered}."]}
            )
        if data["ends_on"] < data["starts_on"]:
            raise serializers.ValidationError({"ends_on": ["The period must end on or after the day it starts."]})
        allocation = services.allocation_create(
            actor=request.user,
            project=project,
            cluster=cluster,
            gpu_hours=data["gpu_hours"],
            gpu_type=data["gpu_type"],
            starts_on=data["starts_on"],
            ends_on=data["ends_on"],
            note=data["note"],
        )
        return Response(AllocationOutput(_render([allocation])[0]).data, status=status.HTTP_201_CREATED)


class AllocationDetailApi(APIView):
    @extend_schema(
        operation_id="allocations_retrieve",
        summary="One allocation with its balances and the limit written into Slurm",
        responses={200: AllocationOutput, **ERRORS},
    )
    def get(self, request: Request, allocation_id: int) -> Response:
        allocation = allocation_get_for_user(user=request.user, allocation_id=allocation_id)
        return Response(AllocationOutput(_render([allocation])[0]).data)


class AllocationGrantApi(APIView):
    @extend_schema(
        operation_id="allocations_grant",
        summary="Add GPU-hours to an allocation, or take unused ones back (portal admins)",
        request=AllocationGrantInput,
        responses={200: AllocationOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, allocation_id: int) -> Response:
        allocation = allocation_get_for_user(user=request.user, allocation_id=allocation_id)
        _require_portal_admin(request, "Changing an allocation")
        given = AllocationGrantInput(data=request.data)
        given.is_valid(raise_exception=True)
        seconds = gpu_hours_to_seconds(given.validated_data["gpu_hours"])
        if seconds == 0:
            raise serializers.ValidationError({"gpu_hours": ["Give a number of GPU-hours other than 0."]})
        updated = services.allocation_grant(
            actor=request.user,
            allocation=allocation,
            gpu_seconds=seconds,
            note=given.validated_data["note"],
        )
        return Response(AllocationOutput(_render([updated])[0]).data)


class AllocationLedgerApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="allocations_ledger",
        summary="Every movement on the allocation, oldest first: grants, reservations, releases, charges",
        responses={200: LedgerEntryOutput(many=True), **ERRORS},
    )
    def get(self, request: Request, allocation_id: int) -> Response:
        allocation = allocation_get_for_user(user=request.user, allocation_id=allocation_id)
        paginator = PagePagination()
        page = paginator.paginate_queryset(allocation_ledger(allocation=allocation), request, view=self) or []
        rows = [
            {
                "id": entry.pk,
                "kind": entry.kind,
                "gpu_seconds": entry.gpu_seconds,
                "gpu_hours": gpu_seconds_to_hours(entry.gpu_seconds),
                "job_id": entry.job_id,
                "slurm_job_id": entry.job.slurm_job_id if entry.job else None,
                "actor": entry.actor.get_username() if entry.actor else None,
                "note": entry.note,
                "created_at": entry.created_at,
            }
            for entry in page
        ]
        return paginator.get_paginated_response(LedgerEntryOutput(rows, many=True).data)
