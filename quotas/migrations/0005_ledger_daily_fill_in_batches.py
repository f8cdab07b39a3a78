"""Fill each allocation's daily sums of its ledger (LedgerDaily) from the entries already written, in short batches.

A week of one allocation per transaction, holding that allocation's row lock, which every ledger writer takes: a
quota write on it waits for one batch at most (milliseconds), others do not wait, and reads never wait. Each batch
replaces its days' sums with what the entries say, so the fill is right whatever was written before or during it,
and running it again (or `manage.py daily_sums_rebuild` after the upgrade) changes nothing. Not atomic: each batch
commits on its own. The SQL is a frozen copy of quotas.usage's slice rebuild as it was when this migration was
written.
"""

from django.db import migrations, transaction

DAYS = """
    SELECT least(entries.first, sums.first), greatest(entries.last, sums.last)
    FROM (
        SELECT (min(created_at) AT TIME ZONE 'UTC')::date AS first,
            (max(created_at) AT TIME ZONE 'UTC')::date AS last
        FROM quotas_ledgerentry WHERE allocation_id = %(allocation)s
    ) entries, (
        SELECT min(day) AS first, max(day) AS last FROM quotas_ledgerdaily WHERE allocation_id = %(allocation)s
    ) sums
"""
LOCK = "SELECT id FROM quotas_allocation WHERE id = %(allocation)s FOR UPDATE"
DELETE = "DELETE FROM quotas_ledgerdaily WHERE allocation_id = %(allocation)s AND day >= %(first)s AND day < %(end)s"
INSERT = """
    INSERT INTO quotas_ledgerdaily (allocation_id, day, charged_gpu_seconds, reserved_gpu_seconds,
        released_gpu_seconds)
    SELECT allocation_id, (created_at AT TIME ZONE 'UTC')::date,
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'charge'), 0),
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'reserve'), 0),
        coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'release'), 0)
    FROM quotas_ledgerentry
    WHERE allocation_id = %(allocation)s AND created_at >= %(starts)s AND created_at < %(ends)s
        AND kind IN ('charge', 'reserve', 'release')
    GROUP BY 1, 2
"""


def fill_in_batches(apps, schema_editor):
    from datetime import UTC, datetime, timedelta

    def midnight(day):
        return datetime(day.year, day.month, day.day, tzinfo=UTC)

    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM quotas_allocation ORDER BY id")
        allocations = [row[0] for row in cursor.fetchall()]
    for allocation in allocations:
        with connection.cursor() as cursor:
            cursor.execute(DAYS, {"allocation": allocation})
            first, last = cursor.fetchone()
        while first is not None and first <= last:
            end = first + timedelta(days=7)
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(LOCK, {"allocation": allocation})
                cursor.execute(DELETE, {"allocation": allocation, "first": first, "end": end})
                cursor.execute(INSERT, {"allocation": allocation, "starts": midnight(first), "ends": midnight(end)})
            first = end


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("quotas", "0004_ledger_array_tasks")]

    operations = [migrations.RunPython(fill_in_batches, migrations.RunPython.noop, elidable=True)]
