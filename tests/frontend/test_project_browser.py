"""The projects area in a real browser: the project and allocation pages on a phone and a desktop, the burn-down
drawn as a canvas under the content security policy, and asking for more GPU-hours through the form."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs.models import Job
from quotas.models import QuotaRequest, period_start
from quotas.services import quota_charge
from tests.conftest import SentTask
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """The test's own service calls queue Slurm and quota tasks after commit; no worker runs here."""


@pytest.fixture
def burning() -> dict[str, Any]:
    """bob, a member of acme/vision, whose allocation of 100 GPU-hours burned 45 of them in the last week."""
    bob = make_user("bob")
    tenant = make_tenant("acme", admin=make_user("alice"))
    project = make_project(tenant, "vision")
    add_project_member(project, bob, "member")
    cluster = make_matrix_cluster("gpucluster")
    today = timezone.now().date()
    allocation = grant_allocation(
        project, cluster, gpu_hours=100, starts_on=today - timedelta(days=9), ends_on=today + timedelta(days=20)
    )

    def charge(day: date, gpu_seconds: int) -> None:
        ended = period_start(day) + timedelta(hours=12)
        job = Job.objects.create(
            project=project,
            cluster=cluster,
            cluster_username="bob",
            name="burn",
            partition="gpu",
            gpus=1,
            time_limit_minutes=1,
            ended_at=ended,
        )
        assert quota_charge(job=job, gpu_seconds=gpu_seconds, now=ended, note="from accounting")

    charge(today - timedelta(days=5), 36_000)
    charge(today - timedelta(days=2), 126_000)
    return {"user": bob, "admin": tenant.memberships.get(role="admin").user, "allocation": allocation, "today": today}


def test_project_and_allocation_pages_fit_a_phone_and_draw_the_burn_down(
    open_page: Any, screenshot: Any, burning: dict[str, Any]
) -> None:
    allocation_path = f"/projects/acme/vision/allocations/{burning['allocation'].pk}/"
    for viewport in ("phone", "desktop"):
        page = open_page(burning["user"], viewport=viewport)
        page.goto("/projects/acme/vision/")
        assert page.get_by_role("heading", name="Allocations").is_visible()
        assert page.locator(".quota-gauge").count() == 1
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        screenshot(page, f"project-{viewport}")

        page.get_by_role("link", name="gpucluster · any GPU type").click()
        page.wait_for_url(f"**{allocation_path}")
        page.locator(".burn-down canvas").first.wait_for()
        assert page.locator(".burn-down .u-legend").inner_text().count("Projected") == 1
        exhaustion = burning["today"] + timedelta(days=8)
        assert (
            f"runs out on {exhaustion}, 12 days before its period ends"
            in page.locator("#projection-sentence").inner_text()
        )
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        screenshot(page, f"allocation-{viewport}")


def test_member_forms_and_tokens_fit_a_phone_and_the_secret_is_shown_once(
    open_page: Any, screenshot: Any, burning: dict[str, Any]
) -> None:
    page = open_page(burning["admin"], viewport="phone")
    for path, name in (("/tenants/acme/", "tenant"), ("/projects/acme/vision/members/", "members")):
        page.goto(path)
        assert page.get_by_role("heading", name="Add a member").is_visible()
        page.locator("details.confirm summary").first.click()  # the removal confirmation opens in place
        # What sticks out, named in the failure message.
        wide = page.evaluate(
            "[...document.querySelectorAll('body *')]"
            ".filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
            ".map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).slice(0, 12)"
        )
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (path, wide)
        screenshot(page, f"{name}-phone")

    page.goto("/tokens/")
    page.get_by_label("Name").fill("laptop")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#token-secret").inner_text()
    assert secret.startswith("gpp_")
    assert "it will not be shown again" in page.get_by_role("alert").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "token-created-phone")
    page.get_by_role("link", name="Done: back to your tokens").click()
    assert page.locator("#main").inner_text().count("laptop") >= 1
    assert secret not in page.content()
    screenshot(page, "tokens-phone")


def test_a_member_requests_more_hours_through_the_form(
    open_page: Any, screenshot: Any, burning: dict[str, Any]
) -> None:
    page = open_page(burning["user"], viewport="desktop")
    page.goto(f"/projects/acme/vision/allocations/{burning['allocation'].pk}/")

    # Keyboard only: the fields are labelled and the button is reached with Tab.
    page.get_by_role("textbox", name="GPU-hours", exact=True).fill("0")
    page.get_by_role("button", name="Send the request").click()
    assert page.locator("#request-gpu-hours-error").inner_text() == "Ask for more than 0 GPU-hours, e.g. 20 or 12.5."
    assert page.get_by_role("textbox", name="GPU-hours", exact=True).get_attribute("aria-invalid") == "true"
    screenshot(page, "request-errors")

    page.get_by_role("textbox", name="GPU-hours", exact=True).fill("40")
    page.get_by_role("textbox", name="Justification").fill("A second training run of the vision model")
    page.get_by_role("textbox", name="Justification").focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")

    page.locator(".message-success").wait_for()
    assert "You asked for 40.0 more GPU-hours" in page.locator(".message-success").inner_text()
    request = QuotaRequest.objects.get()
    row = page.locator(f"#request-{request.pk}")
    assert row.locator(".badge-pending").inner_text() == "Pending"
    assert "A second training run of the vision model" in row.inner_text()
    screenshot(page, "request-pending")

    row.get_by_role("button", name="Withdraw").click()
    page.locator(".message-success").wait_for()
    assert page.locator(f"#request-{request.pk} .badge-withdrawn").inner_text() == "Withdrawn"
