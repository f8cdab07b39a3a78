"""Old history on a 1M-job database: how long the daily sums' fill, the archive's migration and the first archiving
take, and how long anything else waits meanwhile.

It copies a database that bench/history.py loaded (`--from`, default `<DATABASE_URL's name>_history_bench_1000000`)
into `<DATABASE_URL's name>_archive_bench` (CREATE DATABASE ... TEMPLATE: nobody may be connected to the source),
first fills the daily sums (billing.UsageDaily, quotas.LedgerDaily) as the migrations that added them did, in one
statement under a SHARE lock on the table summed, and then as billing 0005 and quotas 0005 do now, in short batches,
while two probes write as a usage import (the billing lock, a share) and a quota write (the allocation's row lock,
a ledger entry) do, every 20 ms, each in a transaction rolled back: their slowest write is the longest that the
fill made a writer wait. Then billing 0004 (usage per array task: a column, a check and two unique indexes on the
usage records) is applied the way Django's operations did it, in one transaction, and as it is written now
(concurrently), while a probe updates a usage record every 20 ms. Then it migrates up to the migration before the
archive, times
`jobs.0013_job_transition_archive` and an archiving
of everything older than `--months` (`job_transitions_archive`, as beat's task and `manage.py job_history_archive`
run it). All the while a probe on a connection of its own records a new transition of a job and reads a job's
timeline every 20 ms, as the sync and the job page do: its slowest write and read are the longest that the
migration or the archiving made anyone wait. Then it exports a tenant's archive and prints the table sizes.

Usage: python bench/history_archive.py [--from DB] [--months 6] [--batch-size 5000] [--keep] [--only-migrations]
Run it under `flock -w 900 /tmp/gpuportal-live.lock` (README, "Old history: the transitions archive").
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PROBE_INTERVAL_SECONDS = 0.02


def _database_url(name: str) -> str:
    parts = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal"))
    return parts._replace(path=f"/{name}").geturl()


def _base_name() -> str:
    return urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal")).path.lstrip("/")


class WriterProbe(threading.Thread):
    """Runs `statements` in a transaction, rolled back, every PROBE_INTERVAL_SECONDS; keeps how long each took."""

    def __init__(self, url: str, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        super().__init__(daemon=True)
        self._url, self._statements = url, statements
        self._done = threading.Event()
        self.writes: list[float] = []

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self._url) as connection:
            while not self._done.is_set():
                started = time.perf_counter()
                for statement, parameters in self._statements:
                    connection.execute(statement, parameters)
                connection.rollback()
                self.writes.append(time.perf_counter() - started)
                self._done.wait(PROBE_INTERVAL_SECONDS)

    def finish(self) -> str:
        self._done.set()
        self.join()
        return (
            f"{len(self.writes)} writes, slowest {max(self.writes, default=0) * 1000:.0f} ms "
            f"(p50 {statistics.median(self.writes or [0]) * 1000:.1f} ms)"
        )


class Probe(threading.Thread):
    """Writes a transition and reads a timeline every PROBE_INTERVAL_SECONDS; keeps the slowest of each."""

    def __init__(self, url: str, *, job_id: str, archive: bool = True) -> None:
        super().__init__(daemon=True)
        self._url, self._job_id = url, job_id
        # Before the archive exists, the timeline is the hot table's alone.
        self._timeline = "SELECT id, at FROM jobs_jobtransition WHERE job_id = %(job)s" + (
            " UNION ALL SELECT id, at FROM jobs_jobtransitionarchive WHERE job_id = %(job)s" if archive else ""
        )
        self._done = threading.Event()
        self.writes: list[float] = []
        self.reads: list[float] = []

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self._url, autocommit=True) as connection:
            while not self._done.is_set():
                started = time.perf_counter()
                connection.execute(
                    "INSERT INTO jobs_jobtransition (job_id, from_state, to_state, at, detail) "
                    "VALUES (%s, 'running', 'running', now(), 'archive probe')",
                    (self._job_id,),
                )
                self.writes.append(time.perf_counter() - started)
                started = time.perf_counter()
                connection.execute(self._timeline + " ORDER BY id", {"job": self._job_id}).fetchall()
                self.reads.append(time.perf_counter() - started)
                self._done.wait(PROBE_INTERVAL_SECONDS)

    def finish(self) -> str:
        self._done.set()
        self.join()
        return (
            f"probe: {len(self.writes)} writes, slowest {max(self.writes, default=0) * 1000:.0f} ms "
            f"(p50 {statistics.median(self.writes or [0]) * 1000:.1f} ms); slowest timeline read "
            f"{max(self.reads, default=0) * 1000:.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", default=f"{_base_name()}_history_bench_1000000")
    parser.add_argument("--months", type=int, default=6, help="Archive what is older than this many months")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--keep", action="store_true", help="Keep the copy afterwards (it is dropped otherwise)")
    parser.add_argument(
        "--only-migrations", action="store_true", help="Measure the daily sums' fill and billing 0004 only"
    )
    arguments = parser.parse_args()
    copy = f"{_base_name()}_archive_bench"

    import psycopg

    admin_url = _database_url("postgres")
    with psycopg.connect(admin_url, autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (copy,)).fetchone()
        if exists is None:
            started = time.perf_counter()
            connection.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{arguments.source}"')
            print(f"copied {arguments.source} to {copy} in {time.perf_counter() - started:.0f} s", flush=True)
        else:
            print(f"reusing {copy} (drop it for a fresh copy of {arguments.source})", flush=True)
    try:
        _measure(
            _database_url(copy),
            months=arguments.months,
            batch_size=arguments.batch_size,
            only_migrations=arguments.only_migrations,
        )
    finally:
        if not arguments.keep:
            with psycopg.connect(admin_url, autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


def _measure(url: str, *, months: int, batch_size: int, only_migrations: bool) -> None:
    os.environ["BENCH_DATABASE_URL"] = url
    redis_base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
    os.environ.setdefault("BENCH_REDIS_BASE", redis_base)
    sys.path.insert(0, str(ROOT / "bench"))
    import portal_stack  # noqa: F401  (sets Django up on BENCH_DATABASE_URL)
    from django.core.management import call_command
    from django.db import connection

    from jobs.history_archive import archive_cutoff, archived_transitions_export, job_transitions_archive
    from jobs.models import Job
    from jobs.selectors import job_detail_load
    from tenants.models import Tenant

    def migrate(*target: str) -> float:
        started = time.perf_counter()
        call_command("migrate", *target, interactive=False, verbosity=0, stdout=io.StringIO())
        return time.perf_counter() - started

    _history_indexes_renumbered(migrate)
    _daily_sums_fill(url, migrate)
    _usage_array_tasks_migration(url, migrate)
    if only_migrations:
        return
    print(f"migrations before the archive's: {migrate('jobs', '0012_job_arrays'):.1f} s", flush=True)
    job = Job.objects.order_by("created_at").only("pk").first()
    assert job is not None, "the copy holds no jobs"
    probe = Probe(url, job_id=str(job.pk), archive=False)
    probe.start()
    print(f"jobs 0013_job_transition_archive: {migrate('jobs', '0013_job_transition_archive'):.1f} s", flush=True)
    print(f"  {probe.finish()}", flush=True)
    migrate()

    def sizes() -> str:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT count(*) FROM jobs_jobtransition), (SELECT count(*) FROM jobs_jobtransitionarchive), "
                "pg_size_pretty(pg_total_relation_size('jobs_jobtransition')), "
                "pg_size_pretty(pg_total_relation_size('jobs_jobtransitionarchive'))"
            )
            hot, archived, hot_size, archive_size = cursor.fetchone() or (0, 0, "", "")
        return f"hot {hot:,} transitions ({hot_size}), archive {archived:,} ({archive_size})"

    print(f"before: {sizes()}", flush=True)
    before = archive_cutoff(months=months)
    timeline_before = [(step.to_state, step.at) for step in job_detail_load(job_id=job.pk).timeline]
    probe = Probe(url, job_id=str(job.pk))
    probe.start()
    run = job_transitions_archive(before=before, batch_size=batch_size)
    print(
        f"archived {run.moved:,} transitions older than {months} months ({before:%Y-%m-%d}) in {run.batches} batches "
        f"of {batch_size}: {run.seconds:.1f} s ({run.moved / max(run.seconds, 1e-9):,.0f}/s); longest batch "
        f"{run.longest_batch_seconds * 1000:.0f} ms",
        flush=True,
    )
    print(f"  {probe.finish()}", flush=True)
    again = job_transitions_archive(before=before, batch_size=batch_size)
    print(f"a second run: {again.moved} moved in {again.seconds * 1000:.0f} ms", flush=True)
    print(f"after: {sizes()}", flush=True)
    timeline_after = [(step.to_state, step.at) for step in job_detail_load(job_id=job.pk).timeline]
    assert timeline_after[: len(timeline_before)] == timeline_before, "the oldest job's timeline changed"
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) jobs_jobtransition")
    print(f"VACUUM ANALYZE of the hot table: {time.perf_counter() - started:.1f} s", flush=True)
    tenant = Tenant.objects.get(slug="acme")
    started = time.perf_counter()
    first_chunk = None
    lines = 0
    for chunk in archived_transitions_export(tenant=tenant):
        first_chunk = first_chunk or time.perf_counter() - started
        lines += chunk.count("\n")
    print(
        f"export of acme's archive: {lines:,} lines in {time.perf_counter() - started:.1f} s, the first "
        f"{min(lines, 2000):,} after {(first_chunk or 0) * 1000:.0f} ms",
        flush=True,
    )


# How billing 0003_usage_daily and quotas 0003_ledger_daily filled the daily sums until they were split: one
# statement each, under a SHARE lock on the table summed.
LEGACY_FILLS = {
    "usage": """
        LOCK TABLE billing_usageshare IN SHARE MODE;
        DELETE FROM billing_usagedaily;
        INSERT INTO billing_usagedaily (day, tenant_id, project_id, cluster_id, user_id, cluster_username,
            gpu_type, billed_month, rate_id, price_per_gpu_hour, currency, gpu_seconds, cost, jobs, carried_jobs)
        SELECT day, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, billed_month,
            rate_id, price_per_gpu_hour, currency, sum(gpu_seconds), sum(cost),
            count(*) FILTER (WHERE first_of_record), count(*) FILTER (WHERE first_of_day AND NOT first_of_record)
        FROM (
            SELECT *,
                row_number() OVER (PARTITION BY usage_record_id ORDER BY starts_at, id) = 1 AS first_of_record,
                row_number() OVER (PARTITION BY usage_record_id, day ORDER BY starts_at, id) = 1 AS first_of_day
            FROM billing_usageshare
        ) shares
        GROUP BY day, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, billed_month,
            rate_id, price_per_gpu_hour, currency
    """,
    "ledger": """
        LOCK TABLE quotas_ledgerentry IN SHARE MODE;
        DELETE FROM quotas_ledgerdaily;
        INSERT INTO quotas_ledgerdaily (allocation_id, day, charged_gpu_seconds, reserved_gpu_seconds,
            released_gpu_seconds)
        SELECT allocation_id, (created_at AT TIME ZONE 'UTC')::date,
            coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'charge'), 0),
            coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'reserve'), 0),
            coalesce(sum(gpu_seconds) FILTER (WHERE kind = 'release'), 0)
        FROM quotas_ledgerentry
        WHERE allocation_id IS NOT NULL AND kind IN ('charge', 'reserve', 'release')
        GROUP BY allocation_id, (created_at AT TIME ZONE 'UTC')::date
    """,
}
FILL_MIGRATIONS = {
    "usage": ("billing", "0005_usage_daily_fill_in_batches"),
    "ledger": ("quotas", "0005_ledger_daily_fill_in_batches"),
}
SHARE_COLUMNS = (
    "usage_record_id, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type, day, starts_at, "
    "ends_at, billed_month, rate_id, price_per_gpu_hour, currency, gpu_seconds, cost"
)


def _daily_sums_fill(url: str, migrate: Any) -> None:
    """The daily sums filled the old way (one statement) and the new way (the batched migrations), each while a
    usage writer and a quota writer probe; then checked against the rows they sum."""
    from django.db import OperationalError, connection, transaction

    from billing.usage import BILLING_LOCK_ID, usage_daily_mismatches
    from quotas.usage import ledger_daily_mismatches

    with connection.cursor() as cursor:
        # The busiest allocation (its batches are the ones its writers wait for) and the newest share.
        cursor.execute(
            "SELECT allocation_id FROM quotas_ledgerentry WHERE allocation_id IS NOT NULL "
            "GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
        )
        (allocation,) = cursor.fetchone() or (None,)
        cursor.execute("SELECT max(id) FROM billing_usageshare")
        (share,) = cursor.fetchone() or (None,)
    assert allocation is not None, "the copy holds no ledger"
    assert share is not None, "the copy holds no usage"
    writers = {
        "usage": [
            ("SELECT pg_advisory_xact_lock(%s)", (BILLING_LOCK_ID,)),
            (
                f"INSERT INTO billing_usageshare ({SHARE_COLUMNS}) SELECT {SHARE_COLUMNS} FROM billing_usageshare "
                "WHERE id = %s",
                (share,),
            ),
        ],
        "ledger": [
            ("SELECT id FROM quotas_allocation WHERE id = %s FOR UPDATE", (allocation,)),
            (
                "INSERT INTO quotas_ledgerentry (allocation_id, project_id, cluster_id, kind, gpu_seconds, note, "
                "created_at) SELECT id, project_id, cluster_id, 'grant', 0, 'probe', now() FROM quotas_allocation "
                "WHERE id = %s",
                (allocation,),
            ),
        ],
    }
    for name, sql in LEGACY_FILLS.items():
        probe = WriterProbe(url, writers[name])
        probe.start()
        time.sleep(0.5)
        deadlocks = 0
        while True:
            started = time.perf_counter()
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(sql)
                break
            except OperationalError as error:
                # A quota writer holds its allocation's row and waits for the ledger, which the fill holds while
                # its sums' foreign key waits for that row at COMMIT: PostgreSQL aborts the fill.
                if "deadlock" not in str(error):
                    raise
                deadlocks += 1
                if deadlocks == 3:
                    print(f"  {name}: the fill deadlocked with the writer 3 times; {probe.finish()}", flush=True)
                    probe = WriterProbe(url, [])  # then once more, with nobody writing
                    probe.start()
        said = " (with nobody writing, after 3 tries that deadlocked with the writer)" if deadlocks >= 3 else ""
        print(
            f"daily sums of the {name}, one statement under a SHARE lock (0003 until now): "
            f"{time.perf_counter() - started:.1f} s{said}; a {name} writer: {probe.finish()}",
            flush=True,
        )
    for name, (app, migration) in FILL_MIGRATIONS.items():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM django_migrations WHERE app = %s AND name = %s", [app, migration])
        probe = WriterProbe(url, writers[name])
        probe.start()
        time.sleep(0.5)
        seconds = migrate(app, migration)
        print(
            f"daily sums of the {name}, {app} {migration}: {seconds:.1f} s; a {name} writer"
            f"{' on the busiest allocation' if name == 'ledger' else ''}: {probe.finish()}",
            flush=True,
        )
    usage, ledger = usage_daily_mismatches(), ledger_daily_mismatches()
    print(f"daily sums that differ from the rows they sum: usage {len(usage)}, ledger {len(ledger)}", flush=True)
    assert not usage, "the batched fill left usage sums that differ from the shares"
    assert not ledger, "the batched fill left ledger sums that differ from the entries"


# billing 0004 as Django's operations ran it before it was written out (sqlmigrate of the original): one
# transaction holding the usage records' write lock through the check's scan and both index builds.
LEGACY_USAGE_ARRAY_TASKS = """
    ALTER TABLE billing_usagerecord ADD COLUMN array_task integer NULL CHECK (array_task >= 0);
    CREATE INDEX billing_usagerecord_job_id_6704a792 ON billing_usagerecord (job_id);
    ALTER TABLE billing_usagerecord DROP CONSTRAINT billing_usagerecord_job_id_6704a792_uniq;
    ALTER TABLE billing_usagerecord ADD CONSTRAINT usage_record_one_per_charge
        UNIQUE NULLS NOT DISTINCT (job_id, array_task);
