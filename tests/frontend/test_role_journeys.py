"""A week in the portal for each role, in Chromium on the real stack: the portal's ASGI server, the session's Celery
worker (and beat for the researcher), PostgreSQL, Redis and the local Slurm 22.05 cluster.

Each role's weekly tasks run end to end once at one size (a laptop or a 390 x 844 phone) and the role's key steps
at the other: every page of its navigation reached from the menu (the phone's Menu button where it folds), and
one main action. Screenshots of every step go to test-artifacts/screenshots/<test name>/, uploaded by CI.

- Researcher (laptop): submits from the form with CPUs and memory, watches the job run and finish in the jobs
  list (its duration and cost counting live), filters the list by state, opens a job's page (script, cost so
  far), cancels another job with a reason and sees who cancelled, reads the quota gauge and the burn-down, and
  asks for more GPU-hours. On the phone it submits the job it later cancels.
- Project manager (phone): sees the pending request but may not decide it, invites a colleague by username and
  changes their role, reads the project's spend and the project's jobs filtered by owner.
- Tenant admin (phone): finds Requests with its pending count in the menu, approves one in part, invites by
  e-mail (the invitation waits), reads the tenant's spend by GPU type and downloads the invoice as CSV.
- Portal admin (laptop): creates a tenant and a project in the console, adds a member, sets a rate from a date
  on, checks the cluster, reads the node board grouped by switch, the spend overview and the audit log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import expect

from billing.models import Invoice
from billing.rates import rate_create
from billing.usage import usage_import
from clusters.accounts import project_slurm_sync
from clusters.models import Cluster, ClusterAccount
from clusters.slurm import SlurmClient
from jobs.models import Job, JobState
from quotas.models import Allocation, QuotaRequest, QuotaRequestState
from quotas.requests import quota_request_create, tenant_pool_create
from quotas.units import gpu_hours_to_seconds
from tenants.models import (
    AuditEvent,
    InvitationState,
    MembershipInvitation,
    Project,
    ProjectMembership,
    Tenant,
    TenantMembership,
)
from tests.billing.usage_factories import charged_job
from tests.conftest import celery_workers_idle
from tests.factories import (
    add_project_member,
    add_tenant_member,
    grant_allocation,
    make_project,
    make_tenant,
    make_user,
)
from tests.jobs.conftest import _remove_from_slurm, local_cluster
from tests.jobs.test_slurm_accounts import slurm_accounts_to_remove  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.cluster]

LIVE_TIMEOUT_MS = 120_000
# Runs long enough to be seen running in the list, its duration and cost counting up: the job sync's pace is a
# second, but beside the other test shards' live jobs on two cores one sync came more than 12 s after the last
# (a 12 s run went from pending to completed in the list), so the run lasts well past such a gap.
SHORT_SCRIPT = "#!/bin/bash\necho 'warming up'\nsleep 30\necho 'done'\n"
SLEEPER_SCRIPT = "#!/bin/bash\necho 'sleeping until cancelled'\nsleep 600\n"
PRICE = Decimal("2.00")


@dataclass
class World:
    """A tenant on the local cluster with one project: a researcher (member, runs as alice), a project manager
    (runs as bob), a tenant admin, a colleague in the tenant but not the project, a portal admin. The project
    has 50 GPU-hours and this month's history already priced (a researcher's h100 job, a manager's a100 job)
    on a draft invoice."""

    cluster: Cluster
    tenant: Tenant
    project: Project
    allocation: Allocation
    researcher: User
    manager: User
    tenant_admin: User
    colleague: User
    portal_admin: User

    @property
    def label(self) -> str:
        return f"{self.tenant.slug}/{self.project.slug}"

    def invoice(self) -> Invoice:
        return Invoice.objects.get(tenant=self.tenant, month=timezone.localdate().replace(day=1))


def _history_window() -> tuple[datetime, datetime]:
    """An hour ending half an hour ago, inside this month (shorter in a month's first 90 minutes)."""
    now = timezone.now()
    first_of_month = timezone.localtime(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = max(first_of_month, now - timedelta(minutes=90))
    return start, start + (now - start) * 2 / 3


@pytest.fixture
def world(slurm_client: SlurmClient) -> Iterator[World]:
    cluster = local_cluster()
    # One transaction, so the tasks the services queue reach the session's worker only once everything exists
    # (as tests/jobs/conftest.py's live project does); the project's Slurm account is synced here.
    with transaction.atomic():
        researcher, manager = make_user("rita"), make_user("manu")
        tenant_admin, colleague = make_user("tara"), make_user("carl")
        portal_admin = make_user("root", is_staff=True)
        ClusterAccount.objects.create(cluster=cluster, user=researcher, username="alice")
        ClusterAccount.objects.create(cluster=cluster, user=manager, username="bob")
        tenant = make_tenant(admin=tenant_admin)
        project = make_project(tenant)
        add_project_member(project, researcher, "member")
        add_project_member(project, manager, "manager")
        add_tenant_member(tenant, colleague)
        start, end = _history_window()
        allocation = grant_allocation(project, cluster, gpu_hours=50, starts_on=timezone.localdate(start))
        rate_create(
            actor=None,
            cluster=cluster,
            gpu_type="",
            price_per_gpu_hour=PRICE,
            currency="EUR",
            valid_from=start - timedelta(days=1),
        )
        charged_job(project, cluster, start=start, end=end, gpus=2, user=researcher)
        charged_job(project, cluster, start=start, end=end, gpu_type="a100", user=manager)
    usage_import()
    celery_workers_idle()
    project_slurm_sync(project_id=project.pk)
    yield World(cluster, tenant, project, allocation, researcher, manager, tenant_admin, colleague, portal_admin)
    _remove_from_slurm(slurm_client, account=project.slurm_account, parent=tenant.slurm_parent_account)


@pytest.fixture
def pending_request(world: World) -> QuotaRequest:
    """The researcher's request for 10 more GPU-hours, waiting for a decision; the tenant has a pool of GPU-hours
    on the cluster for its admins to approve from."""
    tenant_pool_create(
        actor=world.portal_admin,
        tenant=world.tenant,
        cluster=world.cluster,
        gpu_hours=Decimal(100),
        starts_on=world.allocation.starts_on,
        ends_on=world.allocation.ends_on,
    )
    return quota_request_create(
        actor=world.researcher,
        allocation=world.allocation,
        gpu_hours=Decimal(10),
        justification="The ablation study needs another week.",
    )


# Helpers --------------------------------------------------------------------------------------------------


def menu_link(page: Any, label: str) -> Any:
    """The main navigation's link `label` (a count may follow it), opening the phone's menu first where the
    navigation folds behind it."""
    toggle = page.get_by_role("button", name="Menu")
    if toggle.is_visible() and toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
        expect(toggle).to_have_attribute("aria-expanded", "true")
    return page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile(rf"^{label}\b"))


def at_path(path: str) -> re.Pattern[str]:
    """The portal's page at `path`, with or without a query."""
    return re.compile(rf"^http://[^/]+{re.escape(path)}(\?.*)?$")


def go(page: Any, label: str, path: str) -> None:
    """Follow the main navigation's `label` to the page at `path`."""
    menu_link(page, label).click()
    page.wait_for_url(at_path(path))


def navigation_labels(page: Any) -> list[str]:
    """The main navigation's labels as shown, without the counts beside them."""
    return [
        str(label)
        for label in page.eval_on_selector_all(
            "nav[aria-label='Main'] a", "links => links.map(link => link.firstChild.textContent.trim())"
        )
    ]


def assert_fits(page: Any) -> None:
    """Nothing on the page is wider than its window (a phone scrolls up and down only)."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"{page.url} is {width} px wide"


# Where each role's navigation leads: (label, path).
EVERYONE = [
    ("Dashboard", "/"),
    ("Jobs", "/jobs/"),
    ("Submit", "/jobs/new/"),
    ("Clusters", "/clusters/"),
    ("Projects", "/projects/"),
]
MANAGER = [*EVERYONE, ("Billing", "/billing/")]
DECIDER = [*EVERYONE, ("Requests", "/requests/"), ("Billing", "/billing/")]
PORTAL_ADMIN = [*DECIDER, ("Admin", "/staff/")]


def visit_every_menu_page(page: Any, pages: list[tuple[str, str]], screenshot: Any) -> None:
    """From the dashboard, every page of the role's navigation in turn, through the menu; each fits the window."""
    page.goto("/")
    assert navigation_labels(page) == [label for label, _ in pages]
    for label, path in pages:
        go(page, label, path)
        expect(page.get_by_role("heading", level=1).first).to_be_attached()
        assert_fits(page)
        screenshot(page, f"menu-{label.lower()}")


def table_rows(page: Any, selector: str) -> list[list[str]]:
    return [
        [str(cell).strip() for cell in row]
        for row in page.eval_on_selector_all(
            f"{selector} tbody tr, {selector} tfoot tr",
            "rows => rows.map(row => Array.from(row.cells, cell => cell.innerText))",
        )
    ]


def submit_from_form(
    page: Any, *, name: str, script: str, cpus: int, memory_gb: int, minutes: int, screenshot: Any
) -> str:
    """Fill the submit form (reached from the navigation) for one h100 GPU and submit it; the new job's id."""
    go(page, "Submit", "/jobs/new/")
    page.get_by_label("Partition").select_option("h100")
    page.get_by_label("GPU type").select_option("h100")
    page.get_by_label("GPUs per node").fill("1")
    page.get_by_label("CPUs per node").fill(str(cpus))
    page.get_by_label("Memory per node").fill(str(memory_gb))
    page.get_by_label("Time limit (minutes)").fill(str(minutes))
    page.get_by_label("Name").fill(name)
    page.get_by_label("Batch script").fill(script)
    page.get_by_label("Batch script").press("Tab")
    expect(page.locator("#estimate")).to_contain_text("At most")
    screenshot(page, f"submit-{name}")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    expect(page.get_by_text(f"Job “{name}” was accepted")).to_be_visible()
    return str(page.url.rstrip("/").rsplit("/", 1)[1])


def gauge_label(page: Any, label: str) -> str:
    """The project's quota gauge on the dashboard, as its figures are read out."""
    return str(page.get_by_role("img", name=f"{label}: ").get_attribute("aria-label"))


# Researcher -----------------------------------------------------------------------------------------------


def test_a_researchers_week_on_a_laptop_and_a_phone(
    world: World, open_page: Any, screenshot: Any, celery_worker: str, celery_beat: None
) -> None:
    # On the phone: every page of the menu, then the main action, a submission (the job cancelled below).
    phone = open_page(world.researcher, viewport="phone")
    visit_every_menu_page(phone, EVERYONE, screenshot)
    phone.goto("/")
    sleeper_id = submit_from_form(
        phone, name="sleeper", script=SLEEPER_SCRIPT, cpus=2, memory_gb=4, minutes=10, screenshot=screenshot
    )
    assert_fits(phone)
    sleeper = Job.objects.get(pk=sleeper_id)
    assert (sleeper.cpus, sleeper.memory_gb) == (2, 4)

    # On the laptop: the whole week. A job from the form, with CPUs and memory.
    page = open_page(world.researcher)
    page.goto("/")
    short_id = submit_from_form(
        page, name="short-run", script=SHORT_SCRIPT, cpus=4, memory_gb=8, minutes=5, screenshot=screenshot
    )
    expect(page.locator("#job-script")).to_contain_text("sleep 30")

    # The jobs list follows it running and ending, its duration and cost counting while it runs.
    go(page, "Jobs", "/jobs/")
    page.wait_for_selector("#jobs-live-status[data-state='live']")
    row = page.locator(f"tr[data-job-id='{short_id}']")
    state = row.locator("[data-field='state']")
    expect(state).to_have_text("Running", timeout=LIVE_TIMEOUT_MS)
    duration = row.locator("[data-field='duration']")
    expect(duration).to_have_text(re.compile(r"^\d+:\d\d:\d\d$"))
    expect(duration).not_to_have_text(duration.inner_text())  # it ticks without a reload
    cost = row.locator("[data-field='cost']")
    expect(cost).to_have_text(re.compile(r"^\d+\.\d\d EUR$"))
    expect(cost).to_have_attribute("data-price", "2.0000")  # the page counts it up at the running rate
    screenshot(page, "list-running")
    expect(state).to_have_text("Completed", timeout=LIVE_TIMEOUT_MS)
    expect(duration).to_have_attribute("data-ended-at", re.compile(r"^\d{4}-\d\d-\d\dT"))
    screenshot(page, "list-completed")

    # Filtered by state, in the URL.
    page.get_by_label("State").select_option("running")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/jobs/\?(.*&)?state=running(&|$)"))
    expect(page.locator(f"tr[data-job-id='{sleeper_id}']")).to_be_visible()
    assert page.locator(f"tr[data-job-id='{short_id}']").count() == 0
    screenshot(page, "list-running-only")
    page.get_by_label("State").select_option("completed")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/jobs/\?(.*&)?state=completed(&|$)"))
    expect(page.locator(f"tr[data-job-id='{short_id}']")).to_be_visible()
    assert page.locator(f"tr[data-job-id='{sleeper_id}']").count() == 0

    # The other job's page: its script as submitted and its cost so far; cancelled with a reason.
    page.goto("/jobs/?state=running")
    page.locator(f"tr[data-job-id='{sleeper_id}']").get_by_role("link", name="sleeper").click()
    page.wait_for_url(f"**/jobs/{sleeper_id}/")
    expect(page.locator("#job-state")).to_have_text("Running")
    assert "sleep 600" in page.locator("#job-script").inner_text()
    expect(page.locator("dd[data-field='cost']")).to_have_text(re.compile(r"^\d+\.\d\d EUR$"))
    assert page.get_by_text("Cost so far").is_visible()

    # Meanwhile the dashboard's gauge shows the running job's reservation beside this month's use.
    dashboard = open_page(world.researcher)
    dashboard.goto("/")
    gauge = gauge_label(dashboard, world.label)
    assert re.fullmatch(
        rf"{re.escape(world.label)}: [\d.]+ used, [\d.]+ reserved, [\d.]+ of 50(\.0)? GPU-hours left", gauge
    )
    assert ", 0.0 reserved," not in gauge
    screenshot(dashboard, "dashboard-gauge")

    page.get_by_text("Cancel this job…").click()
    page.get_by_label("Reason").fill("Wrong learning rate; rerunning.")
    screenshot(page, "cancel-with-reason")
    page.get_by_role("button", name="Yes, cancel “sleeper”").click()
    page.wait_for_url(f"**/jobs/{sleeper_id}/")
    expect(page.locator("#job-state")).to_have_text("Cancelled", timeout=LIVE_TIMEOUT_MS)
    page.reload()
    cancelled_by = page.locator("#job-cancelled-by")
    expect(cancelled_by).to_contain_text(f"{world.researcher.username}, because:")
    expect(cancelled_by.locator("#job-cancel-reason")).to_have_text("Wrong learning rate; rerunning.")
    screenshot(page, "cancelled-by")
    assert Job.objects.get(pk=sleeper_id).state == JobState.CANCELLED

    # The allocation's burn-down, its axis from zero, and a request for more GPU-hours.
    go(page, "Projects", "/projects/")
    page.get_by_role("link", name=world.project.name).first.click()
    page.get_by_role("link", name=re.compile("^Burn-down, ledger and requests")).click()
    page.wait_for_url(f"**/allocations/{world.allocation.pk}/")
    page.locator(".burn-down canvas").first.wait_for()
    assert page.evaluate("document.querySelector('.burn-down').portalChart.scales.y.min") == 0
    expect(page.locator("#projection-sentence")).not_to_be_empty()
    screenshot(page, "burn-down")
    page.get_by_role("textbox", name="GPU-hours").fill("10")
    page.get_by_label("Justification").fill("The sweep needs another week.")
    page.get_by_role("button", name="Send the request").click()
    expect(page.locator(".requests-table").get_by_text("Pending")).to_be_visible()
    screenshot(page, "request-sent")
    assert QuotaRequest.objects.get(allocation=world.allocation).state == QuotaRequestState.PENDING


# Project manager ------------------------------------------------------------------------------------------


def test_a_project_managers_week_on_a_phone_and_a_laptop(
    world: World, pending_request: QuotaRequest, open_page: Any, screenshot: Any, celery_worker: str
) -> None:
    page = open_page(world.manager, viewport="phone")
    page.goto("/")
    # Managers see spend, not Requests: the researcher's request is decided by the tenant's admins.
    assert navigation_labels(page) == [label for label, _ in MANAGER]
    response = page.goto("/requests/")
    assert response is not None
    assert response.status == 403
    expect(page.get_by_text("Quota requests are decided by tenant admins and portal admins")).to_be_visible()
    screenshot(page, "requests-refused")

    page.goto("/")
    go(page, "Projects", "/projects/")
    page.get_by_role("link", name=world.project.name).first.click()
    page.wait_for_url(f"**/projects/{world.label}/")
    page.get_by_role("link", name=re.compile("^Burn-down, ledger and requests")).click()
    pending = page.locator(f"#request-{pending_request.pk}")
    expect(pending).to_contain_text("Pending")
    expect(pending).to_contain_text(world.researcher.username)
    assert pending.get_by_role("button").count() == 0  # neither decide nor withdraw another's request
    assert page.get_by_role("link", name=re.compile("^Decide")).count() == 0
    assert_fits(page)
    screenshot(page, "pending-request")

    # The project's members: a colleague invited by username, then made a manager.
    page.goto(f"/projects/{world.label}/")
    page.get_by_role("link", name="Members", exact=True).click()
    page.wait_for_url(f"**/projects/{world.label}/members/")
    page.get_by_label("Username or e-mail").fill(world.colleague.username)
    page.get_by_label("Role", exact=True).select_option("member")
    page.get_by_role("button", name="Add or invite").click()
    expect(page.locator(".message-success")).to_contain_text(f"{world.colleague.username} joined")
    page.get_by_label(f"Role of {world.colleague.username}").select_option("manager")
    page.get_by_role("button", name=f"Change role of {world.colleague.username}").click()
    expect(page.locator(".message-success")).to_contain_text(f"{world.colleague.username} is now")
    assert_fits(page)
    screenshot(page, "member-role-changed")
    membership = ProjectMembership.objects.get(project=world.project, user=world.colleague)
    assert membership.role == "manager"

    # The project's spend this month.
    go(page, "Billing", "/billing/")
    page.get_by_role("link", name=re.compile("^Spend by project")).click()
    page.wait_for_url(at_path("/billing/spend/"))
    assert world.label in page.locator("#scope option:checked").inner_text()
    rows = table_rows(page, "#spend-table")
    assert [row[0] for row in rows] == [world.cluster.name, "Total"]
    assert rows[-1][2] == str(world.invoice().total)  # name, GPU-hours, spent, previous, change, %
    assert_fits(page)
    screenshot(page, "project-spend")

    # The project's jobs, by owner.
    page.goto(f"/projects/{world.label}/")
    page.get_by_role("link", name="the project's jobs").click()
    page.wait_for_url(re.compile(r"/jobs/\?(.*&)?project="))
    page.get_by_label("Owner").fill(world.researcher.username)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(rf"/jobs/\?(.*&)?owner={world.researcher.username}(&|$)"))
    owners = page.locator("#job-rows [data-field='owner']").all_inner_texts()
    assert owners == [world.researcher.username]
    assert_fits(page)
    screenshot(page, "jobs-by-owner")

    # On the laptop: every page of the menu, and the jobs by the other owner.
    laptop = open_page(world.manager)
    visit_every_menu_page(laptop, MANAGER, screenshot)
    laptop.goto(f"/jobs/?project={world.label}&owner={world.manager.username}")
    owners = laptop.locator("#job-rows [data-field='owner']").all_inner_texts()
    assert owners == [world.manager.username]


