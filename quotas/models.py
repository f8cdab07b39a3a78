"""GPU-hour allocations per project, the append-only quota ledger, requests for more hours and sent alerts.

Usage is integer GPU-seconds everywhere; GPU-hours are only a way of showing it (see `quotas.units`).
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


def period_start(day: date) -> datetime:
    """Midnight UTC at the start of `day`: when an allocation starting that day opens."""
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def period_end(day: date) -> datetime:
    """Midnight UTC after `day`: when an allocation ending that day (inclusive) closes."""
    return period_start(day + timedelta(days=1))


class Allocation(models.Model):
    """GPU-hours a project may use on one cluster (optionally on one GPU type) from `starts_on` to `ends_on`.

    The ledger is the record; the three balances are its sums, kept in the same transaction as each ledger
    row under this row's lock, so that checking what remains and reserving cannot interleave.
    """

    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="allocations")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="allocations")
    gpu_type = models.CharField(max_length=64, blank=True, help_text="Empty: GPUs of any type")
    starts_on = models.DateField()
    ends_on = models.DateField(help_text="The last day of the period (inclusive)")
    granted_gpu_seconds = models.BigIntegerField(default=0)
    charged_gpu_seconds = models.BigIntegerField(default=0)
    reserved_gpu_seconds = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["project", "cluster", "gpu_type", "-starts_on"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_on__gte=models.F("starts_on")), name="allocation_period_ordered"),
            models.UniqueConstraint(
                fields=["project", "cluster", "gpu_type", "starts_on"], name="allocation_unique_start"
            ),
        ]
        indexes = [models.Index(fields=["cluster", "ends_on"], name="allocation_cluster_ends")]

    def __str__(self) -> str:
        kind = f" {self.gpu_type}" if self.gpu_type else ""
        return f"{self.project} on {self.cluster.name}{kind} {self.starts_on}..{self.ends_on}"

    @property
    def remaining_gpu_seconds(self) -> int:
        return self.granted_gpu_seconds - self.charged_gpu_seconds - self.reserved_gpu_seconds

    @property
    def opens_at(self) -> datetime:
        return period_start(self.starts_on)

    @property
    def closes_at(self) -> datetime:
        return period_end(self.ends_on)

    def is_current(self, now: datetime) -> bool:
        return self.opens_at <= now < self.closes_at


class LedgerKind(models.TextChoices):
    GRANT = "grant", "Grant"  # hours given (negative: taken back)
    RESERVE = "reserve", "Reserve"  # GPUs x time limit, when a job is accepted or found
    RELEASE = "release", "Release"  # the reservation given back, when the job ends or moves to the next period
    CHARGE = "charge", "Charge"  # GPU-seconds the job really used, from Slurm's accounting


class LedgerEntry(models.Model):
    """One movement of GPU-seconds. Rows are only ever added.

    `project` and `cluster` are kept beside `allocation` because usage found in Slurm outside every
    allocation (an external job when none is current) is still charged, with no allocation.
    """

    allocation = models.ForeignKey(
        Allocation, on_delete=models.PROTECT, null=True, blank=True, related_name="ledger_entries"
    )
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="quota_ledger_entries")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="quota_ledger_entries")
    kind = models.CharField(max_length=16, choices=LedgerKind.choices)
    gpu_seconds = models.BigIntegerField()
    job = models.ForeignKey(
        "jobs.Job", on_delete=models.PROTECT, null=True, blank=True, related_name="quota_ledger_entries"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # A job array's task: an array reserves, releases and is charged task by task. None for a plain job.
    array_task = models.PositiveIntegerField(null=True, blank=True)
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        constraints = [
            # A job (an array: each task) is charged once, whatever happens to workers, retries and imports.
            models.UniqueConstraint(
                fields=["job", "array_task"],
                condition=Q(kind="charge", job__isnull=False),
                name="ledger_one_charge_per_job",
                nulls_distinct=False,
            ),
            # One reservation and one release of it per job (task) and allocation (it can move to the next period).
            models.UniqueConstraint(
                fields=["allocation", "job", "array_task", "kind"],
                condition=Q(kind__in=["reserve", "release"], job__isnull=False),
                name="ledger_one_reservation_per_job",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=Q(kind="grant") | Q(gpu_seconds__gte=0), name="ledger_only_grants_negative"
            ),
        ]
        indexes = [
            models.Index(fields=["allocation", "created_at"], name="ledger_allocation_time"),
            models.Index(fields=["project", "cluster", "kind"], name="ledger_project_cluster_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.gpu_seconds} GPU-s ({self.allocation_id})"


class LedgerDaily(models.Model):
    """One allocation's ledger summed per UTC day (by each entry's `created_at`): what its burn-down reads
    (quotas/usage.py), a row per day however many jobs ran. Kept by quotas.services in the transaction that adds
    each entry, and checked against the entries by `ledger_daily_mismatches` (and its test)."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="ledger_days")
    day = models.DateField()
    charged_gpu_seconds = models.BigIntegerField(default=0)
    reserved_gpu_seconds = models.BigIntegerField(default=0)
    released_gpu_seconds = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["allocation", "day"], name="ledger_daily_unique")]

    def __str__(self) -> str:
        return f"{self.allocation_id} {self.day}: {self.charged_gpu_seconds} GPU-s charged"


