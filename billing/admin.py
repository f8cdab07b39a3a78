"""Django admin for billing: rates are added (and corrected while unused) through the rate services; usage
records and invoices are read-only records, finalised through the invoice service."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from billing import rates as rate_services
from billing import reconciliation_admin  # noqa: F401  # registers the reconciliation reports' admin
from billing.invoices import invoice_finalise
from billing.models import Invoice, InvoiceLine, InvoiceState, Rate, UsageRecord, UsageShare
from portal.errors import Conflict
from quotas.admin import ReadOnlyAdmin
from quotas.units import format_gpu_hours


class RateForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Rate
        fields = ("cluster", "gpu_type", "price_per_gpu_hour", "currency", "valid_from", "note")


@admin.register(Rate)
class RateAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = RateForm
    list_display = ("cluster", "gpu_type_label", "price_per_gpu_hour", "currency", "valid_from", "priced_jobs")
    list_filter = ("cluster", "gpu_type", "currency")

    @admin.display(description="GPU type")
    def gpu_type_label(self, obj: Rate) -> str:
        return obj.gpu_type or "any (without its own rate)"

    @admin.display(description="Jobs priced")
    def priced_jobs(self, obj: Rate) -> int:
        return rate_services.rate_priced_usage_count(obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Rate | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        if rate_services.rate_priced_usage_count(obj):
            return ("cluster", "gpu_type", "price_per_gpu_hour", "currency", "valid_from", "note")
        return ("cluster", "gpu_type")

    def has_change_permission(self, request: HttpRequest, obj: Rate | None = None) -> bool:
        return super().has_change_permission(request, obj) and (
            obj is None or not rate_services.rate_priced_usage_count(obj)
        )

    def has_delete_permission(self, request: HttpRequest, obj: Rate | None = None) -> bool:
        return super().has_delete_permission(request, obj) and (
            obj is not None and not rate_services.rate_priced_usage_count(obj)
        )

    def save_model(self, request: HttpRequest, obj: Rate, form: Any, change: bool) -> None:
        try:
            if change:
                changes = {field: form.cleaned_data[field] for field in form.changed_data}
                updated = rate_services.rate_update(actor=request.user, rate=obj, changes=changes)
            else:
                updated = rate_services.rate_create(
                    actor=request.user,
                    cluster=obj.cluster,
                    gpu_type=obj.gpu_type,
                    price_per_gpu_hour=obj.price_per_gpu_hour,
                    currency=obj.currency,
                    valid_from=obj.valid_from,
                    note=obj.note,
                )
            obj.pk = updated.pk
        except (Conflict, ValidationError) as exc:
            # The admin's change form has no place for a service refusal after validation: say it and keep the row.
            self.message_user(request, str(exc), level=messages.ERROR)

    def delete_model(self, request: HttpRequest, obj: Rate) -> None:
        rate_services.rate_delete(actor=request.user, rate=obj)


class UsageShareInline(admin.TabularInline):  # type: ignore[type-arg]
    model = UsageShare
    extra = 0
    can_delete = False
    fields = ("day", "starts_at", "ends_at", "gpu_seconds", "price_per_gpu_hour", "currency", "cost", "billed_month")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "ended_at",
        "project",
        "cluster",
        "gpu_type",
        "slurm_job_id",
        "array_task",
        "gpu_hours",
        "cost",
        "currency",
    )
    list_filter = ("cluster", "gpu_type", "tenant")
    search_fields = ("project__slug", "tenant__slug", "slurm_job_id", "cluster_username")
    date_hierarchy = "ended_at"
    inlines = (UsageShareInline,)

    @admin.display(description="GPU-hours")
    def gpu_hours(self, obj: UsageRecord) -> str:
        return format_gpu_hours(obj.gpu_seconds)


class InvoiceLineInline(admin.TabularInline):  # type: ignore[type-arg]
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = (
        "project",
        "cluster",
        "gpu_type",
        "usage_month",
        "job_count",
        "gpu_seconds",
        "price_per_gpu_hour",
        "amount",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    list_display = ("month", "tenant", "currency", "state", "number", "total", "built_at", "printable")
    list_filter = ("state", "month", "currency")
    search_fields = ("tenant__slug", "number")
    inlines = (InvoiceLineInline,)
    actions = ("finalise",)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None  # lets the list offer the action; an invoice itself is never edited here

    @admin.display(description="Print / CSV")
    def printable(self, obj: Invoice) -> str:
        return format_html(
            '<a href="/billing/invoices/{}/print/">print</a> · <a href="/api/v1/invoices/{}/csv/">CSV</a>',
            obj.pk,
            obj.pk,
        )

    @admin.action(description="Finalise the selected invoices (months that have ended)")
    def finalise(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
        done = 0
        for invoice in queryset.filter(state=InvoiceState.DRAFT):
            try:
                invoice_finalise(actor=request.user, invoice=invoice)
                done += 1
            except Conflict as exc:
                self.message_user(request, f"{invoice}: {exc}", level=messages.WARNING)
        self.message_user(request, f"Finalised {done} invoice{'s' if done != 1 else ''}.")
