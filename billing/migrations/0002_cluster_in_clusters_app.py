"""Clusters moved to the clusters app (see clusters/migrations/0001_clusters_from_jobs.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0001_rates_usage_invoices_reconciliation"),
        ("clusters", "0001_clusters_from_jobs"),
    ]

    operations = [
        # The foreign keys now name clusters.Cluster, whose table is the one they already point to: state only.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="invoiceline",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="clusters.cluster"
                    ),
                ),
                migrations.AlterField(
                    model_name="rate",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="rates", to="clusters.cluster"
                    ),
                ),
                migrations.AlterField(
                    model_name="reconciliationreport",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reconciliation_reports",
                        to="clusters.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="usagerecord",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="usage_records", to="clusters.cluster"
                    ),
                ),
                migrations.AlterField(
                    model_name="usageshare",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="clusters.cluster"
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
