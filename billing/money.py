"""Money: the one place amounts are computed from GPU-seconds and rounded.

Usage costs are kept to the micro-unit (6 places) so that summing many short jobs loses nothing; amounts a
person reads or pays are rounded half up to the currency's minor unit, by one rule (`amount_billed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal

SECONDS_PER_HOUR = 3600
USAGE_COST_PLACES = Decimal("0.000001")
# ISO 4217 currencies without a minor unit; every other currency has cents.
_NO_MINOR_UNIT = frozenset({"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "XAF"})

# The rule for every amount shown or billed, whatever the view (invoice, spend per period, day, project or user,
# a job's cost, exports): usage is grouped by the invoice line it goes on, the micro-unit costs of each group
# are summed and rounded once, and a figure that spans several lines is the sum of those rounded amounts.
# This is what a customer can check: an invoice's lines add up to its total, and spend shows for the same usage
# exactly what the invoice says. (Rounding the grand total once instead would let a total differ by a cent from
# the sum of the lines printed above it; rounding each job or day to cents would lose or add many cents over
# thousands of short jobs.) A figure for part of a line (one day, one user) is what an invoice holding only that
# usage would say, so the days of a month may differ by a cent from the month's total.
#
# The fields of a usage share (`billing.models.UsageShare`) that make one invoice line; `usage_month` is the
# month of its `day` (annotate it with `TruncMonth("day")`). `tenant_id`, `currency` and `billed_month` pick
# the invoice, the rest the line on it.
INVOICE_LINE_FIELDS = (
    "tenant_id",
    "currency",
    "billed_month",
    "project_id",
    "cluster_id",
    "gpu_type",
    "rate_id",
    "price_per_gpu_hour",
    "usage_month",
)


def _minor_unit(currency: str) -> Decimal:
    return Decimal("1") if currency.upper() in _NO_MINOR_UNIT else Decimal("0.01")


def minor_unit_places(currency: str) -> int:
    """Digits after the decimal point of an amount in `currency` (2 for EUR, 0 for JPY), for display only."""
    return -int(_minor_unit(currency).as_tuple().exponent)


def usage_cost(*, gpu_seconds: int, price_per_gpu_hour: Decimal) -> Decimal:
    """GPU-seconds x price per GPU-hour, to the micro-unit."""
    exact = Decimal(gpu_seconds) * price_per_gpu_hour / SECONDS_PER_HOUR
    return exact.quantize(USAGE_COST_PLACES, rounding=ROUND_HALF_UP)


def amount_due(*, amount: Decimal, currency: str) -> Decimal:
    """The amount of one invoice line (its usage costs summed): rounded half up to the currency's minor unit."""
    return amount.quantize(_minor_unit(currency), rounding=ROUND_HALF_UP)


def amount_billed(*, line_costs: Iterable[Decimal], currency: str) -> Decimal:
    """What some usage comes to: its exact cost on each invoice line it falls on, each rounded once, summed.

    `line_costs` holds one sum per line (see INVOICE_LINE_FIELDS); an invoice's total and any spend figure are
    computed here, so that they agree to the cent.
    """
    return sum((amount_due(amount=cost, currency=currency) for cost in line_costs), zero(currency))


def zero(currency: str) -> Decimal:
    return amount_due(amount=Decimal(0), currency=currency)
