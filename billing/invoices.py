"""Monthly invoices: built from usage shares in one grouped query, drafts while the month runs, final after.

A draft's lines are replaced whenever usage reaches its month (the import rebuilds the drafts it touches), so
a draft always equals the sum of its usage. Finalising rebuilds once more, then freezes the invoice: its lines
and total are never written again, and usage that arrives for its month later goes on the next open invoice.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from billing.models import Invoice, InvoiceLine, InvoiceState, UsageShare, first_of_month
from billing.money import amount_billed, amount_due
from billing.selectors import usage_per_line
from billing.usage import billing_lock
from jobs.models import DatabaseRestore
from portal.errors import Conflict
from quotas.models import period_start
from tenants.services import Actor, audit_record

logger = logging.getLogger(__name__)


def next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def month_closes_at(month: date) -> datetime:
    return period_start(next_month(month))


def invoices_build(*, month: date, tenant_ids: Collection[int] | None = None, now: datetime | None = None) -> int:
    """Create or rebuild the draft invoices of `month` (of some tenants, or all) from their usage shares.

    Final invoices are left as they are. The number of queries does not depend on the number of usage
    records: one grouped query reads them all. Returns the number of drafts written.
    """
    now = now or timezone.now()
    month = first_of_month(month)
    with transaction.atomic():
        billing_lock()
        shares = UsageShare.objects.filter(billed_month=month)
        invoices = Invoice.objects.filter(month=month)
        if tenant_ids is not None:
            shares = shares.filter(tenant_id__in=tenant_ids)
            invoices = invoices.filter(tenant_id__in=tenant_ids)
        groups = list(usage_per_line(shares).annotate(job_count=Count("usage_record_id", distinct=True)))
        existing = {
            (invoice.tenant_id, invoice.currency): invoice
            for invoice in invoices.select_for_update(of=("self",), no_key=True)
        }
        missing = {(group["tenant_id"], group["currency"]) for group in groups} - existing.keys()
        created = Invoice.objects.bulk_create(
            [
                Invoice(tenant_id=tenant_id, month=month, currency=currency, built_at=now)
                for tenant_id, currency in missing
            ]
        )
        existing.update({(invoice.tenant_id, invoice.currency): invoice for invoice in created})
        drafts = {key: invoice for key, invoice in existing.items() if invoice.state == InvoiceState.DRAFT}

        InvoiceLine.objects.filter(invoice__in=list(drafts.values())).delete()
        lines: list[InvoiceLine] = []
        gpu_seconds: dict[tuple[int, str], int] = defaultdict(int)
        line_costs: dict[tuple[int, str], list[Decimal]] = defaultdict(list)
        for group in groups:
            key = (group["tenant_id"], group["currency"])
            invoice = drafts.get(key)
            if invoice is None:
                continue
            amount = amount_due(amount=group["cost"], currency=invoice.currency)
            lines.append(
                InvoiceLine(
                    invoice=invoice,
                    project_id=group["project_id"],
                    cluster_id=group["cluster_id"],
                    gpu_type=group["gpu_type"],
                    rate_id=group["rate_id"],
                    price_per_gpu_hour=group["price_per_gpu_hour"],
                    usage_month=group["usage_month"],
                    job_count=group["job_count"],
                    gpu_seconds=group["seconds"],
                    amount=amount,
                )
            )
            gpu_seconds[key] += group["seconds"]
            line_costs[key].append(group["cost"])
        InvoiceLine.objects.bulk_create(lines, batch_size=5000)
        for key, invoice in drafts.items():
            invoice.gpu_seconds = gpu_seconds.get(key, 0)
            # The sum of the lines' amounts, as spend computes it for the same usage.
            invoice.total = amount_billed(line_costs=line_costs.get(key, []), currency=invoice.currency)
            invoice.built_at = now
        Invoice.objects.bulk_update(list(drafts.values()), ["gpu_seconds", "total", "built_at"], batch_size=1000)
    return len(drafts)


def invoice_number_for(invoice: Invoice) -> str:
    return f"INV-{invoice.month:%Y%m}-{invoice.pk:06d}"


def invoice_finalise(*, actor: Actor, invoice: Invoice, now: datetime | None = None) -> Invoice:
    """Freeze a closed month's invoice, after bringing it up to date with the usage received so far."""
    now = now or timezone.now()
    closes_at = month_closes_at(invoice.month)
    if now < closes_at:
        raise Conflict(
            f"The invoice of {invoice.month:%Y-%m} is a draft until the month has ended; it can be finalised from "
            f"{closes_at:%Y-%m-%d %H:%M} UTC.",
            code="month_running",
        )
    with transaction.atomic():
        billing_lock()
        locked = (
            Invoice.objects.select_for_update(of=("self",), no_key=True).select_related("tenant").get(pk=invoice.pk)
        )
        if locked.is_final:
            raise Conflict(
                f"Invoice {locked.number} is already final and cannot change; usage that arrives for its month is "
                "billed on the next month's invoice.",
                code="invoice_final",
            )
        invoices_build(month=locked.month, tenant_ids=[locked.tenant_id], now=now)
        locked.refresh_from_db()
        locked.state = InvoiceState.FINAL
        locked.number = invoice_number_for(locked)
        locked.finalised_at = now
        locked.finalised_by = actor if actor is not None and actor.is_authenticated else None
        locked.save(update_fields=["state", "number", "finalised_at", "finalised_by"])
        audit_record(
            actor=actor,
            action="invoice.finalise",
            target=locked,
            tenant=locked.tenant,
            before={"state": InvoiceState.DRAFT},
            after={"state": InvoiceState.FINAL, "number": locked.number, "total": str(locked.total)},
        )
    return locked


