"""The main journeys of the browser portal, end to end on the real stack: Debian's Chromium (Playwright) on
the portal's ASGI server, a Celery worker and beat, PostgreSQL, Redis and the local Slurm cluster.

One researcher signs in, submits from a template, watches the job go from queued to completed in the jobs
list without reloading while its log streams live on the job page, cancels another job, sees the quota
gauge move and asks for more GPU-hours; a portal admin approves part of it; the tenant admin downloads the
month's invoice as CSV. Screenshots of every step go to test-artifacts/screenshots/<test name>/.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from billing.models import Invoice
from billing.rates import rate_create
from clusters.accounts import project_slurm_sync
from clusters.models import ClusterAccount
from clusters.slurm import SlurmClient
from jobs.job_services import job_template_save
from jobs.models import Job, JobState
from quotas.models import Allocation, QuotaRequest, QuotaRequestState
from quotas.units import gpu_hours_to_seconds
from tenants.models import Project
from tests.factories import PASSWORD, add_project_member, grant_allocation, make_project, make_tenant, make_user
from tests.jobs.conftest import _remove_from_slurm, local_cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.cluster]

# Prints ten numbered steps with a carriage-return progress bar, about a second apart.
TEMPLATE_SCRIPT = (
    "#!/bin/bash\n"
    "for step in $(seq 1 10); do\n"
    '  for pct in 25 50 75 100; do printf \'\\rstep %s [%3s%%]\' "$step" "$pct"; sleep 0.25; done\n'
    "  printf '\\nstep %s done\\n' \"$step\"\n"
    "done\n"
)
SLEEPER_SCRIPT = "#!/bin/bash\necho sleeping\nsleep 600\n"


@dataclass
class Journey:
    researcher: User
    tenant_admin: User
    portal_admin: User
    project: Project
    allocation: Allocation

    @property
    def label(self) -> str:
        return f"{self.project.tenant.slug}/{self.project.slug}"


@pytest.fixture
def journey(slurm_client: SlurmClient) -> Iterator[Journey]:
    cluster = local_cluster()
    researcher = make_user("journey-researcher")
    tenant_admin = make_user("journey-tenant-admin")
    portal_admin = make_user("journey-admin", is_staff=True)
    ClusterAccount.objects.create(cluster=cluster, user=researcher, username="alice")
    tenant = make_tenant(admin=tenant_admin)
    project = make_project(tenant)
    add_project_member(project, researcher, "member")
    allocation = grant_allocation(project, cluster, gpu_hours=50)
    first_of_month = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if not cluster.rates.exists():
        rate_create(
            actor=None,
            cluster=cluster,
            gpu_type="",
            price_per_gpu_hour=Decimal("2.00"),
            currency="EUR",
            valid_from=first_of_month,
        )
    job_template_save(
        user=researcher,
        project=project,
        values={
            "name": "Progress demo",
            "description": "Ten steps with a progress bar",
            "partition": "h100",
            "gpu_type": "h100",
            "gpus": 1,
            "time_limit_minutes": 5,
            "script": TEMPLATE_SCRIPT,
        },
    )
    project_slurm_sync(project_id=project.pk)
    yield Journey(researcher, tenant_admin, portal_admin, project, allocation)
    _remove_from_slurm(slurm_client, account=project.slurm_account, parent=tenant.slurm_parent_account)


def gauge_text(page: Any, label: str) -> str:
    """The figures of the project's quota gauge on the dashboard, as the page writes them."""
    return str(page.get_by_role("img", name=f"{label}: ").get_attribute("aria-label"))


def used_gpu_hours(gauge: str) -> Decimal:
    match = re.search(r": ([\d.]+) used", gauge)
    assert match, gauge
    return Decimal(match.group(1))


def wait_for(condition: Any, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.25)


