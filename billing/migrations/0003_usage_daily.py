"""Daily sums of the usage shares (UsageDaily), filled from the shares already priced.

The fill holds a SHARE lock on the shares: a usage import waits until the migration commits (about 10 s on a
database with 1M jobs; README, "Benchmarks"), reads go on. The SQL is a frozen copy of
billing.usage.USAGE_DAILY_FROM_SHARES_SQL as it was when this migration was written.
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
        migrations.RunSQL(
            sql="""
            LOCK TABLE billing_usageshare IN SHARE MODE;
            INSERT INTO billing_usagedaily (day, tenant_id, project_id, cluster_id, user_id, cluster_username,
                gpu_type, billed_month, rate_id, price_per_gpu_hour, currency, gpu_seconds, cost, jobs, carried_jobs)
            SELECT day, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, billed_month,
                rate_id, price_per_gpu_hour, currency, sum(gpu_seconds), sum(cost),
                count(*) FILTER (WHERE first_of_record), count(*) FILTER (WHERE first_of_day AND NOT first_of_record)
            FROM (
                SELECT *,
                    row_number() OVER (PARTITION BY usage_record_id ORDER BY starts_at, id) = 1 AS first_of_record,
                    row_number() OVER (PARTITION BY usage_record_id, day ORDER BY starts_at, id) = 1 AS first_of_day
                FROM billing_usageshare
            ) shares
            GROUP BY day, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, billed_month,
                rate_id, price_per_gpu_hour, currency;
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
