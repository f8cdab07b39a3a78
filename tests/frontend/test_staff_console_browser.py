"""In a real browser on the real server: a portal admin sets up a new customer from the admin console alone
(a tenant, its project, a member and a price), and the audit log shows every step; on a phone the console's
pages fit the screen."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.models import Rate
from tenants.models import AuditEvent, Project, ProjectMembership, Tenant, TenantMembership
from tests.factories import make_matrix_cluster, make_user

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_portal_admin_creates_a_tenant_a_project_a_member_and_a_rate(open_page: Any, screenshot: Any) -> None:
    staff = make_user("root", is_staff=True)
    bob = make_user("bob")
    make_matrix_cluster("browsercluster")
    starts = (timezone.now() + timedelta(days=40)).date().replace(day=1)

    page = open_page(staff)
    page.goto("/staff/")
    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Tenants").click()
    page.wait_for_url("**/staff/tenants/")
    page.get_by_label("Slug", exact=True).fill("Orbit Labs")
    page.get_by_label("Name", exact=True).fill("Orbit Labs")
    page.get_by_role("button", name="Create tenant").click()
    # The slug is refused beside its field, and the form keeps what was typed.
    assert "is not a valid slug" in page.locator("#id_slug-error").inner_text()
    assert page.get_by_label("Name", exact=True).input_value() == "Orbit Labs"
    screenshot(page, "tenant-slug-refused")
    page.get_by_label("Slug", exact=True).fill("orbit")
    page.get_by_role("button", name="Create tenant").click()
    page.wait_for_url("**/staff/tenants/orbit/")
    assert page.get_by_role("status").inner_text() == "Tenant orbit created; add its members and projects below."

    page.locator("#id_project_slug").fill("rockets")
    page.locator("#id_project_name").fill("Rocket simulations")
    page.get_by_role("button", name="Create project").click()
    page.wait_for_url("**/staff/tenants/orbit/projects/rockets/")
    assert page.locator("#account-state-browsercluster").inner_text() == "Pending"
    screenshot(page, "project-created")

    page.get_by_role("navigation", name="Breadcrumbs").get_by_role("link", name="orbit").click()
    page.get_by_role("link", name="Manage members of orbit").click()
    page.wait_for_url("**/tenants/orbit/")
    page.get_by_label("Username or e-mail").fill("bob")
    page.get_by_label("Role", exact=True).select_option("member")
    page.get_by_role("button", name="Add or invite").click()
    page.wait_for_url("**/tenants/orbit/")
    page.goto("/staff/tenants/orbit/projects/rockets/")
    page.get_by_role("link", name="Manage members of orbit/rockets").click()
    page.wait_for_url("**/projects/orbit/rockets/members/")
    page.get_by_label("Username or e-mail").fill("bob")
    page.get_by_label("Role", exact=True).select_option("member")
    page.get_by_role("button", name="Add or invite").click()
    page.wait_for_url("**/projects/orbit/rockets/members/")
    screenshot(page, "member-added")

    page.goto("/staff/rates/")
    assert "A new rate never changes past charges" in page.locator("#rate-rule").inner_text()
    page.get_by_label("Cluster").select_option("browsercluster")
    page.get_by_label("GPU type").fill("h100")
    page.get_by_label("Price per GPU-hour").fill("2.12345")
    page.get_by_label("Currency").fill("EUR")
    page.get_by_label("Valid from").fill(starts.isoformat())
    page.get_by_role("button", name="Create rate").click()
    assert page.locator("#id_price_per_gpu_hour-error").inner_text() == "Give at most 4 decimals, e.g. 2.1250."
    screenshot(page, "rate-refused")
    page.get_by_label("Price per GPU-hour").fill("2.5")
    page.get_by_role("button", name="Create rate").click()
    page.wait_for_url("**/staff/rates/")
    assert page.get_by_role("status").inner_text() == (
        f"Rate set: browsercluster h100: 2.5 EUR/GPU-hour from {starts:%Y-%m-%d} 00:00."
    )
    screenshot(page, "rate-set")

    page.get_by_role("navigation", name="Admin pages").get_by_role("link", name="Audit log").click()
    page.wait_for_url("**/staff/audit/")
    actions = page.locator("tbody th code").all_inner_texts()
    assert actions[:5] == [
        "rate.create",
        "project_member.added",
        "tenant_member.added",
        "project.created",
        "tenant.created",
    ]
    screenshot(page, "audit-log")

    tenant = Tenant.objects.get(slug="orbit")
    project = Project.objects.get(tenant=tenant, slug="rockets")
    assert TenantMembership.objects.get(tenant=tenant, user=bob).role == "member"
    assert ProjectMembership.objects.get(project=project, user=bob).role == "member"
    rate = Rate.objects.get(cluster__name="browsercluster")
    assert (rate.gpu_type, rate.price_per_gpu_hour, rate.currency) == ("h100", Decimal("2.5"), "EUR")
    assert set(AuditEvent.objects.filter(actor=staff).values_list("action", flat=True)) == {
        "tenant.created",
        "project.created",
        "tenant_member.added",
        "project_member.added",
        "rate.create",
    }

    phone = open_page(staff, viewport="phone")
    for url in ("/staff/tenants/", "/staff/tenants/orbit/", "/staff/audit/"):
        phone.goto(url)
        assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), url
    screenshot(phone, "audit-log-phone")
