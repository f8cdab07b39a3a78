"""Clusters moved to the clusters app (see clusters/migrations/0001_clusters_from_jobs.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0001_clusters_from_jobs"),
        ("quotas", "0001_allocations_ledger_requests_alerts"),
    ]

    operations = [
        # The foreign keys now name clusters.Cluster, whose table is the one they already point to: state only.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="allocation",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="allocations", to="clusters.cluster"
                    ),
                ),
                migrations.AlterField(
                    model_name="ledgerentry",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="quota_ledger_entries",
                        to="clusters.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="quotalimitstate",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="quota_limit_states",
                        to="clusters.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="tenantpool",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="quota_pools", to="clusters.cluster"
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
