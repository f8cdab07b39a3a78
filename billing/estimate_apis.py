"""REST API for cost estimates and spend over time (under /api/v1/): anyone who sees a project estimates a
job's cost before submitting; tenant admins and project managers read what was spent, per day and per spender."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.urls import URLPattern, path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.estimates import estimate_data, estimate_for_request
from billing.spend import (
    MAX_PERIOD_DAYS,
    TOP_LIMIT_MAX,
    DailySpend,
    SpendScope,
    SpendTopBy,
    TopSpend,
    spend_daily,
    spend_period,
    spend_scope_for_user,
    spend_top,
)
from jobs.job_services import JobRequest
from portal.api_errors import ERRORS
from portal.api_inputs import BodyInput
from portal.api_serializers import FieldsBoundOnce
from quotas.apis import gpu_hours_field
from quotas.units import gpu_seconds_to_hours
from tenants.selectors import ProjectAction, project_get_by_label_for_user


def _amount_field(help_text: str, *, allow_null: bool = False) -> serializers.CharField:
    # A string, rounded to the currency's minor unit by billing.money (0 places for JPY, 2 for EUR).
    return serializers.CharField(help_text=help_text, allow_null=allow_null)


def _amount(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


# Estimates ---------------------------------------------------------------------------------------------


class EstimateInput(BodyInput):
    project = serializers.CharField(help_text="tenant/project, e.g. acme/vision")
    cluster = serializers.CharField(help_text="A cluster from GET /api/v1/clusters/")
    partition = serializers.CharField(required=False, help_text="Default: the cluster's default partition")
    gpu_type = serializers.CharField(required=False, allow_blank=True, help_text="e.g. h100; default: any")
    gpus = serializers.IntegerField(
        required=False, min_value=1, max_value=1000, help_text="GPUs on each node; default 1"
    )
    nodes = serializers.IntegerField(
        source="node_count", required=False, min_value=1, max_value=10_000, help_text="Nodes; default 1"
    )
    time_limit_minutes = serializers.IntegerField(
        required=False, min_value=1, max_value=10_000_000, help_text="Default: the partition's default, else 60"
    )
    # Not priced (GPU-hours are), but checked against the partition's nodes as a submission is.
    cpus = serializers.IntegerField(
        required=False, min_value=1, max_value=100_000, help_text="CPUs on each node; default: the partition's"
    )
    memory_gb = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=1_000_000,
        help_text="Memory on each node in GB; default: the partition's",
    )
    template = serializers.CharField(
        required=False, help_text="A template id from GET /api/v1/job-templates/; given fields override it"
    )
    array = serializers.CharField(
        required=False, allow_blank=True, help_text="A job array's indexes, e.g. 0-99%10: every task is counted"
    )


# Each submission's reply renders one: its fields are made once (`FieldsBoundOnce`; none reads the context).
class EstimateRateOutput(FieldsBoundOnce):
    id = serializers.IntegerField()
    gpu_type = serializers.CharField(help_text="Empty: the cluster's rate for GPUs without a rate of their own")
    price_per_gpu_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    currency = serializers.CharField()
    valid_from = serializers.DateTimeField()


class EstimateAllocationOutput(FieldsBoundOnce):
    id = serializers.IntegerField()
    gpu_type = serializers.CharField(help_text="Empty: GPUs of any type")
    ends_on = serializers.DateField(help_text="The last day of the period")
    remaining_gpu_hours = gpu_hours_field("Before the job: granted - used - reserved by other jobs")
    remaining_after_gpu_hours = gpu_hours_field("Once the job's GPU-hours are reserved; negative: it does not fit")


class EstimateOutput(FieldsBoundOnce):
    """The same estimate answers POST /api/v1/estimates/ and rides on the submit reply as `estimate`."""

    project = serializers.CharField(help_text="tenant/project")
    cluster = serializers.CharField()
    partition = serializers.CharField()
    gpu_type = serializers.CharField(help_text="The type the GPUs will have; empty when any type may come")
    gpus = serializers.IntegerField(help_text="GPUs on each node")
    nodes = serializers.IntegerField(help_text="Nodes of each run")
    total_gpus = serializers.IntegerField(help_text="gpus x nodes")
    time_limit_minutes = serializers.IntegerField()
    array_tasks = serializers.IntegerField(help_text="A job array's number of tasks; 0 for a plain job")
    array_tasks_that_fit = serializers.IntegerField(
        allow_null=True, help_text="How many of the array's tasks the allocation has room for; null: no array"
    )
    gpu_hours = gpu_hours_field(
        "The most the job can use, and so what it reserves: tasks x nodes x GPUs per node x time limit"
    )
    rate = EstimateRateOutput(allow_null=True, help_text="The rate in force now; null: no price is set")
    max_cost = _amount_field("gpu_hours x the rate's price; null without a rate", allow_null=True)
    currency = serializers.CharField(allow_null=True)
    allocation = EstimateAllocationOutput(allow_null=True, help_text="The allocation it draws on; null: none open")
    fits = serializers.BooleanField(help_text="Whether the allocation has room: a submission would be accepted")
    message = serializers.CharField(help_text="The estimate in one sentence")


class EstimateApi(APIView):
    @extend_schema(
        operation_id="estimates_create",
        summary="The most a job can cost (GPUs x time limit x the rate in force) and what it leaves of the allocation",
        request=EstimateInput,
        responses={200: EstimateOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        given = EstimateInput(data=request.data)
        given.is_valid(raise_exception=True)
        data = dict(given.validated_data)
        project = project_get_by_label_for_user(user=request.user, label=data.pop("project"), action=ProjectAction.VIEW)
        estimate = estimate_for_request(project=project, request=JobRequest(**data))
        return Response(EstimateOutput(estimate_data(estimate)).data)


# Spend -------------------------------------------------------------------------------------------------


class SpendScopeOutput(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=["all", "tenant", "project"])
    name = serializers.CharField(help_text="The tenant's slug or tenant/project; empty for all tenants")


def _scope_data(scope: SpendScope) -> dict[str, str]:
    return {"kind": scope.kind.value, "name": scope.name}


class SpendPeriodInput(serializers.Serializer[Any]):
    start = serializers.DateField(required=False, help_text="First day (UTC); default: the 1st of this month")
    end = serializers.DateField(
        required=False, help_text=f"Last day (UTC), included; default: today; at most {MAX_PERIOD_DAYS} days"
    )
    currency = serializers.CharField(
        required=False, min_length=3, max_length=3, help_text="Needed only when the usage is priced in several"
    )


class SpendDailyInput(SpendPeriodInput):
    tenant = serializers.CharField(required=False, help_text="A tenant's slug (its admins)")
    project = serializers.CharField(required=False, help_text="tenant/project (its managers and the tenant's admins)")


class SpendDayOutput(serializers.Serializer[Any]):
    day = serializers.DateField()
    amount = _amount_field("Spent on GPUs used this UTC day")
    gpu_hours = gpu_hours_field()


class SpendProjectOutput(serializers.Serializer[Any]):
    project = serializers.CharField(help_text="tenant/project")
    total = _amount_field("Spent in the period")
    gpu_hours = gpu_hours_field()


class SpendDailyOutput(serializers.Serializer[Any]):
    scope = SpendScopeOutput()
    start = serializers.DateField()
    end = serializers.DateField()
    currency = serializers.CharField(allow_null=True, help_text="Null when nothing was spent")
    total = _amount_field(
        "The period's cost, each invoice line's part rounded once, then summed: for a month, what its invoices say "
        "(the days' amounts may differ from it by a cent)"
    )
    gpu_hours = gpu_hours_field()
    days = SpendDayOutput(many=True, help_text="Every day of the period, oldest first; zeros included")
    projects = SpendProjectOutput(many=True, allow_null=True, help_text="Per project, most first; null for a project")


def _daily_data(spend: DailySpend) -> dict[str, Any]:
    return {
        "scope": _scope_data(spend.scope),
        "start": spend.start,
        "end": spend.end,
        "currency": spend.currency,
        "total": _amount(spend.total),
        "gpu_hours": gpu_seconds_to_hours(spend.gpu_seconds),
        "days": [
            {"day": day.day, "amount": _amount(day.amount), "gpu_hours": gpu_seconds_to_hours(day.gpu_seconds)}
            for day in spend.days
        ],
        "projects": None
        if spend.projects is None
        else [
            {"project": row.project, "total": _amount(row.amount), "gpu_hours": gpu_seconds_to_hours(row.gpu_seconds)}
            for row in spend.projects
        ],
    }


class SpendDailyApi(APIView):
    @extend_schema(
        operation_id="spend_daily",
        summary="A tenant's or project's spend per day (by the day GPUs were used), and per project for a tenant",
        parameters=[SpendDailyInput],
        responses={200: SpendDailyOutput, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        given = SpendDailyInput(data=request.query_params)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        scope = spend_scope_for_user(user=request.user, tenant=data.get("tenant"), project=data.get("project"))
        start, end = spend_period(start=data.get("start"), end=data.get("end"), today=timezone.now().date())
        spend = spend_daily(scope=scope, start=start, end=end, currency=data.get("currency"))
        return Response(SpendDailyOutput(_daily_data(spend)).data)


class SpendTopInput(SpendPeriodInput):
    tenant = serializers.CharField(required=False, help_text="A tenant's slug; none: every tenant (portal admins)")
    project = serializers.CharField(required=False, help_text="tenant/project: its top users")
    by = serializers.ChoiceField(choices=[by.value for by in SpendTopBy], default=SpendTopBy.PROJECT.value)
    limit = serializers.IntegerField(required=False, default=10, min_value=1, max_value=TOP_LIMIT_MAX)


class SpenderOutput(serializers.Serializer[Any]):
    project = serializers.CharField(required=False, help_text="by=project: tenant/project")
    user = serializers.CharField(
        required=False, help_text="by=user: the portal username, or the POSIX user of external jobs without one"
    )
    portal_user = serializers.BooleanField(required=False, help_text="by=user: false for a POSIX user only")
    amount = _amount_field("Spent in the period")
    gpu_hours = gpu_hours_field()
    jobs = serializers.IntegerField(help_text="Jobs that used GPUs in the period")


class SpendTopOutput(serializers.Serializer[Any]):
    scope = SpendScopeOutput()
    start = serializers.DateField()
    end = serializers.DateField()
    by = serializers.ChoiceField(choices=[by.value for by in SpendTopBy])
    currency = serializers.CharField(allow_null=True, help_text="Null when nothing was spent")
    results = SpenderOutput(many=True, help_text="Most spent first")


def _top_data(top: TopSpend) -> dict[str, Any]:
    results = []
    for spender in top.spenders:
        who: dict[str, Any] = (
            {"project": spender.name}
            if top.by is SpendTopBy.PROJECT
            else {"user": spender.name, "portal_user": spender.portal_user}
        )
        results.append(
            {
                **who,
                "amount": _amount(spender.amount),
                "gpu_hours": gpu_seconds_to_hours(spender.gpu_seconds),
                "jobs": spender.jobs,
            }
        )
    return {
        "scope": _scope_data(top.scope),
        "start": top.start,
        "end": top.end,
        "by": top.by.value,
        "currency": top.currency,
        "results": results,
    }


class SpendTopApi(APIView):
    @extend_schema(
        operation_id="spend_top",
        summary="The projects or users that spent most in a period, of a tenant, a project or (portal admins) all",
        parameters=[SpendTopInput],
        responses={200: SpendTopOutput, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        given = SpendTopInput(data=request.query_params)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        scope = spend_scope_for_user(
            user=request.user, tenant=data.get("tenant"), project=data.get("project"), all_allowed=True
        )
        start, end = spend_period(start=data.get("start"), end=data.get("end"), today=timezone.now().date())
        top = spend_top(
            scope=scope,
            start=start,
            end=end,
            by=SpendTopBy(data["by"]),
            limit=data["limit"],
            currency=data.get("currency"),
        )
        return Response(SpendTopOutput(_top_data(top)).data)


urlpatterns: list[URLPattern] = [
    path("estimates/", EstimateApi.as_view(), name="api-estimates"),
    path("spend/daily/", SpendDailyApi.as_view(), name="api-spend-daily"),
    path("spend/top/", SpendTopApi.as_view(), name="api-spend-top"),
]