# Tenant admin ---------------------------------------------------------------------------------------------


def test_a_tenant_admins_week_on_a_phone_and_a_laptop(
    world: World, pending_request: QuotaRequest, open_page: Any, screenshot: Any, celery_worker: str
) -> None:
    page = open_page(world.tenant_admin, viewport="phone")
    page.goto("/")
    requests_link = menu_link(page, "Requests")
    expect(requests_link).to_have_accessible_name("Requests 1 pending")
    screenshot(page, "menu-with-pending-count")
    requests_link.click()
    page.wait_for_url("**/requests/")
    page.get_by_role("link", name=f"Decide #{pending_request.pk}").click()
    page.get_by_label("Approve in part").check()
    page.get_by_label("GPU-hours to approve").fill("6")
    assert_fits(page)
    screenshot(page, "decide-in-part")
    page.get_by_role("button", name="Record the decision").click()
    expect(page.locator(".message-success")).to_be_visible()
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == gpu_hours_to_seconds(Decimal(56))
    expect(menu_link(page, "Requests")).to_have_accessible_name("Requests")

    # A colleague invited by e-mail: nobody has the address yet, so the invitation waits.
    page.goto("/")
    go(page, "Projects", "/projects/")
    page.get_by_role("link", name=world.tenant.name).first.click()
    page.wait_for_url(f"**/tenants/{world.tenant.slug}/")
    page.get_by_label("Username or e-mail").fill("newcomer@example.org")
    page.get_by_label("Role", exact=True).select_option("member")
    page.get_by_role("button", name="Add or invite").click()
    expect(page.get_by_text("Nobody in the portal has the address newcomer@example.org yet")).to_be_visible()
    pending = page.get_by_role("table", name="Invitations to the tenant waiting for their invitee")
    expect(pending.get_by_role("rowheader", name="newcomer@example.org")).to_be_visible()
    assert_fits(page)
    screenshot(page, "invitation-pending")
    assert MembershipInvitation.objects.get(email="newcomer@example.org").state == InvitationState.PENDING

    # The tenant's spend by GPU type.
    go(page, "Billing", "/billing/")
    page.get_by_role("link", name=re.compile("^Spend by project")).click()
    page.wait_for_url(at_path("/billing/spend/"))
    page.get_by_label("Group by").select_option("gpu_type")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"/billing/spend/\?(.*&)?group=gpu_type(&|$)"))
    rows = table_rows(page, "#spend-table")
    assert sorted(row[0] for row in rows) == ["Total", "a100", "h100"]
    assert rows[-1][0] == "Total"
    assert rows[-1][2] == str(world.invoice().total)  # name, GPU-hours, spent, previous, change, %
    assert_fits(page)
    screenshot(page, "spend-by-gpu-type")

    # This month's invoice as CSV.
    go(page, "Billing", "/billing/")
    page.get_by_role("link", name=timezone.localdate().strftime("%Y-%m")).click()
    page.wait_for_url(f"**/billing/invoices/{world.invoice().pk}/")
    screenshot(page, "invoice")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download CSV").click()
    csv_text = Path(download_info.value.path()).read_text(encoding="utf-8")
    assert world.label in csv_text
    assert "TOTAL" in csv_text
    assert str(world.invoice().total) in csv_text

    # On the laptop: every page of the menu (the request decided, no count any more), and the invitation.
    laptop = open_page(world.tenant_admin)
    visit_every_menu_page(laptop, DECIDER, screenshot)
    laptop.goto(f"/tenants/{world.tenant.slug}/")
    expect(laptop.get_by_role("rowheader", name="newcomer@example.org")).to_be_visible()


