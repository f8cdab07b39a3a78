"""Jobs of 1, 2 and 4 GPUs on both GPU types, and one submitted around the portal, run on the real cluster and are
priced exactly once each: GPU-seconds from Slurm's accounting x the rate of their GPU type."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from billing.models import Invoice, UsageRecord, UsageShare
from billing.money import amount_due, usage_cost
from billing.rates import rate_create
from billing.usage import UsageImportResult, usage_import
from clusters.clients import slurm_client_for
from clusters.models import Cluster
from clusters.slurm import SlurmClient, SlurmNotFound
from clusters.slurm.types import AccountingRecord, JobSubmission
from jobs.models import Job
from jobs.quota_usage import quota_usage_collect
from quotas.models import LedgerEntry
from tests.conftest import wait_until
from tests.jobs.conftest import LiveProject

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {"h100": Decimal("2.7500"), "a100": Decimal("1.2345")}


def _record(client: SlurmClient, slurm_job_id: int) -> AccountingRecord:
    deadline = time.monotonic() + 30
    while True:
        try:
            record = client.accounting_job(job_id=slurm_job_id)
        except SlurmNotFound:
            record = None
        if record is not None and record.state.is_finished:
            return record
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm job {slurm_job_id} has no finished accounting record after 30 s")
        time.sleep(0.25)


def test_jobs_of_both_gpu_types_and_an_external_job_are_priced_exactly_once(
    live_project: LiveProject, slurm_client: SlurmClient, job_directory: Path, celery_worker: str
) -> None:
    cluster = live_project.cluster
    # A day back, so that the whole run is priced by these rates; an any-type rate that must not be used.
    since = timezone.now() - timedelta(days=1)
    rates = {
        gpu_type: rate_create(
            actor=None, cluster=cluster, gpu_type=gpu_type, price_per_gpu_hour=price, currency="EUR", valid_from=since
        )
        for gpu_type, price in PRICES.items()
    }
    rate_create(
        actor=None, cluster=cluster, gpu_type="", price_per_gpu_hour=Decimal("99"), currency="EUR", valid_from=since
    )

    submitted = [
        live_project.submit(
            name=f"{gpu_type}-{gpus}", partition=gpu_type, gpu_type=gpu_type, gpus=gpus, script="#!/bin/bash\nsleep 2\n"
        )
        for gpu_type in PRICES
        for gpus in (1, 2, 4)
    ]
    outside = JobSubmission(
        name="outside",
        account=live_project.project.slurm_account,
        partition="a100",
        script="#!/bin/bash\nsleep 2\n",
        time_limit_minutes=1,
        working_directory=str(job_directory),
        standard_output=str(job_directory / "stdout.txt"),
        standard_error=str(job_directory / "stderr.txt"),
        gpus=2,
        gpu_type="a100",
        environment={"PATH": "/usr/bin:/bin"},
    )
    outside_id = slurm_client.submit_job(user="alice", submission=outside).job_id

    portal_jobs = [live_project.wait_for(reply["id"], lambda job: job.is_final, timeout=120) for reply in submitted]

    def external_found() -> bool:
        live_project.sync()
        return Job.objects.filter(
            cluster=cluster, is_external=True, slurm_job_id=outside_id, ended_at__isnull=False
        ).exists()

    wait_until(external_found, timeout_seconds=60, what="the sync seeing the external job end")
    jobs = [*portal_jobs, Job.objects.get(cluster=cluster, is_external=True, slurm_job_id=outside_id)]

    def all_charged() -> bool:
        fresh = Cluster.objects.get(pk=cluster.pk)
        quota_usage_collect(cluster=fresh, client=slurm_client_for(fresh))
        return LedgerEntry.objects.filter(job__in=jobs, kind="charge").count() == len(jobs)

    wait_until(all_charged, timeout_seconds=90, what="every job charged from accounting")

    first = usage_import()
    assert (first.imported, first.unpriced) == (7, 0)
    # Importing again changes nothing.
    assert usage_import() == UsageImportResult()
    assert UsageRecord.objects.filter(job__in=jobs).count() == 7

    expected_total = Decimal(0)
    for job in jobs:
        assert job.slurm_job_id is not None
        accounting = _record(slurm_client, job.slurm_job_id)
        usage = UsageRecord.objects.get(job=job)
        gpu_type = accounting.gpu_type or ""
        gpus = 2 if job.is_external else int(job.name.split("-")[1])
        assert (gpu_type, accounting.gpus_allocated) == (job.gpu_type or gpu_type, gpus)
        assert usage.gpu_seconds == accounting.elapsed_seconds * gpus
        assert usage.gpu_seconds > 0
        assert usage.gpu_type == gpu_type
        assert usage.cost == usage_cost(gpu_seconds=usage.gpu_seconds, price_per_gpu_hour=PRICES[gpu_type])
        assert usage.cost == (Decimal(usage.gpu_seconds) * PRICES[gpu_type] / 3600).quantize(Decimal("0.000001"))
        assert list(UsageShare.objects.filter(usage_record=usage).values_list("rate_id", "gpu_seconds")) == [
            (rates[gpu_type].pk, usage.gpu_seconds)
        ]  # a few seconds' run: one share, at its type's own rate
        expected_total += usage.cost

    invoice = Invoice.objects.get(tenant=live_project.project.tenant)
    assert (invoice.state, invoice.currency) == ("draft", "EUR")
    assert invoice.gpu_seconds == sum(UsageRecord.objects.get(job=job).gpu_seconds for job in jobs)
    # One line per GPU type (one project, one cluster, one rate each), each the sum of its usage rounded once.
    lines = {line.gpu_type: line for line in invoice.lines.all()}
    assert sorted(lines) == ["a100", "h100"]
    for gpu_type, line in lines.items():
        records = UsageRecord.objects.filter(job__in=jobs, gpu_type=gpu_type)
        assert line.job_count == records.count() == (4 if gpu_type == "a100" else 3)
        assert line.gpu_seconds == sum(record.gpu_seconds for record in records)
        assert line.amount == amount_due(amount=sum((record.cost for record in records), Decimal(0)), currency="EUR")
    assert invoice.total == sum(line.amount for line in lines.values())
    assert abs(invoice.total - expected_total) < Decimal("0.01")
