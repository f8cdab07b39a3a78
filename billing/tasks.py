"""Celery tasks for billing: thin wrappers that call one service. Each is idempotent."""

from __future__ import annotations

import logging

from celery import shared_task

from billing import efficiency, invoices, job_end_notices, reconciliation, usage

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def usage_import() -> None:
    """Price the jobs charged since the last run and bring the affected draft invoices up to date; then tell
    those who asked that their jobs ended, now that the cost of those is known."""
    result = usage.usage_import()
    if result.imported or result.unpriced:
        logger.info("usage import: %s", result)
    told = job_end_notices.job_end_notices_send()
    if told:
        logger.info("told %d watchers that their jobs ended", told)
    told = job_end_notices.pipeline_end_notices_send()
    if told:
        logger.info("told %d watchers that their pipelines ended", told)


@shared_task(ignore_result=True, soft_time_limit=540, time_limit=600)
def efficiency_sums_add() -> None:
    """Add the jobs that ended and settled since the last run to their month's efficiency sums: at most 60 batches
    of 5,000 (a few minutes while a database upgraded with millions of measured jobs catches up), the rest next
    time."""
    added = efficiency.efficiency_sums_add(max_batches=60)
    if added:
        logger.info("added %d jobs to the efficiency sums", added)


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def invoices_finalise_due() -> None:
    """Finalise the draft invoices of months that closed more than BILLING_FINALISE_AFTER_HOURS ago."""
    finalised = invoices.invoices_finalise_due()
    if finalised:
        logger.info("finalised %d invoices", finalised)


@shared_task(ignore_result=True, soft_time_limit=540, time_limit=600)
def reconciliation_report_run(report_id: int) -> None:
    """Compare the portal's usage of the report's cluster and period with Slurm's accounting."""
    reconciliation.reconciliation_report_run(report_id=report_id)
