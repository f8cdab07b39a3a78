"""Money: the one place amounts are computed from GPU-seconds and rounded.

Usage costs are kept to the micro-unit (6 places) so that summing many short jobs loses nothing; amounts a
person reads or pays (invoice lines, estimates) are rounded once, half up, to the currency's minor unit.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

SECONDS_PER_HOUR = 3600
USAGE_COST_PLACES = Decimal("0.000001")
# ISO 4217 currencies without a minor unit; every other currency has cents.
_NO_MINOR_UNIT = frozenset({"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "XAF"})


def _minor_unit(currency: str) -> Decimal:
    return Decimal("1") if currency.upper() in _NO_MINOR_UNIT else Decimal("0.01")


def usage_cost(*, gpu_seconds: int, price_per_gpu_hour: Decimal) -> Decimal:
    """GPU-seconds x price per GPU-hour, to the micro-unit."""
    exact = Decimal(gpu_seconds) * price_per_gpu_hour / SECONDS_PER_HOUR
    return exact.quantize(USAGE_COST_PLACES, rounding=ROUND_HALF_UP)


def amount_due(*, amount: Decimal, currency: str) -> Decimal:
    """An amount as billed: rounded half up to the currency's minor unit."""
    return amount.quantize(_minor_unit(currency), rounding=ROUND_HALF_UP)


def zero(currency: str) -> Decimal:
    return amount_due(amount=Decimal(0), currency=currency)
