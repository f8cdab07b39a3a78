"""Each allocation's ledger summed per UTC day (LedgerDaily): the table, empty.

Migration 0005_ledger_daily_fill_in_batches fills it from the entries already written, a week of one allocation
per transaction. This one filled it in one statement under a SHARE lock on the ledger (quota writes waited 4.5 s
on a database of 1M jobs); an install that applied it then has its sums recomputed by 0005 to the same values.
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
    ]
