"""REST API for asking for more GPU-hours, deciding, tenant pools and the burn-down series (under /api/v1/)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.urls import URLPattern, path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_errors import ERRORS, ERRORS_WITH_CONFLICT
from portal.api_inputs import BodyInput
from portal.api_pagination import PagePagination
from quotas import requests as quota_requests
from quotas.apis import AllocationBalanceOutput, allocation_balance_data, gpu_hours_field
from quotas.models import Allocation, QuotaRequest, QuotaRequestState, TenantPool
from quotas.requests import QuotaRequestAction, quota_request_get_for_user, quota_request_list_for_user
from quotas.selectors import allocation_get_for_user
from quotas.units import gpu_seconds_to_hours
from quotas.usage import UsageSeries, allocation_usage_series
from tenants.selectors import ProjectAction, TenantAction, is_portal_admin, tenant_get_for_user


def _project_label(allocation: Allocation) -> str:
    return f"{allocation.project.tenant.slug}/{allocation.project.slug}"


# Requests ----------------------------------------------------------------------------------------------


class QuotaRequestOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    allocation = AllocationBalanceOutput(help_text="The allocation asked about, with its balances as of now")
    state = serializers.ChoiceField(choices=QuotaRequestState.choices)
    requested_by = serializers.CharField()
    requested_gpu_hours = gpu_hours_field()
    requested_gpu_seconds = serializers.IntegerField()
    justification = serializers.CharField()
    granted_gpu_hours = gpu_hours_field("What the decision granted: all, part or none of the request")
    granted_gpu_seconds = serializers.IntegerField()
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    decision_reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    links = serializers.DictField(child=serializers.CharField(), help_text="self, decide, withdraw, allocation")


def _request_data(request: QuotaRequest) -> dict[str, Any]:
    path = quota_requests.quota_request_path(request)
    return {
        "id": request.pk,
        "allocation": allocation_balance_data(request.allocation),
        "state": request.state,
        "requested_by": request.requested_by.get_username(),
        "requested_gpu_hours": gpu_seconds_to_hours(request.requested_gpu_seconds),
        "requested_gpu_seconds": request.requested_gpu_seconds,
        "justification": request.justification,
        "granted_gpu_hours": gpu_seconds_to_hours(request.granted_gpu_seconds),
        "granted_gpu_seconds": request.granted_gpu_seconds,
        "decided_by": request.decided_by.get_username() if request.decided_by else None,
        "decided_at": request.decided_at,
        "decision_reason": request.decision_reason,
        "created_at": request.created_at,
        "links": {
            "self": path,
            "decide": f"{path}decide/",
            "withdraw": f"{path}withdraw/",
            "allocation": f"/api/v1/allocations/{request.allocation_id}/",
        },
    }


def _page(view: APIView, request: Request, requests: QuerySet[QuotaRequest]) -> Response:
    paginator = PagePagination()
    page = paginator.paginate_queryset(requests, request, view=view) or []
    return paginator.get_paginated_response(QuotaRequestOutput([_request_data(r) for r in page], many=True).data)


def _reload(request: Request, request_id: int) -> QuotaRequest:
    """The request as stored now, with the allocation balances a decision just changed."""
    return quota_request_get_for_user(user=request.user, request_id=request_id)


class QuotaRequestCreateInput(BodyInput):
    gpu_hours = serializers.DecimalField(max_digits=12, decimal_places=2, help_text="e.g. 20 or 12.5")
    justification = serializers.CharField(
        allow_blank=True, max_length=5000, help_text="What the hours are for; the admins decide on it"
    )


class AllocationRequestListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="allocation_requests_list",
        summary="Requests for more GPU-hours on an allocation, newest first (anyone who sees the project)",
        responses={200: QuotaRequestOutput(many=True), **ERRORS},
    )
    def get(self, request: Request, allocation_id: int) -> Response:
        allocation = allocation_get_for_user(user=request.user, allocation_id=allocation_id)
        return _page(self, request, quota_request_list_for_user(user=request.user).filter(allocation=allocation))

    @extend_schema(
        operation_id="allocation_requests_create",
        summary="Ask for more GPU-hours on an allocation (project members and managers); the admins are told",
        request=QuotaRequestCreateInput,
        responses={201: QuotaRequestOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, allocation_id: int) -> Response:
        allocation = allocation_get_for_user(
            user=request.user, allocation_id=allocation_id, action=ProjectAction.SUBMIT
        )
        serializer = QuotaRequestCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        created = quota_requests.quota_request_create(
            actor=request.user,  # type: ignore[arg-type]
            allocation=allocation,
            gpu_hours=serializer.validated_data["gpu_hours"],
            justification=serializer.validated_data["justification"],
        )
        found = _reload(request, created.pk)
        return Response(
            QuotaRequestOutput(_request_data(found)).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": quota_requests.quota_request_path(found)},
        )


class QuotaRequestFilterInput(serializers.Serializer[Any]):
    state = serializers.ChoiceField(choices=QuotaRequestState.choices, required=False)
    tenant = serializers.CharField(required=False, help_text="A tenant's slug")


class QuotaRequestListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="quota_requests_list",
        summary="Requests you may see, newest first: your projects', your tenants' (as its admin), all (portal admins)",
        parameters=[QuotaRequestFilterInput],
        responses={200: QuotaRequestOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = QuotaRequestFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        requests = quota_request_list_for_user(user=request.user)
        if "state" in filters.validated_data:
            requests = requests.filter(state=filters.validated_data["state"])
        if "tenant" in filters.validated_data:
            tenant = tenant_get_for_user(user=request.user, slug=filters.validated_data["tenant"])
            requests = requests.filter(allocation__project__tenant=tenant)
        return _page(self, request, requests)


class QuotaRequestDetailApi(APIView):
    @extend_schema(
        operation_id="quota_requests_retrieve",
        summary="One request, with its allocation's balances as of now",
        responses={200: QuotaRequestOutput, **ERRORS},
    )
    def get(self, request: Request, request_id: int) -> Response:
        return Response(QuotaRequestOutput(_request_data(_reload(request, request_id))).data)


class QuotaRequestDecideInput(BodyInput):
    approve_gpu_hours = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        allow_null=True,
        help_text="All of the request, part of it, or null (or 0) to deny",
    )
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=5000,
        help_text="Required to deny; the requester reads it",
    )


class QuotaRequestDecideApi(APIView):
    @extend_schema(
        operation_id="quota_requests_decide",
        summary=(
            "Approve a pending request in full or in part (granted at once), or deny it with a reason: tenant admins "
            "within their tenant's pool, portal admins any amount"
        ),
        request=QuotaRequestDecideInput,
        responses={200: QuotaRequestOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, request_id: int) -> Response:
        found = quota_request_get_for_user(user=request.user, request_id=request_id, action=QuotaRequestAction.DECIDE)
        serializer = QuotaRequestDecideInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        quota_requests.quota_request_decide(
            actor=request.user,  # type: ignore[arg-type]
            request=found,
            approve_gpu_hours=serializer.validated_data["approve_gpu_hours"],
            reason=serializer.validated_data["reason"],
        )
        return Response(QuotaRequestOutput(_request_data(_reload(request, request_id))).data)


class QuotaRequestWithdrawApi(APIView):
    @extend_schema(
        operation_id="quota_requests_withdraw",
        summary="Withdraw your own pending request",
        request=None,
        responses={200: QuotaRequestOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, request_id: int) -> Response:
        found = quota_request_get_for_user(user=request.user, request_id=request_id, action=QuotaRequestAction.WITHDRAW)
        quota_requests.quota_request_withdraw(actor=request.user, request=found)  # type: ignore[arg-type]
        return Response(QuotaRequestOutput(_request_data(_reload(request, request_id))).data)


# Tenant pools ------------------------------------------------------------------------------------------


class TenantPoolOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    tenant = serializers.CharField()
    cluster = serializers.CharField()
    starts_on = serializers.DateField()
    ends_on = serializers.DateField()
    gpu_hours = gpu_hours_field("Given to the tenant by a portal admin")
    distributed_gpu_hours = gpu_hours_field("Granted by the tenant's admins on approving requests")
    available_gpu_hours = gpu_hours_field()
    gpu_seconds = serializers.IntegerField()
    distributed_gpu_seconds = serializers.IntegerField()
    available_gpu_seconds = serializers.IntegerField()
    created_at = serializers.DateTimeField()


def _pool_data(pool: TenantPool) -> dict[str, Any]:
    return {
        "id": pool.pk,
        "tenant": pool.tenant.slug,
        "cluster": pool.cluster.name,
        "starts_on": pool.starts_on,
        "ends_on": pool.ends_on,
        "gpu_hours": gpu_seconds_to_hours(pool.gpu_seconds),
        "distributed_gpu_hours": gpu_seconds_to_hours(pool.distributed_gpu_seconds),
        "available_gpu_hours": gpu_seconds_to_hours(pool.available_gpu_seconds),
        "gpu_seconds": pool.gpu_seconds,
        "distributed_gpu_seconds": pool.distributed_gpu_seconds,
        "available_gpu_seconds": pool.available_gpu_seconds,
        "created_at": pool.created_at,
    }


class TenantPoolFilterInput(serializers.Serializer[Any]):
    tenant = serializers.CharField(required=False, help_text="A tenant's slug")


class TenantPoolCreateInput(BodyInput):
    tenant = serializers.CharField(help_text="A tenant's slug")
    cluster = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=12, decimal_places=2)
    starts_on = serializers.DateField()
    ends_on = serializers.DateField(help_text="The last day of the period (inclusive)")


class TenantPoolListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="tenant_pools_list",
        summary="GPU-hours tenants' admins may approve from: your tenants' as tenant admin, all as portal admin",
        parameters=[TenantPoolFilterInput],
        responses={200: TenantPoolOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = TenantPoolFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        pools = quota_requests.tenant_pool_list_for_user(user=request.user)
        if "tenant" in filters.validated_data:
            tenant = tenant_get_for_user(
                user=request.user, slug=filters.validated_data["tenant"], action=TenantAction.MANAGE
            )
            pools = pools.filter(tenant=tenant)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(pools, request, view=self) or []
        return paginator.get_paginated_response(TenantPoolOutput([_pool_data(p) for p in page], many=True).data)

    @extend_schema(
        operation_id="tenant_pools_create",
        summary="Give a tenant GPU-hours on a cluster for a period, for its admins to approve from (portal admins)",
        request=TenantPoolCreateInput,
        responses={201: TenantPoolOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request) -> Response:
        from clusters.models import Cluster

        if not is_portal_admin(request.user):
            raise PermissionDenied("Giving a tenant a pool of GPU-hours needs a portal admin.")
        serializer = TenantPoolCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        tenant = tenant_get_for_user(user=request.user, slug=data["tenant"])
        cluster = Cluster.objects.filter(name=data["cluster"]).first()
        if cluster is None:
            raise serializers.ValidationError(
                {"cluster": [f"No cluster '{data['cluster']}'; see GET /api/v1/clusters/."]}
            )
        pool = quota_requests.tenant_pool_create(
            actor=request.user,  # type: ignore[arg-type]
            tenant=tenant,
            cluster=cluster,
            gpu_hours=data["gpu_hours"],
            starts_on=data["starts_on"],
            ends_on=data["ends_on"],
        )
        pool = TenantPool.objects.select_related("tenant", "cluster").get(pk=pool.pk)
        return Response(TenantPoolOutput(_pool_data(pool)).data, status=status.HTTP_201_CREATED)


# Burn-down ---------------------------------------------------------------------------------------------


class UsageDayOutput(serializers.Serializer[Any]):
    date = serializers.DateField()
    used_gpu_hours = gpu_hours_field("Charges that landed that day")
    reserved_gpu_hours = gpu_hours_field("Reservations still open at the end of that day")
    cumulative_used_gpu_hours = gpu_hours_field("Charges from the start of the period to the end of that day")
    used_gpu_seconds = serializers.IntegerField()
    reserved_gpu_seconds = serializers.IntegerField()
    cumulative_used_gpu_seconds = serializers.IntegerField()


class UsageSeriesOutput(serializers.Serializer[Any]):
    allocation = AllocationBalanceOutput()
    as_of = serializers.DateField(help_text="The last day shown: today, or the period's last day once it is over")
    burn_rate_gpu_hours_per_day = gpu_hours_field("Charges over the last 7 days (fewer early in the period), per day")
    burn_rate_days = serializers.IntegerField(help_text="The days the burn rate averages over")
    projected_exhaustion_on = serializers.DateField(
        allow_null=True,
        help_text=(
            "Today + remaining / burn rate (today when nothing remains); null when nothing is burning or it falls "
            "after the period ends"
        ),
    )
    exhausted_before_period_end = serializers.BooleanField(
        help_text="Whether the allocation runs out before its period ends at the current burn rate"
    )
    days = UsageDayOutput(many=True)


def _usage_data(series: UsageSeries) -> dict[str, Any]:
    return {
        "allocation": allocation_balance_data(series.allocation),
        "as_of": series.as_of,
        "burn_rate_gpu_hours_per_day": series.burn_rate_gpu_hours_per_day,
        "burn_rate_days": series.burn_rate_days,
        "projected_exhaustion_on": series.projected_exhaustion_on,
        "exhausted_before_period_end": series.exhausted_before_period_end,
        "days": [
            {
                "date": day.day,
                "used_gpu_hours": gpu_seconds_to_hours(day.used_gpu_seconds),
                "reserved_gpu_hours": gpu_seconds_to_hours(day.reserved_gpu_seconds),
                "cumulative_used_gpu_hours": gpu_seconds_to_hours(day.cumulative_used_gpu_seconds),
                "used_gpu_seconds": day.used_gpu_seconds,
                "reserved_gpu_seconds": day.reserved_gpu_seconds,
                "cumulative_used_gpu_seconds": day.cumulative_used_gpu_seconds,
            }
            for day in series.days
        ],
    }


class UsageSeriesInput(serializers.Serializer[Any]):
    days = serializers.IntegerField(
        required=False, min_value=1, max_value=3660, help_text="Only the last N days; default: the whole period"
    )


class AllocationUsageApi(APIView):
    @extend_schema(
        operation_id="allocation_usage_retrieve",
        summary="The burn-down: GPU-hours used and reserved per day, the 7-day burn rate, the projected exhaustion",
        parameters=[UsageSeriesInput],
        responses={200: UsageSeriesOutput, **ERRORS},
    )
    def get(self, request: Request, allocation_id: int) -> Response:
        allocation = allocation_get_for_user(user=request.user, allocation_id=allocation_id)
        filters = UsageSeriesInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        series = allocation_usage_series(
            allocation=allocation, now=timezone.now(), days=filters.validated_data.get("days")
        )
        return Response(UsageSeriesOutput(_usage_data(series)).data)


urlpatterns: list[URLPattern] = [
    path(
        "allocations/<int:allocation_id>/requests/", AllocationRequestListApi.as_view(), name="api-allocation-requests"
    ),
    path("allocations/<int:allocation_id>/usage/", AllocationUsageApi.as_view(), name="api-allocation-usage"),
    path("quota-requests/", QuotaRequestListApi.as_view(), name="api-quota-requests"),
    path("quota-requests/<int:request_id>/", QuotaRequestDetailApi.as_view(), name="api-quota-request"),
    path("quota-requests/<int:request_id>/decide/", QuotaRequestDecideApi.as_view(), name="api-quota-request-decide"),
    path(
        "quota-requests/<int:request_id>/withdraw/",
        QuotaRequestWithdrawApi.as_view(),
        name="api-quota-request-withdraw",
    ),
    path("tenant-pools/", TenantPoolListApi.as_view(), name="api-tenant-pools"),
]
