"""GPU efficiency in the browser: an idle running job flagged on its page, the dashboard and the job list; a job's
idle GPU-hours and their cost; the monthly efficiency page and the invoice showing the idle share of its charges."""

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
from jobs.models import Job, JobEfficiency, JobGpuUsage, JobState
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


class World:
    """Tenant acme, project vision: last month a 2-hour job of ann's on 2 GPUs at 2 EUR, 1.5 GPU-hours of it idle
    (3.00 EUR); now a running job of hers with one of its GPUs idle for longer than the cluster's limit."""

    def __init__(self) -> None:
        self.month = previous_month(timezone.now().date().replace(day=1))
        self.cluster = make_matrix_cluster("effpages")
        rate_create(
            actor=None,
            cluster=self.cluster,
            gpu_type="",
            price_per_gpu_hour=Decimal(2),
            currency="EUR",
            valid_from=at(self.month),
        )
        self.tenant_admin = make_user("tadmin")
        self.acme = make_tenant("acme", admin=self.tenant_admin)
        self.vision = make_project(self.acme, "vision")
        self.ann = make_user("ann")
        add_project_member(self.vision, self.ann)
        day = self.month + timedelta(days=2)
        self.finished = charged_job(
            self.vision, self.cluster, start=at(day, 10), end=at(day, 12), gpus=2, user=self.ann
        )
        JobEfficiency.objects.create(
            job=self.finished,
            source="dcgm",
            observed_gpu_seconds=14400,
            utilisation_percent_seconds=14400 * 25.0,
            peak_memory_mib=21714,
            idle_gpu_seconds=5400,
        )
        usage_import()
        self.invoice = Invoice.objects.get(tenant=self.acme)
        now = timezone.now()
        self.running = Job.objects.create(
            project=self.vision,
            cluster=self.cluster,
            user=self.ann,
            cluster_username="alice",
            name="notebook",
            partition="gpu",
            gpu_type="h100",
            gpus=1,
            time_limit_minutes=600,
            state=JobState.RUNNING,
            started_at=now - timedelta(hours=2),
            gpu_indices={"n1": [3]},
        )
        JobEfficiency.objects.create(
            job=self.running,
            source="dcgm",
            observed_gpu_seconds=3600,
            idle_gpu_seconds=3600,
            idle_gpus=1,
            idle_since=now - timedelta(hours=1),
            flagged_at=now - timedelta(minutes=30),
            peak_memory_mib=21714,
        )
        JobGpuUsage.objects.create(
            job=self.running,
            node="n1",
            gpu_index=3,
            observed_seconds=3600,
            peak_memory_mib=21714,
            idle_seconds=3600,
            idle_since=now - timedelta(hours=1),
            counted_until=now,
        )


@pytest.fixture
def world() -> World:
    return World()


def _html(user: Any, url: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200, response.content.decode()[:500]
    return str(response.content.decode())


def test_an_idle_running_job_is_flagged_on_its_page_the_dashboard_and_the_job_list(world: World) -> None:
    page = _html(world.ann, f"/jobs/{world.running.pk}/")
    assert '<p class="notice notice-warning" id="gpu-idle">GPUs idle: 1 of its 1 GPU(s) under 10% utilisation' in page
    assert "<td>n1</td><td>3</td><td>0%</td><td>21714 MiB</td><td>1.0 h</td>" in page

    for url in ("/", "/jobs/"):
        assert ">GPUs idle</span>" in _html(world.ann, url)
    JobEfficiency.objects.filter(job=world.running).update(flagged_at=None, idle_since=None, idle_gpus=0)
    for url in ("/", "/jobs/", f"/jobs/{world.running.pk}/"):
        assert "GPUs idle" not in _html(world.ann, url)


def test_a_finished_jobs_page_shows_its_efficiency_and_the_cost_of_its_idle_hours(world: World) -> None:
    page = _html(world.ann, f"/jobs/{world.finished.pk}/")

    assert "<dt>Mean utilisation</dt><dd>25.0%</dd>" in page
    assert "<dt>Peak GPU memory</dt><dd>21714 MiB</dd>" in page
    assert '<dd id="idle-gpu-hours">1.50 (under 10% utilisation)</dd>' in page
    # 1.5 idle GPU-hours x 2 EUR.
    assert '<dd id="idle-cost">3.00 EUR at 2.0000 EUR per GPU-hour</dd>' in page


def test_the_monthly_page_and_the_invoice_show_the_idle_hours_and_their_cost(world: World) -> None:
    month = f"{world.month:%Y-%m}"
    page = _html(world.tenant_admin, f"/billing/efficiency/?scope=acme&month={month}")
    assert '<dd data-field="idle-gpu-hours">1.50</dd>' in page
    assert '<dd data-field="idle-cost">3.00 EUR</dd>' in page
    assert f'href="/api/v1/efficiency/csv/?month={month}&amp;tenant=acme" download>Download CSV</a>' in page

    invoice = _html(world.tenant_admin, f"/billing/invoices/{world.invoice.pk}/")
    assert '<strong id="invoice-total">8.00 EUR</strong>' in invoice  # 2 h x 2 GPUs x 2 EUR
    assert '<dd data-field="idle-cost">3.00 EUR</dd>' in invoice
    assert f'<a href="/jobs/{world.finished.pk}/">job</a>' in invoice

    staff = _html(make_user(is_staff=True), f"/billing/efficiency/?month={month}")
    assert '<option value="all" selected>Every tenant</option>' in staff
    assert '<th scope="row">acme</th>' in staff


def test_the_job_api_says_which_jobs_idle_and_what_each_gpu_read(world: World) -> None:
    api = APIClient()
    api.force_authenticate(world.ann)

    listed = {job["name"]: job["gpu_idle"] for job in api.get("/api/v1/jobs/").json()["results"]}
    assert listed == {"notebook": True, "job": False}
    detail = api.get(f"/api/v1/jobs/{world.running.pk}/").json()
    assert detail["gpu_indices"] == {"n1": [3]}
    assert detail["efficiency"]["idle_gpus"] == 1
    assert detail["efficiency"]["idle_gpu_seconds"] == 3600
    assert detail["efficiency"]["utilisation_source"] == "dcgm"
    assert [(gpu["node"], gpu["gpu_index"], gpu["idle_seconds"]) for gpu in detail["gpus_used"]] == [("n1", 3, 3600)]
    assert api.get(f"/api/v1/jobs/{world.finished.pk}/").json()["gpus_used"] == []


def test_the_dashboard_shows_this_months_idle_cost_to_those_who_read_the_spend(world: World) -> None:
    manager = make_user("max")
    add_project_member(world.vision, manager, "manager")
    # This month: the running notebook's GPU idled 1 hour, at 2 EUR per GPU-hour.
    idle_cost = (
        '<td class="number priority-2">1.00</td>\n              <td class="number" data-field="idle-cost">'
        '<a href="/billing/efficiency/?scope={scope}">2.00 EUR<span class="visually-hidden"> idle cost of {label}'
    )

    assert idle_cost.format(scope="acme", label="Tenant acme") in _html(world.tenant_admin, "/")
    assert idle_cost.format(scope="acme/vision", label="Project acme/vision") in _html(manager, "/")
    assert 'data-field="idle-cost"' not in _html(world.ann, "/")
