"""Pricing usage: each charged job becomes one record, split by day and rate; a rate change mid-month prices each
job at its own rate; a job over a month boundary is billed to each month by the time it ran in it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.invoices import invoice_finalise, invoices_build
from billing.models import Invoice, InvoiceLine, UsageRecord, UsageShare, first_of_month
from billing.rates import rate_create
from billing.usage import UsageImportResult, split_gpu_seconds, usage_import
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import make_matrix_cluster, make_project, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def setting():  # type: ignore[no-untyped-def]
    cluster = make_matrix_cluster()
    tenant = make_tenant()
    return cluster, tenant, make_project(tenant)


def _shares(job) -> list[tuple[str, int, str, str]]:  # type: ignore[no-untyped-def]
    return [
        (f"{share.day}", share.gpu_seconds, f"{share.price_per_gpu_hour}", f"{share.cost}")
        for share in UsageShare.objects.filter(usage_record__job=job).order_by("starts_at")
    ]


def _lines(invoice: Invoice) -> list[tuple[str, str, int, int, str]]:
    return [
        (line.gpu_type, f"{line.price_per_gpu_hour}", line.job_count, line.gpu_seconds, f"{line.amount}")
        for line in InvoiceLine.objects.filter(invoice=invoice).order_by("price_per_gpu_hour", "gpu_type")
    ]


def test_a_rate_change_mid_month_prices_earlier_and_later_jobs_at_their_own_rates(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, tenant, project = setting
    month = previous_month(first_of_month(timezone.now().date()))
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2.00"),
        currency="EUR",
        valid_from=at(month),
    )
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("3.00"),
        currency="EUR",
        valid_from=at(month.replace(day=15)),
    )
    early = charged_job(project, cluster, start=at(month.replace(day=10), 10), end=at(month.replace(day=10), 11))
    late = charged_job(
        project, cluster, start=at(month.replace(day=20), 9), end=at(month.replace(day=20), 9, 30), gpus=2
    )
    across = charged_job(project, cluster, start=at(month.replace(day=14), 23), end=at(month.replace(day=15), 1))

    assert usage_import() == UsageImportResult(imported=3, unpriced=0, invoices_rebuilt=1)

    assert _shares(early) == [(f"{month:%Y-%m}-10", 3600, "2.0000", "2.000000")]
    assert _shares(late) == [(f"{month:%Y-%m}-20", 3600, "3.0000", "3.000000")]
    # An hour on each side of the change (which is also midnight): each hour at the rate in force during it.
    assert _shares(across) == [
        (f"{month:%Y-%m}-14", 3600, "2.0000", "2.000000"),
        (f"{month:%Y-%m}-15", 3600, "3.0000", "3.000000"),
    ]
    assert UsageRecord.objects.get(job=across).cost == Decimal("5.000000")

    invoice = Invoice.objects.get(tenant=tenant, month=month)
    assert _lines(invoice) == [("h100", "2.0000", 2, 7200, "4.00"), ("h100", "3.0000", 2, 7200, "6.00")]
    assert (invoice.total, invoice.gpu_seconds, invoice.state) == (Decimal("10.00"), 14400, "draft")


def test_a_rate_change_during_a_day_splits_the_day(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, _, project = setting
    day = previous_month(first_of_month(timezone.now().date())).replace(day=3)
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("1.00"),
        currency="USD",
        valid_from=at(day - timedelta(days=2)),
    )
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("4.00"),
        currency="USD",
        valid_from=at(day, 12),
    )
    job = charged_job(project, cluster, start=at(day, 11), end=at(day, 13), gpus=3)
    usage_import()
    assert _shares(job) == [(f"{day}", 10800, "1.0000", "3.000000"), (f"{day}", 10800, "4.0000", "12.000000")]


def test_a_job_spanning_a_month_boundary_is_billed_to_each_month_by_the_time_it_ran_in_it(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, tenant, project = setting
    this_month = first_of_month(timezone.now().date())
    last_month = previous_month(this_month)
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("1.5000"),
        currency="EUR",
        valid_from=at(previous_month(last_month)),
    )
    # 22:00 on the last day to 04:00 on the first: 2 h in the old month, 4 h in the new, on 4 GPUs; accounting
    # reported one second less than the wall clock, which the larger share absorbs.
    job = charged_job(
        project,
        cluster,
        start=at(this_month - timedelta(days=1), 22),
        end=at(this_month, 4),
        gpus=4,
        gpu_seconds=6 * 3600 * 4 - 1,
    )
    usage_import()
    assert _shares(job) == [
        (f"{this_month - timedelta(days=1)}", 28800, "1.5000", "12.000000"),
        (f"{this_month}", 57599, "1.5000", "23.999583"),
    ]
    old = Invoice.objects.get(tenant=tenant, month=last_month)
    new = Invoice.objects.get(tenant=tenant, month=this_month)
    assert (_lines(old), old.total) == ([("h100", "1.5000", 1, 28800, "12.00")], Decimal("12.00"))
    assert (_lines(new), new.total) == ([("h100", "1.5000", 1, 57599, "24.00")], Decimal("24.00"))
    assert UsageRecord.objects.get(job=job).gpu_seconds == 86399


def test_shares_are_whole_gpu_seconds_that_add_up_to_the_total() -> None:
    start = at(timezone.now().date(), 0)
    cuts = [start + timedelta(seconds=10), start + timedelta(seconds=20)]
    pieces = split_gpu_seconds(gpu_seconds=10, start=start, end=start + timedelta(seconds=30), cuts=cuts)
    assert [piece.gpu_seconds for piece in pieces] == [4, 3, 3]
    assert split_gpu_seconds(gpu_seconds=7, start=start, end=start, cuts=[])[0].gpu_seconds == 7


def test_importing_twice_changes_nothing_and_unpriced_usage_waits_for_a_rate(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, _, project = setting
    day = timezone.now().date() - timedelta(days=2)
    job = charged_job(project, cluster, start=at(day, 8), end=at(day, 9), gpu_type="a100", gpus=2)
    # No rate on the cluster at all: nothing to price, nothing recorded.
    assert usage_import() == UsageImportResult()
    # A rate for another type only: the job is counted as unpriced and waits.
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2"),
        currency="EUR",
        valid_from=at(day - timedelta(days=1)),
    )
    assert usage_import() == UsageImportResult(unpriced=1)
    assert not UsageRecord.objects.exists()
    # Once its type has a price, it is priced, once.
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="a100",
        price_per_gpu_hour=Decimal("0.9"),
        currency="EUR",
        valid_from=at(day - timedelta(days=1)),
    )
    assert usage_import().imported == 1
    assert usage_import() == UsageImportResult()
    record = UsageRecord.objects.get()
    assert (record.job_id, record.gpu_seconds, record.cost, record.currency) == (job.pk, 7200, Decimal("1.8"), "EUR")


def test_draft_totals_equal_the_sum_of_usage_and_finalising_freezes_them(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, tenant, project = setting
    other_project = make_project(tenant)
    this_month = first_of_month(timezone.now().date())
    month = previous_month(this_month)
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("0.3333"),
        currency="EUR",
        valid_from=at(month),
    )
    for index in range(1, 8):  # odd durations, so that costs have many places
        charged_job(
            project,
            cluster,
            start=at(month.replace(day=index), 1),
            end=at(month.replace(day=index), 1, 7 * index),
            gpus=index % 3 + 1,
        )
    charged_job(other_project, cluster, start=at(month.replace(day=9), 5), end=at(month.replace(day=9), 6), gpus=4)
    usage_import()

    invoice = Invoice.objects.get(tenant=tenant, month=month)
    for line in InvoiceLine.objects.filter(invoice=invoice):
        shares = UsageShare.objects.filter(billed_month=month, project=line.project)
        assert line.gpu_seconds == sum(share.gpu_seconds for share in shares)
        assert line.amount == sum((share.cost for share in shares), Decimal(0)).quantize(Decimal("0.01"))
    records = UsageRecord.objects.filter(tenant=tenant)
    assert invoice.gpu_seconds == sum(record.gpu_seconds for record in records)
    assert invoice.total == sum(line.amount for line in invoice.lines.all())
    assert abs(invoice.total - sum(record.cost for record in records)) <= Decimal("0.01")
    frozen = (_lines(invoice), invoice.total, invoice.gpu_seconds)

    final = invoice_finalise(actor=None, invoice=invoice)
    assert (final.state, final.number) == ("final", f"INV-{month:%Y%m}-{invoice.pk:06d}")

    # Usage of the closed month that arrives now goes on this month's invoice as late usage.
    late = charged_job(project, cluster, start=at(month.replace(day=28), 2), end=at(month.replace(day=28), 3))
    usage_import()
    invoices_build(month=month)  # a rebuild of the month leaves a final invoice alone
    final.refresh_from_db()
    assert (_lines(final), final.total, final.gpu_seconds) == frozen
    current = Invoice.objects.get(tenant=tenant, month=this_month)
    line = InvoiceLine.objects.get(invoice=current)
    assert (line.usage_month, line.gpu_seconds, line.amount) == (month, 3600, Decimal("0.33"))
    assert UsageShare.objects.get(usage_record__job=late).billed_month == this_month
