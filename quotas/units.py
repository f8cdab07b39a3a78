"""GPU-seconds (what the ledger stores) to GPU-hours and GPU-minutes (what people and Slurm read), in one place."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

SECONDS_PER_HOUR = 3600
HOURS_PLACES = Decimal("0.01")


def gpu_hours_to_seconds(hours: Decimal) -> int:
    """GPU-hours as given by a person (e.g. Decimal("12.5")) to whole GPU-seconds."""
    return int((hours * SECONDS_PER_HOUR).to_integral_value(rounding=ROUND_HALF_UP))


def gpu_seconds_to_hours(seconds: int) -> Decimal:
    """GPU-seconds to GPU-hours, to the hundredth, for display and the API."""
    return (Decimal(seconds) / SECONDS_PER_HOUR).quantize(HOURS_PLACES, rounding=ROUND_HALF_UP)


def gpu_seconds_to_limit_minutes(seconds: int) -> int:
    """GPU-seconds to Slurm's GrpTRESMins, rounded down: Slurm never allows more than the portal does."""
    return max(seconds, 0) // 60


def format_gpu_hours(seconds: int) -> str:
    """'16.0', '3.5', '0.25': at least one decimal, at most two, as a message to a person reads best."""
    hours = gpu_seconds_to_hours(seconds)
    text = f"{hours:.2f}"
    return text[:-1] if text.endswith("0") else text
