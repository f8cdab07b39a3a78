"""Building one month's invoices from 1,000,000 usage records spread over 200 projects (20 tenants x 10).

The records (each with its job and its one day's share) are written straight into PostgreSQL with
`generate_series`, in three steps (10,000, 100,000, then 1,000,000 in all); after each step the month's
invoices are built with `invoices_build`, timed, and its SQL queries counted: the count must stay the same
while the records grow a hundredfold. Two GPU types, and a price change for one of them in mid-month, make
three lines per project. The result is checked against a direct SQL sum of the shares.
Usage: python bench/invoice.py [--records N]
"""

from __future__ import annotations

import argparse
import time
from datetime import date, timedelta
from decimal import Decimal

import portal_stack as stack  # sets up Django on the benchmark's database first
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.invoices import invoices_build
from billing.models import Invoice, InvoiceLine, first_of_month
from billing.money import amount_due
from billing.rates import rate_create
from clusters.models import Cluster
from quotas.models import period_start
from tenants import services

TENANTS, PROJECTS_PER_TENANT = 20, 10


def month_to_bill() -> date:
    """Last month: a closed month, as invoices are built for real."""
    return first_of_month(first_of_month(timezone.now().date()) - timedelta(days=1))


def world_create(month: date) -> tuple[Cluster, list[int], dict[str, list[int]]]:
    cluster = Cluster.objects.create(
        name="benchcluster", slurmrestd_url="http://127.0.0.1:9", jwt_key_file="/nonexistent", log_root="/tmp"
    )
    projects = []
    for tenant_index in range(TENANTS):
        tenant = services.tenant_create(actor=None, slug=f"benchtenant{tenant_index:02d}", name="Bench tenant")
        for project_index in range(PROJECTS_PER_TENANT):
            projects.append(
                services.project_create(actor=None, tenant=tenant, slug=f"p{project_index:02d}", name="Bench project")
            )
    rates: dict[str, list[int]] = {"h100": [], "a100": []}
    for gpu_type, price, starts in (
        ("h100", "2.5000", month),
        ("h100", "2.7500", month.replace(day=15)),
        ("a100", "1.6000", month),
    ):
        rate = rate_create(
            actor=None,
            cluster=cluster,
            gpu_type=gpu_type,
            price_per_gpu_hour=Decimal(price),
            currency="EUR",
            valid_from=period_start(starts),
        )
        rates[gpu_type].append(rate.pk)
    return cluster, [project.pk for project in projects], rates


# One statement per table, each row derived from its number n: project n % 200, day n % days of the month,
# start at second (n * 7) % 80,000 of its day, 1-4 GPUs, 60-3,659 s. The share is priced at the h100 rate in
# force on its day (the price changes on the 15th) or at the a100 rate.
INSERT_SQL = """
CREATE TEMP TABLE bench_rows ON COMMIT DROP AS
SELECT n,
       gen_random_uuid() AS job_id,
       (%(projects)s::bigint[])[1 + n %% 200] AS project_id,
       CASE WHEN n %% 2 = 0 THEN 'h100' ELSE 'a100' END AS gpu_type,
       1 + n %% 4 AS gpus,
       60 + n %% 3600 AS seconds,
       %(month_start)s::timestamptz
           + make_interval(days => (n %% %(days)s)::int, secs => (n * 7) %% 80000) AS started_at
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n;

INSERT INTO jobs_job (id, project_id, cluster_id, user_id, cluster_username, is_external, name, partition,
    gpu_type, gpus, time_limit_minutes, script, environment, template_id, idempotency_key, working_directory,
    stdout_path, stderr_path, state, slurm_state, state_reason, last_error, slurm_job_id, nodes, exit_code,
    submit_attempts, created_at, submitted_at, started_at, ended_at, updated_at)
SELECT job_id, project_id, %(cluster)s, NULL, 'alice', false, 'bench', gpu_type, gpu_type, gpus, 61, '', '{}',
    '', '', '', '', '', 'completed', 'COMPLETED', '', '', 10000000 + n, '', 0, 1, started_at, started_at,
    started_at, started_at + make_interval(secs => seconds), started_at + make_interval(secs => seconds)
FROM bench_rows;

INSERT INTO billing_usagerecord (job_id, tenant_id, project_id, cluster_id, user_id, cluster_username, gpu_type,
    slurm_job_id, started_at, ended_at, gpu_seconds, cost, currency, imported_at)
SELECT r.job_id, p.tenant_id, r.project_id, %(cluster)s, NULL, 'alice', r.gpu_type, 10000000 + r.n, r.started_at,
    r.started_at + make_interval(secs => r.seconds), r.gpus * r.seconds,
    round(r.gpus * r.seconds * rate.price_per_gpu_hour / 3600, 6), 'EUR', now()
FROM bench_rows r
JOIN tenants_project p ON p.id = r.project_id
JOIN LATERAL (
    SELECT id, price_per_gpu_hour FROM billing_rate
    WHERE cluster_id = %(cluster)s AND gpu_type = r.gpu_type AND valid_from <= r.started_at
    ORDER BY valid_from DESC LIMIT 1
) rate ON true;

INSERT INTO billing_usageshare (usage_record_id, tenant_id, project_id, cluster_id, user_id, cluster_username,
    gpu_type, day, starts_at, ends_at, billed_month, rate_id, price_per_gpu_hour, currency, gpu_seconds, cost)
SELECT u.id, u.tenant_id, u.project_id, u.cluster_id, NULL, u.cluster_username, u.gpu_type,
    (u.started_at AT TIME ZONE 'UTC')::date, u.started_at, u.ended_at, %(month_start)s::date, rate.id,
    rate.price_per_gpu_hour, 'EUR', u.gpu_seconds, u.cost
FROM billing_usagerecord u
JOIN bench_rows r ON r.job_id = u.job_id
JOIN LATERAL (
    SELECT id, price_per_gpu_hour FROM billing_rate
    WHERE cluster_id = %(cluster)s AND gpu_type = u.gpu_type AND valid_from <= u.started_at
    ORDER BY valid_from DESC LIMIT 1
) rate ON true;
"""


