"""The name search's index holds the UTC day each job was created beside its name's trigrams.

A search for a rare name read every match of the history from the trigram index to find the newest (linear in
the history: 15 ms of index at 1M jobs, 0.5 s at 10M, bench/history.py). With the day in the same GIN index
(btree_gin, a trusted extension like pg_trgm), the job list looks within the last days first and reads only
their matches (jobs.selectors.job_list_window). Built CONCURRENTLY before the old index is dropped, so writers
are never locked out and a search always has an index; each step is skipped when done, so a stopped migration
runs again. ANALYZE gathers the statistics of the new expression.
"""

import datetime

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.operations import BtreeGinExtension
from django.db import migrations
from django.db.models.functions import TruncDate, Upper


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0018_job_cancel_reason")]

    operations = [
        BtreeGinExtension(),
        # Written out: Django renders these expressions with one pair of parentheses too many for PostgreSQL.
        migrations.RunSQL(
            sql='CREATE INDEX CONCURRENTLY IF NOT EXISTS "job_name_search_by_day" ON "jobs_job" '
            'USING gin (UPPER("name") gin_trgm_ops, (("created_at" AT TIME ZONE \'UTC\')::date))',
            reverse_sql='DROP INDEX CONCURRENTLY IF EXISTS "job_name_search_by_day"',
            state_operations=[
                migrations.AddIndex(
                    model_name="job",
                    index=GinIndex(
                        OpClass(Upper("name"), name="gin_trgm_ops"),
                        TruncDate("created_at", tzinfo=datetime.UTC),
                        name="job_name_search_by_day",
                    ),
                )
            ],
        ),
        migrations.RunSQL(
            sql='DROP INDEX CONCURRENTLY IF EXISTS "job_name_search"',
            reverse_sql='CREATE INDEX CONCURRENTLY IF NOT EXISTS "job_name_search" ON "jobs_job" '
            'USING gin (UPPER("name") gin_trgm_ops)',
            state_operations=[migrations.RemoveIndex(model_name="job", name="job_name_search")],
        ),
        migrations.RunSQL(sql="ANALYZE jobs_job", reverse_sql=migrations.RunSQL.noop),
    ]
