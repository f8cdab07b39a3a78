"""The billing pages through the test client: a month's spend per day, per project and per user with exact
amounts from priced usage, the roles the spend API allows (members 403, outsiders 404), invoices and their
downloads, and the empty state."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Invoice
from billing.rates import rate_create
from billing.usage import usage_import
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


class World:
    """Tenant acme: last month 2 GPU-hours in vision (ann) and 3 in speech (bob) at 2 EUR, i.e. 4.00 + 6.00."""

    def __init__(self) -> None:
        self.month = previous_month(timezone.now().date().replace(day=1))
        cluster = make_matrix_cluster("billcluster")
        rate_create(
            actor=None,
            cluster=cluster,
            gpu_type="",
            price_per_gpu_hour=Decimal(2),
            currency="EUR",
            valid_from=at(self.month),
        )
        self.tenant_admin = make_user("tadmin")
        self.acme = make_tenant("acme", admin=self.tenant_admin)
        self.vision = make_project(self.acme, "vision")
        self.speech = make_project(self.acme, "speech")
        self.ann, self.bob, self.manager = make_user("ann"), make_user("bob"), make_user("mgr")
        add_project_member(self.vision, self.ann)
        add_project_member(self.speech, self.bob)
        add_project_member(self.vision, self.manager, "manager")
        self.outsider = make_user("olga")
        make_tenant("other", admin=self.outsider)
        day = self.month + timedelta(days=2)
        charged_job(self.vision, cluster, start=at(day, 10), end=at(day, 12), user=self.ann)
        later = self.month + timedelta(days=4)
        charged_job(self.speech, cluster, start=at(later, 8), end=at(later, 9), gpus=3, user=self.bob)
        usage_import()
        self.invoice = Invoice.objects.get(tenant=self.acme)


@pytest.fixture
def world() -> World:
    return World()


def _get(user: Any, url: str) -> Any:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client.get(url)


def _chart(html: str, chart_id: str) -> dict[str, Any]:
    found = re.search(rf'<script id="{chart_id}" type="application/json">(.*?)</script>', html, re.S)
    assert found, f"no chart {chart_id}"
    return dict(json.loads(found.group(1)))


def test_a_tenant_admin_sees_the_months_spend_per_day_project_and_user(world: World) -> None:
    response = _get(world.tenant_admin, f"/billing/?month={world.month:%Y-%m}")

    assert response.status_code == 200
    html = response.content.decode()
    assert '<div class="stat" id="spend-total">10.00 EUR</div>' in html
    assert '<option value="acme" selected>Tenant acme (all its projects)</option>' in html
    speech = '<th scope="row">acme/speech</th><td class="number">3.00</td><td class="number">6.00</td>'
    vision = '<th scope="row">acme/vision</th><td class="number">2.00</td><td class="number">4.00</td>'
    assert html.index(speech) < html.index(vision)  # most spent first
    assert re.search(
        r'<th scope="row">bob</th>\s*<td class="number">1</td><td class="number">3.00</td><td class="number">6.00</td>',
        html,
    )
    assert re.search(
        r'<th scope="row">ann</th>\s*<td class="number">1</td><td class="number">2.00</td><td class="number">4.00</td>',
        html,
    )
    chart = _chart(html, "spend-per-day")
    assert chart["kind"] == "bars"
    values = chart["series"][0]["values"]
    assert len(values) == len(chart["x"]) >= 28
    assert (values[2], values[4], sum(values)) == (4.0, 6.0, 10.0)
    # The days with spend as a table beside the chart.
    assert (
        f'<th scope="row">{world.month + timedelta(days=2):%Y-%m-%d}</th>'
        '<td class="number">2.00</td><td class="number">4.00</td>' in html
    )
    # The invoice, a draft with its total, links to its page.
    assert f'<a href="/billing/invoices/{world.invoice.pk}/">{world.month:%Y-%m}</a>' in html
    assert '<span class="badge badge-draft">Draft</span>' in html
    assert "10.00 EUR</td>" in html


def test_this_month_without_usage_shows_the_empty_state(world: World) -> None:
    html = _get(world.tenant_admin, "/billing/").content.decode()

    assert "No usage priced yet this month." in html
    assert '<div class="stat" id="spend-total">0.00 </div>' in html
    assert 'data-chart="spend-per-day"' not in html


def test_a_project_manager_sees_the_projects_spend_only(world: World) -> None:
    response = _get(world.manager, f"/billing/?month={world.month:%Y-%m}")

    html = response.content.decode()
    assert response.status_code == 200
    assert '<option value="acme/vision" selected>Project acme/vision</option>' in html
    assert '<div class="stat" id="spend-total">4.00 EUR</div>' in html
    assert "acme/speech" not in html
    assert "Invoices go to the tenant's admins" in html
    # The whole tenant's spend is for its admins.
    assert _get(world.manager, "/billing/?scope=acme").status_code == 403


def test_members_get_403_and_outsiders_404(world: World) -> None:
    assert _get(world.ann, "/billing/").status_code == 403
    assert _get(world.ann, "/billing/?scope=acme/vision").status_code == 403
    assert _get(world.outsider, "/billing/?scope=acme").status_code == 404
    assert _get(world.outsider, "/billing/?scope=acme/vision").status_code == 404
    assert _get(None, "/billing/").status_code == 302
    # The outsider's own tenant, without a trace of acme.
    html = _get(world.outsider, "/billing/").content.decode()
    assert '<option value="other" selected>Tenant other (all its projects)</option>' in html
    assert "acme" not in html


def test_a_month_that_is_not_one_is_explained(world: World) -> None:
    html = _get(world.tenant_admin, "/billing/?month=2026-13").content.decode()

    assert "&#x27;2026-13&#x27; is not a month; pick one as YYYY-MM" in html
    assert 'class="form-errors" role="alert"' in html


def test_the_invoice_page_lists_its_lines_and_links_its_csv_and_printable_copy(world: World) -> None:
    url = f"/billing/invoices/{world.invoice.pk}/"

    response = _get(world.tenant_admin, url)

    html = response.content.decode()
    assert response.status_code == 200
    assert f'<a class="button" href="/api/v1/invoices/{world.invoice.pk}/csv/" download>Download CSV</a>' in html
    assert f'href="/billing/invoices/{world.invoice.pk}/print/">Printable / PDF</a>' in html
    assert '<strong id="invoice-total">10.00 EUR</strong>' in html
    assert re.search(r'<th scope="row">acme/speech</th><td>billcluster</td><td>h100</td>', html)
    assert '<td class="number">6.00 EUR</td>' in html
    assert _get(world.manager, url).status_code == 404
    assert _get(world.ann, url).status_code == 404
    assert _get(world.outsider, url).status_code == 404
    csv = _get(world.tenant_admin, f"/api/v1/invoices/{world.invoice.pk}/csv/").content.decode()
    assert (
        csv.splitlines()[-1]
        == f"draft-{world.invoice.pk},acme,{world.month:%Y-%m},draft,TOTAL,,,,,18000,5.00,,EUR,10.00"
    )
