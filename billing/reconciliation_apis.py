"""REST API for reconciliation reports (under /api/v1/): portal admins ask for a cluster's usage of a period to
be compared with Slurm's accounting, and read the findings once a worker has done it."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import reconciliation
from billing.apis import DateOrDateTimeField, cluster_named
from billing.models import ReconciliationKind, ReconciliationReport, ReconciliationState
from billing.reconciliation import reconciliation_report_path
from portal.api_errors import ERRORS
from portal.api_inputs import BodyInput
from portal.api_pagination import PagePagination


class ReconciliationSummaryOutput(serializers.Serializer[Any]):
    accounts = serializers.IntegerField(help_text="Slurm accounts of the cluster's projects asked about")
    portal_jobs = serializers.IntegerField(help_text="Portal jobs that ran on GPUs and ended in the period")
    slurm_jobs = serializers.IntegerField(help_text="Finished GPU jobs in Slurm's accounting, matched or not")
    jobs_compared = serializers.IntegerField(help_text="Jobs found in both")
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="Findings per kind")
    portal_gpu_seconds = serializers.IntegerField()
    slurm_gpu_seconds = serializers.IntegerField()
    difference_gpu_seconds = serializers.IntegerField(help_text="Portal minus Slurm")
    portal_gpu_hours = serializers.DecimalField(max_digits=14, decimal_places=2)
    slurm_gpu_hours = serializers.DecimalField(max_digits=14, decimal_places=2)
    difference_gpu_hours = serializers.DecimalField(max_digits=14, decimal_places=2)
    findings_total = serializers.IntegerField()
    findings_stored = serializers.IntegerField()
    findings_truncated = serializers.BooleanField(help_text="True when only the first findings were kept")


class ReconciliationFindingOutput(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=ReconciliationKind.choices)
    slurm_job_id = serializers.IntegerField(allow_null=True)
    account = serializers.CharField()
    job = serializers.UUIDField(allow_null=True, help_text="The portal job's id; null when the portal has none")
    portal_gpu_seconds = serializers.IntegerField(allow_null=True, help_text="Its usage record, else its charge")
    slurm_gpu_seconds = serializers.IntegerField(allow_null=True, help_text="Elapsed seconds x allocated GPUs")
    detail = serializers.CharField()


class ReconciliationReportOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    cluster = serializers.CharField()
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField(help_text="Exclusive: jobs that ended before this moment")
    state = serializers.ChoiceField(choices=ReconciliationState.choices)
    requested_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    summary = ReconciliationSummaryOutput(allow_null=True, help_text="Once the report is done")
    error = serializers.CharField(help_text="Why a failed report stopped")
    links = serializers.DictField(child=serializers.CharField(), help_text="self")


class ReconciliationReportDetailOutput(ReconciliationReportOutput):
    findings = ReconciliationFindingOutput(many=True)


def _report_data(report: ReconciliationReport) -> dict[str, Any]:
    return {
        "id": report.pk,
        "cluster": report.cluster.name,
        "period_start": report.period_start,
        "period_end": report.period_end,
        "state": report.state,
        "requested_by": report.requested_by.get_username() if report.requested_by else None,
        "created_at": report.created_at,
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "summary": report.summary if report.state == ReconciliationState.DONE else None,
        "error": report.error,
        "links": {"self": reconciliation_report_path(report)},
    }


class ReconciliationReportFilterInput(serializers.Serializer[Any]):
    cluster = serializers.CharField(required=False, help_text="A cluster's name")
    state = serializers.ChoiceField(choices=ReconciliationState.choices, required=False)


class ReconciliationReportCreateInput(BodyInput):
    cluster = serializers.CharField(help_text="A cluster's name")
    start = DateOrDateTimeField(help_text="A date (midnight UTC) or a date-time with its offset")
    end = DateOrDateTimeField(
        required=False,
        help_text="Exclusive, at most 92 days after start, not in the future; a date means its midnight UTC "
        "(a month is 2026-05-01 to 2026-06-01). Left out: now",
    )


class ReconciliationReportListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="reconciliation_reports_list",
        summary="Reconciliation reports, newest first, without their findings (portal admins only)",
        parameters=[ReconciliationReportFilterInput],
        responses={200: ReconciliationReportOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        reconciliation.reconciliation_access_check(user=request.user)
        filters = ReconciliationReportFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        reports = reconciliation.reconciliation_report_list_for_user(
            user=request.user,
            cluster_name=filters.validated_data.get("cluster"),
            state=filters.validated_data.get("state"),
        )
        paginator = PagePagination()
        page = paginator.paginate_queryset(reports, request, view=self) or []
        return paginator.get_paginated_response(
            ReconciliationReportOutput([_report_data(report) for report in page], many=True).data
        )

    @extend_schema(
        operation_id="reconciliation_reports_create",
        summary=(
            "Compare a cluster's usage of a period (jobs that ended in it) with Slurm's accounting (portal admins "
            "only); a worker computes the report, which starts pending"
        ),
        request=ReconciliationReportCreateInput,
        responses={202: ReconciliationReportOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        # Refuse non-admins before reading the input: the answer to a bad cluster lists the clusters.
        reconciliation.reconciliation_access_check(user=request.user)
        given = ReconciliationReportCreateInput(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        report = reconciliation.reconciliation_report_request(
            actor=request.user,
            cluster=cluster_named(data["cluster"]),
            period_start=data["start"],
            period_end=data.get("end") or timezone.now(),
        )
        found = reconciliation.reconciliation_report_get_for_user(user=request.user, report_id=report.pk)
        return Response(
            ReconciliationReportOutput(_report_data(found)).data,
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": reconciliation_report_path(found)},
        )


class ReconciliationReportDetailFilterInput(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=ReconciliationKind.choices, required=False, help_text="Only these findings")


class ReconciliationReportDetailApi(APIView):
    @extend_schema(
        operation_id="reconciliation_reports_retrieve",
        summary="A reconciliation report with its findings, job by job (portal admins only)",
        parameters=[ReconciliationReportDetailFilterInput],
        responses={200: ReconciliationReportDetailOutput, **ERRORS},
    )
    def get(self, request: Request, report_id: int) -> Response:
        report = reconciliation.reconciliation_report_get_for_user(user=request.user, report_id=report_id)
        filters = ReconciliationReportDetailFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        kind = filters.validated_data.get("kind")
        findings = [finding for finding in report.findings if kind is None or finding["kind"] == kind]
        return Response(ReconciliationReportDetailOutput({**_report_data(report), "findings": findings}).data)


urlpatterns: list[URLPattern] = [
    path("reconciliation-reports/", ReconciliationReportListApi.as_view(), name="api-reconciliation-reports"),
    path(
        "reconciliation-reports/<int:report_id>/",
        ReconciliationReportDetailApi.as_view(),
        name="api-reconciliation-report",
    ),
]