"""


def _usage_array_tasks_migration(url: str, migrate: Any) -> None:
    """billing 0004 on the copy, the old way and the new, each while a usage writer probes; back to 0003 between."""
    from django.db import connection, transaction

    from billing.models import UsageRecord

    record = UsageRecord.objects.order_by("-id").values_list("pk", flat=True).first()
    assert record is not None, "the copy holds no usage"
    writer = [("UPDATE billing_usagerecord SET imported_at = imported_at WHERE id = %s", (record,))]
    migrate("billing", "0003_usage_daily")
    probe = WriterProbe(url, writer)
    probe.start()
    time.sleep(0.5)
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(LEGACY_USAGE_ARRAY_TASKS)
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('billing', '0004_usage_array_tasks', now())"
        )
    print(
        f"billing 0004 as one transaction (until now): {time.perf_counter() - started:.1f} s; a usage writer: "
        f"{probe.finish()}",
        flush=True,
    )
    migrate("billing", "0003_usage_daily")
    probe = WriterProbe(url, writer)
    probe.start()
    time.sleep(0.5)
    seconds = migrate("billing", "0004_usage_array_tasks")
    print(
        f"billing 0004_usage_array_tasks (concurrently): {seconds:.1f} s; a usage writer: {probe.finish()}", flush=True
    )
    migrate()


def _history_indexes_renumbered(migrate: Any) -> None:
    """A database loaded before the history branch's index migration was renumbered 0011 at its merge has it
    recorded before 0009 and 0010: record it as not applied, apply those two, and record it again (its indexes
    are there)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM django_migrations WHERE app = 'jobs'")
        applied = {name for (name,) in cursor.fetchall()}
        if "0011_job_history_indexes" not in applied or "0010_job_reruns_start_estimates_end_watches" in applied:
            return
        cursor.execute("DELETE FROM django_migrations WHERE app = 'jobs' AND name = '0011_job_history_indexes'")
    seconds = migrate("jobs", "0010_job_reruns_start_estimates_end_watches")
    print(f"jobs 0009 and 0010, missing from the loaded database: {seconds:.1f} s", flush=True)
    migrate("jobs", "0011_job_history_indexes", "--fake")


if __name__ == "__main__":
    main()
