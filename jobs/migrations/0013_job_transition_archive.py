"""The archive of old job transitions (jobs/history_archive.py) and the index the archiving selects by.

Made for a populated database: the archive starts empty (creating it takes no lock a request waits on for longer
than it takes to create an empty table), and the index on `at` is built CONCURRENTLY, which cannot run in a
transaction, hence `atomic = False`; on 4M transitions (1M jobs) it takes seconds while jobs change state
(README, "Old history: the transitions archive").
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0012_job_arrays")]

    operations = [
        migrations.CreateModel(
            name="JobTransitionArchive",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                (
                    "from_state",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("queued", "Queued"),
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                            ("timeout", "Timed out"),
                            ("node_fail", "Node failure"),
                            ("rejected", "Rejected"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "to_state",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                            ("timeout", "Timed out"),
                            ("node_fail", "Node failure"),
                            ("rejected", "Rejected"),
                        ],
                        max_length=16,
                    ),
                ),
                ("at", models.DateTimeField()),
                ("detail", models.CharField(blank=True, max_length=500)),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="archived_transitions",
                        to="jobs.job",
                    ),
                ),
            ],
            options={
                "ordering": ["job", "id"],
                "indexes": [models.Index(fields=["at", "id"], name="job_transition_archive_at")],
            },
        ),
        AddIndexConcurrently(model_name="jobtransition", index=models.Index(fields=["at"], name="job_transition_at")),
    ]