def invoice_finalisation_due_at(month: date) -> datetime:
    """When the periodic task finalises a draft of `month`."""
    return month_closes_at(month) + timedelta(hours=settings.BILLING_FINALISE_AFTER_HOURS)


def invoices_held_after_restore() -> QuerySet[Invoice]:
    """Drafts whose finalisation was due before a restore that no operator has reviewed yet was noticed: the
    lost copy of the database may have finalised one of them, numbered and sent it, after the backup was taken.
    The periodic task leaves them alone (`manage.py restore_check` lists them), so that none is finalised a
    second time, perhaps with other lines, without an operator comparing it with what was sent."""
    unreviewed = DatabaseRestore.objects.filter(reviewed_at__isnull=True).order_by("-detected_at").first()
    if unreviewed is None:
        return Invoice.objects.none()
    grace = timedelta(hours=settings.BILLING_FINALISE_AFTER_HOURS)
    latest_month = first_of_month((unreviewed.detected_at - grace).date())
    drafts = Invoice.objects.filter(state=InvoiceState.DRAFT, month__lt=latest_month).select_related("tenant")
    held = [invoice.pk for invoice in drafts if invoice_finalisation_due_at(invoice.month) <= unreviewed.detected_at]
    return Invoice.objects.filter(pk__in=held).select_related("tenant").order_by("month", "pk")


def invoices_finalise_due(*, now: datetime | None = None) -> int:
    """Finalise every draft whose month closed more than BILLING_FINALISE_AFTER_HOURS ago, except those held
    after a restore (`invoices_held_after_restore`)."""
    now = now or timezone.now()
    grace = timedelta(hours=settings.BILLING_FINALISE_AFTER_HOURS)
    latest_month = first_of_month((now - grace).date())
    held = set(invoices_held_after_restore().values_list("pk", flat=True))
    if held:
        logger.warning(
            "%d draft invoices are not finalised: a restore of the database may have lost their finalisation; "
            "see manage.py restore_check",
            len(held),
        )
    finalised = 0
    for invoice in Invoice.objects.filter(state=InvoiceState.DRAFT, month__lt=latest_month).order_by("month", "pk"):
        if invoice.pk not in held and now - month_closes_at(invoice.month) >= grace:
            invoice_finalise(actor=None, invoice=invoice, now=now)
            finalised += 1
    return finalised