def records_add(*, cluster: Cluster, projects: list[int], month: date, first: int, last: int) -> float:
    started = time.perf_counter()
    days = (first_of_month(month + timedelta(days=32)) - month).days
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(
            INSERT_SQL,
            {
                "projects": projects,
                "month_start": period_start(month),
                "days": days,
                "first": first,
                "last": last,
                "cluster": cluster.pk,
            },
        )
        cursor.execute("COMMIT")
        cursor.execute("ANALYZE billing_usageshare")
    return time.perf_counter() - started


def check(month: date) -> tuple[Decimal, Decimal]:
    """The invoices' grand total, and the same computed by SQL from the shares (each line rounded once)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(cost) FROM billing_usageshare WHERE billed_month = %s "
            "GROUP BY tenant_id, project_id, cluster_id, gpu_type, rate_id",
            [month],
        )
        expected = sum((amount_due(amount=row[0], currency="EUR") for row in cursor.fetchall()), Decimal(0))
    built = sum((invoice.total for invoice in Invoice.objects.filter(month=month)), Decimal(0))
    return built, expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    records = parser.parse_args().records
    steps = sorted({min(records, 10_000), min(records, 100_000), records})

    print(f"bench/invoice.py: one month's invoices from usage records over {TENANTS * PROJECTS_PER_TENANT} projects")
    print(f"  {stack.machine_note()}")
    print(f"  database recreated and migrated in {stack.database_recreate():.1f} s")
    stack.redis_flush()
    month = month_to_bill()
    cluster, projects, _ = world_create(month)
    stack.redis_flush()  # the project syncs the services queued: no worker runs here, and none is wanted

    print(
        f"  {'records':>10} {'insert s':>9} {'build s':>8} {'queries':>8} {'invoices':>9} {'lines':>6}"
        f" {'total EUR':>14}"
    )
    done = 0
    for step in steps:
        inserted = records_add(cluster=cluster, projects=projects, month=month, first=done, last=step - 1)
        done = step
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            drafts = invoices_build(month=month)
            seconds = time.perf_counter() - started
        built, expected = check(month)
        assert built == expected, f"invoices total {built}, the shares say {expected}"
        lines = InvoiceLine.objects.filter(invoice__month=month).count()
        print(f"  {done:>10,} {inserted:>9.1f} {seconds:>8.2f} {len(queries):>8} {drafts:>9} {lines:>6} {built:>14,}")
    print("  Queries do not depend on the records: one grouped read of the shares, then the writes per invoice set")
    print("  (create the missing invoices - the first build only -, delete old lines, insert lines, update totals).")


if __name__ == "__main__":
    main()
