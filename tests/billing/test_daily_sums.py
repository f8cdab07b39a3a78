"""The daily sums that spend and burn-down read (billing.UsageDaily, quotas.LedgerDaily) equal the raw rows they
sum, as charges and usage land batch after batch; invoices equal the sum of their usage; a sum written around
the services is found by the check and repaired by a rebuild."""

from __future__ import annotations

import importlib
import io
from datetime import date, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import F
from django.utils import timezone

from billing.models import Invoice, UsageDaily, UsageShare, first_of_month
from billing.rates import rate_create
from billing.selectors import usage_amount, usage_per_line
from billing.spend import SpendScope, SpendTopBy, spend_top
from billing.usage import usage_daily_mismatches, usage_daily_rebuild, usage_import
from quotas.models import LedgerDaily
from quotas.usage import ledger_daily_mismatches, ledger_daily_rebuild
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import grant_allocation, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


def test_daily_sums_equal_the_shares_and_the_ledger_batch_after_batch() -> None:
    cluster, tenant = make_matrix_cluster(), make_tenant()
    project = make_project(tenant)
    ann, ben = make_user("ann"), make_user("ben")
    month = previous_month(first_of_month(timezone.now().date()))
    day = month.replace(day=10)
    grant_allocation(project, cluster, 5000, starts_on=month, ends_on=month.replace(day=28))
    for price, starts in (("2.0000", at(month)), ("3.0000", at(day, 12))):  # a new price at noon on the 10th
        rate_create(
            actor=None,
            cluster=cluster,
            gpu_type="",
            price_per_gpu_hour=Decimal(price),
            currency="EUR",
            valid_from=starts,
        )
    # First batch: ann across midnight into the 10th and across the price change; ben within the 9th; a job of
    # no portal user.
    charged_job(project, cluster, start=at(day - timedelta(days=1), 23), end=at(day, 13), gpus=2, user=ann)
    charged_job(project, cluster, start=at(day - timedelta(days=1), 8), end=at(day - timedelta(days=1), 9), user=ben)
    charged_job(project, cluster, start=at(day, 1), end=at(day, 2), gpus=4)
    usage_import()
    # Second batch: more on the same days adds to the same rows.
    charged_job(project, cluster, start=at(day, 14), end=at(day, 15), user=ann)
    charged_job(project, cluster, start=at(day - timedelta(days=1), 10), end=at(day - timedelta(days=1), 12), user=ben)
    usage_import()

    assert usage_daily_mismatches() == []
    assert ledger_daily_mismatches() == []
    ann_rows = UsageDaily.objects.filter(user=ann).order_by("day", "price_per_gpu_hour")
    assert [
        (f"{row.day}", f"{row.price_per_gpu_hour}", row.gpu_seconds, f"{row.cost}", row.jobs, row.carried_jobs)
        for row in ann_rows
    ] == [
        (f"{day - timedelta(days=1)}", "2.0000", 7200, "4.000000", 1, 0),  # 23:00-24:00 on 2 GPUs
        (f"{day}", "2.0000", 86400, "48.000000", 0, 1),  # 00:00-12:00 on 2 GPUs, carried from the 9th
        (f"{day}", "3.0000", 10800, "9.000000", 1, 0),  # 12:00-13:00 on 2 GPUs, then 14:00-15:00 on 1
    ]
    charged = {
        f"{row.day}": row.charged_gpu_seconds for row in LedgerDaily.objects.order_by("day") if row.charged_gpu_seconds
    }
    assert charged == {f"{day - timedelta(days=1)}": 3600 + 7200, f"{day}": 100800 + 14400 + 3600}

    # The jobs that used GPUs on the 10th: ann's two (one carried from the 9th) and the one of no portal user.
    top = spend_top(scope=SpendScope(tenant=tenant), start=day, end=day, by=SpendTopBy.USER, limit=10)
    assert [(row.name, row.jobs, row.amount) for row in top.spenders] == [
        ("ann", 2, Decimal("57.00")),
        ("alice", 1, Decimal("8.00")),
    ]
    # Invoices never differ from the sum of their usage.
    invoice = Invoice.objects.get(tenant=tenant, month=month)
    shares = UsageShare.objects.filter(tenant=tenant, billed_month=month)
    assert invoice.total == usage_amount(usage_per_line(shares), "EUR") == Decimal("75.00")


