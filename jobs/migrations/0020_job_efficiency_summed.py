"""A job's efficiency row says whether it has been added to its month's sums (billing.EfficiencySum), and two
indexes serve the efficiency report: the rows not summed yet (few: the jobs running or just ended) and the
idlest jobs first (a month's worst jobs).

The column has a database default, so PostgreSQL adds it without rewriting the table; the indexes are built
CONCURRENTLY (hence `atomic = False`), without locking out the GPU collector's writes.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0019_job_name_search_by_day")]

    operations = [
        migrations.AddField(
            model_name="jobefficiency",
            name="summed",
            field=models.BooleanField(db_default=False, default=False),
        ),
        AddIndexConcurrently(
            model_name="jobefficiency",
            index=models.Index(condition=models.Q(summed=False), fields=["job"], name="job_efficiency_unsummed"),
        ),
        AddIndexConcurrently(
            model_name="jobefficiency",
            index=models.Index(fields=["-idle_gpu_seconds", "job"], name="job_efficiency_idlest"),
        ),
    ]