def test_a_researcher_an_admin_and_a_tenant_admin_through_the_portal(
    journey: Journey, open_page: Any, screenshot: Any, celery_worker: str, celery_beat: None
) -> None:
    # Sign in through the form.
    page = open_page()
    page.goto("/")
    page.get_by_label("Username").fill(journey.researcher.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"^http://[^/]+/$"))
    gauge_before = gauge_text(page, journey.label)
    assert used_gpu_hours(gauge_before) == 0
    screenshot(page, "dashboard-before")

    # Submit from the template: the form is filled from it and the estimate follows.
    page.goto("/jobs/new/")
    page.get_by_role("link", name="Progress demo").click()
    assert page.get_by_label("Batch script").input_value() == TEMPLATE_SCRIPT
    page.get_by_label("Name").fill("journey-progress")
    estimate = page.locator("#estimate")
    estimate.get_by_text(re.compile(r"At most 0\.08 GPU-hours")).wait_for()
    screenshot(page, "submit-from-template")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    job_id = page.url.rstrip("/").rsplit("/", 1)[1]
    job_page = page

    # The jobs list, in a second tab, follows the job without ever reloading.
    jobs_list = job_page.context.new_page()
    jobs_list.goto("/jobs/")
    jobs_list.evaluate("window.journeyMarker = 'not reloaded'")
    badge = jobs_list.locator(f"tr[data-job-id='{job_id}'] [data-field='state']")
    seen_in_list: list[str] = []
    log_seen_while_running = False
    terminal = job_page.locator("#terminal-stdout")

    def finished_in_list() -> bool:
        nonlocal log_seen_while_running
        text = str(badge.inner_text())
        if not seen_in_list or seen_in_list[-1] != text:
            seen_in_list.append(text)
            screenshot(jobs_list, f"list-{text.lower()}")
        if text == "Running" and "step 1 done" in terminal.inner_text():
            log_seen_while_running = True
        return text == "Completed"

    wait_for(finished_in_list, timeout=180, what="the job reaching Completed in the list")
    assert jobs_list.evaluate("window.journeyMarker") == "not reloaded"
    assert seen_in_list[0] in ("Queued", "Pending", "Running")
    assert "Running" in seen_in_list
    assert log_seen_while_running, "the log did not stream while the job ran"

    # Its live log: every step, the progress bar overwritten in place as a terminal shows it.
    job_page.locator("#job-state").get_by_text("Completed").wait_for(timeout=30_000)
    terminal.get_by_text("step 10 done").wait_for()
    log_text = terminal.inner_text()
    assert "step 10 [100%]" in log_text
    assert "[ 25%]step" not in log_text.replace("\n", "")  # no bar fragments left over after \r
    screenshot(job_page, "job-completed-with-log")

    # Cancel another job from its page while it runs; meanwhile the dashboard's gauge shows its reservation.
    job_page.goto("/jobs/new/")
    job_page.get_by_label("Name").fill("journey-sleeper")
    job_page.get_by_label("GPUs").fill("2")
    job_page.get_by_label("Time limit (minutes)").fill("30")
    job_page.get_by_label("Batch script").fill(SLEEPER_SCRIPT)
    job_page.get_by_role("button", name="Submit job").click()
    job_page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    sleeper_id = job_page.url.rstrip("/").rsplit("/", 1)[1]
    job_page.locator("#job-state").get_by_text("Running").wait_for(timeout=120_000)

    dashboard = jobs_list  # the list's tab has served its purpose

    def gauge_reserves_the_sleeper_alone() -> bool:
        # The first job holds its reservation until Slurm's accounting record of it is collected and charged.
        dashboard.goto("/")
        return ", 1.0 reserved," in gauge_text(dashboard, journey.label)  # 2 GPUs x 30 minutes

    wait_for(gauge_reserves_the_sleeper_alone, timeout=60, what="the gauge reserving the sleeper's hours alone")
    screenshot(dashboard, "dashboard-while-running")
    # Let it run long enough to be charged at least 0.01 GPU-hours (2 GPUs x 18 s).
    started_at = Job.objects.get(pk=sleeper_id).started_at
    assert started_at is not None
    wait_for(lambda: (timezone.now() - started_at).total_seconds() > 20, timeout=60, what="the sleeper running 20 s")

    job_page.get_by_text("Cancel this job…").click()
    screenshot(job_page, "cancel-confirm")
    job_page.get_by_role("button", name="Yes, cancel “journey-sleeper”").click()
    job_page.locator("#job-state").get_by_text("Cancelled").wait_for(timeout=120_000)
    screenshot(job_page, "job-cancelled")
    assert Job.objects.get(pk=sleeper_id).state == JobState.CANCELLED

    # Once Slurm's accounting has both jobs, the reservation becomes a charge of what they used.
    def charged() -> bool:
        dashboard.goto("/")
        gauge = gauge_text(dashboard, journey.label)
        return ", 0.0 reserved," in gauge and used_gpu_hours(gauge) > 0

    wait_for(charged, timeout=120, what="the dashboard's gauge showing the jobs charged")
    assert gauge_text(dashboard, journey.label) != gauge_before
    screenshot(dashboard, "dashboard-after")

    # Ask for more GPU-hours on the allocation's page.
    page.goto(f"/projects/{journey.label}/allocations/{journey.allocation.pk}/")
    page.get_by_role("textbox", name="GPU-hours").fill("10")
    page.get_by_label("Justification").fill("The evaluation needs another week.")
    page.get_by_role("button", name="Send the request").click()
    page.get_by_text("Pending").first.wait_for()
    screenshot(page, "request-sent")
    quota_request = QuotaRequest.objects.get(allocation=journey.allocation)
    assert quota_request.state == QuotaRequestState.PENDING

    # A portal admin approves part of it.
    admin = open_page(journey.portal_admin)
    admin.goto("/requests/")
    admin.get_by_role("link", name=f"Decide #{quota_request.pk}").click()
    admin.get_by_label("Approve in part").check()
    admin.get_by_label("GPU-hours to approve").fill("6")
    screenshot(admin, "decision")
    admin.get_by_role("button", name="Record the decision").click()
    admin.locator(".message-success").wait_for()
    screenshot(admin, "decided")
    journey.allocation.refresh_from_db()
    assert journey.allocation.granted_gpu_seconds == gpu_hours_to_seconds(Decimal(56))

    # The tenant admin downloads this month's invoice as CSV.
    wait_for(
        lambda: Invoice.objects.filter(tenant=journey.project.tenant, total__gt=0).exists(),
        timeout=120,
        what="the usage import pricing the jobs into a draft invoice",
    )
    invoice = Invoice.objects.get(tenant=journey.project.tenant)
    billing = open_page(journey.tenant_admin, viewport="tablet")
    billing.goto(f"/billing/invoices/{invoice.pk}/")
    screenshot(billing, "invoice")
    with billing.expect_download() as download_info:
        billing.get_by_role("link", name="Download CSV").click()
    csv_text = Path(download_info.value.path()).read_text(encoding="utf-8")
    assert journey.label in csv_text
    assert "TOTAL" in csv_text
    assert str(invoice.total) in csv_text
    assert download_info.value.suggested_filename.endswith(".csv")
