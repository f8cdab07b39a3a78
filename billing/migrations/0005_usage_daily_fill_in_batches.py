"""Fill the daily sums of the usage shares (UsageDaily) from the shares already priced, in short batches.

One tenant's day per transaction, under the billing lock that every usage import takes: an import waits for one
batch at most (milliseconds), never for the whole fill, and reads never wait. Each batch replaces its day's sums
with what the shares say, so the fill is right whatever was imported before or during it, and running it again
(or `manage.py daily_sums_rebuild` after the upgrade) changes nothing. Not atomic: each batch commits on its own.
The SQL is a frozen copy of billing.usage's slice rebuild as it was when this migration was written.
"""

from django.db import migrations, transaction

BILLING_LOCK_ID = 0x62696C6C
COLUMNS = (
    "day, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, billed_month, rate_id, "
    "price_per_gpu_hour, currency"
)
DAYS = """
    SELECT least(shares.first, sums.first), greatest(shares.last, sums.last)
    FROM (SELECT min(day) AS first, max(day) AS last FROM billing_usageshare WHERE tenant_id = %(tenant)s) shares,
        (SELECT min(day) AS first, max(day) AS last FROM billing_usagedaily WHERE tenant_id = %(tenant)s) sums
"""
DELETE = "DELETE FROM billing_usagedaily WHERE tenant_id = %(tenant)s AND day = %(day)s"
INSERT = f"""
    INSERT INTO billing_usagedaily ({COLUMNS}, gpu_seconds, cost, jobs, carried_jobs)
    SELECT {COLUMNS}, sum(gpu_seconds), sum(cost), count(*) FILTER (WHERE first_of_record),
        count(*) FILTER (WHERE first_of_day AND NOT first_of_record)
    FROM (
        SELECT *,
            row_number() OVER (PARTITION BY usage_record_id ORDER BY starts_at, id) = 1 AS first_of_record,
            row_number() OVER (PARTITION BY usage_record_id, day ORDER BY starts_at, id) = 1 AS first_of_day
        FROM billing_usageshare
        WHERE usage_record_id IN (
            SELECT usage_record_id FROM billing_usageshare WHERE tenant_id = %(tenant)s AND day = %(day)s
        )
    ) shares
    WHERE tenant_id = %(tenant)s AND day = %(day)s
    GROUP BY {COLUMNS}
"""  # noqa: S608


def fill_in_batches(apps, schema_editor):
    from datetime import timedelta

    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM tenants_tenant ORDER BY id")
        tenants = [row[0] for row in cursor.fetchall()]
    for tenant in tenants:
        with connection.cursor() as cursor:
            cursor.execute(DAYS, {"tenant": tenant})
            day, last = cursor.fetchone()
        while day is not None and day <= last:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [BILLING_LOCK_ID])
                cursor.execute(DELETE, {"tenant": tenant, "day": day})
                cursor.execute(INSERT, {"tenant": tenant, "day": day})
            day += timedelta(days=1)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("billing", "0004_usage_array_tasks")]

    operations = [migrations.RunPython(fill_in_batches, migrations.RunPython.noop, elidable=True)]
