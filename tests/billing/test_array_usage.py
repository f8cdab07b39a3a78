"""Job arrays on the bill: each task's charge becomes a usage record of its own (keyed by job and task), priced
and split by day and rate exactly as a plain job's; the invoice, the daily sums and the job's page add them up."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone

import billing.invoices
from billing.job_end_notices import job_end_notices_send
from billing.models import Invoice, InvoiceLine, UsageDaily, UsageRecord, UsageShare, first_of_month
from billing.rates import rate_create
from billing.selectors import JobUsage, job_usage
from billing.usage import UsageImportResult, usage_daily_mismatches, usage_import
from jobs.models import JobArrayTask, JobEndWatch
from tenants.models import Notification
from tests.billing.usage_factories import at, charged_array, charged_job, previous_month
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def setting():  # type: ignore[no-untyped-def]
    cluster = make_matrix_cluster()
    tenant = make_tenant()
    project = make_project(tenant)
    month = previous_month(first_of_month(timezone.now().date()))
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2.00"),
        currency="EUR",
        valid_from=at(month),
    )
    return cluster, tenant, project, month


def _shares(**lookup: object) -> list[tuple[str, int, str, str]]:
    return [
        (f"{share.day}", share.gpu_seconds, f"{share.price_per_gpu_hour}", f"{share.cost}")
        for share in UsageShare.objects.filter(**lookup).order_by("starts_at")
    ]


def test_an_array_is_priced_task_by_task_and_its_invoice_line_is_the_sum(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, tenant, project, month = setting
    member = make_user()
    add_project_member(project, member)
    day = month.replace(day=10)
    job = charged_array(
        project,
        cluster,
        gpus=2,
        user=member,
        runs=[(at(day, 10), at(day, 11)), (at(day, 10), at(day, 10, 30)), (at(day, 12), at(day, 12, 15))],
    )

    assert usage_import() == UsageImportResult(imported=3, unpriced=0, invoices_rebuilt=1)

    task_ids = dict(JobArrayTask.objects.filter(job=job).values_list("index", "slurm_job_id"))
    records = UsageRecord.objects.filter(job=job).order_by("array_task")
    assert [(r.array_task, r.slurm_job_id, r.gpu_seconds, f"{r.cost}") for r in records] == [
        (0, task_ids[0], 7200, "4.000000"),
        (1, task_ids[1], 3600, "2.000000"),
        (2, task_ids[2], 1800, "1.000000"),
    ]
    invoice = Invoice.objects.get(tenant=tenant, month=month)
    lines = InvoiceLine.objects.filter(invoice=invoice)
    assert [(line.job_count, line.gpu_seconds, f"{line.amount}") for line in lines] == [(3, 12600, "7.00")]
    assert invoice.total == Decimal("7.00")
    assert job_usage(job=job) == JobUsage(
        gpu_seconds=12600, amount=Decimal("7.00"), currency="EUR", priced=3, complete=True
    )
    assert list(UsageDaily.objects.values_list("day", "gpu_seconds", "cost", "jobs", "carried_jobs")) == [
        (day, 12600, Decimal("7.000000"), 3, 0)
    ]
    assert usage_daily_mismatches() == []

    # A second import finds nothing to do.
    assert usage_import() == UsageImportResult()
    assert (UsageRecord.objects.count(), UsageShare.objects.count()) == (3, 3)
    assert InvoiceLine.objects.get(invoice=invoice).amount == Decimal("7.00")
    assert usage_daily_mismatches() == []

    # The job's page shows the array's cost: the sum of its tasks'.
    client = Client()
    client.force_login(member)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<dt>Cost</dt><dd>7.00 EUR</dd>" in page
    assert "<dt>Used</dt><dd>3.5 GPU-hours (3 tasks priced)</dd>" in page


def test_a_task_across_midnight_splits_by_day_as_a_plain_job_does(setting) -> None:  # type: ignore[no-untyped-def]
    cluster, _, project, month = setting
    evening, morning = month.replace(day=14), month.replace(day=15)
    plain = charged_job(project, cluster, start=at(evening, 23), end=at(morning, 1))
    array = charged_array(project, cluster, runs=[(at(evening, 23), at(morning, 1)), (at(morning, 9), at(morning, 10))])

    assert usage_import() == UsageImportResult(imported=3, unpriced=0, invoices_rebuilt=1)

    split = [(f"{evening}", 3600, "2.0000", "2.000000"), (f"{morning}", 3600, "2.0000", "2.000000")]
    assert _shares(usage_record__job=plain) == split
    assert _shares(usage_record__job=array, usage_record__array_task=0) == split
    assert _shares(usage_record__job=array, usage_record__array_task=1) == [(f"{morning}", 3600, "2.0000", "2.000000")]
    # The plain job and task 0 begin on the 14th and carry on into the 15th; task 1 begins on the 15th.
    daily = UsageDaily.objects.order_by("day").values_list("day", "gpu_seconds", "jobs", "carried_jobs")
    assert list(daily) == [(evening, 7200, 2, 0), (morning, 10800, 1, 2)]
    assert usage_daily_mismatches() == []


def test_a_crash_loses_nothing_and_each_task_is_priced_once(setting, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cluster, _, project, month = setting
    day = month.replace(day=3)
    job = charged_array(
        project, cluster, runs=[(at(day, 1), at(day, 2)), (at(day, 3), at(day, 5)), (at(day, 6), at(day, 6, 6))]
    )

    def crash(**_: object) -> int:
        raise RuntimeError("worker lost")

    monkeypatch.setattr(billing.invoices, "invoices_build", crash)
    with pytest.raises(RuntimeError):
        usage_import()
    assert (UsageRecord.objects.count(), UsageShare.objects.count(), UsageDaily.objects.count()) == (0, 0, 0)
    monkeypatch.undo()

    watcher = make_user()
    add_project_member(project, watcher)
    JobEndWatch.objects.create(job=job, user=watcher)

    # Batches of two: the first two tasks, then the last, then nothing. The watcher is told the array's cost once
    # every task is priced.
    assert usage_import(batch_size=2).imported == 2
    assert job_usage(job=job) == JobUsage(
        gpu_seconds=10800, amount=Decimal("6.00"), currency="EUR", priced=2, complete=False
    )
    assert job_end_notices_send() == 0
    assert usage_import(batch_size=2).imported == 1
    assert job_end_notices_send() == 1
    assert Notification.objects.get(user=watcher).body.endswith("It used 3.10 GPU-hours, which cost 6.20 EUR.")
    assert usage_import(batch_size=2) == UsageImportResult()
    assert sorted(UsageRecord.objects.values_list("array_task", "gpu_seconds")) == [(0, 3600), (1, 7200), (2, 360)]
    assert job_usage(job=job) == JobUsage(
        gpu_seconds=11160, amount=Decimal("6.20"), currency="EUR", priced=3, complete=True
    )
    assert usage_daily_mismatches() == []

    # The database refuses a second record of a task, as of a plain job.
    record = UsageRecord.objects.get(job=job, array_task=1)
    record.pk = None
    with pytest.raises(IntegrityError), transaction.atomic():
        record.save()
    plain = charged_job(project, cluster, start=at(day, 7), end=at(day, 8))
    usage_import()
    again = UsageRecord.objects.get(job=plain)
    again.pk = None
    with pytest.raises(IntegrityError), transaction.atomic():
        again.save()
