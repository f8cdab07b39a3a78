"""Django admin for quotas: allocations are created through the quota services (so a grant row and an audit
event come with them); the ledger, requests, alerts and Slurm limits are read-only records."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from quotas.models import Allocation, LedgerEntry, QuotaAlert, QuotaLimitState, QuotaRequest, TenantPool
from quotas.services import allocation_create
from quotas.units import format_gpu_hours


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class LedgerInline(admin.TabularInline):  # type: ignore[type-arg]
    model = LedgerEntry
    fk_name = "allocation"
    extra = 0
    can_delete = False
    fields = ("created_at", "kind", "gpu_seconds", "job", "actor", "note")
    readonly_fields = fields
    ordering = ("-id",)

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class AllocationAddForm(forms.ModelForm):  # type: ignore[type-arg]
    gpu_hours = forms.DecimalField(max_digits=12, decimal_places=2, min_value=Decimal(0))
    note = forms.CharField(required=False, max_length=500)

    class Meta:
        model = Allocation
        fields = ("project", "cluster", "gpu_type", "starts_on", "ends_on")


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("__str__", "granted", "used", "reserved", "remaining")
    list_filter = ("cluster", "gpu_type")
    search_fields = ("project__slug", "project__tenant__slug")
    inlines = (LedgerInline,)
    readonly_fields = (
        "project",
        "cluster",
        "gpu_type",
        "starts_on",
        "ends_on",
        "granted",
        "used",
        "reserved",
        "remaining",
        "created_by",
        "created_at",
    )

    @admin.display(description="Granted GPU-hours")
    def granted(self, obj: Allocation) -> str:
        return format_gpu_hours(obj.granted_gpu_seconds)

    @admin.display(description="Used GPU-hours")
    def used(self, obj: Allocation) -> str:
        return format_gpu_hours(obj.charged_gpu_seconds)

    @admin.display(description="Reserved GPU-hours")
    def reserved(self, obj: Allocation) -> str:
        return format_gpu_hours(obj.reserved_gpu_seconds)

    @admin.display(description="Remaining GPU-hours")
    def remaining(self, obj: Allocation) -> str:
        return format_gpu_hours(obj.remaining_gpu_seconds)

    def get_form(self, request: HttpRequest, obj: Allocation | None = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = AllocationAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_inlines(self, request: HttpRequest, obj: Allocation | None) -> Any:
        return self.inlines if obj is not None else ()

    def get_readonly_fields(self, request: HttpRequest, obj: Allocation | None = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: Allocation | None = None) -> Any:
        if obj is None:
            return ("project", "cluster", "gpu_type", "gpu_hours", "starts_on", "ends_on", "note")
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: Allocation, form: Any, change: bool) -> None:
        # Through the service: the grant row, the audit event and the Slurm limit come with it.
        created = allocation_create(
            actor=request.user,
            project=form.cleaned_data["project"],
            cluster=form.cleaned_data["cluster"],
            gpu_type=form.cleaned_data["gpu_type"],
            gpu_hours=form.cleaned_data["gpu_hours"],
            starts_on=form.cleaned_data["starts_on"],
            ends_on=form.cleaned_data["ends_on"],
            note=form.cleaned_data["note"],
        )
        obj.pk = created.pk

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # grants go through POST /api/v1/allocations/{id}/grant/ or an approved request

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "gpu_seconds", "allocation", "project", "cluster", "job", "note")
    list_filter = ("kind", "cluster")
    search_fields = ("project__slug", "note")


@admin.register(QuotaRequest)
class QuotaRequestAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "allocation", "requested_by", "requested_gpu_seconds", "state", "decided_by")
    list_filter = ("state",)


@admin.register(TenantPool)
class TenantPoolAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "cluster", "starts_on", "ends_on", "gpu_seconds", "distributed_gpu_seconds")


@admin.register(QuotaAlert)
class QuotaAlertAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "allocation", "threshold_percent", "used_gpu_seconds")


@admin.register(QuotaLimitState)
class QuotaLimitStateAdmin(ReadOnlyAdmin):
    """What the portal wrote into Slurm; differences Slurm's side shows are in Slurm drift reports."""

    list_display = ("project", "cluster", "applied_minutes", "applied_at", "opening_gpu_seconds", "last_error")
    list_filter = ("cluster",)
