# Reruns linked to the job they run again, and the start time Slurm expects for a pending job.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0008_job_request_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="expected_start_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rerun_of",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="reruns",
                to="jobs.job",
            ),
        ),
    ]
