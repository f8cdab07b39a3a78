"""Prices per GPU-hour, usage priced from Slurm's accounting, monthly invoices and reconciliation reports.

Usage is integer GPU-seconds; money is `Decimal`, rounded only in `billing.money`. A job's usage is one
`UsageRecord`, split into `UsageShare`s: one per UTC day (and per rate, should a rate change during the day),
so that months, days and rates each get exactly the GPU-seconds consumed in them.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

CURRENCY_VALIDATOR = RegexValidator(r"^[A-Z]{3}$", "An ISO 4217 currency code in capitals, e.g. EUR or USD.")


def first_of_month(day: date) -> date:
    return day.replace(day=1)


class Rate(models.Model):
    """The price of one GPU-hour of a type on a cluster from `valid_from` until the next rate of the same type.

    `gpu_type` empty prices GPUs of every type that has no rate of its own in force. A rate that has priced
    usage is never changed (the services refuse it): a new price is a new rate from a later moment.
    """

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="rates")
    gpu_type = models.CharField(max_length=64, blank=True, help_text="Empty: every GPU type without its own rate")
    price_per_gpu_hour = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(0)], help_text="Price of one GPU for one hour"
    )
    currency = models.CharField(max_length=3, validators=[CURRENCY_VALIDATOR])
    valid_from = models.DateTimeField(help_text="In force from this moment until the next rate of the same type")
    note = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["cluster", "gpu_type", "-valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "gpu_type", "valid_from"], name="rate_unique_start"),
            models.CheckConstraint(condition=Q(price_per_gpu_hour__gte=0), name="rate_price_not_negative"),
        ]

    def __str__(self) -> str:
        kind = self.gpu_type or "any GPU"
        price = f"{self.price_per_gpu_hour} {self.currency}/GPU-hour"
        return f"{self.cluster.name} {kind}: {price} from {self.valid_from:%Y-%m-%d %H:%M}"


class UsageRecord(models.Model):
    """What one finished job used, priced: exactly one per charge in the quota ledger (elapsed x allocated GPUs
    from Slurm's accounting), so one per plain job and one per task of a job array (`array_task`, its index;
    None for a plain job). `cost` is the sum of its shares' costs."""

    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="usage_records")
    array_task = models.PositiveIntegerField(null=True, blank=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage_records")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="usage_records")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="usage_records")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_records"
    )
    cluster_username = models.CharField(max_length=32, blank=True)
    gpu_type = models.CharField(max_length=64, blank=True)
    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    gpu_seconds = models.BigIntegerField(validators=[MinValueValidator(0)])
    cost = models.DecimalField(max_digits=20, decimal_places=6)
    currency = models.CharField(max_length=3)
    imported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-ended_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "ended_at"], name="usage_record_cluster_ended"),
            models.Index(fields=["project", "-ended_at"], name="usage_record_project_recent"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpu_seconds__gte=0), name="usage_record_seconds_positive"),
            # One record per charge: a job, or each task of an array, is priced once whatever runs the import.
            models.UniqueConstraint(
                fields=["job", "array_task"], name="usage_record_one_per_charge", nulls_distinct=False
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project} job {self.slurm_job_id}: {self.gpu_seconds} GPU-s, {self.cost} {self.currency}"


# What makes one row of UsageDaily: a day, an invoice line (billing.money.INVOICE_LINE_FIELDS) and a user.
USAGE_DAILY_KEY = (
    "day",
    "tenant",
    "project",
    "cluster",
    "user",
    "cluster_username",
    "gpu_type",
    "billed_month",
    "rate",
    "price_per_gpu_hour",
    "currency",
)


class UsageShare(models.Model):
    """The part of a usage record consumed on one UTC day at one rate. Tenant, project, user and GPU type are
    copied from the record so that invoices and spend series are one grouped query over this table.

    `billed_month` is the month whose invoice carries the share: the month it was consumed in, unless that
    month's invoice was already final when the usage arrived; then the next open month's ("late usage").
    """

    usage_record = models.ForeignKey(UsageRecord, on_delete=models.CASCADE, related_name="shares")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    cluster_username = models.CharField(max_length=32, blank=True)
    gpu_type = models.CharField(max_length=64, blank=True)
    day = models.DateField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    billed_month = models.DateField(help_text="First day of the month whose invoice carries this share")
    rate = models.ForeignKey(Rate, on_delete=models.PROTECT, related_name="shares")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3)
    gpu_seconds = models.BigIntegerField()
    cost = models.DecimalField(max_digits=20, decimal_places=6)

    class Meta:
        ordering = ["usage_record", "starts_at"]
        indexes = [
            models.Index(fields=["billed_month", "tenant"], name="usage_share_invoice"),
            models.Index(fields=["tenant", "day"], name="usage_share_tenant_day"),
            models.Index(fields=["project", "day"], name="usage_share_project_day"),
        ]
        constraints = [models.CheckConstraint(condition=Q(gpu_seconds__gte=0), name="usage_share_seconds_positive")]

    def __str__(self) -> str:
        return f"{self.usage_record_id} {self.day}: {self.gpu_seconds} GPU-s at {self.price_per_gpu_hour}"


