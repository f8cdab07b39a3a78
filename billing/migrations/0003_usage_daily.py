"""Daily sums of the usage shares (UsageDaily): the table, empty.

Migration 0005_usage_daily_fill_in_batches fills it from the shares already priced, a tenant's day per transaction.
This one filled it in one statement under a SHARE lock on the shares (usage imports waited 6.9 s on a database of
1M jobs); an install that applied it then has its sums recomputed by 0005 to the same values.
"""

from decimal import Decimal

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0002_cluster_in_clusters_app"),
        ("clusters", "0004_directory_posix_usernames"),
        ("tenants", "0005_audit_event_request_id"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageDaily",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("day", models.DateField()),
                ("cluster_username", models.CharField(blank=True, max_length=32)),
                ("gpu_type", models.CharField(blank=True, max_length=64)),
                ("billed_month", models.DateField()),
                ("price_per_gpu_hour", models.DecimalField(decimal_places=4, max_digits=12)),
                ("currency", models.CharField(max_length=3)),
                ("gpu_seconds", models.BigIntegerField(default=0)),
                ("cost", models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=20)),
                ("jobs", models.PositiveIntegerField(default=0, help_text="Records whose first share is in this row")),
                (
                    "carried_jobs",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Records begun on an earlier day whose first share of this day is in this row",
                    ),
                ),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="clusters.cluster"
                    ),
                ),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="tenants.project"
                    ),
                ),
                (
                    "rate",
                    models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="billing.rate"),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="tenants.tenant"
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["tenant", "day"], name="usage_daily_tenant_day"),
                    models.Index(fields=["project", "day"], name="usage_daily_project_day"),
                    models.Index(fields=["day"], name="usage_daily_day"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=(
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
                        ),
                        name="usage_daily_key",
                        nulls_distinct=False,
                    )
                ],
            },
        ),
    ]
