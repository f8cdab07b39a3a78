"""The rates and invoices API: prices never change under priced usage; invoices are their tenant admins' only."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import Invoice, InvoiceState, Rate
from billing.rates import rate_create
from billing.usage import usage_import
from tenants.models import AuditEvent
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


def _api(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


@pytest.fixture
def billed() -> dict[str, Any]:
    """Two tenants with usage last month; acme's invoice has two projects' lines."""
    cluster = make_matrix_cluster()
    staff, acme_admin, globex_admin = make_user(is_staff=True), make_user(), make_user()
    acme, globex = make_tenant(admin=acme_admin), make_tenant(admin=globex_admin)
    vision, nlp, genomics = make_project(acme, "vision"), make_project(acme, "nlp"), make_project(globex, "genomics")
    manager = make_user()
    add_project_member(vision, manager, "manager")
    month = previous_month(timezone.now().date().replace(day=1))
    rate = rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2.5"),
        currency="EUR",
        valid_from=at(month),
    )
    charged_job(vision, cluster, start=at(month.replace(day=2), 9), end=at(month.replace(day=2), 10), gpus=2)
    charged_job(vision, cluster, start=at(month.replace(day=3), 9), end=at(month.replace(day=3), 9, 30), gpus=1)
    charged_job(nlp, cluster, start=at(month.replace(day=4), 9), end=at(month.replace(day=4), 9, 12), gpus=4)
    charged_job(genomics, cluster, start=at(month.replace(day=5), 9), end=at(month.replace(day=5), 10))
    usage_import()
    return {
        "cluster": cluster,
        "rate": rate,
        "staff": staff,
        "acme_admin": acme_admin,
        "globex_admin": globex_admin,
        "manager": manager,
        "month": month,
        "acme": Invoice.objects.get(tenant=acme, month=month),
        "globex": Invoice.objects.get(tenant=globex, month=month),
    }


def test_a_tenant_admin_reads_their_invoice_with_its_lines(billed: dict[str, Any]) -> None:
    invoice = billed["acme"]
    response = _api(billed["acme_admin"]).get(f"/api/v1/invoices/{invoice.pk}/")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["state"], body["currency"], body["month"], body["total"]) == (
        "draft",
        "EUR",
        f"{billed['month']:%Y-%m}",
        "8.25",
    )
    assert [
        (line["project"].split("/")[1], line["gpu_hours"], line["jobs"], line["amount"]) for line in body["lines"]
    ] == [
        ("nlp", "0.80", 1, "2.00"),
        ("vision", "2.50", 2, "6.25"),
    ]
    listed = _api(billed["acme_admin"]).get("/api/v1/invoices/").json()
    assert [row["id"] for row in listed["results"]] == [invoice.pk]


def test_invoices_are_filtered_by_month_and_an_impossible_month_is_refused(billed: dict[str, Any]) -> None:
    api = _api(billed["acme_admin"])
    listed = api.get("/api/v1/invoices/", {"month": f"{billed['month']:%Y-%m}"}).json()
    assert [row["id"] for row in listed["results"]] == [billed["acme"].pk]
    for month in ("0000-00", "2026-13", "2026-1x"):
        response = api.get("/api/v1/invoices/", {"month": month})
        assert response.status_code == 400, month
        assert response.json() == {
            "code": "invalid",
            "message": "month: Give a month as YYYY-MM, e.g. 2026-11.",
            "fields": {"month": ["Give a month as YYYY-MM, e.g. 2026-11."]},
        }


@pytest.mark.parametrize("who", ["globex_admin", "manager"])
def test_nobody_but_the_tenants_admins_reads_its_invoice(billed: dict[str, Any], who: str) -> None:
    invoice = billed["acme"]
    api = _api(billed[who])
    for path in (f"/api/v1/invoices/{invoice.pk}/", f"/api/v1/invoices/{invoice.pk}/csv/"):
        response = api.get(path)
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
        assert "8.25" not in response.content.decode()
        assert invoice.tenant.slug not in response.content.decode()
    # The same answer as for an invoice that does not exist.
    missing = api.get("/api/v1/invoices/999999/").json()
    assert (
        missing["message"].replace("999999", str(invoice.pk))
        == api.get(f"/api/v1/invoices/{invoice.pk}/").json()["message"]
    )
    assert invoice.pk not in [row["id"] for row in api.get("/api/v1/invoices/").json()["results"]]


def test_the_csv_export_has_every_line_and_the_total(billed: dict[str, Any]) -> None:
    invoice = billed["acme"]
    response = _api(billed["acme_admin"]).get(f"/api/v1/invoices/{invoice.pk}/csv/")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [
        (row["project"], row["gpu_type"], row["gpu_seconds"], row["price_per_gpu_hour"], row["amount"]) for row in rows
    ] == [
        (f"{invoice.tenant.slug}/nlp", "h100", "2880", "2.5000", "2.00"),
        (f"{invoice.tenant.slug}/vision", "h100", "9000", "2.5000", "6.25"),
        ("TOTAL", "", "11880", "", "8.25"),
    ]


def test_finalising_is_for_portal_admins_and_freezes_the_invoice(billed: dict[str, Any]) -> None:
    invoice = billed["acme"]
    refused = _api(billed["acme_admin"]).post(f"/api/v1/invoices/{invoice.pk}/finalise/")
    assert refused.status_code == 403
    invoice.refresh_from_db()
    assert invoice.state == InvoiceState.DRAFT

    done = _api(billed["staff"]).post(f"/api/v1/invoices/{invoice.pk}/finalise/")
    assert done.status_code == 200, done.json()
    assert (done.json()["state"], done.json()["number"], done.json()["total"]) == (
        "final",
        f"INV-{billed['month']:%Y%m}-{invoice.pk:06d}",
        "8.25",
    )
    again = _api(billed["staff"]).post(f"/api/v1/invoices/{invoice.pk}/finalise/")
    assert (again.status_code, again.json()["code"]) == (409, "invoice_final")
    assert AuditEvent.objects.filter(action="invoice.finalise", target_id=str(invoice.pk)).count() == 1


def test_a_running_months_invoice_cannot_be_finalised(billed: dict[str, Any]) -> None:
    today = timezone.now().date()
    project = make_project(billed["acme"].tenant)
    start = at(today) if timezone.now() - at(today) > timedelta(minutes=5) else at(today - timedelta(days=1), 23)
    charged_job(project, billed["cluster"], start=start, end=start + timedelta(minutes=2))
    usage_import()
    current = Invoice.objects.get(tenant=billed["acme"].tenant, month=today.replace(day=1))
    response = _api(billed["staff"]).post(f"/api/v1/invoices/{current.pk}/finalise/")
    if start.month == today.month:
        assert (response.status_code, response.json()["code"]) == (409, "month_running")
        assert "can be finalised from" in response.json()["message"]
        current.refresh_from_db()
        assert current.state == InvoiceState.DRAFT


def test_rates_are_read_by_everyone_and_set_by_portal_admins(billed: dict[str, Any]) -> None:
    listed = _api(billed["manager"]).get("/api/v1/rates/?cluster=matrixcluster").json()
    assert [(row["gpu_type"], row["price_per_gpu_hour"], row["currency"]) for row in listed["results"]] == [
        ("h100", "2.5000", "EUR")
    ]
    body = {
        "cluster": "matrixcluster",
        "gpu_type": "h100",
        "price_per_gpu_hour": "3.1",
        "currency": "eur",
        "valid_from": "2099-01-01",
    }
    refused = _api(billed["acme_admin"]).post("/api/v1/rates/", body, format="json")
    assert refused.status_code == 403
    assert Rate.objects.count() == 1
    created = _api(billed["staff"]).post("/api/v1/rates/", body, format="json")
    assert created.status_code == 201, created.json()
    assert (created.json()["currency"], created.json()["valid_from"]) == ("EUR", "2099-01-01T00:00:00Z")


def test_a_rate_that_priced_usage_never_changes(billed: dict[str, Any]) -> None:
    rate = billed["rate"]
    api = _api(billed["staff"])
    for response in (
        api.patch(f"/api/v1/rates/{rate.pk}/", {"price_per_gpu_hour": "9"}, format="json"),
        api.delete(f"/api/v1/rates/{rate.pk}/"),
    ):
        assert response.status_code == 409
        assert response.json()["code"] == "rate_in_use"
        assert "create a new rate valid from the moment the new price applies" in response.json()["message"]
    rate.refresh_from_db()
    assert rate.price_per_gpu_hour == Decimal("2.5000")

    # Nor may a new rate start before usage its type has already been billed for.
    before = billed["month"].replace(day=3).isoformat()
    overlap = api.post(
        "/api/v1/rates/",
        {
            "cluster": "matrixcluster",
            "gpu_type": "h100",
            "price_per_gpu_hour": "1",
            "currency": "EUR",
            "valid_from": before,
        },
        format="json",
    )
    assert (overlap.status_code, overlap.json()["code"]) == (409, "rate_overlaps_priced_usage")
    assert Rate.objects.count() == 1


def test_an_unused_rate_can_be_corrected_and_bad_input_says_how_to_fix_it(billed: dict[str, Any]) -> None:
    api = _api(billed["staff"])
    future = api.post(
        "/api/v1/rates/",
        {
            "cluster": "matrixcluster",
            "gpu_type": "",
            "price_per_gpu_hour": "1.1",
            "currency": "EUR",
            "valid_from": "2099-02-01",
        },
        format="json",
    ).json()
    fixed = api.patch(f"/api/v1/rates/{future['id']}/", {"price_per_gpu_hour": "1.2"}, format="json")
    assert (fixed.status_code, fixed.json()["price_per_gpu_hour"]) == (200, "1.2000")

    cases = [
        ({"currency": "USD"}, "currency", "a cluster prices in one currency"),
        ({"valid_from": "next tuesday"}, "valid_from", "Give a date"),
        ({"cluster": "nowhere"}, "cluster", "There is no cluster 'nowhere'"),
        ({"gpu_type": "tpu"}, "gpu_type", "has no GPUs of type 'tpu'"),
        ({"price_per_gpu_hour": "-1"}, "price_per_gpu_hour", "greater than or equal to 0"),
    ]
    for change, field, words in cases:
        body = {
            "cluster": "matrixcluster",
            "gpu_type": "h100",
            "price_per_gpu_hour": "2",
            "currency": "EUR",
            "valid_from": "2099-03-01",
            **change,
        }
        response = api.post("/api/v1/rates/", body, format="json")
        assert response.status_code == 400, (change, response.json())
        assert response.json()["code"] == "invalid"
        assert words in " ".join(response.json()["fields"][field]), response.json()
    assert Rate.objects.count() == 2


def test_the_printable_invoice_is_a_page_for_the_tenants_admins(billed: dict[str, Any], client: Any) -> None:
    invoice = billed["acme"]
    client.force_login(billed["acme_admin"])
    page = client.get(f"/billing/invoices/{invoice.pk}/print/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Draft invoice" in text
    assert "8.25 EUR" in text
    assert "Download CSV" in text
    assert f"{invoice.tenant.slug}/vision" in text
    assert "6.25 EUR" in text
    client.force_login(billed["globex_admin"])
    denied = client.get(f"/billing/invoices/{invoice.pk}/print/")
    assert denied.status_code == 404
    assert "8.25" not in denied.content.decode()


def test_a_rate_from_a_moment_with_any_offset_is_stored_in_utc(billed: dict[str, Any]) -> None:
    api = _api(billed["staff"])
    body = {"cluster": "matrixcluster", "gpu_type": "h100", "price_per_gpu_hour": "3", "currency": "EUR"}

    # +16:00 is valid for Python but out of range for PostgreSQL: it used to be a 500.
    created = api.post("/api/v1/rates/", {**body, "valid_from": "2099-03-01T00:00:00+16:00"}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["valid_from"] == "2099-02-28T08:00:00Z"

    too_early = api.post("/api/v1/rates/", {**body, "valid_from": "0001-01-01T00:00:00+01:00"}, format="json")
    assert too_early.status_code == 400
    assert too_early.json()["fields"] == {
        "valid_from": ["Give a date (2026-12-01, meaning midnight UTC) or an ISO 8601 date-time."]
    }
