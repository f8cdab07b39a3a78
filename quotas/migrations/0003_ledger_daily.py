"""Each allocation's ledger summed per UTC day (LedgerDaily), filled from the entries already written.

The fill holds a SHARE lock on the ledger: quota writes wait until the migration commits (seconds on a database
with 1M jobs; README, "Benchmarks"), reads go on.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("quotas", "0002_cluster_in_clusters_app"),
    ]

    operations = [
        migrations.CreateModel(
            name="LedgerDaily",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("day", models.DateField()),
                ("charged_gpu_seconds", models.BigIntegerField(default=0)),
                ("reserved_gpu_seconds", models.BigIntegerField(default=0)),
                ("released_gpu_seconds", models.BigIntegerField(default=0)),
                (
                    "allocation",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="ledger_days", to="quotas.allocation"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("allocation", "day"), name="ledger_daily_unique")],
            },
        ),
        migrations.RunSQL(
            sql="""
            LOCK TABLE quotas_ledgerentry IN SHARE MODE;
            INSERT INTO quotas_ledgerdaily (allocation_id, day, charged_gpu_seconds, reserved_gpu_seconds,
                released_gpu_seconds)
            SELECT allocation_id, (created_at AT TIME ZONE 'UTC')::date,
                coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'charge'), 0),
                coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'reserve'), 0),
                coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'release'), 0)
            FROM quotas_ledgerentry
            WHERE allocation_id IS NOT NULL AND kind IN ('charge', 'reserve', 'release')
            GROUP BY allocation_id, (created_at AT TIME ZONE 'UTC')::date;
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
