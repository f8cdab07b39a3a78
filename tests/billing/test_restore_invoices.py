"""After a restore of the database, drafts whose finalisation the lost copy may have done (numbered and sent)
are held until an operator has reviewed them; `manage.py restore_check` lists them and what was rebuilt."""

from __future__ import annotations

import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.invoices import invoices_finalise_due
from billing.models import Invoice, InvoiceState
from billing.rates import rate_create
from billing.usage import usage_import
from jobs.database_restores import database_restore_declare
from jobs.models import RECOVERED_DETAIL, DatabaseRestore, JobState, JobTransition
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import make_matrix_cluster, make_project, make_tenant

pytestmark = pytest.mark.django_db


def _restore_check(*args: str) -> str:
    out = io.StringIO()
    call_command("restore_check", *args, stdout=out)
    return out.getvalue()


def test_a_draft_due_before_an_unreviewed_restore_is_held_and_listed_until_reviewed() -> None:
    cluster = make_matrix_cluster()
    tenant = make_tenant()
    project = make_project(tenant, "vision")
    month = previous_month(timezone.now().date().replace(day=1))
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2.5"),
        currency="EUR",
        valid_from=at(month),
    )
    job = charged_job(project, cluster, start=at(month.replace(day=2), 9), end=at(month.replace(day=2), 10))
    JobTransition.objects.create(
        job=job, to_state=JobState.PENDING, detail=f"{RECOVERED_DETAIL}: Slurm job {job.slurm_job_id}"
    )
    usage_import()
    invoice = Invoice.objects.get(tenant=tenant, month=month)
    assert invoice.state == InvoiceState.DRAFT
    database_restore_declare(backup_after=timezone.now() - timedelta(hours=1), declared_by="operator")

    assert invoices_finalise_due() == 0
    listing = _restore_check()
    assert "Restore 1: declared by operator" in listing.replace(
        f"Restore {DatabaseRestore.objects.get().pk}:", "Restore 1:"
    )
    assert f"HELD: draft invoice {invoice.pk} of {tenant.slug} for {month:%Y-%m} (2.50 EUR)" in listing
    assert f"would be INV-{month:%Y%m}-{invoice.pk:06d}" in listing
    assert f"Rebuilt jobs on {cluster.name} in account {project.slurm_account}: 1, 1 charged, 1 priced" in listing
    invoice.refresh_from_db()
    assert (invoice.state, invoice.number) == (InvoiceState.DRAFT, "")

    reviewed = _restore_check("--reviewed", "--by", "carol")
    assert "1 restore(s) marked reviewed by carol." in reviewed
    assert "HELD" not in reviewed
    assert invoices_finalise_due() == 1
    invoice.refresh_from_db()
    assert (invoice.state, invoice.number) == (InvoiceState.FINAL, f"INV-{month:%Y%m}-{invoice.pk:06d}")


def test_without_a_restore_the_check_says_so_and_nothing_is_held() -> None:
    listing = _restore_check()
    assert "No restore of the database was noticed or declared." in listing
    assert "No job was rebuilt from Slurm." in listing


def test_a_declared_time_that_is_not_one_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="--declare-backup-after 'yesterday' is not a time"):
        _restore_check("--declare-backup-after", "yesterday")
    assert not DatabaseRestore.objects.exists()
