"""The admin workflow pages through the test client: deciding quota requests (in part, denied with a reason,
tenant admins for their own tenant only), allocations, rates, clusters, drift and reconciliation reports, each
for the roles that may use them and with the errors shown beside their fields."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Rate, ReconciliationReport, ReconciliationState
from billing.rates import rate_create
from billing.usage import usage_import
from clusters.models import SlurmDriftReport
from quotas.models import Allocation, QuotaRequestState
from quotas.requests import quota_request_create, tenant_pool_create
from tenants.models import Notification
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db

HOUR = 3600


class World:
    def __init__(self) -> None:
        self.staff = make_user("root", is_staff=True)
        self.cluster = make_matrix_cluster("staffcluster")
        self.tenant_admin = make_user("tadmin")
        self.acme = make_tenant("acme", admin=self.tenant_admin)
        self.vision = make_project(self.acme, "vision")
        self.ann = make_user("ann")
        add_project_member(self.vision, self.ann)
        self.allocation = grant_allocation(self.vision, self.cluster, 100)
        self.request = quota_request_create(
            actor=self.ann,
            allocation=self.allocation,
            gpu_hours=Decimal(10),
            justification="Training run for the paper",
        )
        self.outsider = make_user("olga")
        other = make_tenant("other", admin=self.outsider)
        lab = make_project(other, "lab")
        carl = make_user("carl")
        add_project_member(lab, carl)
        self.other_request = quota_request_create(
            actor=carl, allocation=grant_allocation(lab, self.cluster, 50), gpu_hours=Decimal(5), justification="more"
        )


@pytest.fixture
def world() -> World:
    return World()


def _client(user: Any) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _html(response: Any) -> str:
    return str(response.content.decode())


# The decision queue -------------------------------------------------------------------------------------


def test_the_queue_lists_the_pending_requests_each_decider_may_decide(world: World) -> None:
    staff_html = _html(_client(world.staff).get("/requests/"))
    assert f'<a href="/requests/{world.request.pk}/">Decide #{world.request.pk}</a>' in staff_html
    assert f'<a href="/requests/{world.other_request.pk}/">Decide #{world.other_request.pk}</a>' in staff_html

    admin_html = _html(_client(world.tenant_admin).get("/requests/"))
    assert f"Decide #{world.request.pk}" in admin_html
    assert f"Decide #{world.other_request.pk}" not in admin_html
    assert "Training run for the paper" in admin_html

    assert _client(world.ann).get("/requests/").status_code == 403
    assert _client(None).get("/requests/").status_code == 302


def test_the_request_page_shows_the_gauge_usage_and_justification(world: World) -> None:
    html = _html(_client(world.staff).get(f"/requests/{world.request.pk}/"))

    assert f"Request #{world.request.pk}: 10.0 GPU-hours for acme/vision" in html
    assert 'class="quota-gauge gauge-ok"' in html
    assert "<dt>Granted</dt><dd>100.0 GPU-hours</dd>" in html
    assert "Training run for the paper" in html
    assert '<input type="radio" name="decision" value="part"' in html


def test_approving_in_part_grants_exactly_that_many_hours_and_tells_the_requester(world: World) -> None:
    client = _client(world.staff)

    response = client.post(f"/requests/{world.request.pk}/", {"decision": "part", "gpu_hours": "4", "reason": ""})

    assert response.status_code == 302
    assert response["Location"] == "/requests/"
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 104 * HOUR
    world.request.refresh_from_db()
    assert (world.request.state, world.request.granted_gpu_seconds) == (
        QuotaRequestState.PARTIALLY_APPROVED,
        4 * HOUR,
    )
    notice = Notification.objects.get(user=world.ann, kind="quota.request_decided")
    assert notice.title == "acme/vision: your request was approved in part: 4.0 of 10.0 GPU-hours"
    html = _html(client.get("/requests/"))
    assert (
        f"Request {world.request.pk} approved in part: 4.0 of 10.0 GPU-hours granted to acme/vision; ann has been told."
        in html
    )
    assert f"Decide #{world.request.pk}" not in html


def test_denying_needs_a_reason_and_changes_nothing_without_one(world: World) -> None:
    response = _client(world.staff).post(f"/requests/{world.request.pk}/", {"decision": "deny", "reason": "  "})

    assert response.status_code == 400
    html = _html(response)
    assert '<div class="field has-error">' in html
    assert (
        '<p class="field-error" id="id_reason-error">Say why the request is denied; the requester reads it.</p>' in html
    )
    assert 'aria-invalid="true"' in html
    world.request.refresh_from_db()
    world.allocation.refresh_from_db()
    assert world.request.state == QuotaRequestState.PENDING
    assert world.allocation.granted_gpu_seconds == 100 * HOUR
    assert not Notification.objects.filter(kind="quota.request_decided").exists()

    response = _client(world.staff).post(f"/requests/{world.request.pk}/", {"decision": "deny", "reason": "No budget"})
    assert response.status_code == 302
    world.request.refresh_from_db()
    assert (world.request.state, world.request.decision_reason) == (QuotaRequestState.DENIED, "No budget")


def test_approving_in_part_needs_the_hours(world: World) -> None:
    response = _client(world.staff).post(f"/requests/{world.request.pk}/", {"decision": "part", "gpu_hours": ""})

    assert response.status_code == 400
    assert "Give the GPU-hours to approve in part, e.g. 5." in _html(response)


def test_a_tenant_admin_decides_for_their_own_tenant_only_from_its_pool(world: World) -> None:
    client = _client(world.tenant_admin)
    assert client.get(f"/requests/{world.other_request.pk}/").status_code == 404
    assert client.post(f"/requests/{world.other_request.pk}/", {"decision": "full"}).status_code == 404
    assert _client(world.ann).get(f"/requests/{world.request.pk}/").status_code == 403

    # Without a pool the approval is refused above the form, and nothing changes.
    response = client.post(f"/requests/{world.request.pk}/", {"decision": "full"})
    assert response.status_code == 409
    assert "Tenant &#x27;acme&#x27; has no pool of GPU-hours on cluster staffcluster" in _html(response)
    world.request.refresh_from_db()
    assert world.request.state == QuotaRequestState.PENDING

    today = timezone.now().date()
    tenant_pool_create(
        actor=world.staff,
        tenant=world.acme,
        cluster=world.cluster,
        gpu_hours=Decimal(50),
        starts_on=today - timedelta(days=30),
        ends_on=today + timedelta(days=60),
    )
    response = client.post(f"/requests/{world.request.pk}/", {"decision": "full"})
    assert response.status_code == 302
    world.request.refresh_from_db()
    world.other_request.refresh_from_db()
    assert (world.request.state, world.request.granted_gpu_seconds) == (QuotaRequestState.APPROVED, 10 * HOUR)
    assert world.other_request.state == QuotaRequestState.PENDING


# Portal admins only ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["/staff/", "/staff/allocations/", "/staff/rates/", "/staff/clusters/", "/staff/drift/", "/staff/reconciliation/"],
)
def test_the_admin_pages_are_for_portal_admins(world: World, url: str) -> None:
    assert _client(world.staff).get(url).status_code == 200
    assert _client(world.tenant_admin).get(url).status_code == 403
    assert _client(world.ann).get(url).status_code == 403
    assert _client(None).get(url).status_code == 302


def test_the_overview_counts_pending_requests_and_shows_cluster_health(world: World) -> None:
    world.cluster.last_ping_at = timezone.now()
    world.cluster.last_ping_ok = False
    world.cluster.last_ping_error = "connection refused"
    world.cluster.save()

    html = _html(_client(world.staff).get("/staff/"))

    assert '<div class="stat" id="pending-count">2</div>' in html
    assert '<a href="/clusters/staffcluster/">staffcluster</a>' in html
    assert '<span class="health-bad">Failing</span>' in html
    assert "connection refused" in html
    assert "No drift check has run yet" in html


def test_allocations_are_listed_filtered_created_and_granted(world: World) -> None:
    client = _client(world.staff)
    html = _html(client.get("/staff/allocations/?tenant=acme"))
    assert '<th scope="row">acme/vision</th>' in html
    assert '<th scope="row">other/lab</th>' not in html

    next_year = timezone.now().date().replace(day=1) + timedelta(days=400)
    form = {
        "project": "acme/vision",
        "cluster": "staffcluster",
        "gpu_type": "h100",
        "gpu_hours": "250",
        "starts_on": next_year.isoformat(),
        "ends_on": (next_year + timedelta(days=30)).isoformat(),
    }
    response = client.post("/staff/allocations/", form)
    assert response.status_code == 302
    created = Allocation.objects.get(project=world.vision, gpu_type="h100")
    assert created.granted_gpu_seconds == 250 * HOUR

    # The same period again overlaps: the service's message above the form.
    response = client.post("/staff/allocations/", form)
    assert response.status_code == 409
    assert "acme/vision already has an allocation on staffcluster for h100" in _html(response)
    # A GPU type the cluster lacks, beside its field.
    response = client.post("/staff/allocations/", {**form, "gpu_type": "a100", "gpu_hours": ""})
    assert response.status_code == 400
    html = _html(response)
    assert "Cluster &#x27;staffcluster&#x27; has no GPUs of type &#x27;a100&#x27;; it has: h100." in html
    assert '<p class="field-error" id="id_gpu_hours-error">This field is required.</p>' in html

    response = client.post(f"/staff/allocations/{world.allocation.pk}/grant/", {"gpu_hours": "5", "note": "conference"})
    assert response.status_code == 302
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 105 * HOUR
    assert (
        _client(world.tenant_admin)
        .post(f"/staff/allocations/{world.allocation.pk}/grant/", {"gpu_hours": "5", "note": "x"})
        .status_code
        == 403
    )
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 105 * HOUR


def test_a_rate_overlapping_priced_usage_is_refused_and_used_rates_are_locked(world: World) -> None:
    month = previous_month(timezone.now().date().replace(day=1))
    used = rate_create(
        actor=None,
        cluster=world.cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal(2),
        currency="EUR",
        valid_from=at(month),
    )
    charged_job(world.vision, world.cluster, start=at(month, 10), end=at(month, 12), user=world.ann)
    usage_import()
    client = _client(world.staff)

    response = client.post(
        "/staff/rates/",
        {
            "cluster": "staffcluster",
            "gpu_type": "",
            "price_per_gpu_hour": "3",
            "currency": "EUR",
            "valid_from": f"{month}",
        },
    )

    assert response.status_code == 409
    html = _html(response)
    assert '<div class="form-errors" role="alert">' in html
    assert "Usage of GPUs without a rate of their own on staffcluster is already priced up to" in html
    assert Rate.objects.count() == 1
    html = _html(client.get("/staff/rates/"))
    assert (
        '<span class="badge badge-in-force">In force now</span> <span class="badge badge-locked">Locked</span>' in html
    )
    assert "This rate is locked: it has priced 1 job" in _html(client.get(f"/staff/rates/{used.pk}/"))
    assert client.post(f"/staff/rates/{used.pk}/delete/").status_code == 409

    # A bad currency beside its field; then a future rate, corrected and removed.
    response = client.post(
        "/staff/rates/",
        {
            "cluster": "staffcluster",
            "gpu_type": "h100",
            "price_per_gpu_hour": "3",
            "currency": "E",
            "valid_from": "2099-01-01",
        },
    )
    assert '<p class="field-error" id="id_currency-error">Give an ISO 4217 code, e.g. EUR.</p>' in _html(response)
    response = client.post(
        "/staff/rates/",
        {
            "cluster": "staffcluster",
            "gpu_type": "h100",
            "price_per_gpu_hour": "3",
            "currency": "eur",
            "valid_from": "2099-01-01",
        },
    )
    assert response.status_code == 302
    future = Rate.objects.get(gpu_type="h100")
    assert (future.price_per_gpu_hour, future.currency) == (Decimal(3), "EUR")
    response = client.post(
        f"/staff/rates/{future.pk}/",
        {"price_per_gpu_hour": "3.5", "currency": "EUR", "valid_from": "2099-02-01", "note": "corrected"},
    )
    assert response.status_code == 302
    future.refresh_from_db()
    assert (future.price_per_gpu_hour, future.note) == (Decimal("3.5"), "corrected")
    assert client.post(f"/staff/rates/{future.pk}/delete/").status_code == 302
    assert not Rate.objects.filter(pk=future.pk).exists()


def test_drift_reports_show_their_findings(world: World) -> None:
    SlurmDriftReport.objects.create(
        cluster=world.cluster,
        started_at=timezone.now(),
        finished_at=timezone.now(),
        findings=[
            {
                "kind": "missing_user_association",
                "account": "acme_vision",
                "user": "ann",
                "detail": "added",
                "repaired": True,
            },
            {
                "kind": "gpu_limit",
                "account": "acme_vision",
                "user": "",
                "detail": "limit 10 != 6000",
                "repaired": False,
            },
        ],
    )

    html = _html(_client(world.staff).get("/staff/drift/"))

    assert "2 findings, 1 not repaired" in html
    assert "<td>limit 10 != 6000</td>" in html
    assert '<span class="badge badge-unrepaired">Not repaired</span>' in html


def test_requesting_a_reconciliation_report_creates_a_pending_one(world: World) -> None:
    client = _client(world.staff)

    response = client.post(
        "/staff/reconciliation/", {"cluster": "staffcluster", "start": "2026-01-01", "end": "2026-01-02"}
    )

    assert response.status_code == 302
    report = ReconciliationReport.objects.get()
    assert (report.state, report.cluster, report.requested_by) == (
        ReconciliationState.PENDING,
        world.cluster,
        world.staff,
    )
    assert f"Report {report.pk} requested" in _html(client.get("/staff/reconciliation/"))
    assert "A worker has not finished this report yet (pending)" in _html(
        client.get(f"/staff/reconciliation/{report.pk}/")
    )

    response = client.post(
        "/staff/reconciliation/", {"cluster": "staffcluster", "start": "2026-01-02", "end": "2026-01-01"}
    )
    assert response.status_code == 400
    assert '<p class="field-error" id="id_end-error">The period must end after it starts' in _html(response)
    assert ReconciliationReport.objects.count() == 1


def test_a_done_reconciliation_report_shows_its_summary_and_findings(world: World) -> None:
    now = timezone.now()
    report = ReconciliationReport.objects.create(
        cluster=world.cluster,
        period_start=now - timedelta(days=2),
        period_end=now - timedelta(days=1),
        state=ReconciliationState.DONE,
        finished_at=now,
        summary={
            "accounts": 1,
            "portal_jobs": 3,
            "slurm_jobs": 4,
            "jobs_compared": 3,
            "counts": {"missing_in_slurm": 0, "missing_in_portal": 1, "gpu_seconds_differ": 0, "unpriced": 0},
            "portal_gpu_seconds": 7200,
            "slurm_gpu_seconds": 10800,
            "difference_gpu_seconds": -3600,
            "portal_gpu_hours": "2.00",
            "slurm_gpu_hours": "3.00",
            "difference_gpu_hours": "-1.00",
            "findings_total": 1,
            "findings_stored": 1,
            "findings_truncated": False,
        },
        findings=[
            {
                "kind": "missing_in_portal",
                "slurm_job_id": 4242,
                "account": "acme_vision",
                "job": None,
                "portal_gpu_seconds": None,
                "slurm_gpu_seconds": 3600,
                "detail": "ran as carol",
            }
        ],
    )

    html = _html(_client(world.staff).get(f"/staff/reconciliation/{report.pk}/"))

    assert '<div class="stat">2.00 / 3.00</div>' in html
    assert "Portal minus Slurm: -1.00" in html
    assert "<td>4242</td>" in html
    assert '<td class="priority-2">ran as carol</td>' in html
    assert _client(world.tenant_admin).get(f"/staff/reconciliation/{report.pk}/").status_code == 403


def test_a_rate_from_a_moment_with_any_offset_is_stored_in_utc(world: World) -> None:
    client = _client(world.staff)
    form = {"cluster": "staffcluster", "gpu_type": "h100", "price_per_gpu_hour": "3", "currency": "EUR"}

    # +16:00 is valid for Python but out of range for PostgreSQL: it used to be a 500.
    created = client.post("/staff/rates/", {**form, "valid_from": "2099-03-01T00:00:00+16:00"})
    too_early = client.post("/staff/rates/", {**form, "valid_from": "0001-01-01T00:00:00+01:00"})

    assert created.status_code == 302
    assert [rate.valid_from.isoformat() for rate in Rate.objects.all()] == ["2099-02-28T08:00:00+00:00"]
    assert too_early.status_code == 400
    assert "Give a date (2026-12-01) or a date and time (2026-12-01T08:00)." in _html(too_early)