class UsageDaily(models.Model):
    """The usage shares of one UTC day summed per invoice line and per user: what spend and the dashboard read,
    so that a month's or a year's spend is a few hundred rows whatever the number of jobs.

    Kept by the usage import (billing/usage.py) in the transaction that writes the shares, by adding to the
    row of its key; never edited otherwise. `jobs` counts the usage records whose first share is in the row and
    `carried_jobs` those begun earlier that go on that day, so the jobs that used GPUs in a period are its rows'
    `jobs` plus its first day's `carried_jobs`. `usage_daily_mismatches` (and its test) checks the rows against
    the shares they sum.
    """

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    cluster_username = models.CharField(max_length=32, blank=True)
    gpu_type = models.CharField(max_length=64, blank=True)
    billed_month = models.DateField()
    rate = models.ForeignKey(Rate, on_delete=models.PROTECT, related_name="+")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3)
    gpu_seconds = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal(0))
    jobs = models.PositiveIntegerField(default=0, help_text="Records whose first share is in this row")
    carried_jobs = models.PositiveIntegerField(
        default=0, help_text="Records begun on an earlier day whose first share of this day is in this row"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[*USAGE_DAILY_KEY],
                name="usage_daily_key",
                nulls_distinct=False,
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "day"], name="usage_daily_tenant_day"),
            models.Index(fields=["project", "day"], name="usage_daily_project_day"),
            models.Index(fields=["day"], name="usage_daily_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.project_id} {self.user_id}: {self.gpu_seconds} GPU-s, {self.cost} {self.currency}"


class InvoiceState(models.TextChoices):
    DRAFT = "draft", "Draft"  # the month is running (or just ended): rebuilt as usage arrives
    FINAL = "final", "Final"  # frozen: its lines and total never change again


class Invoice(models.Model):
    """A tenant's usage of one month in one currency: a draft while the month runs, final once it has closed."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="invoices")
    month = models.DateField(help_text="First day of the month")
    currency = models.CharField(max_length=3)
    state = models.CharField(max_length=8, choices=InvoiceState.choices, default=InvoiceState.DRAFT)
    number = models.CharField(max_length=40, blank=True, help_text="Given when the invoice is finalised")
    gpu_seconds = models.BigIntegerField(default=0)
    total = models.DecimalField(max_digits=16, decimal_places=2, default=0)
    built_at = models.DateTimeField(default=timezone.now)
    finalised_at = models.DateTimeField(null=True, blank=True)
    finalised_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-month", "tenant__slug", "currency"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month", "currency"], name="invoice_one_per_tenant_month"),
            models.UniqueConstraint(fields=["number"], condition=~Q(number=""), name="invoice_number_unique"),
            models.CheckConstraint(
                condition=Q(state="draft") | (Q(finalised_at__isnull=False) & ~Q(number="")),
                name="invoice_final_has_number",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug} {self.month:%Y-%m} {self.currency} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state == InvoiceState.FINAL


class InvoiceLine(models.Model):
    """One project's GPU-hours of one type on one cluster at one rate. `usage_month` differs from the invoice's
    month only for late usage (consumed in a month whose invoice was already final)."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="+")
    gpu_type = models.CharField(max_length=64, blank=True)
    rate = models.ForeignKey(Rate, on_delete=models.PROTECT, related_name="+")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    usage_month = models.DateField()
    job_count = models.PositiveIntegerField()
    gpu_seconds = models.BigIntegerField()
    amount = models.DecimalField(max_digits=16, decimal_places=2)

    class Meta:
        ordering = ["invoice", "project__slug", "cluster__name", "gpu_type", "usage_month", "price_per_gpu_hour"]

    def __str__(self) -> str:
        return f"{self.invoice}: {self.project.slug} {self.gpu_type or 'any'} {self.amount}"


class ReconciliationState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class ReconciliationKind(models.TextChoices):
    MISSING_IN_SLURM = "missing_in_slurm", "Known to the portal, missing from Slurm's accounting"
    MISSING_IN_PORTAL = "missing_in_portal", "In Slurm's accounting, unknown to the portal"
    GPU_SECONDS_DIFFER = "gpu_seconds_differ", "GPU-seconds differ"
    UNPRICED = "unpriced", "Finished in Slurm, no usage record yet"


class ReconciliationReport(models.Model):
    """The portal's usage of one cluster and period compared with Slurm's accounting, job by job.

    `findings` is a list of `{kind, slurm_job_id, account, job, portal_gpu_seconds, slurm_gpu_seconds, detail}`
    (kind from `ReconciliationKind`); `summary` holds the totals and counts.
    """

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="reconciliation_reports")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    state = models.CharField(max_length=8, choices=ReconciliationState.choices, default=ReconciliationState.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    findings = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(period_end__gt=models.F("period_start")), name="reconciliation_period")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name} {self.period_start:%Y-%m-%d}..{self.period_end:%Y-%m-%d} ({self.state})"


class EfficiencySum(models.Model):
    """The GPU efficiency of a project's jobs started in one month and priced in one currency ("": no rate priced
    them), summed: what the efficiency report (the dashboard's idle cost, an invoice's page) reads for the jobs
    that are done, so that a month of tens of thousands of measured jobs is a few rows.

    Kept by billing/efficiency.py `efficiency_sums_add`, which adds each ended job once (JobEfficiency.summed)
    in the transaction that marks it; never edited otherwise. `efficiency_sums_mismatches` (and its test) checks
    the rows against the jobs they sum.
    """

    month = models.DateField()
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="+")
    currency = models.CharField(max_length=3, blank=True)
    jobs = models.PositiveIntegerField(default=0)
    observed_gpu_seconds = models.BigIntegerField(default=0)
    utilisation_percent_seconds = models.FloatField(default=0)
    idle_gpu_seconds = models.BigIntegerField(default=0)
    saved_gpu_seconds = models.BigIntegerField(default=0)
    ended_for_idling = models.PositiveIntegerField(default=0)
    idle_cost = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal(0))
    saved_cost = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal(0))
    # The idlest of these jobs, idlest first (ties by id), up to billing.efficiency.IDLEST_KEPT: [[idle GPU-seconds,
    # "job id"], ...], so that a month's worst jobs are found among a few rows' lists.
    idlest = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["month", "project", "currency"], name="efficiency_sum_once"),
        ]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} {self.project_id} {self.currency or '-'}: {self.jobs} jobs"
