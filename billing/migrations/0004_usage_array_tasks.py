"""Usage records per array task: the column, and one record per job and task instead of one per job.

Written to run on a populated database (usage records are millions of rows) without long locks: the column is
added without its check, which is then validated without blocking writers, and both indexes are built
CONCURRENTLY, hence `atomic = False`. Django's own operations would have held the table's write lock through
the scan and both index builds. The schema it leaves is the one they leave. Every step is skipped when already
done, so a migration stopped half-way runs again (after dropping an index a failed build left INVALID).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

TABLE = "billing_usagerecord"


def _unless_constraint(name: str, statement: str) -> str:
    return f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = '{name}') THEN {statement}; END IF; END $$"


FORWARD = (
    f'ALTER TABLE "{TABLE}" ADD COLUMN IF NOT EXISTS "array_task" integer NULL',
    _unless_constraint(
        f"{TABLE}_array_task_check",
        f'ALTER TABLE "{TABLE}" ADD CONSTRAINT "{TABLE}_array_task_check" CHECK ("array_task" >= 0) NOT VALID',
    ),
    f'ALTER TABLE "{TABLE}" VALIDATE CONSTRAINT "{TABLE}_array_task_check"',
    # The index of the foreign key a one-to-one field did not need (its unique constraint served).
    f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{TABLE}_job_id_6704a792" ON "{TABLE}" ("job_id")',
    f'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "usage_record_one_per_charge" ON "{TABLE}" '
    '("job_id", "array_task") NULLS NOT DISTINCT',
    _unless_constraint(
        "usage_record_one_per_charge",
        f'ALTER TABLE "{TABLE}" ADD CONSTRAINT "usage_record_one_per_charge" UNIQUE USING INDEX "usage_record_one_per_charge"',
    ),
    # The one-to-one field's own unique constraint: one usage record per job is now one per job and task. Its name
    # depends on how the table came to be (PostgreSQL's "..._job_id_key" when billing 0001 created it, Django's
    # "..._uniq" when a reverse of this migration added it back), so it is found by its column.
    """DO $$ DECLARE name text; BEGIN
        FOR name IN SELECT conname FROM pg_constraint WHERE conrelid = 'billing_usagerecord'::regclass
            AND contype = 'u' AND conkey = ARRAY[(SELECT attnum FROM pg_attribute
                WHERE attrelid = 'billing_usagerecord'::regclass AND attname = 'job_id')]::smallint[]
        LOOP EXECUTE format('ALTER TABLE billing_usagerecord DROP CONSTRAINT %I', name); END LOOP;
    END $$""",
)

BACKWARD = (
    f'ALTER TABLE "{TABLE}" ADD CONSTRAINT "{TABLE}_job_id_6704a792_uniq" UNIQUE ("job_id")',
    f'ALTER TABLE "{TABLE}" DROP CONSTRAINT "usage_record_one_per_charge"',
    f'DROP INDEX CONCURRENTLY IF EXISTS "{TABLE}_job_id_6704a792"',
    f'ALTER TABLE "{TABLE}" DROP COLUMN "array_task"',
)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("billing", "0003_usage_daily"),
        ("clusters", "0005_gpu_utilisation_sources"),
        ("jobs", "0012_job_arrays"),
        ("tenants", "0005_audit_event_request_id"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)],
            state_operations=[
                migrations.AddField(
                    model_name="usagerecord",
                    name="array_task",
                    field=models.PositiveIntegerField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name="usagerecord",
                    name="job",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="usage_records", to="jobs.job"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="usagerecord",
                    constraint=models.UniqueConstraint(
                        fields=("job", "array_task"), name="usage_record_one_per_charge", nulls_distinct=False
                    ),
                ),
            ],
        ),
    ]
