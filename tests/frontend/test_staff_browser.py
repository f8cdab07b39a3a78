"""In a real browser on the real server: a portal admin approves a quota request in part through the decision
form, and a tenant admin downloads an invoice as CSV from its page; at phone width nothing overflows."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.models import Invoice
from billing.rates import rate_create
from billing.usage import usage_import
from quotas.models import QuotaRequestState
from quotas.requests import quota_request_create
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_an_admin_approves_in_part_and_a_tenant_admin_downloads_the_invoice_csv(
    open_page: Any, screenshot: Any
) -> None:
    staff = make_user("root", is_staff=True)
    tenant_admin = make_user("tadmin")
    acme = make_tenant("acme", admin=tenant_admin)
    vision = make_project(acme, "vision")
    ann = make_user("ann")
    add_project_member(vision, ann)
    cluster = make_matrix_cluster("browsercluster")
    allocation = grant_allocation(vision, cluster, 100)
    request = quota_request_create(actor=ann, allocation=allocation, gpu_hours=Decimal(20), justification="Ablations")
    month = previous_month(timezone.now().date().replace(day=1))
    rate_create(
        actor=None, cluster=cluster, gpu_type="", price_per_gpu_hour=Decimal(2), currency="EUR", valid_from=at(month)
    )
    day = month + timedelta(days=2)
    charged_job(vision, cluster, start=at(day, 10), end=at(day, 13), user=ann)
    usage_import()
    invoice = Invoice.objects.get(tenant=acme)

    page = open_page(staff)
    page.goto("/requests/")
    screenshot(page, "queue")
    page.get_by_role("link", name=f"Decide #{request.pk}").click()
    page.get_by_label("Approve in part").check()
    page.get_by_label("GPU-hours to approve").fill("7.5")
    page.get_by_role("button", name="Record the decision").click()
    page.wait_for_url("**/requests/")
    message = page.get_by_role("status")
    assert message.inner_text() == (
        f"Request {request.pk} approved in part: 7.5 of 20.0 GPU-hours granted to acme/vision; ann has been told."
    )
    screenshot(page, "approved")
    request.refresh_from_db()
    allocation.refresh_from_db()
    assert (request.state, request.granted_gpu_seconds) == (QuotaRequestState.PARTIALLY_APPROVED, 27000)
    assert allocation.granted_gpu_seconds == 100 * 3600 + 27000

    page = open_page(tenant_admin, viewport="phone")
    page.goto(f"/billing/?month={month:%Y-%m}")
    assert page.locator("#spend-total").inner_text() == "6.00 EUR"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "billing-phone")
    page.get_by_role("link", name=f"{month:%Y-%m}").click()
    page.wait_for_url(f"**/billing/invoices/{invoice.pk}/")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "invoice-phone")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download CSV").click()
    download = download_info.value
    assert download.suggested_filename == f"draft-acme-{month:%Y-%m}-EUR.csv"
    with open(download.path(), encoding="utf-8") as csv_file:
        rows = csv_file.read().splitlines()
    assert rows[0].startswith("invoice,tenant,month,state,project,cluster,gpu_type")
    assert rows[1] == (
        f"draft-{invoice.pk},acme,{month:%Y-%m},draft,acme/vision,browsercluster,h100,{month:%Y-%m},1,10800,3.00,2.0000,EUR,6.00"
    )
    assert rows[2] == f"draft-{invoice.pk},acme,{month:%Y-%m},draft,TOTAL,,,,,10800,3.00,,EUR,6.00"