def test_a_sum_written_around_the_services_is_found_and_a_rebuild_repairs_it() -> None:
    cluster, tenant = make_matrix_cluster(), make_tenant()
    project = make_project(tenant)
    today = timezone.now().date()
    grant_allocation(project, cluster, 100)
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("1.0000"),
        currency="EUR",
        valid_from=at(today - timedelta(days=3)),
    )
    yesterday: date = today - timedelta(days=1)
    charged_job(project, cluster, start=at(yesterday, 1), end=at(yesterday, 2))
    usage_import()
    UsageDaily.objects.update(cost=F("cost") + 1)
    LedgerDaily.objects.update(charged_gpu_seconds=F("charged_gpu_seconds") + 5)

    usage_wrong = usage_daily_mismatches()
    assert sorted((row[0], row[-4], row[-3]) for row in usage_wrong) == [
        ("expected", 3600, Decimal("1.000000")),
        ("kept", 3600, Decimal("2.000000")),
    ]
    ledger_wrong = ledger_daily_mismatches()
    assert sorted((row[0], row[3]) for row in ledger_wrong) == [("expected", 3600), ("kept", 3605)]

    assert usage_daily_rebuild().rows == 1
    assert ledger_daily_rebuild().rows == 1
    assert usage_daily_mismatches() == []
    assert ledger_daily_mismatches() == []


def _sums() -> tuple[list[Any], list[Any]]:
    usage: list[Any] = list(
        UsageDaily.objects.order_by("day", "tenant_id", "user_id", "price_per_gpu_hour").values_list(
            "day", "tenant_id", "user_id", "price_per_gpu_hour", "gpu_seconds", "cost", "jobs", "carried_jobs"
        )
    )
    ledger: list[Any] = list(
        LedgerDaily.objects.order_by("allocation_id", "day").values_list(
            "allocation_id", "day", "charged_gpu_seconds", "reserved_gpu_seconds", "released_gpu_seconds"
        )
    )
    return usage, ledger


def _days_of_history() -> None:
    """Jobs across midnight (one over three days) and across batches, in two tenants, imported as usual."""
    cluster = make_matrix_cluster()
    month = previous_month(first_of_month(timezone.now().date()))
    rate_create(
        actor=None, cluster=cluster, gpu_type="", price_per_gpu_hour=Decimal("2.0000"), currency="EUR",
        valid_from=at(month),
    )  # fmt: skip
    for name, first_day in (("acme", 3), ("globex", 9)):
        project = make_project(make_tenant(name))
        grant_allocation(project, cluster, 5000, starts_on=month, ends_on=month.replace(day=28))
        day = month.replace(day=first_day)
        charged_job(project, cluster, start=at(day, 22), end=at(day + timedelta(days=2), 1), gpus=2)
        charged_job(project, cluster, start=at(day, 8), end=at(day, 9))
        charged_job(project, cluster, start=at(day + timedelta(days=8), 23), end=at(day + timedelta(days=9), 2))
    usage_import()


def test_a_rebuild_in_batches_of_a_day_writes_the_sums_the_writers_kept() -> None:
    _days_of_history()
    kept = _sums()
    assert kept[0]
    assert kept[1]
    UsageDaily.objects.all().delete()
    LedgerDaily.objects.update(charged_gpu_seconds=0)  # stale rows are replaced, not added to

    usage = usage_daily_rebuild(days_per_batch=1)
    ledger = ledger_daily_rebuild(days_per_batch=1)

    assert _sums() == kept
    assert usage.rows == len(kept[0])
    assert ledger.rows == len(kept[1])
    assert usage.batches > 1
    assert ledger.batches > 1
    assert usage_daily_mismatches() == []
    assert ledger_daily_mismatches() == []
    # A second run changes nothing.
    usage_daily_rebuild(days_per_batch=3)
    ledger_daily_rebuild()
    assert _sums() == kept


@pytest.mark.parametrize(
    ("migration", "table"),
    [
        ("billing.migrations.0005_usage_daily_fill_in_batches", UsageDaily),
        ("quotas.migrations.0005_ledger_daily_fill_in_batches", LedgerDaily),
    ],
)
def test_the_migrations_fill_the_sums_in_batches_as_the_writers_keep_them(
    migration: str, table: type[UsageDaily | LedgerDaily]
) -> None:
    _days_of_history()
    kept = _sums()
    table.objects.all().delete()

    importlib.import_module(migration).fill_in_batches(None, SimpleNamespace(connection=connection))

    assert _sums() == kept
    assert usage_daily_mismatches() == []
    assert ledger_daily_mismatches() == []


def test_the_command_finds_a_wrong_sum_and_rebuilds_it() -> None:
    _days_of_history()
    LedgerDaily.objects.update(charged_gpu_seconds=F("charged_gpu_seconds") + 1)
    output = io.StringIO()

    with pytest.raises(CommandError, match="differ"):
        call_command("daily_sums_rebuild", "--check", stdout=output)
    call_command("daily_sums_rebuild", stdout=output)
    call_command("daily_sums_rebuild", "--check", stdout=output)

    said = output.getvalue().splitlines()
    assert said[0].startswith("Usage per day: 0 rows differ from the shares; ledger per day: ")
    assert not said[0].startswith("Usage per day: 0 rows differ from the shares; ledger per day: 0 ")
    assert said[1].startswith("Usage per day: ")
    assert said[2].startswith("Ledger per day: ")
    assert said[3] == "Usage per day: 0 rows differ from the shares; ledger per day: 0 rows differ from the entries."
    assert ledger_daily_mismatches() == []
