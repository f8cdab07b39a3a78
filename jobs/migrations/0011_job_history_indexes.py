"""Indexes for the job lists over a long history (bench/history.py), built without locking out writes.

CREATE INDEX CONCURRENTLY cannot run in a transaction, hence `atomic = False`; on 1M jobs each takes seconds
while submissions and the sync go on (README, "Benchmarks"). The search index needs PostgreSQL's pg_trgm, a
trusted extension: the database's owner may create it. ANALYZE at the end gathers the statistics of the
indexed expression, without which the planner guesses how many names a search matches.
"""

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.operations import AddIndexConcurrently, TrigramExtension
from django.db import migrations, models
from django.db.models.functions import Upper


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0010_job_reruns_start_estimates_end_watches")]

    operations = [
        AddIndexConcurrently(model_name="job", index=models.Index(fields=["-created_at", "-id"], name="job_recent")),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["project", "state", "-created_at", "-id"], name="job_project_state_recent"),
        ),
        TrigramExtension(),
        # Written out: Django renders this expression with one pair of parentheses too many for PostgreSQL.
        migrations.RunSQL(
            sql='CREATE INDEX CONCURRENTLY IF NOT EXISTS "job_name_search" ON "jobs_job" '
            'USING gin (UPPER("name") gin_trgm_ops)',
            reverse_sql='DROP INDEX CONCURRENTLY IF EXISTS "job_name_search"',
            state_operations=[
                migrations.AddIndex(
                    model_name="job",
                    index=GinIndex(OpClass(Upper("name"), name="gin_trgm_ops"), name="job_name_search"),
                )
            ],
        ),
        migrations.RunSQL(sql="ANALYZE jobs_job", reverse_sql=migrations.RunSQL.noop),
    ]
