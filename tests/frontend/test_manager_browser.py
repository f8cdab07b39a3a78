"""A tenant admin in a real browser: from the navigation to the tenant's members, inviting a colleague by e-mail,
setting their role, and leaving an invitation pending for an address nobody has yet."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import InvitationState, MembershipInvitation, TenantMembership
from tests.conftest import SentTask
from tests.factories import make_tenant, make_user

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """No worker runs here; tenant memberships queue nothing, but the services may."""


def test_a_tenant_admin_invites_a_colleague_by_email_and_sets_their_role(open_page: Any, screenshot: Any) -> None:
    admin = make_user("ada")
    tenant = make_tenant("acme", admin=admin)
    colleague = make_user("sam")
    colleague.email = "sam@example.org"
    colleague.save(update_fields=["email"])

    page = open_page(admin)
    page.goto("/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Projects").click()
    page.get_by_role("link", name=tenant.name).click()
    page.wait_for_url("**/tenants/acme/")
    screenshot(page, "tenant-members")

    page.get_by_label("Username or e-mail").fill("sam@example.org")
    page.get_by_label("Role", exact=True).select_option("member")
    page.get_by_role("button", name="Add or invite").click()
    page.get_by_text("sam joined tenant acme as Member. They have been told.").wait_for()
    screenshot(page, "colleague-added")

    page.get_by_label("Role of sam").select_option("admin")
    page.get_by_role("button", name="Change role of sam").click()
    page.get_by_text("sam is now Tenant admin in tenant acme.").wait_for()
    assert TenantMembership.objects.get(tenant=tenant, user=colleague).role == "admin"

    page.get_by_label("Username or e-mail").fill("newcomer@example.org")
    page.get_by_role("button", name="Add or invite").click()
    page.get_by_text("Nobody in the portal has the address newcomer@example.org yet").wait_for()
    pending = page.get_by_role("table", name="Invitations to the tenant waiting for their invitee")
    assert pending.get_by_role("rowheader", name="newcomer@example.org").is_visible()
    screenshot(page, "invitation-pending")
    assert MembershipInvitation.objects.get(email="newcomer@example.org").state == InvitationState.PENDING
