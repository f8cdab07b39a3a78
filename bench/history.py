"""A year of a busy cluster: how fast the history routes answer with 10k and with 1M finished jobs.

For each size (`--jobs 10000,1000000`) the benchmark uses its own database, `<DATABASE_URL's name>_history_bench_
<size>` (dropped and recreated unless `--reuse` finds it already loaded, in which case it is only migrated, and
the migration is timed: that is how long the migrations take on a populated database). It holds the demo's
tenants, projects and users (`seed_demo`) and a year of finished jobs bulk-loaded in PostgreSQL (one
`INSERT ... SELECT generate_series` per table, no ORM): each job with its four transitions, its reservation,
release and charge in the quota ledger (against that month's allocation), its priced usage record and day share,
and every closed month's invoices built by `invoices_build`.

Then every route of the history (job lists in the browser and the API, filtered and 50 pages deep, a job, the
dashboard, a project page, spend, usage and burn-down, billing and an invoice) is requested through Django's test
client, signed in as alice (acme's tenant admin: 70% of the jobs are acme's) and as bob (a member of acme/vision:
45%), and the spend overview of every tenant as admin (a portal admin); each route's p50/p95 in ms and its SQL
queries per request are printed, the sizes side by side. The sizes take turns (ROUNDS rounds, each timing every
route once per size, alternating which goes first), so that both are measured under the same load of the machine.

Usage: python bench/history.py [--jobs 10000,1000000] [--requests 20] [--reuse] [--routes search]
Run it under `flock -w 900 /tmp/gpuportal-live.lock` (README, "Benchmarks").
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "HISTORY-RESULT "
# The parent's words to a child, and the child's answers (one line each).
READY, ROUND, ROUND_DONE, END = "HISTORY-READY", "HISTORY-ROUND", "HISTORY-ROUND-DONE", "HISTORY-END"
ROUNDS = 4  # the timed requests of each route are split into this many turns per size
# The routes, in the order printed: (label, path or a placeholder filled from the data, the users asking).
ROUTES: list[tuple[str, str, tuple[str, ...]]] = [
    ("page /jobs/", "/jobs/", ("alice", "bob")),
    ("page /jobs/ 50 pages deep", "{jobs_page_50}", ("alice", "bob")),
    ("page /jobs/?state=failed", "/jobs/?state=failed", ("alice", "bob")),
    ("page /jobs/?project=acme/vision&state=failed", "/jobs/?project=acme/vision&state=failed", ("alice", "bob")),
    ("page /jobs/?search=train-7", "/jobs/?search=train-7", ("alice", "bob")),
    # One job in 997 has this name: few matches, found through the trigram index rather than by walking the list.
    ("page /jobs/?search=train-996", "/jobs/?search=train-996", ("alice", "bob")),
    # Digits are also a Slurm job id.
    ("page /jobs/?search=<Slurm job id>", "/jobs/?search={slurm_job_id}", ("alice", "bob")),
    # Another order sorts the newest 1,000 matching jobs (frontend.job_views.SORT_LIMIT); oldest first pages by
    # cursor like newest first.
    ("page /jobs/?sort=-cost", "/jobs/?sort=-cost", ("alice", "bob")),
    ("page /jobs/?sort=-duration&page=20", "/jobs/?sort=-duration&page=20", ("alice", "bob")),
    ("page /jobs/?sort=submitted (oldest first)", "/jobs/?sort=submitted", ("alice", "bob")),
    ("GET /api/v1/jobs/", "/api/v1/jobs/", ("alice", "bob")),
    ("GET /api/v1/jobs/ 50 pages deep", "{api_jobs_page_50}", ("alice", "bob")),
    (
        "GET /api/v1/jobs/?project=acme/vision&state=failed",
        "/api/v1/jobs/?project=acme/vision&state=failed",
        ("alice", "bob"),
    ),
    ("GET /api/v1/jobs/?user=bob&state=completed", "/api/v1/jobs/?user=bob&state=completed", ("alice", "bob")),
    ("GET /api/v1/jobs/<id>/", "/api/v1/jobs/{job_id}/", ("alice", "bob")),
    ("page /jobs/<id>/", "/jobs/{job_id}/", ("alice", "bob")),
    ("page / (dashboard)", "/", ("alice", "bob")),
    ("page /projects/acme/vision/", "/projects/acme/vision/", ("alice", "bob")),
    ("GET /api/v1/allocations/<id>/usage/", "/api/v1/allocations/{allocation_id}/usage/", ("alice", "bob")),
    ("page /billing/", "/billing/", ("alice",)),
    ("page /billing/invoices/<id>/", "/billing/invoices/{invoice_id}/", ("alice",)),
    ("GET /api/v1/invoices/<id>/", "/api/v1/invoices/{invoice_id}/", ("alice",)),
    ("page /billing/efficiency/", "/billing/efficiency/", ("alice",)),
    (
        "GET /api/v1/efficiency/?tenant=acme&month=<last>",
        "/api/v1/efficiency/?tenant=acme&month={last_month}",
        ("alice",),
    ),
    ("GET /api/v1/spend/top/?tenant=acme&by=user", "/api/v1/spend/top/?tenant=acme&by=user", ("alice",)),
    ("GET /api/v1/spend/daily/?tenant=acme", "/api/v1/spend/daily/?tenant=acme", ("alice",)),
    # The spend overview: every tenant's for the portal admin (this month, and a closed month by project), and
    # acme's own for its admin.
    ("page /staff/spend/", "/staff/spend/", ("admin",)),
    ("page /staff/spend/?group=project&month=<last>", "/staff/spend/?group=project&month={last_month}", ("admin",)),
    ("page /staff/spend/?group=gpu_type (a year)", "/staff/spend/?group=gpu_type&from={year_ago}", ("admin",)),
    ("page /billing/spend/?group=cluster", "/billing/spend/?group=cluster", ("alice",)),
]
WARMUP_REQUESTS = 3


def database_url_for(jobs: int) -> str:
    parts = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal"))
    name = f"{parts.path.lstrip('/')}_history_bench_{jobs}"
    return parts._replace(path=f"/{name}").geturl()


def size_label(jobs: int) -> str:
    if jobs >= 1_000_000 and jobs % 1_000_000 == 0:
        return f"{jobs // 1_000_000}M"
    return f"{jobs // 1000}k" if jobs % 1000 == 0 else str(jobs)


# Parent: one child process per size (each sets Django up on its own database), then the table. ------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default="10000,1000000", help="Sizes, comma-separated")
    parser.add_argument("--requests", type=int, default=20, help="Timed requests per route and user")
    parser.add_argument("--reuse", action="store_true", help="Keep a loaded database of the same size; migrate it")
    parser.add_argument("--routes", default="", help="Only the routes whose label contains this text")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    sizes = [int(size) for size in arguments.jobs.split(",")]
    if arguments.child:
        child(jobs=sizes[0], reuse=arguments.reuse, routes=arguments.routes)
        return

    print(f"bench/history.py: the history routes with {', '.join(f'{size:,}' for size in sizes)} finished jobs")
    # Each size has its own child process (Django on its own database). They load one after the other, then
    # take turns: each round times every route once per size, alternating which size goes first, so both see the
    # machine as it was at the same moments (a run of one size after the other measured whatever else the
    # machine did in each half).
    children: dict[int, subprocess.Popen[str]] = {}
    for size in sizes:
        url = database_url_for(size)
        redis_base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
        environment = {**os.environ, "BENCH_DATABASE_URL": url, "BENCH_REDIS_BASE": redis_base}
        command = [sys.executable, __file__, "--child", "--jobs", str(size)]
        if arguments.reuse:
            command.append("--reuse")
        if arguments.routes:
            command += ["--routes", arguments.routes]
        children[size] = subprocess.Popen(
            command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        _relay_until(children[size], READY, size)
    rounds = max(1, min(ROUNDS, arguments.requests))
    for number in range(rounds):
        requests = arguments.requests // rounds + (1 if number < arguments.requests % rounds else 0)
        for size in sizes if number % 2 == 0 else reversed(sizes):
            _command(children[size], f"{ROUND} {requests}")
            _relay_until(children[size], ROUND_DONE, size)
            print(f"  {size_label(size)}: round {number + 1} of {rounds} timed ({requests} per route)", flush=True)
    results: dict[int, dict[str, Any]] = {}
    for size, process in children.items():
        _command(process, END)
        results[size] = json.loads(_relay_until(process, RESULT_PREFIX, size)[len(RESULT_PREFIX) :])
        if process.wait() != 0:
            sys.exit(f"the {size:,} jobs run failed ({process.returncode})")
    table_print(sizes, results)


def _command(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


def _relay_until(process: subprocess.Popen[str], marker: str, size: int) -> str:
    """Print the child's lines until one starts with `marker`; that line."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(marker):
            return line.rstrip("\n")
        print(line, end="", flush=True)
    sys.exit(f"the {size:,} jobs run ended early ({process.wait()})")


