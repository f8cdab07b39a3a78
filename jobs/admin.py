"""Django admin for clusters: registration is editable, everything synced from Slurm is read-only."""

from __future__ import annotations

from functools import partial

from django.contrib import admin, messages
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.models import Cluster, ClusterAccount, GpuType, Node, Partition
from jobs.tasks import cluster_sync

SYNCED_FROM_SLURM = (
    "api_version",
    "slurm_release",
    "last_ping_at",
    "last_ping_ok",
    "last_ping_latency_ms",
    "last_ping_error",
    "inventory_synced_at",
)


class ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class PartitionInline(ReadOnlyInline):
    model = Partition
    fields = ("name", "state", "is_default", "max_time_minutes", "gpu_types", "max_gpus_per_node", "synced_at")


class GpuTypeInline(ReadOnlyInline):
    model = GpuType
    fields = ("name", "gpus_total", "gpus_used", "max_gpus_per_node", "synced_at")


class NodeInline(ReadOnlyInline):
    model = Node
    fields = ("name", "state", "reason", "gpu_type", "gpus_total", "gpus_used", "cpus", "cpus_allocated", "synced_at")


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "slurmrestd_url", "api_version", "slurm_release", "last_ping_ok", "last_ping_at")
    list_filter = ("is_active", "last_ping_ok")
    readonly_fields = SYNCED_FROM_SLURM
    fieldsets = (
        (None, {"fields": ("name", "slurmrestd_url", "jwt_key_file", "admin_user", "log_root", "is_active")}),
        ("Last seen by the workers", {"fields": SYNCED_FROM_SLURM}),
    )
    inlines = (GpuTypeInline, PartitionInline, NodeInline)
    actions = ("sync_now",)
    # slurmrestd speaks plain HTTP unless a TLS proxy fronts it, so a bare host:port means http.
    formfield_overrides = {models.URLField: {"assume_scheme": "http"}}

    @admin.action(description="Check health and sync inventory now")
    def sync_now(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster_id in queryset.values_list("pk", flat=True):
            transaction.on_commit(partial(cluster_sync.delay, cluster_id))
        self.message_user(request, f"Asked the workers to sync {queryset.count()} cluster(s).", messages.SUCCESS)


@admin.register(ClusterAccount)
class ClusterAccountAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "cluster", "username")
    list_filter = ("cluster",)
    search_fields = ("user__username", "username")
    autocomplete_fields = ("user",)
