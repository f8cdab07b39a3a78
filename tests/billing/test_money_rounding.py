"""One rounding rule in every view: the spend of a month, its projects and users, and a job's cost say to the cent
what the invoice for the same usage says, and the invoice's lines add up to its total.

At 3.60 EUR per GPU-hour a GPU-second costs exactly 0.001 EUR, so 34 and 41 GPU-seconds cost 0.034 and 0.041:
rounded per invoice line that is 0.03 + 0.04 = 0.07, while the exact sum 0.075 rounds to 0.08.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import Invoice
from billing.rates import rate_create
from billing.usage import usage_import
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db

PRICE = Decimal("3.60")  # 0.001 EUR per GPU-second


def _api(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


class Usage:
    """Tenant acme's usage last month, 34 and 41 GPU-seconds on one day on two different invoice lines: of two
    projects, of one project's two GPU types (each type has its own rate, at the same price), or of one job that
    ran across a change of rate (its shares go on the lines of their own rates)."""

    def __init__(self, *, split_by: str) -> None:
        self.month = previous_month(timezone.now().date().replace(day=1))
        self.day = self.month + timedelta(days=2)
        cluster = make_matrix_cluster("roundcluster")
        start = at(self.day, 10)
        for gpu_type, valid_from in (("h100", at(self.month)), ("a100", at(self.month))) + (
            (("h100", start + timedelta(seconds=34)),) if split_by == "rate" else ()
        ):
            rate_create(
                actor=None, cluster=cluster, gpu_type=gpu_type, price_per_gpu_hour=PRICE, currency="EUR",
                valid_from=valid_from,
            )  # fmt: skip
        self.admin = make_user("roundadmin")
        self.tenant = make_tenant("acme", admin=self.admin)
        vision = make_project(self.tenant, "vision")
        self.ann = make_user("ann")
        add_project_member(vision, self.ann)
        if split_by == "rate":
            end = start + timedelta(seconds=75)
            self.jobs = [charged_job(vision, cluster, start=start, end=end, gpu_type="h100", user=self.ann)]
        else:
            other_project, other_type = (make_project(self.tenant, "speech"), "h100") if split_by == "project" else (
                vision, "a100"
            )  # fmt: skip
            if other_project != vision:
                add_project_member(other_project, self.ann)
            end = at(self.day, 10, 5)
            self.jobs = [
                charged_job(vision, cluster, start=start, end=end, gpu_seconds=34, gpu_type="h100", user=self.ann),
                charged_job(
                    other_project, cluster, start=start, end=end, gpu_seconds=41, gpu_type=other_type, user=self.ann
                ),
            ]
        usage_import()
        self.invoice = Invoice.objects.get(tenant=self.tenant, month=self.month)

    @property
    def period(self) -> dict[str, str]:
        last_day = (self.month + timedelta(days=32)).replace(day=1) - timedelta(days=1)
        return {"start": f"{self.month}", "end": f"{last_day}"}


@pytest.fixture(params=["project", "gpu_type", "rate"])
def usage(request: pytest.FixtureRequest) -> Usage:
    return Usage(split_by=request.param)


def test_the_invoice_rounds_each_line_once_and_its_lines_add_up_to_its_total(usage: Usage) -> None:
    body = _api(usage.admin).get(f"/api/v1/invoices/{usage.invoice.pk}/").json()

    assert sorted(line["amount"] for line in body["lines"]) == ["0.03", "0.04"]
    assert body["total"] == "0.07"


def test_the_months_spend_equals_its_invoice_to_the_cent(usage: Usage) -> None:
    invoice_total = _api(usage.admin).get(f"/api/v1/invoices/{usage.invoice.pk}/").json()["total"]

    daily = _api(usage.admin).get("/api/v1/spend/daily/", {"tenant": "acme", **usage.period}).json()
    top = _api(usage.admin).get("/api/v1/spend/top/", {"tenant": "acme", **usage.period}).json()
    users = _api(usage.admin).get("/api/v1/spend/top/", {"tenant": "acme", "by": "user", **usage.period}).json()

    assert invoice_total == "0.07"
    assert daily["total"] == invoice_total
    assert [day["amount"] for day in daily["days"] if day["day"] == f"{usage.day}"] == [invoice_total]
    assert sum(Decimal(row["total"]) for row in daily["projects"]) == Decimal(invoice_total)
    assert sum(Decimal(row["amount"]) for row in top["results"]) == Decimal(invoice_total)
    assert [(row["user"], row["amount"], row["jobs"]) for row in users["results"]] == [("ann", "0.07", len(usage.jobs))]


def test_the_billing_page_shows_the_invoices_total(usage: Usage) -> None:
    client = Client()
    client.force_login(usage.admin)

    billing = client.get(f"/billing/?scope=acme&month={usage.month:%Y-%m}").content.decode()

    assert '<div class="stat" id="spend-total">0.07 EUR</div>' in billing
    assert '<td class="number">0.07 EUR</td>' in billing  # the invoice in the list beside it


def test_a_jobs_cost_is_what_the_invoice_says_for_it(usage: Usage) -> None:
    client = Client()
    client.force_login(usage.ann)
    # Each job alone on a line, or one job whose shares go on the lines of two rates.
    expected = ["0.03 EUR", "0.04 EUR"] if len(usage.jobs) == 2 else ["0.07 EUR"]

    pages = [client.get(f"/jobs/{job.pk}/").content.decode() for job in usage.jobs]

    for page, cost in zip(pages, expected, strict=True):
        assert f"<dt>Cost</dt><dd>{cost}</dd>" in page
