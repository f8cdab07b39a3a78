"""The GPU efficiency API: a month's report for a project, a tenant or every tenant (JSON and CSV), and one job's
idle GPU-hours with their cost at its rate. Who may read what: billing.efficiency."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import URLPattern, path
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.apis import MonthField
from billing.efficiency import EfficiencyReport, JobWaste, ScopeTotals, efficiency_csv, efficiency_report, job_waste_for
from billing.spend import spend_scope_for_user
from jobs.selectors import job_get_for_user
from portal.api_errors import ERRORS


class EfficiencyInput(serializers.Serializer[Any]):
    tenant = serializers.CharField(required=False, help_text="A tenant's slug (its admins)")
    project = serializers.CharField(required=False, help_text="tenant/project (its managers and the tenant's admins)")
    month = MonthField(
        required=False, help_text="YYYY-MM (UTC); default: this month. A job counts in the month it started"
    )


def _amounts(amounts: dict[str, Any]) -> list[dict[str, str]]:
    return [{"currency": currency, "amount": str(amount)} for currency, amount in amounts.items()]


def _totals(totals: ScopeTotals) -> dict[str, Any]:
    return {
        "jobs": totals.jobs,
        "mean_utilisation_percent": totals.mean_utilisation_percent,
        "idle_gpu_hours": str(totals.idle_gpu_hours),
        "idle_cost": _amounts(totals.idle_amounts),
        "jobs_ended_for_idling": totals.ended_for_idling,
        "saved_gpu_hours": str(totals.saved_gpu_hours),
        "saved": _amounts(totals.saved_amounts),
    }


def job_waste_data(waste: JobWaste) -> dict[str, Any]:
    job, efficiency = waste.job, waste.efficiency
    mean = efficiency.mean_utilisation_percent
    return {
        "job": str(job.pk),
        "name": job.name,
        "project": str(job.project),
        "cluster": job.cluster.name,
        "state": job.state,
        "utilisation_source": efficiency.source,
        "mean_utilisation_percent": None if mean is None else round(mean, 1),
        "peak_memory_mib": efficiency.peak_memory_mib,
        "idle_gpu_hours": str(waste.idle_gpu_hours),
        "currency": waste.currency,
        "price_per_gpu_hour": None if waste.rate is None else str(waste.rate.price_per_gpu_hour),
        "idle_cost": None if waste.idle_amount is None else str(waste.idle_amount),
        "ended_for_idling": efficiency.ended_at is not None,
    }


def report_data(report: EfficiencyReport) -> dict[str, Any]:
    return {
        "scope": {"kind": report.scope.kind.value, "name": report.scope.name},
        "month": f"{report.month:%Y-%m}",
        "totals": _totals(report.totals),
        "groups": [{"name": name, **_totals(totals)} for name, totals in report.by_group.items()],
        "worst_jobs": [job_waste_data(waste) for waste in report.worst],
    }


def _report(request: Request, *, with_jobs: bool = False) -> EfficiencyReport:
    given = EfficiencyInput(data=request.query_params)
    given.is_valid(raise_exception=True)
    data = given.validated_data
    scope = spend_scope_for_user(
        user=request.user, tenant=data.get("tenant"), project=data.get("project"), all_allowed=True
    )
    month = data.get("month") or timezone.now().date().replace(day=1)
    return efficiency_report(scope=scope, month=month, with_jobs=with_jobs)


class EfficiencyReportApi(APIView):
    @extend_schema(
        operation_id="efficiency_report",
        summary="A month's GPU efficiency of a project, a tenant, or every tenant (portal admins): idle GPU-hours, "
        "their cost, per project or tenant, and the worst jobs",
        parameters=[EfficiencyInput],
        responses={200: OpenApiResponse(description="The report"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(report_data(_report(request)))


class EfficiencyCsvApi(APIView):
    @extend_schema(
        operation_id="efficiency_report_csv",
        summary="The month's report as CSV: one line per job measured, the worst first",
        parameters=[EfficiencyInput],
        responses={200: OpenApiResponse(description="text/csv"), **ERRORS},
    )
    def get(self, request: Request) -> HttpResponse:
        report = _report(request, with_jobs=True)
        name = (report.scope.name or "all").replace("/", "-")
        response = HttpResponse(efficiency_csv(report), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="efficiency-{name}-{report.month:%Y-%m}.csv"'
        return response


class JobEfficiencyApi(APIView):
    @extend_schema(
        operation_id="jobs_efficiency",
        summary="A job's GPU efficiency and the cost of its idle GPU-hours at its rate (null: nothing measured it)",
        responses={200: OpenApiResponse(description="The job's figures, or null"), **ERRORS},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request.user, job_id=job_id)
        waste = job_waste_for(job)
        return Response(None if waste is None else job_waste_data(waste))


urlpatterns: list[URLPattern] = [
    path("efficiency/", EfficiencyReportApi.as_view(), name="api-efficiency"),
    path("efficiency/csv/", EfficiencyCsvApi.as_view(), name="api-efficiency-csv"),
    path("jobs/<uuid:job_id>/efficiency/", JobEfficiencyApi.as_view(), name="api-job-efficiency"),
]
