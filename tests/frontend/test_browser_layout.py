"""The layout in a real browser: sign in through the form, the navigation each role gets, the content
security policy the pages satisfy, and the phone, tablet and desktop widths."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.factories import PASSWORD, make_tenant, make_user

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_signing_in_through_the_form_lands_on_the_dashboard_under_the_csp(open_page: Any, screenshot: Any) -> None:
    make_user("alice")
    page = open_page()

    page.goto("/")
    assert page.url.endswith("/login/?next=/")
    policy = page.context.request.get("/login/").headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    screenshot(page, "login")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.wait_for_url(re.compile(r"^http://[^/]+/$"))
    assert (
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Dashboard").get_attribute("aria-current")
        == "page"
    )
    screenshot(page, "dashboard")


@pytest.mark.parametrize("viewport", ["phone", "tablet", "desktop"])
def test_the_navigation_fits_every_width_and_offers_only_what_the_role_may_use(
    open_page: Any, screenshot: Any, viewport: str
) -> None:
    member = make_user("bob")
    make_tenant("acme", admin=make_user("alice"))
    staff = make_user("root", is_staff=True)

    page = open_page(member, viewport=viewport)
    page.goto("/")
    menu = page.get_by_role("button", name="Menu")
    if viewport == "phone":
        # On a phone the navigation folds behind the Menu button; it opens and closes from the keyboard.
        assert not page.get_by_role("navigation", name="Main").is_visible()
        menu.focus()
        page.keyboard.press("Enter")
        assert menu.get_attribute("aria-expanded") == "true"
        page.keyboard.press("Escape")
        assert menu.get_attribute("aria-expanded") == "false"
        assert page.evaluate("document.activeElement.getAttribute('aria-controls')") == "site-menu"
        menu.click()
    else:
        assert not menu.is_visible()
    navigation = page.get_by_role("navigation", name="Main")
    labels = [link.inner_text() for link in navigation.get_by_role("link").all()]
    assert labels == ["Dashboard", "Jobs", "Submit", "Clusters", "Projects"]
    # Nothing wider than the screen: no sideways scrolling of the whole page.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, f"member-{viewport}")

    page = open_page(staff, viewport=viewport)
    page.goto("/")
    if viewport == "phone":
        page.get_by_role("button", name="Menu").click()
    labels = [link.inner_text() for link in page.get_by_role("navigation", name="Main").get_by_role("link").all()]
    assert labels == ["Dashboard", "Jobs", "Submit", "Clusters", "Projects", "Requests", "Billing", "Admin"]
