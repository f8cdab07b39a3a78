"""Django admin for clusters: registration and users' cluster usernames are editable; everything synced from
Slurm (inventory, projects' account states, drift reports) is read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from clusters.models import (
    Cluster,
    ClusterAccount,
    DirectoryPosixUsername,
    GpuType,
    Node,
    Partition,
    ProjectSlurmAccount,
    SlurmDriftKind,
    SlurmDriftReport,
)
from portal.queue import task_enqueue_on_commit

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
        (
            "GPU utilisation",
            {
                "fields": (
                    "dcgm_prometheus_url",
                    "slurm_gpu_accounting",
                    "idle_gpu_threshold_percent",
                    "idle_gpu_after_seconds",
                )
            },
        ),
        ("Last seen by the workers", {"fields": SYNCED_FROM_SLURM}),
    )
    inlines = (GpuTypeInline, PartitionInline, NodeInline)
    actions = ("sync_now", "reconcile_slurm_accounts_now")
    # slurmrestd speaks plain HTTP unless a TLS proxy fronts it, so a bare host:port means http.
    formfield_overrides = {models.URLField: {"assume_scheme": "http"}}

    def save_model(self, request: HttpRequest, obj: Cluster, form: Any, change: bool) -> None:
        """A new cluster, or a changed connection, is checked by a worker at once (it holds the key, the web tier
        does not): the result shows under "Last seen by the workers" within seconds."""
        connection_changed = not change or bool(
            {"slurmrestd_url", "jwt_key_file", "admin_user", "is_active"} & set(form.changed_data)
        )
        if connection_changed and change:
            obj.api_version = ""  # negotiated again with the new address
        super().save_model(request, obj, form, change)
        if connection_changed and obj.is_active:
            task_enqueue_on_commit("clusters.tasks.cluster_sync", obj.pk, fallback="beat checks it within a minute")
            self.message_user(
                request,
                f"A worker is checking {obj.name} now: its API version, health and inventory appear under "
                "'Last seen by the workers' in a few seconds (`manage.py cluster_add` on a worker host checks it "
                "before saving).",
                messages.INFO,
            )

    @admin.action(description="Check health and sync inventory now")
    def sync_now(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster_id in queryset.values_list("pk", flat=True):
            task_enqueue_on_commit("clusters.tasks.cluster_sync", cluster_id, fallback="beat syncs it within a minute")
        self.message_user(request, f"Asked the workers to sync {queryset.count()} cluster(s).", messages.SUCCESS)

    @admin.action(description="Reconcile Slurm accounts now")
    def reconcile_slurm_accounts_now(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        cluster_ids = list(queryset.filter(is_active=True).values_list("pk", flat=True))
        for cluster_id in cluster_ids:
            task_enqueue_on_commit(
                "clusters.tasks.cluster_slurm_reconcile", cluster_id, fallback="beat reconciles it within 10 minutes"
            )
        self.message_user(
            request,
            f"Asked the workers to reconcile the Slurm accounts of {len(cluster_ids)} active cluster(s); "
            "the result appears under Slurm drift reports.",
            messages.SUCCESS,
        )


@admin.register(ClusterAccount)
class ClusterAccountAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "cluster", "username")
    list_filter = ("cluster",)
    list_select_related = ("user", "cluster")
    search_fields = ("user__username", "username")
    autocomplete_fields = ("user",)


@admin.register(DirectoryPosixUsername)
class DirectoryPosixUsernameAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Which claim of a provider sets people's POSIX user on a cluster, at each sign-in (clusters/directory.py)."""

    list_display = ("provider", "cluster", "claim")
    list_filter = ("provider", "cluster")


def _kind_label(kind: str) -> str:
    return SlurmDriftKind(kind).label if kind in SlurmDriftKind.values else kind


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rows only the workers write: portal admins may look, not touch."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(ProjectSlurmAccount)
class ProjectSlurmAccountAdmin(ReadOnlyAdmin):
    list_display = ("project", "account", "cluster", "state", "synced_at", "last_error")
    list_filter = ("cluster", "state")
    search_fields = ("project__slug", "project__tenant__slug", "project__slurm_account")
    list_select_related = ("project__tenant", "cluster")

    @admin.display(description="Slurm account", ordering="project__slurm_account")
    def account(self, row: ProjectSlurmAccount) -> str:
        return row.project.slurm_account


@admin.register(SlurmDriftReport)
class SlurmDriftReportAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "cluster", "finished_at", "finding_count", "unrepaired_count", "failed")
    list_filter = ("cluster",)
    list_select_related = ("cluster",)
    date_hierarchy = "started_at"
    fields = ("cluster", "started_at", "finished_at", "error", "findings_table")
    readonly_fields = fields

    @admin.display(description="Findings")
    def finding_count(self, report: SlurmDriftReport) -> int:
        return len(report.findings)

    @admin.display(description="Not repaired")
    def unrepaired_count(self, report: SlurmDriftReport) -> int:
        return report.unrepaired_count

    @admin.display(description="Stopped early", boolean=True)
    def failed(self, report: SlurmDriftReport) -> bool:
        return bool(report.error) or report.finished_at is None

    @admin.display(description="Findings")
    def findings_table(self, report: SlurmDriftReport) -> SafeString:
        if not report.findings:
            return format_html("<p>{}</p>", "None: Slurm matched the portal.")
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _kind_label(finding.get("kind", "")),
                    finding.get("account", ""),
                    finding.get("user", ""),
                    "yes" if finding.get("repaired") else "no",
                    finding.get("detail", ""),
                )
                for finding in report.findings
            ),
        )
        return format_html(
            "<table><thead><tr><th>Kind</th><th>Account</th><th>User</th><th>Repaired</th><th>Detail</th></tr>"
            "</thead><tbody>{}</tbody></table>",
            rows,
        )