# Portal admin ---------------------------------------------------------------------------------------------


def test_a_portal_admins_week_on_a_laptop_and_a_phone(
    world: World,
    open_page: Any,
    screenshot: Any,
    celery_worker: str,
    slurm_accounts_to_remove: list[str],  # noqa: F811  (the fixture imported above)
) -> None:
    staff = world.portal_admin
    starts = (timezone.localdate() + timedelta(days=40)).replace(day=1)
    slug = f"orbit{world.tenant.slug[-6:]}"

    page = open_page(staff)
    page.goto("/")
    go(page, "Admin", "/staff/")
    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Tenants").click()
    page.wait_for_url("**/staff/tenants/")
    page.get_by_label("Slug", exact=True).fill(slug)
    page.get_by_label("Name", exact=True).fill("Orbit Labs")
    page.get_by_role("button", name="Create tenant").click()
    page.wait_for_url(f"**/staff/tenants/{slug}/")
    tenant = Tenant.objects.get(slug=slug)
    slurm_accounts_to_remove.append(tenant.slurm_parent_account)
    page.locator("#id_project_slug").fill("rockets")
    page.locator("#id_project_name").fill("Rocket simulations")
    page.get_by_role("button", name="Create project").click()
    page.wait_for_url(f"**/staff/tenants/{slug}/projects/rockets/")
    slurm_accounts_to_remove.insert(0, Project.objects.get(tenant=tenant, slug="rockets").slurm_account)
    screenshot(page, "project-created")

    page.get_by_role("navigation", name="Breadcrumbs").get_by_role("link", name=slug).click()
    page.get_by_role("link", name=f"Manage members of {slug}").click()
    page.wait_for_url(f"**/tenants/{slug}/")
    page.get_by_label("Username or e-mail").fill(world.colleague.username)
    page.get_by_label("Role", exact=True).select_option("admin")
    page.get_by_role("button", name="Add or invite").click()
    expect(page.locator(".message-success")).to_contain_text(f"{world.colleague.username} joined tenant {slug}")
    screenshot(page, "member-added")
    assert TenantMembership.objects.get(tenant=tenant, user=world.colleague).role == "admin"

    # A new price from next month on; this month's charges keep theirs.
    page.goto("/staff/")
    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Rates").click()
    page.get_by_label("Cluster").select_option(world.cluster.name)
    page.get_by_label("GPU type").fill("h100")
    page.get_by_label("Price per GPU-hour").fill("2.5")
    page.get_by_label("Currency").fill("EUR")
    page.get_by_label("Valid from").fill(starts.isoformat())
    page.get_by_role("button", name="Create rate").click()
    page.wait_for_url("**/staff/rates/")
    expect(page.get_by_role("status")).to_have_text(
        f"Rate set: {world.cluster.name} h100: 2.5 EUR/GPU-hour from {starts:%Y-%m-%d} 00:00."
    )
    screenshot(page, "rate-set")
    invoice_total = world.invoice().total

    # The cluster checked by a worker: the page waits for its answer.
    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Clusters").click()
    page.get_by_role("link", name=world.cluster.name, exact=True).first.click()
    page.wait_for_url(f"**/staff/clusters/{world.cluster.name}/")
    checked_before = Cluster.objects.get(pk=world.cluster.pk).last_ping_at
    page.get_by_role("button", name=f"Check {world.cluster.name} now").click()
    page.wait_for_url(re.compile(r"[?&]since="))
    status = page.locator("#cluster-status:not([aria-busy])")
    expect(status.locator("#cluster-reachable")).to_contain_text("Yes", timeout=60_000)
    expect(status.locator("#cluster-version")).to_contain_text("Slurm 22.05")
    assert Cluster.objects.get(pk=world.cluster.pk).last_ping_at != checked_before
    screenshot(page, "cluster-checked")

    # The node board, grouped by switch.
    go(page, "Clusters", "/clusters/")
    page.get_by_role("link", name=world.cluster.name, exact=True).first.click()
    page.wait_for_url(f"**/clusters/{world.cluster.name}/")
    groups = page.eval_on_selector_all(
        "section.switch-group",
        "groups => groups.map(group => [group.dataset.switch,"
        " Array.from(group.querySelectorAll('[data-node]'), node => node.dataset.node)])",
    )
    assert groups == [["leaf1", ["gpu01", "gpu02"]], ["leaf2", ["gpu03", "gpu04"]]]
    screenshot(page, "node-board")

    # Spend across tenants: the world's tenant at its invoice's total.
    go(page, "Admin", "/staff/")
    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Spend").click()
    page.wait_for_url(at_path("/staff/spend/"))
    tenant_row = [row for row in table_rows(page, "#spend-table") if row[0] == world.tenant.slug]
    assert tenant_row, table_rows(page, "#spend-table")
    assert tenant_row[0][2] == str(invoice_total)  # name, GPU-hours, spent, previous, change, %
    screenshot(page, "spend-overview")

    # Every change in the audit log.
    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Audit log").click()
    page.wait_for_url("**/staff/audit/")
    mine = ["rate.create", "tenant_member.added", "project.created", "tenant.created"]  # newest first
    actions = page.locator("tbody th code").all_inner_texts()
    assert [action for action in actions if action in mine][:4] == mine
    screenshot(page, "audit-log")
    assert AuditEvent.objects.filter(actor=staff, action="tenant.created", target_label=slug).exists()

    # On the phone: every page of the menu, and the audit log readable.
    phone = open_page(staff, viewport="phone")
    visit_every_menu_page(phone, PORTAL_ADMIN, screenshot)
    phone.goto("/")
    go(phone, "Admin", "/staff/")
    phone.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Audit log").click()
    phone.wait_for_url("**/staff/audit/")
    expect(phone.locator("tbody th code").first).to_be_visible()
    assert_fits(phone)
    screenshot(phone, "audit-log-phone")
