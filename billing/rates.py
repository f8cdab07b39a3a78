"""Prices per GPU-hour: which rate is in force when, and the services that add, change and remove rates.

A rate that has priced usage is never changed or removed, and no new rate may start before usage that its
predecessors already priced: an invoice's amounts never move under it. A cluster prices in one currency.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max

from billing.models import Rate, UsageShare
from clusters.models import Cluster
from portal.errors import Conflict
from tenants.services import Actor, audit_record

logger = logging.getLogger(__name__)


class RateBook:
    """The rates of some clusters, loaded once, answering "which rate prices this GPU type at this moment"."""

    def __init__(self, rates: Iterable[Rate]) -> None:
        self._chains: dict[tuple[int, str], list[Rate]] = defaultdict(list)
        for rate in sorted(rates, key=lambda rate: rate.valid_from):
            self._chains[(rate.cluster_id, rate.gpu_type)].append(rate)

    @classmethod
    def for_clusters(cls, cluster_ids: Iterable[int]) -> RateBook:
        return cls(Rate.objects.filter(cluster_id__in=set(cluster_ids)))

    @classmethod
    def for_estimates(cls, cluster_id: int) -> RateBook:
        """The cluster's rates from the cache, for estimates only: a submission's reply reads no rates from the
        database. Every rate change empties it; at worst (a change racing a refill) it lags RATES_CACHE_SECONDS.
        Prices are always read from the database."""
        key = _rates_cache_key(cluster_id)
        try:
            rates = cache.get(key)
        except Exception:  # the cache (Redis) down costs a query, never the request
            logger.warning("rates cache unavailable", exc_info=True)
            rates = None
        if rates is None:
            rates = list(Rate.objects.filter(cluster_id=cluster_id))
            with contextlib.suppress(Exception):
                cache.set(key, rates, RATES_CACHE_SECONDS)
        return cls(rates)

    def _latest(self, chain: list[Rate], at: datetime) -> Rate | None:
        found = None
        for rate in chain:
            if rate.valid_from > at:
                break
            found = rate
        return found

    def in_force(self, *, cluster_id: int, gpu_type: str, at: datetime) -> Rate | None:
        """The GPU type's own rate in force at `at`, else the cluster's rate for any GPU type, else None."""
        if gpu_type:
            own = self._latest(self._chains.get((cluster_id, gpu_type), []), at)
            if own is not None:
                return own
        return self._latest(self._chains.get((cluster_id, ""), []), at)

    def changes_between(self, *, cluster_id: int, gpu_type: str, start: datetime, end: datetime) -> list[datetime]:
        """Moments strictly inside (start, end) at which the rate pricing `gpu_type` may change."""
        moments = {rate.valid_from for rate in self._chains.get((cluster_id, ""), [])}
        if gpu_type:
            moments |= {rate.valid_from for rate in self._chains.get((cluster_id, gpu_type), [])}
        return sorted(moment for moment in moments if start < moment < end)


RATES_CACHE_SECONDS = 60


def _rates_cache_key(cluster_id: int) -> str:
    return f"billing:rates:{cluster_id}"


def _forget_cached_rates(cluster_id: int) -> None:
    def forget() -> None:
        try:
            cache.delete(_rates_cache_key(cluster_id))
        except Exception:
            logger.warning("rates cache unavailable: estimates may show the old rate for a minute", exc_info=True)

    transaction.on_commit(forget)


def _rate_state(rate: Rate) -> dict[str, Any]:
    return {
        "cluster": rate.cluster.name,
        "gpu_type": rate.gpu_type,
        "price_per_gpu_hour": str(rate.price_per_gpu_hour),
        "currency": rate.currency,
        "valid_from": rate.valid_from.isoformat(),
        "note": rate.note,
    }


def rate_priced_usage_count(rate: Rate) -> int:
    return UsageShare.objects.filter(rate=rate).values("usage_record").distinct().count()


def _check_new_rate(
    *, cluster: Cluster, gpu_type: str, currency: str, valid_from: datetime, exclude_id: int | None
) -> None:
    others = Rate.objects.filter(cluster=cluster)
    if exclude_id is not None:
        others = others.exclude(pk=exclude_id)
    currencies = set(others.values_list("currency", flat=True))
    if currencies and currency not in currencies:
        raise ValidationError(
            {
                "currency": [
                    f"Rates of {cluster.name} are in {', '.join(sorted(currencies))}; a cluster prices in one currency."
                ]
            }
        )
    # Usage priced by the chain this rate joins: the type's own rates, or for an any-type rate the usage that
    # no type-specific rate priced.
    priced = UsageShare.objects.filter(cluster=cluster)
    priced = priced.filter(gpu_type=gpu_type) if gpu_type else priced.filter(rate__gpu_type="")
    priced_until = priced.aggregate(until=Max("ends_at"))["until"]
    if priced_until is not None and valid_from < priced_until:
        kind = f"{gpu_type} GPUs" if gpu_type else "GPUs without a rate of their own"
        raise Conflict(
            f"Usage of {kind} on {cluster.name} is already priced up to {priced_until:%Y-%m-%d %H:%M:%S} UTC, and "
            "priced usage never changes price; let the new rate start then or later.",
            code="rate_overlaps_priced_usage",
        )


def rate_create(
    *,
    actor: Actor,
    cluster: Cluster,
    gpu_type: str,
    price_per_gpu_hour: Decimal,
    currency: str,
    valid_from: datetime,
    note: str = "",
) -> Rate:
    currency = currency.upper()
    with transaction.atomic():
        Cluster.objects.select_for_update(of=("self",), no_key=True).filter(
            pk=cluster.pk
        ).first()  # one rate change per cluster at a time
        _check_new_rate(cluster=cluster, gpu_type=gpu_type, currency=currency, valid_from=valid_from, exclude_id=None)
        if Rate.objects.filter(cluster=cluster, gpu_type=gpu_type, valid_from=valid_from).exists():
            raise Conflict(
                f"A rate for {gpu_type or 'any GPU type'} on {cluster.name} already starts at "
                f"{valid_from:%Y-%m-%d %H:%M:%S} UTC; change that one (if it has priced nothing yet) "
                "or pick another start.",
                code="rate_exists",
            )
        rate = Rate(
            cluster=cluster,
            gpu_type=gpu_type,
            price_per_gpu_hour=price_per_gpu_hour,
            currency=currency,
            valid_from=valid_from,
            note=note,
            created_by=actor if actor is not None and actor.is_authenticated else None,
        )
        rate.full_clean()
        rate.save()
        audit_record(actor=actor, action="rate.create", target=rate, tenant=None, before=None, after=_rate_state(rate))
        _forget_cached_rates(rate.cluster_id)
    return rate


def _refuse_if_used(rate: Rate, doing: str) -> None:
    used = rate_priced_usage_count(rate)
    if used:
        raise Conflict(
            f"This rate has priced {used} job{'s' if used != 1 else ''} and cannot be {doing}; to change the price, "
            "create a new rate valid from the moment the new price applies.",
            code="rate_in_use",
        )


def rate_update(*, actor: Actor, rate: Rate, changes: dict[str, Any]) -> Rate:
    """Change a rate that has priced nothing yet (fields: price_per_gpu_hour, currency, valid_from, note)."""
    with transaction.atomic():
        Cluster.objects.select_for_update(of=("self",), no_key=True).filter(pk=rate.cluster_id).first()
        rate = Rate.objects.select_for_update(of=("self",), no_key=True).select_related("cluster").get(pk=rate.pk)
        _refuse_if_used(rate, "changed")
        before = _rate_state(rate)
        for field in ("price_per_gpu_hour", "currency", "valid_from", "note"):
            if field in changes:
                setattr(rate, field, changes[field])
        rate.currency = rate.currency.upper()
        _check_new_rate(
            cluster=rate.cluster,
            gpu_type=rate.gpu_type,
            currency=rate.currency,
            valid_from=rate.valid_from,
            exclude_id=rate.pk,
        )
        rate.full_clean()
        rate.save()
        audit_record(
            actor=actor, action="rate.update", target=rate, tenant=None, before=before, after=_rate_state(rate)
        )
        _forget_cached_rates(rate.cluster_id)
    return rate


def rate_delete(*, actor: Actor, rate: Rate) -> None:
    with transaction.atomic():
        rate = Rate.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=rate.pk)  # deleted
        _refuse_if_used(rate, "deleted")
        audit_record(actor=actor, action="rate.delete", target=rate, tenant=None, before=_rate_state(rate), after=None)
        _forget_cached_rates(rate.cluster_id)
        rate.delete()
