"""GPU efficiency in a real browser: a tenant admin reads the month's idle GPU-hours, their cost and the worst jobs,
and downloads the CSV, which a member of another tenant reaches neither; a manager sets the project's idle-GPU
policy on a phone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.models import ProjectEfficiencyPolicy
from tenants.models import AuditEvent
from tests.conftest import SentTask
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user
from tests.frontend.test_efficiency_pages import World

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """The world's own service calls queue tasks after commit; no worker runs here."""


def test_a_tenant_admin_reads_the_months_idle_cost_and_downloads_it_and_another_tenant_cannot(
    open_page: Any, screenshot: Any
) -> None:
    world = World()  # last month: ann's 2-GPU job idled 1.5 GPU-hours at 2 EUR per GPU-hour
    month = f"{world.month:%Y-%m}"
    page = open_page(world.tenant_admin, viewport="desktop")

    page.goto(f"/billing/efficiency/?month={month}")  # the first scope offered is the admin's tenant

    assert page.get_by_role("heading", level=1).inner_text() == f"GPU efficiency: acme, {world.month:%B %Y}"
    assert page.locator('[data-field="idle-gpu-hours"]').inner_text() == "1.50"
    assert page.locator('[data-field="idle-cost"]').inner_text() == "3.00 EUR"
    worst = page.get_by_role("table", name="The jobs that idled the most GPU-hours")
    assert [row.inner_text().split("\t") for row in worst.locator("tbody tr").all()] == [
        ["job", "acme/vision", "2", "25.0%", "21714 MiB", "1.50", "3.00 EUR"]
    ]
    screenshot(page, "efficiency-tenant-admin")
    worst.get_by_role("link", name="job").click()
    page.wait_for_url(f"**/jobs/{world.finished.pk}/")
    assert page.locator("#idle-cost").inner_text() == "3.00 EUR at 2.0000 EUR per GPU-hour"
    page.go_back()

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download CSV").click()
    download = download_info.value
    assert download.suggested_filename == f"efficiency-acme-{month}.csv"
    lines = Path(download.path()).read_text().splitlines()
    assert lines[0].startswith("job_id,name,project,cluster,user,started_at,ended_at,gpus,")
    assert world.finished.started_at is not None
    assert world.finished.ended_at is not None
    started, ended = world.finished.started_at.isoformat(), world.finished.ended_at.isoformat()
    assert lines[1:] == [
        f"{world.finished.pk},job,acme/vision,effpages,ann,{started},{ended},2,dcgm,25.0,21714,1.50,EUR,2.0000,3.00,"
        "no,0.00,0.00"
    ]

    outsider = make_user("olga")
    add_tenant_member(make_tenant("otherco", admin=make_user("oscar")), outsider)
    other = open_page(outsider, viewport="desktop")
    csv_path = f"/api/v1/efficiency/csv/?month={month}&tenant=acme"
    for path in (f"/billing/efficiency/?scope=acme&month={month}", csv_path):
        answer = other.goto(path)
        assert answer is not None
        assert answer.status == 404, path
        assert "3.00" not in other.content()
    answer = other.goto(f"/billing/efficiency/?month={month}")  # olga administers nothing: no report of hers either
    assert answer is not None
    assert answer.status == 403
    assert "acme" not in other.content()
    screenshot(other, "efficiency-outsider")


def test_a_manager_sets_the_projects_idle_gpu_policy_on_a_phone(open_page: Any, screenshot: Any) -> None:
    project = make_project(make_tenant("acme"), "vision")
    manager = make_user("max")
    add_project_member(project, manager, "manager")
    page = open_page(manager, viewport="phone")
    page.goto("/projects/acme/vision/")

    page.get_by_label("End jobs whose GPUs all stay idle, warning their owner first").check()
    limit = page.get_by_label("End after all GPUs idle for (minutes)")
    limit.fill("10")
    page.get_by_role("button", name="Save the idle-GPU policy").click()
    assert (
        page.locator("#policy-limit-error").inner_text() == "Give between 15 and 10080 minutes (a week); you gave 10."
    )
    assert limit.get_attribute("aria-invalid") == "true"
    assert page.get_by_label("End jobs whose GPUs all stay idle, warning their owner first").is_checked()
    assert not ProjectEfficiencyPolicy.objects.exists()
    screenshot(page, "policy-refused-phone")

    limit.fill("60")
    page.get_by_role("button", name="Save the idle-GPU policy").click()
    page.locator(".message-success").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "policy-saved-phone")
    policy = ProjectEfficiencyPolicy.objects.get(project=project)
    assert (policy.notify_managers, policy.end_idle_jobs, policy.end_after_idle_seconds, policy.warning_seconds) == (
        False,
        True,
        3600,
        900,
    )
    assert AuditEvent.objects.get(action="project.efficiency_policy_updated").actor == manager
