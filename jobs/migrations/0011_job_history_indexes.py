"""Indexes for the job lists over a long history (bench/history.py), built without locking out writes.

CREATE INDEX CONCURRENTLY cannot run in a transaction, hence `atomic = False`; on 1M jobs each takes seconds
while submissions and the sync go on (README, "Benchmarks").
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0008_job_request_id")]

    operations = [
        AddIndexConcurrently(model_name="job", index=models.Index(fields=["-created_at", "-id"], name="job_recent")),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["project", "state", "-created_at", "-id"], name="job_project_state_recent"),
        ),
    ]