class QuotaLimitState(models.Model):
    """What the portal last wrote as the GPU-minute limit of a project's Slurm account on a cluster.

    `opening_gpu_seconds` is the account's GPU usage in Slurm's accounting from before the portal tracked
    it (jobs that ended before `tracking_started_at`): Slurm's usage counter includes it, and so must the limit.
    """

    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="quota_limit_states")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="quota_limit_states")
    tracking_started_at = models.DateTimeField(default=timezone.now)
    opening_gpu_seconds = models.BigIntegerField(default=0)
    opening_measured = models.BooleanField(default=False)
    applied_minutes = models.BigIntegerField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["project", "cluster"]
        constraints = [models.UniqueConstraint(fields=["project", "cluster"], name="quota_limit_state_unique")]

    def __str__(self) -> str:
        return f"{self.project} on {self.cluster_id}: {self.applied_minutes} GPU-minutes"


class QuotaRequestState(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    PARTIALLY_APPROVED = "partially_approved", "Approved in part"
    DENIED = "denied", "Denied"
    WITHDRAWN = "withdrawn", "Withdrawn"


class QuotaRequest(models.Model):
    """A member's request for more GPU-hours on one allocation, and its decision."""

    allocation = models.ForeignKey(Allocation, on_delete=models.PROTECT, related_name="requests")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_gpu_seconds = models.BigIntegerField()
    justification = models.TextField()
    state = models.CharField(max_length=24, choices=QuotaRequestState.choices, default=QuotaRequestState.PENDING)
    granted_gpu_seconds = models.BigIntegerField(default=0)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(requested_gpu_seconds__gt=0), name="quota_request_positive"),
            models.CheckConstraint(
                condition=Q(granted_gpu_seconds__gte=0) & Q(granted_gpu_seconds__lte=models.F("requested_gpu_seconds")),
                name="quota_request_grant_within_request",
            ),
        ]
        indexes = [models.Index(fields=["state", "-created_at"], name="quota_request_state_recent")]

    def __str__(self) -> str:
        return f"{self.requested_gpu_seconds} GPU-s for {self.allocation_id} ({self.state})"


class TenantPool(models.Model):
    """GPU-hours a portal admin gives a tenant on a cluster for a period, which its tenant admins may hand out
    to their projects by approving requests. Portal admins approve without drawing on a pool."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="quota_pools")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="quota_pools")
    starts_on = models.DateField()
    ends_on = models.DateField()
    gpu_seconds = models.BigIntegerField()
    distributed_gpu_seconds = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "cluster", "-starts_on"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_on__gte=models.F("starts_on")), name="tenant_pool_period_ordered"),
            models.UniqueConstraint(fields=["tenant", "cluster", "starts_on"], name="tenant_pool_unique_start"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} on {self.cluster_id} {self.starts_on}..{self.ends_on}"

    @property
    def available_gpu_seconds(self) -> int:
        return self.gpu_seconds - self.distributed_gpu_seconds


class QuotaAlert(models.Model):
    """A usage threshold (50, 80, 100 %) an allocation crossed, recorded once so that it is announced once."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="alerts")
    threshold_percent = models.PositiveSmallIntegerField()
    used_gpu_seconds = models.BigIntegerField(help_text="Charged plus reserved when it was crossed")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["allocation", "threshold_percent"]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "threshold_percent"], name="quota_alert_once_per_threshold")
        ]

    def __str__(self) -> str:
        return f"{self.allocation_id} crossed {self.threshold_percent}%"
