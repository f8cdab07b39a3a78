"""REST API for rates and invoices (under /api/v1/): everyone reads prices, portal admins set them; tenant
admins read their tenant's invoices, as JSON or CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import invoices as invoice_services
from billing import rates as rate_services
from billing.models import Invoice, InvoiceLine, InvoiceState
from billing.selectors import invoice_get_for_user, invoice_lines, invoice_list_for_user, rate_get, rate_list
from clusters.models import Cluster
from portal.api_errors import ERRORS, ERRORS_WITH_CONFLICT
from portal.api_inputs import BodyInput
from portal.api_pagination import PagePagination
from quotas.models import period_start
from quotas.units import gpu_seconds_to_hours
from tenants.selectors import is_portal_admin


def _require_portal_admin(request: Request, doing: str) -> None:
    if not is_portal_admin(request.user):
        raise PermissionDenied(f"{doing} needs a portal admin.")


def _money_field(help_text: str | None = None, places: int = 2) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=20, decimal_places=places, help_text=help_text)


# Rates -------------------------------------------------------------------------------------------------


class RateOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    cluster = serializers.CharField(source="cluster.name")
    gpu_type = serializers.CharField(help_text="Empty: every GPU type without a rate of its own")
    price_per_gpu_hour = _money_field(places=4)
    currency = serializers.CharField()
    valid_from = serializers.DateTimeField()
    note = serializers.CharField()
    created_at = serializers.DateTimeField()


class RateFilterInput(serializers.Serializer[Any]):
    cluster = serializers.CharField(required=False)
    gpu_type = serializers.CharField(required=False, allow_blank=True, help_text="Empty for the any-type rates")


def _valid_from(value: date | datetime) -> datetime:
    """A day means its midnight UTC, the way prices are announced."""
    if isinstance(value, datetime):
        return value
    return period_start(value)


@extend_schema_field(OpenApiTypes.DATETIME)
class DateOrDateTimeField(serializers.Field[datetime, Any, Any, Any]):
    default_error_messages = {"invalid": "Give a date (2026-12-01, meaning midnight UTC) or an ISO 8601 date-time."}

    def to_internal_value(self, data: Any) -> datetime:
        text = str(data).strip()
        try:
            if len(text) == 10:
                return _valid_from(date.fromisoformat(text))
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            self.fail("invalid")
        if timezone.is_naive(parsed):
            self.fail("invalid")
        # In UTC: PostgreSQL refuses offsets past 15:59 that Python accepts (a 500 before).
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            self.fail("invalid")

    def to_representation(self, value: datetime) -> str:
        return value.isoformat()


class RateCreateInput(BodyInput):
    cluster = serializers.CharField()
    gpu_type = serializers.CharField(required=False, allow_blank=True, default="", help_text="Empty: any type")
    price_per_gpu_hour = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0)
    currency = serializers.RegexField(r"^[A-Za-z]{3}$", error_messages={"invalid": "Give an ISO 4217 code, e.g. EUR."})
    valid_from = DateOrDateTimeField(help_text="A date (midnight UTC) or a date-time with its offset")
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)


class RateUpdateInput(BodyInput):
    price_per_gpu_hour = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0, required=False)
    currency = serializers.RegexField(r"^[A-Za-z]{3}$", required=False)
    valid_from = DateOrDateTimeField(required=False)
    note = serializers.CharField(required=False, allow_blank=True, max_length=300)


def cluster_named(name: str) -> Cluster:
    """The cluster of that name, or a 400 on the `cluster` field listing the names there are."""
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        names = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none yet"
        raise serializers.ValidationError({"cluster": [f"There is no cluster '{name}'; choose one of: {names}."]})
    return cluster


class RateListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="rates_list",
        summary="Prices per GPU-hour per cluster and GPU type, newest first within each type",
        parameters=[RateFilterInput],
        responses={200: RateOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = RateFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        rates = rate_list(
            cluster=filters.validated_data.get("cluster"), gpu_type=filters.validated_data.get("gpu_type")
        )
        paginator = PagePagination()
        page = paginator.paginate_queryset(rates, request, view=self) or []
        return paginator.get_paginated_response(RateOutput(page, many=True).data)

    @extend_schema(
        operation_id="rates_create",
        summary="Set a price from a moment on (portal admins); earlier usage keeps the price it was billed at",
        request=RateCreateInput,
        responses={201: RateOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request) -> Response:
        _require_portal_admin(request, "Setting a price")
        given = RateCreateInput(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        cluster = cluster_named(data["cluster"])
        if data["gpu_type"] and not cluster.gpu_types.filter(name=data["gpu_type"]).exists():
            offered = ", ".join(cluster.gpu_types.values_list("name", flat=True)) or "none synced yet"
            raise serializers.ValidationError(
                {"gpu_type": [f"Cluster '{cluster.name}' has no GPUs of type '{data['gpu_type']}'; it has: {offered}."]}
            )
        rate = rate_services.rate_create(
            actor=request.user,
            cluster=cluster,
            gpu_type=data["gpu_type"],
            price_per_gpu_hour=data["price_per_gpu_hour"],
            currency=data["currency"],
            valid_from=data["valid_from"],
            note=data["note"],
        )
        return Response(RateOutput(rate).data, status=status.HTTP_201_CREATED)


class RateDetailApi(APIView):
    @extend_schema(operation_id="rates_retrieve", summary="One rate", responses={200: RateOutput, **ERRORS})
    def get(self, request: Request, rate_id: int) -> Response:
        return Response(RateOutput(rate_get(rate_id=rate_id)).data)

    @extend_schema(
        operation_id="rates_update",
        summary="Correct a rate that has priced nothing yet (portal admins); a used rate answers 409",
        request=RateUpdateInput,
        responses={200: RateOutput, **ERRORS_WITH_CONFLICT},
    )
    def patch(self, request: Request, rate_id: int) -> Response:
        _require_portal_admin(request, "Changing a price")
        rate = rate_get(rate_id=rate_id)
        given = RateUpdateInput(data=request.data)
        given.is_valid(raise_exception=True)
        rate = rate_services.rate_update(actor=request.user, rate=rate, changes=dict(given.validated_data))
        return Response(RateOutput(rate).data)

    @extend_schema(
        operation_id="rates_destroy",
        summary="Remove a rate that has priced nothing yet (portal admins)",
        responses={204: None, **ERRORS_WITH_CONFLICT},
    )
    def delete(self, request: Request, rate_id: int) -> Response:
        _require_portal_admin(request, "Removing a price")
        rate_services.rate_delete(actor=request.user, rate=rate_get(rate_id=rate_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


# Invoices ----------------------------------------------------------------------------------------------


class InvoiceLineOutput(serializers.Serializer[Any]):
    project = serializers.CharField(help_text="tenant/project")
    cluster = serializers.CharField()
    gpu_type = serializers.CharField(help_text="Empty: jobs that asked for any GPU type")
    usage_month = serializers.CharField(
        help_text="YYYY-MM the usage happened in (earlier than the invoice's: late usage)"
    )
    jobs = serializers.IntegerField()
    gpu_seconds = serializers.IntegerField()
    gpu_hours = serializers.DecimalField(max_digits=14, decimal_places=2)
    price_per_gpu_hour = _money_field(places=4)
    amount = _money_field("The line's usage costs summed, rounded once")


class InvoiceOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    tenant = serializers.CharField()
    month = serializers.CharField(help_text="YYYY-MM")
    currency = serializers.CharField()
    state = serializers.ChoiceField(choices=InvoiceState.choices)
    number = serializers.CharField(help_text="Given when finalised")
    gpu_seconds = serializers.IntegerField()
    gpu_hours = serializers.DecimalField(max_digits=14, decimal_places=2)
    total = _money_field("The lines' amounts summed")
    built_at = serializers.DateTimeField(help_text="When its lines were last computed from usage")
    finalised_at = serializers.DateTimeField(allow_null=True)
    finalisable_from = serializers.DateTimeField(help_text="When the month closes and the invoice may be finalised")
    links = serializers.DictField(child=serializers.CharField())


class InvoiceDetailOutput(InvoiceOutput):
    lines = InvoiceLineOutput(many=True)


def _line_data(line: InvoiceLine) -> dict[str, Any]:
    return {
        "project": f"{line.project.tenant.slug}/{line.project.slug}",
        "cluster": line.cluster.name,
        "gpu_type": line.gpu_type,
        "usage_month": f"{line.usage_month:%Y-%m}",
        "jobs": line.job_count,
        "gpu_seconds": line.gpu_seconds,
        "gpu_hours": gpu_seconds_to_hours(line.gpu_seconds),
        "price_per_gpu_hour": line.price_per_gpu_hour,
        "amount": line.amount,
    }


def invoice_data(invoice: Invoice, *, lines: list[InvoiceLine] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": invoice.pk,
        "tenant": invoice.tenant.slug,
        "month": f"{invoice.month:%Y-%m}",
        "currency": invoice.currency,
        "state": invoice.state,
        "number": invoice.number,
        "gpu_seconds": invoice.gpu_seconds,
        "gpu_hours": gpu_seconds_to_hours(invoice.gpu_seconds),
        "total": invoice.total,
        "built_at": invoice.built_at,
        "finalised_at": invoice.finalised_at,
        "finalisable_from": invoice_services.month_closes_at(invoice.month),
        "links": {
            "self": f"/api/v1/invoices/{invoice.pk}/",
            "csv": f"/api/v1/invoices/{invoice.pk}/csv/",
            "print": f"/billing/invoices/{invoice.pk}/print/",
        },
    }
    if lines is not None:
        data["lines"] = [_line_data(line) for line in lines]
    return data


@extend_schema_field({"type": "string", "pattern": r"^\d{4}-\d{2}$", "example": "2026-11"})
class MonthField(serializers.Field[date, Any, Any, Any]):
    """A calendar month as YYYY-MM, read as its first day; "0000-00" or "2026-13" is refused, not a crash."""

    default_error_messages = {"invalid": "Give a month as YYYY-MM, e.g. 2026-11."}

    def to_internal_value(self, data: Any) -> date:
        text = str(data).strip()
        if len(text) != 7:
            self.fail("invalid")
        try:
            return date.fromisoformat(f"{text}-01")
        except ValueError:
            self.fail("invalid")

    def to_representation(self, value: date) -> str:
        return f"{value:%Y-%m}"


class InvoiceFilterInput(serializers.Serializer[Any]):
    tenant = serializers.CharField(required=False, help_text="A tenant's slug")
    month = MonthField(required=False, help_text="YYYY-MM")
    state = serializers.ChoiceField(choices=InvoiceState.choices, required=False)


class InvoiceListApi(APIView):
    pagination_class = PagePagination

    @extend_schema(
        operation_id="invoices_list",
        summary="Invoices of the tenants you administer, newest month first (drafts for running months)",
        parameters=[InvoiceFilterInput],
        responses={200: InvoiceOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = InvoiceFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        data = filters.validated_data
        invoices = invoice_list_for_user(
            user=request.user, tenant=data.get("tenant"), month=data.get("month"), state=data.get("state")
        )
        paginator = PagePagination()
        page = paginator.paginate_queryset(invoices, request, view=self) or []
        return paginator.get_paginated_response(
            InvoiceOutput([invoice_data(invoice) for invoice in page], many=True).data
        )


class InvoiceDetailApi(APIView):
    @extend_schema(
        operation_id="invoices_retrieve",
        summary="An invoice with its lines per project, cluster, GPU type and rate",
        responses={200: InvoiceDetailOutput, **ERRORS},
    )
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = invoice_get_for_user(user=request.user, invoice_id=invoice_id)
        lines = list(invoice_lines(invoice=invoice).select_related("project__tenant"))
        return Response(InvoiceDetailOutput(invoice_data(invoice, lines=lines)).data)


CSV_HEADER = [
    "invoice",
    "tenant",
    "month",
    "state",
    "project",
    "cluster",
    "gpu_type",
    "usage_month",
    "jobs",
    "gpu_seconds",
    "gpu_hours",
    "price_per_gpu_hour",
    "currency",
    "amount",
]


def invoice_csv(invoice: Invoice, lines: list[InvoiceLine]) -> str:
    """The invoice as CSV: one row per line, then a total row; amounts exactly as on the invoice."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    label = invoice.number or f"draft-{invoice.pk}"
    for line in lines:
        row = _line_data(line)
        writer.writerow(
            [
                label,
                invoice.tenant.slug,
                f"{invoice.month:%Y-%m}",
                invoice.state,
                row["project"],
                row["cluster"],
                row["gpu_type"] or "any",
                row["usage_month"],
                row["jobs"],
                row["gpu_seconds"],
                row["gpu_hours"],
                row["price_per_gpu_hour"],
                invoice.currency,
                row["amount"],
            ]
        )
    total_hours = gpu_seconds_to_hours(invoice.gpu_seconds)
    writer.writerow(
        [
            label,
            invoice.tenant.slug,
            f"{invoice.month:%Y-%m}",
            invoice.state,
            "TOTAL",
            "",
            "",
            "",
            "",
            invoice.gpu_seconds,
            total_hours,
            "",
            invoice.currency,
            invoice.total,
        ]
    )
    return out.getvalue()


