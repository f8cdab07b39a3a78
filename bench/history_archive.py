"""Old history on a 1M-job database: how long the archive's migration and the first archiving take, and how long
anything else waits meanwhile.

It copies a database that bench/history.py loaded (`--from`, default `<DATABASE_URL's name>_history_bench_1000000`)
into `<DATABASE_URL's name>_archive_bench` (CREATE DATABASE ... TEMPLATE: nobody may be connected to the source),
migrates it up to the migration before the archive, then times `jobs.0013_job_transition_archive` and an archiving
of everything older than `--months` (`job_transitions_archive`, as beat's task and `manage.py job_history_archive`
run it). All the while a probe on a connection of its own records a new transition of a job and reads a job's
timeline every 20 ms, as the sync and the job page do: its slowest write and read are the longest that the
migration or the archiving made anyone wait. Then it exports a tenant's archive and prints the table sizes.

Usage: python bench/history_archive.py [--from DB] [--months 6] [--batch-size 5000] [--keep]
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
        _measure(_database_url(copy), months=arguments.months, batch_size=arguments.batch_size)
    finally:
        if not arguments.keep:
            with psycopg.connect(admin_url, autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


def _measure(url: str, *, months: int, batch_size: int) -> None:
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