def table_print(sizes: list[int], results: dict[int, dict[str, Any]]) -> None:
    labels = [size_label(size) for size in sizes]
    header = f"  {'route':<54} {'user':<6}" + "".join(f" {label + ' p50/p95 ms':>19}" for label in labels)
    header += "".join(f" {label + ' cpu/sql':>15}" for label in labels)
    header += f" {'queries':>9} {'p95 x':>6}"
    print("  p50/p95: the request's wall time; cpu/sql: p50 of this process's CPU time (the client and Django, not")
    print("  PostgreSQL's) and of the wall time of its SQL queries, in ms: a p95 well above cpu + sql is time spent")
    print("  waiting for a CPU that other processes held.")
    print(header)
    for label, _, users in ROUTES:
        for user in users:
            if not any(f"{label}|{user}" in results[size]["routes"] for size in sizes):
                continue  # left out by --routes
            cells, costs, queries = [], [], []
            for size in sizes:
                figure = results[size]["routes"].get(f"{label}|{user}")
                if figure is None:
                    cells.append(f" {'-':>19}")
                    costs.append(f" {'-':>15}")
                    continue
                status = "" if figure["status"] == 200 else f" ({figure['status']})"
                cells.append(f" {figure['p50']:>8.1f} /{figure['p95']:>7.1f}{status:>2}")
                costs.append(f" {figure.get('cpu', 0):>7.1f} /{figure.get('sql', 0):>6.1f}")
                queries.append(str(figure["queries"]))
            first = results[sizes[0]]["routes"].get(f"{label}|{user}")
            last = results[sizes[-1]]["routes"].get(f"{label}|{user}")
            ratio = f"{last['p95'] / first['p95']:.1f}" if first and last and first["p95"] else "-"
            print(f"  {label:<54} {user:<6}{''.join(cells)}{''.join(costs)} {'/'.join(queries):>9} {ratio:>6}")
    for size in sizes:
        info = results[size]
        print(
            f"  {size_label(size)}: {info['note']}; {info.get('load', '')}; database {info['database_mb']:,.0f} MB"
            f" ({info['database_mb'] * 1_000_000 / size / 1024:,.2f} GB per million jobs)"
        )
    sizes_print(sizes[-1], results[sizes[-1]])