class InvoiceCsvApi(APIView):
    @extend_schema(
        operation_id="invoices_csv",
        summary="The invoice as CSV (one row per line and a total row)",
        responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR), **ERRORS},
    )
    def get(self, request: Request, invoice_id: int) -> HttpResponse:
        invoice = invoice_get_for_user(user=request.user, invoice_id=invoice_id)
        lines = list(invoice_lines(invoice=invoice).select_related("project__tenant"))
        response = HttpResponse(invoice_csv(invoice, lines), content_type="text/csv; charset=utf-8")
        filename = f"{invoice.number or f'draft-{invoice.tenant.slug}-{invoice.month:%Y-%m}'}-{invoice.currency}.csv"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response


class InvoiceFinaliseApi(APIView):
    @extend_schema(
        operation_id="invoices_finalise",
        summary="Freeze a closed month's invoice now rather than after the grace period (portal admins)",
        request=None,
        responses={200: InvoiceDetailOutput, **ERRORS_WITH_CONFLICT},
    )
    def post(self, request: Request, invoice_id: int) -> Response:
        invoice = invoice_get_for_user(user=request.user, invoice_id=invoice_id)
        _require_portal_admin(request, "Finalising an invoice")
        invoice = invoice_services.invoice_finalise(actor=request.user, invoice=invoice)
        lines = list(invoice_lines(invoice=invoice).select_related("project__tenant"))
        return Response(InvoiceDetailOutput(invoice_data(invoice, lines=lines)).data)
