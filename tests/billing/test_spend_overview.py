"""The spend overview's selector: a closed month's totals equal its invoices to the cent (per tenant and in all),
every grouping adds up to the total, and the change against the previous period is exact, a group absent from
either period included."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from billing.invoices import invoice_finalise
from billing.models import Invoice, InvoiceState
from billing.spend import SpendScope
from billing.spend_overview import SpendGroupBy, previous_period, spend_overview
from tests.billing.spend_overview_worlds import ArithmeticWorld, InvoiceWorld

pytestmark = pytest.mark.django_db


def _month_end(month: date) -> date:
    following = date(month.year + month.month // 12, month.month % 12 + 1, 1)
    return date.fromordinal(following.toordinal() - 1)


def test_the_overviews_totals_equal_the_sum_of_the_invoices_of_the_same_period() -> None:
    world = InvoiceWorld()
    for invoice in Invoice.objects.filter(month=world.month):
        invoice_finalise(actor=world.staff, invoice=invoice)
    invoices = Invoice.objects.filter(month=world.month)
    assert invoices.count() == 2
    assert set(invoices.values_list("state", flat=True)) == {InvoiceState.FINAL}

    overview = spend_overview(
        scope=SpendScope(), group_by=SpendGroupBy.TENANT, start=world.month, end=_month_end(world.month)
    )

    per_tenant = {group.name: group.amount for group in overview.groups}
    invoiced = {invoice.tenant.slug: invoice.total for invoice in invoices.select_related("tenant")}
    assert per_tenant == invoiced
    assert overview.total.amount == invoices.aggregate(total=Sum("total"))["total"]
    assert overview.total.gpu_seconds == invoices.aggregate(seconds=Sum("gpu_seconds"))["seconds"]
    # The previous month's drafts, in the same figures.
    drafts = Invoice.objects.filter(month=world.before)
    assert overview.total.previous_amount == drafts.aggregate(total=Sum("total"))["total"]
    # A tenant's own overview says what its invoice says.
    acme = spend_overview(
        scope=SpendScope(tenant=world.acme),
        group_by=SpendGroupBy.CLUSTER,
        start=world.month,
        end=_month_end(world.month),
    )
    assert acme.total.amount == invoiced["acme"]


@pytest.mark.parametrize("group_by", list(SpendGroupBy))
def test_every_grouping_adds_up_to_the_total_to_the_cent(group_by: SpendGroupBy) -> None:
    world = InvoiceWorld()

    overview = spend_overview(scope=SpendScope(), group_by=group_by, start=world.month, end=_month_end(world.month))

    assert sum(group.amount for group in overview.groups) == overview.total.amount
    assert sum(group.previous_amount for group in overview.groups) == overview.total.previous_amount
    assert sum(group.gpu_seconds for group in overview.groups) == overview.total.gpu_seconds
    assert overview.total.amount > 0


def _figures(overview: object) -> list[tuple[str, str, str, str, str | None]]:
    return [
        (
            g.name,
            str(g.amount),
            str(g.previous_amount),
            str(g.change),
            None if g.change_percent is None else str(g.change_percent),
        )
        for g in overview.groups  # type: ignore[attr-defined]
    ]


def test_the_change_against_the_previous_period_per_project() -> None:
    world = ArithmeticWorld()

    overview = spend_overview(scope=SpendScope(), group_by=SpendGroupBy.PROJECT, start=world.start, end=world.end)

    assert (overview.previous_start, overview.previous_end) == (date(2025, 3, 1), date(2025, 3, 10))
    assert _figures(overview) == [
        ("acme/vision", "6.00", "2.00", "4.00", "200.0"),
        ("acme/speech", "2.00", "0.00", "2.00", None),  # new: no division by zero
        ("globex/lab", "0.00", "4.00", "-4.00", "-100.0"),
    ]
    total = overview.total
    assert (total.amount, total.previous_amount, total.change, total.change_percent) == (
        Decimal("8.00"),
        Decimal("6.00"),
        Decimal("2.00"),
        Decimal("33.3"),
    )


@pytest.mark.parametrize(
    ("group_by", "expected"),
    [
        (
            SpendGroupBy.TENANT,
            [("acme", "8.00", "2.00", "6.00", "300.0"), ("globex", "0.00", "4.00", "-4.00", "-100.0")],
        ),
        (SpendGroupBy.CLUSTER, [("north", "6.00", "6.00", "0.00", "0.0"), ("south", "2.00", "0.00", "2.00", None)]),
        (SpendGroupBy.GPU_TYPE, [("h100", "6.00", "6.00", "0.00", "0.0"), ("a100", "2.00", "0.00", "2.00", None)]),
    ],
)
def test_the_change_per_tenant_cluster_and_gpu_type(
    group_by: SpendGroupBy, expected: list[tuple[str, str, str, str, str | None]]
) -> None:
    world = ArithmeticWorld()

    overview = spend_overview(scope=SpendScope(), group_by=group_by, start=world.start, end=world.end)

    assert _figures(overview) == expected


def test_a_tenants_overview_holds_its_own_usage_only() -> None:
    world = ArithmeticWorld()

    overview = spend_overview(
        scope=SpendScope(tenant=world.globex), group_by=SpendGroupBy.PROJECT, start=world.start, end=world.end
    )

    assert _figures(overview) == [("globex/lab", "0.00", "4.00", "-4.00", "-100.0")]


def test_a_period_and_its_previous_one_without_usage_have_no_groups_and_no_currency() -> None:
    ArithmeticWorld()

    overview = spend_overview(
        scope=SpendScope(), group_by=SpendGroupBy.TENANT, start=date(2024, 6, 1), end=date(2024, 6, 30)
    )

    assert (overview.groups, overview.currency, overview.total.amount, overview.total.change_percent) == (
        [],
        None,
        Decimal("0.00"),
        None,
    )


@pytest.mark.parametrize(
    ("start", "end", "previous"),
    [
        # A whole month against the whole month before, whatever their lengths.
        (date(2025, 3, 1), date(2025, 3, 31), (date(2025, 2, 1), date(2025, 2, 28))),
        (date(2025, 2, 1), date(2025, 2, 28), (date(2025, 1, 1), date(2025, 1, 31))),
        (date(2025, 1, 1), date(2025, 1, 31), (date(2024, 12, 1), date(2024, 12, 31))),
        # A month so far against the same days of the month before (capped at its last day).
        (date(2025, 3, 1), date(2025, 3, 12), (date(2025, 2, 1), date(2025, 2, 12))),
        (date(2025, 3, 1), date(2025, 3, 30), (date(2025, 2, 1), date(2025, 2, 28))),
        # Any other period: the equal-length period just before it.
        (date(2025, 3, 11), date(2025, 3, 20), (date(2025, 3, 1), date(2025, 3, 10))),
        (date(2025, 3, 5), date(2025, 3, 5), (date(2025, 3, 4), date(2025, 3, 4))),
        (date(2025, 2, 15), date(2025, 3, 14), (date(2025, 1, 18), date(2025, 2, 14))),
    ],
)
def test_the_previous_period(start: date, end: date, previous: tuple[date, date]) -> None:
    assert previous_period(start, end) == previous


def test_the_overview_is_two_queries_whatever_the_usage() -> None:
    world = InvoiceWorld()

    with CaptureQueriesContext(connection) as queries:
        spend_overview(scope=SpendScope(), group_by=SpendGroupBy.PROJECT, start=world.before, end=world.month)

    assert len(queries) == 2  # this period's daily sums per invoice line, and the previous period's
