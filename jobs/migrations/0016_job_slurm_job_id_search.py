"""An index on the Slurm job id, for the job lists' search of digits (`name` contains them, or it is the Slurm job
id): without it the OR of the two conditions reads every job. Built CONCURRENTLY (hence `atomic = False`), so
submissions and the sync go on meanwhile (README, "A year of history")."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0015_multi_node_jobs")]

    operations = [
        AddIndexConcurrently(model_name="job", index=models.Index(fields=["slurm_job_id"], name="job_slurm_job_id")),
    ]