def sizes_print(jobs: int, info: dict[str, Any]) -> None:
    """The largest database's tables (with their indexes): rows, MB, and MB per million jobs."""
    tables = info.get("tables") or []
    if not tables:
        return
    per_million = 1_000_000 / jobs
    print(f"  {size_label(jobs)}: tables with their indexes (rows estimated by ANALYZE)")
    print(f"    {'table':<34} {'rows':>12} {'MB':>9} {'MB per 1M jobs':>15}")
    shown = [table for table in tables if table[2] >= 1]
    for name, rows, megabytes in shown:
        print(f"    {name:<34} {rows:>12,} {megabytes:>9,.0f} {megabytes * per_million:>15,.0f}")
    total = sum(table[2] for table in tables)
    print(
        f"    {'all ' + str(len(tables)) + ' tables':<34} {'':>12} {total:>9,.0f} {total * per_million:>15,.0f}"
        f"  ({total * per_million / 1024:,.2f} GB per million jobs; {len(tables) - len(shown)} under 1 MB not shown)"
    )


# Child: load (or migrate) one database, then time the routes. ----------------------------------------------


def child(*, jobs: int, reuse: bool, routes: str = "") -> None:
    import portal_stack as stack  # sets Django up on BENCH_DATABASE_URL
    from django.core.management import call_command

    name = urlsplit(stack.DATABASE_URL).path.lstrip("/")
    assert "_history_bench_" in name, f"refusing to drop {name!r}: not a history benchmark database"
    if reuse and _loaded_jobs() == jobs:
        started = time.perf_counter()
        output = io.StringIO()
        call_command("migrate", interactive=False, verbosity=2, stdout=output)
        for line in output.getvalue().splitlines():
            if "Applying" in line:
                print(f"  {size_label(jobs)}: {line.strip()}", flush=True)
        note = f"reused, migrated in {time.perf_counter() - started:.1f} s"
    else:
        note = _load(stack, jobs=jobs)
    print(f"  {size_label(jobs)}: {note}", flush=True)
    print(READY, flush=True)
    timer = RouteTimer(only=routes)
    load_before = None
    for line in sys.stdin:
        word, _, argument = line.strip().partition(" ")
        if word == ROUND:
            load_before = os.getloadavg()[0] if load_before is None else load_before
            timer.round(requests=int(argument))
            print(ROUND_DONE, flush=True)
        elif word == END:
            break
    figures = timer.figures()
    load = f"load average {load_before or 0:.1f} before the routes, {os.getloadavg()[0]:.1f} after"
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        database_bytes = cursor.fetchone()[0]
        cursor.execute(TABLE_SIZES_SQL)
        tables = [[name, rows, size / 1024 / 1024] for name, rows, size in cursor.fetchall()]
    result = {
        "note": note,
        "load": load,
        "routes": figures,
        "database_mb": database_bytes / 1024 / 1024,
        "tables": tables,
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# The tables of the portal's schema, largest first: rows (the planner's estimate after VACUUM ANALYZE) and bytes
# with their indexes and TOAST (pg_total_relation_size).
TABLE_SIZES_SQL = """
    SELECT c.relname, greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = 'public'
    ORDER BY pg_total_relation_size(c.oid) DESC
"""


def _loaded_jobs() -> int | None:
    from django.db import connection
    from django.db.utils import OperationalError, ProgrammingError

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM jobs_job")
            return int(cursor.fetchone()[0])
    except (OperationalError, ProgrammingError):
        return None


def _load(stack: Any, *, jobs: int) -> str:
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    started = time.perf_counter()
    parts = urlsplit(stack.DATABASE_URL)
    name = parts.path.lstrip("/")
    connections.close_all()
    with psycopg.connect(parts._replace(path="/postgres").geturl(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", interactive=False, verbosity=0)
    migrated = time.perf_counter() - started
    call_command("seed_demo", verbosity=0)
    _year_of_rates_and_allocations()
    stack.redis_flush()  # the Slurm syncs the services queued: no worker runs here
    started = time.perf_counter()
    sums = _history_insert(jobs=jobs)
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    invoices = _invoices_build()
    built = time.perf_counter() - started
    return (
        f"migrated in {migrated:.1f} s, {jobs:,} jobs loaded in {loaded:.1f} s ({sums}), "
        f"{invoices} months invoiced in {built:.1f} s"
    )


MONTHS = 12


def _months_back() -> list[Any]:
    """The first days of this month and of the 12 before it, oldest first."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import first_of_month

    months = [first_of_month(timezone.now().date())]
    for _ in range(MONTHS):
        months.insert(0, first_of_month(months[0] - timedelta(days=1)))
    return months


def _year_of_rates_and_allocations() -> None:
    """The demo's prices from a year back, and each past month's allocations as this month's (seed_demo)."""
    import calendar
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import transaction

    from billing.models import Rate
    from billing.rates import rate_create
    from quotas.models import Allocation, period_start
    from quotas.services import allocation_create

    months = _months_back()
    admin = get_user_model().objects.get(username="admin")
    with transaction.atomic():
        for rate in list(Rate.objects.select_related("cluster")):
            rate_create(
                actor=None,
                cluster=rate.cluster,
                gpu_type=rate.gpu_type,
                price_per_gpu_hour=rate.price_per_gpu_hour,
                currency=rate.currency,
                valid_from=period_start(months[0]),
            )
        current = list(Allocation.objects.select_related("project", "cluster"))
        for month in months[:-1]:
            last_day = month.replace(day=calendar.monthrange(month.year, month.month)[1])
            for allocation in current:
                allocation_create(
                    actor=admin,
                    project=allocation.project,
                    cluster=allocation.cluster,
                    gpu_hours=Decimal(allocation.granted_gpu_seconds // 3600),
                    gpu_type=allocation.gpu_type,
                    starts_on=month,
                    ends_on=last_day,
                    note="history benchmark",
                )


# Job n of N: created (N - n) / N of a year ago, so the newest is a few seconds old; its project and user by
# n % 20 (acme/vision: alice 3, bob 6 of 20; acme/nlp: alice 5; globex/genomics: carol 6); its end by
# (n * 7) % 100 (80% completed, 10% failed, 6% cancelled, 4% timeout); 1-4 GPUs for 1-7,200 s.
HISTORY_SQL = """
CREATE TEMP TABLE history_rows ON COMMIT DROP AS
SELECT n, gen_random_uuid() AS job_id, created_at,
       CASE WHEN n %% 20 < 9 THEN %(vision)s WHEN n %% 20 < 14 THEN %(nlp)s ELSE %(genomics)s END AS project_id,
       CASE WHEN n %% 20 < 3 THEN %(alice)s WHEN n %% 20 < 9 THEN %(bob)s WHEN n %% 20 < 14 THEN %(alice)s
            ELSE %(carol)s END AS user_id,
       CASE WHEN n %% 20 < 3 THEN 'alice' WHEN n %% 20 < 9 THEN 'bob' WHEN n %% 20 < 14 THEN 'alice'
            ELSE 'carol' END AS username,
       CASE WHEN n %% 20 < 9 THEN 'h100' ELSE 'a100' END AS gpu_type,
       CASE WHEN (n * 7) %% 100 < 80 THEN 'completed' WHEN (n * 7) %% 100 < 90 THEN 'failed'
            WHEN (n * 7) %% 100 < 96 THEN 'cancelled' ELSE 'timeout' END AS state,
       1 + n %% 4 AS gpus,
       1 + (n * 13) %% 7200 AS seconds,
       created_at + interval '30 seconds' AS started_at,
       created_at + interval '30 seconds' + make_interval(secs => 1 + (n * 13) %% 7200) AS ended_at
FROM (
    -- The fraction first: 365 days times 10M overflows an interval.
    SELECT n, now() - interval '365 days' * ((%(jobs)s - n)::float8 / %(jobs)s) - interval '3 hours' AS created_at
    FROM generate_series(0, %(jobs)s - 1) AS n
) numbered;

INSERT INTO jobs_job (id, project_id, cluster_id, user_id, cluster_username, is_external, name, partition,
    gpu_type, gpus, time_limit_minutes, script, environment, template_id, idempotency_key, request_id,
    working_directory, stdout_path, stderr_path, state, slurm_state, state_reason, last_error, slurm_job_id,
    slurm_submit_time, nodes, exit_code, submit_attempts, created_at, submitted_at, started_at, ended_at,
    updated_at, gpu_indices, "array", array_progress, array_task_count, slurm_dependency, node_count, switches,
    cancel_reason)
SELECT job_id, project_id, %(cluster)s, user_id, username, false, 'train-' || (n %% 997), gpu_type, gpu_type,
    gpus, 180, E'#!/bin/bash\\npython train.py\\n', '{}', '', '', '', '/home/' || username,
    '/var/log/jobs/' || job_id || '.out', '/var/log/jobs/' || job_id || '.err', state, upper(state), '', '',
    1000000 + n, created_at + interval '2 seconds', 'gpu' || (n %% 4 + 1),
    CASE WHEN state = 'completed' THEN 0 ELSE 1 END, 1, created_at, created_at + interval '2 seconds',
    started_at, ended_at, ended_at, '{}', '', '{}', 0, '', 1, '[]', ''
FROM history_rows ORDER BY n;

INSERT INTO jobs_jobtransition (job_id, from_state, to_state, at, detail)
SELECT job_id, from_state, to_state, at, '' FROM history_rows, LATERAL (VALUES
    (1, '', 'queued', created_at), (2, 'queued', 'pending', created_at + interval '2 seconds'),
    (3, 'pending', 'running', started_at), (4, 'running', state, ended_at)
) AS steps(step, from_state, to_state, at)
ORDER BY n, step;

-- What the GPU collector leaves for a measured job: its utilisation and idle GPU-seconds (the efficiency report,
-- the dashboard's idle cost); every job here, as DCGM or NVML would measure every GPU job.
INSERT INTO jobs_jobefficiency (job_id, source, observed_gpu_seconds, utilisation_percent_seconds,
    peak_memory_mib, idle_gpu_seconds, idle_gpus, updated_at)
SELECT job_id, 'dcgm', gpus * seconds, gpus * seconds * (20 + n %% 80)::float8, 20000 + n %% 60000,
    gpus * seconds * (n %% 5) / 10, 0, ended_at
FROM history_rows ORDER BY n;

CREATE TEMP TABLE history_charges ON COMMIT DROP AS
SELECT r.*, a.id AS allocation_id, p.tenant_id, rate.id AS rate_id, rate.price_per_gpu_hour,
       round(r.gpus * r.seconds * rate.price_per_gpu_hour / 3600, 6) AS cost
FROM history_rows r
JOIN tenants_project p ON p.id = r.project_id
LEFT JOIN quotas_allocation a ON a.project_id = r.project_id AND a.cluster_id = %(cluster)s
    AND (r.created_at AT TIME ZONE 'UTC')::date BETWEEN a.starts_on AND a.ends_on
JOIN LATERAL (
    SELECT id, price_per_gpu_hour FROM billing_rate
    WHERE cluster_id = %(cluster)s AND gpu_type = r.gpu_type AND valid_from <= r.started_at
    ORDER BY valid_from DESC LIMIT 1
) rate ON true;

INSERT INTO quotas_ledgerentry (allocation_id, project_id, cluster_id, kind, gpu_seconds, job_id, actor_id, note,
    created_at)
SELECT allocation_id, project_id, %(cluster)s, kind, gpu_seconds, job_id, NULL, '', at
FROM history_charges, LATERAL (VALUES
    (1, 'reserve', gpus * 180 * 60, created_at), (2, 'release', gpus * 180 * 60, ended_at),
    (3, 'charge', gpus * seconds, ended_at)
) AS entries(step, kind, gpu_seconds, at)
ORDER BY n, step;

INSERT INTO billing_usagerecord (job_id, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type,
    slurm_job_id, started_at, ended_at, gpu_seconds, cost, currency, imported_at)
SELECT job_id, tenant_id, project_id, %(cluster)s, user_id, username, gpu_type, 1000000 + n, started_at, ended_at,
    gpus * seconds, cost, 'EUR', ended_at
FROM history_charges ORDER BY n;

INSERT INTO billing_usageshare (usage_record_id, tenant_id, project_id, cluster_id, user_id, cluster_username,
    gpu_type, day, starts_at, ends_at, billed_month, rate_id, price_per_gpu_hour, currency, gpu_seconds, cost)
SELECT u.id, c.tenant_id, c.project_id, %(cluster)s, c.user_id, c.username, c.gpu_type,
    (c.started_at AT TIME ZONE 'UTC')::date, c.started_at, c.ended_at,
    date_trunc('month', c.ended_at AT TIME ZONE 'UTC')::date, c.rate_id, c.price_per_gpu_hour, 'EUR',
    c.gpus * c.seconds, c.cost
FROM history_charges c JOIN billing_usagerecord u ON u.job_id = c.job_id ORDER BY c.n;

UPDATE quotas_allocation a SET charged_gpu_seconds = charged.gpu_seconds
FROM (
    SELECT allocation_id, sum(gpu_seconds) AS gpu_seconds FROM quotas_ledgerentry
    WHERE kind = 'charge' AND allocation_id IS NOT NULL GROUP BY allocation_id
) charged
WHERE a.id = charged.allocation_id;
"""


def _history_insert(*, jobs: int) -> str:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from clusters.models import Cluster
    from tenants.models import Project

    users = {user.username: user.pk for user in get_user_model().objects.all()}
    projects = {project.slug: project.pk for project in Project.objects.all()}
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        # Foreign keys are not checked row by row (Django makes them deferred: 20M checks at COMMIT took longer
        # than the load); the rows above are made consistent by construction, as a restore's would be.
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            HISTORY_SQL,
            {
                "jobs": jobs,
                "cluster": Cluster.objects.get(name="local").pk,
                "vision": projects["vision"],
                "nlp": projects["nlp"],
                "genomics": projects["genomics"],
                "alice": users["alice"],
                "bob": users["bob"],
                "carol": users["carol"],
            },
        )
        cursor.execute("COMMIT")
        cursor.execute("VACUUM ANALYZE")
    return _after_load(jobs=jobs)


def _after_load(*, jobs: int) -> str:
    """The daily sums the portal keeps as charges land, computed once from the bulk-loaded rows, in batches as
    `manage.py daily_sums_rebuild` and the migrations that add them do."""
    from billing.efficiency import efficiency_sums_rebuild
    from billing.usage import usage_daily_rebuild
    from quotas.usage import ledger_daily_rebuild

    usage, ledger = usage_daily_rebuild(), ledger_daily_rebuild()
    started = time.perf_counter()
    summed = efficiency_sums_rebuild()  # what beat's efficiency_sums_add does as jobs settle, at once
    seconds = time.perf_counter() - started
    # What autovacuum does at a site soon after: the rebuild marked every efficiency row summed, and until the
    # planner's statistics say so it reads the month's unsummed jobs from the idlest-first index, row by row (2.6 s
    # at 1M). This machine's PostgreSQL runs without autovacuum (its CI configuration), so do it here.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return (
        f"daily sums rebuilt: usage {usage.seconds:.1f} s in {usage.batches} batches (longest "
        f"{usage.longest_batch_seconds * 1000:.0f} ms), ledger {ledger.seconds:.1f} s in {ledger.batches} batches "
        f"(longest {ledger.longest_batch_seconds * 1000:.0f} ms); {summed:,} jobs added to the efficiency sums in "
        f"{seconds:.1f} s"
    )


def _invoices_build() -> int:
    from billing.invoices import invoices_build

    months = _months_back()[:-1]  # the closed ones
    for month in months:
        invoices_build(month=month)
    return len(months)


# The routes ------------------------------------------------------------------------------------------------

NEXT_LINK = re.compile(r'<a href="([^"]*)" rel="next"')


def _next_url(path: str, response: Any) -> str | None:
    """The next page's path: an API list's `next`, or a page's `rel="next"` link."""
    if response["Content-Type"].startswith("application/json"):
        following = response.json().get("next")
        if not following:
            return None
        parts = urlsplit(following)
        return f"{parts.path}?{parts.query}"
    found = NEXT_LINK.search(response.content.decode())
    if found is None:
        return None
    link = found.group(1).replace("&amp;", "&")
    return link if link.startswith("/") else f"{path.split('?')[0]}{link}"


def _page_deep(client: Any, path: str, pages: int) -> str:
    """The URL of page `pages` of a list, reached by following its next links (untimed)."""
    url = path
    for _ in range(pages - 1):
        response = client.get(url)
        following = _next_url(path, response)
        if following is None:
            break
        url = following
    return url


class RouteTimer:
    """Every route as alice, bob and admin (Django's test client, signed in), timed in rounds: each `round` adds
    `requests` timings per route (after a few unmeasured ones in the first), `figures` gives p50/p95 of them all."""

    def __init__(self, *, only: str = "") -> None:
        from datetime import timedelta

        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.utils import timezone

        from billing.models import Invoice
        from jobs.models import Job
        from quotas.models import Allocation

        vision_job = Job.objects.filter(project__slug="vision").order_by("-created_at").first()
        allocation = Allocation.objects.filter(project__slug="vision", cluster__name="local").order_by("-starts_on")[0]
        invoice = Invoice.objects.filter(tenant__slug="acme").order_by("-month").first()
        today = timezone.now().date()
        # (key, client, path) for every route and user asked; timings by key
        self.asks: list[tuple[str, Any, str]] = []
        for username in ("alice", "bob", "admin"):
            client = Client()
            client.force_login(get_user_model().objects.get(username=username))
            values = {
                "job_id": vision_job.pk if vision_job else "",
                "slurm_job_id": vision_job.slurm_job_id if vision_job else "",
                "allocation_id": allocation.pk,
                "invoice_id": invoice.pk if invoice else 0,
                "jobs_page_50": _page_deep(client, "/jobs/", 50),
                "api_jobs_page_50": _page_deep(client, "/api/v1/jobs/", 50),
                "last_month": f"{today.replace(day=1) - timedelta(days=1):%Y-%m}",
                "year_ago": f"{today - timedelta(days=365)}",
            }
            for label, template, users in ROUTES:
                if username in users and only in label:
                    self.asks.append((f"{label}|{username}", client, template.format(**values)))
        self.timings: dict[str, list[float]] = {key: [] for key, _, _ in self.asks}
        self.cpu: dict[str, list[float]] = {key: [] for key, _, _ in self.asks}
        self.sql: dict[str, list[float]] = {key: [] for key, _, _ in self.asks}
        self.last: dict[str, tuple[int, int]] = {}  # status, queries
        self.warm = False

    def round(self, *, requests: int) -> None:
        from django.db import connection, reset_queries
        from django.test.utils import CaptureQueriesContext

        for key, client, path in self.asks:
            gc.collect()  # what walking 49 pages left behind is not collected inside a timed request
            for _ in range(0 if self.warm else WARMUP_REQUESTS):
                client.get(path)
            for _ in range(requests):
                # Inside the context Django keeps every query (up to 9,000, then nothing is counted): from empty.
                reset_queries()
                with CaptureQueriesContext(connection) as queries:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    response = client.get(path)
                    self.timings[key].append((time.perf_counter() - started) * 1000)
                    self.cpu[key].append((time.process_time() - cpu_started) * 1000)
                self.sql[key].append(sum(float(query["time"]) for query in queries.captured_queries) * 1000)
                self.last[key] = (response.status_code, len(queries))
        self.warm = True

    def figures(self) -> dict[str, dict[str, Any]]:
        import portal_stack as stack

        figures: dict[str, dict[str, Any]] = {}
        for key, _, path in self.asks:
            status, queries = self.last[key]
            figures[key] = {
                "status": status,
                "p50": stack.percentile(self.timings[key], 0.5),
                "p95": stack.percentile(self.timings[key], 0.95),
                "cpu": stack.percentile(self.cpu[key], 0.5),
                "sql": stack.percentile(self.sql[key], 0.5),
                "queries": queries,
                "path": path,
            }
        return figures


if __name__ == "__main__":
    main()
