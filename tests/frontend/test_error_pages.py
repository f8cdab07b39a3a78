"""The portal's own error pages (templates 403.html, 404.html, 500.html), as browser users get them with DEBUG
off, and the JSON error shape that API clients get for the same three failures at /api/ addresses.

The live portal runs like production (PORTAL_DEBUG=false). A crash cannot be provoked in its process, so the
500 is checked in-process (Django's test client runs with DEBUG off too), and its HTML is then shown in
Chromium at the portal's address to check that it renders in the portal's look on a phone.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from tests.factories import make_user
from tests.frontend.conftest import VIEWPORTS, session_cookie_for

pytestmark = [pytest.mark.django_db(transaction=True)]

# The portal's look: the header's surface colour, from portal.css.
HEADER_BACKGROUND = "rgb(246, 248, 250)"
DJANGO_DEBUG_MARKS = ("Django", "Traceback", "URLconf", "DEBUG = True")


def _assert_portal_look(page: Any, heading: str) -> None:
    assert page.get_by_role("heading", level=1).inner_text() == heading
    assert page.title() == f"{heading} · GPU portal"
    header = page.locator(".site-header")
    assert header.evaluate("element => getComputedStyle(element).backgroundColor") == HEADER_BACKGROUND
    assert page.get_by_role("link", name="Go to your dashboard").get_attribute("href") == "/"
    text = page.content()
    assert not [mark for mark in DJANGO_DEBUG_MARKS if mark in text]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("viewport", ["phone", "desktop"])
def test_an_unknown_page_answers_the_portals_404(open_page: Any, screenshot: Any, viewport: str) -> None:
    page = open_page(make_user("alice"), viewport=viewport)

    response = page.goto("/no/such/page/")

    assert response.status == 404
    assert response.headers["content-type"].startswith("text/html")
    _assert_portal_look(page, "Not found")
    screenshot(page, f"404-{viewport}")


def test_an_unknown_page_answers_404_to_anonymous_visitors_too(open_page: Any) -> None:
    page = open_page()

    assert page.goto("/no/such/page/").status == 404
    _assert_portal_look(page, "Not found")


@pytest.mark.parametrize("viewport", ["phone", "desktop"])
def test_a_page_the_role_may_not_use_answers_the_portals_403(open_page: Any, screenshot: Any, viewport: str) -> None:
    page = open_page(make_user("bob"), viewport=viewport)

    response = page.goto("/staff/")

    assert response.status == 403
    assert response.headers["content-type"].startswith("text/html")
    _assert_portal_look(page, "Not allowed")
    screenshot(page, f"403-{viewport}")


def test_a_form_sent_without_its_token_answers_the_portals_403(open_page: Any, screenshot: Any) -> None:
    page = open_page(make_user("gina"), viewport="phone")
    page.goto("/notifications/")

    # A form like the page's own, without the CSRF token: what a stale tab or another site would send.
    with page.expect_navigation():
        page.evaluate(
            """() => {
              const form = document.createElement("form");
              form.method = "post";
              form.action = "/notifications/read-all/";
              document.body.append(form);
              form.submit();
            }"""
        )

    assert page.get_by_role("heading", level=1).inner_text() == "Form expired"
    _assert_portal_look(page, "Form expired")
    screenshot(page, "403-csrf-phone")


def test_api_addresses_keep_the_json_error_shape_for_404_and_403(open_page: Any) -> None:
    page = open_page(make_user("carol"))
    page.goto("/")

    unknown = page.context.request.get("/api/v1/no-such-thing/")
    forbidden = page.context.request.get("/api/v1/reconciliation-reports/")

    assert unknown.status == 404
    assert unknown.json() == {
        "code": "not_found",
        "message": "There is no API route /api/v1/no-such-thing/; see /api/docs/.",
        "fields": {},
    }
    assert forbidden.status == 403
    assert forbidden.json()["code"] == "permission_denied"
    assert forbidden.json()["fields"] == {}


def _crash(*args: object, **kwargs: object) -> None:
    raise RuntimeError("a bug")


def test_a_crash_on_a_page_answers_the_portals_500(monkeypatch: pytest.MonkeyPatch) -> None:
    from frontend import context_processors

    monkeypatch.setattr(context_processors, "user_reach_with_unread", _crash)
    client = Client(raise_request_exception=False)
    client.force_login(make_user("dave"))

    response = client.get("/jobs/")

    assert not settings.DEBUG
    assert response.status_code == 500
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "<h1>Something failed</h1>" in html
    assert "frontend/portal.css" in html
    assert "a bug" not in html
    assert "Traceback" not in html


def test_a_crash_at_an_api_address_answers_the_json_error_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from portal import apis

    monkeypatch.setattr(apis.MeApi, "get", _crash)
    client = Client(raise_request_exception=False)
    client.force_login(make_user("erin"))

    response = client.get("/api/v1/me/")

    assert response.status_code == 500
    assert response.json() == {
        "code": "server_error",
        "message": "The portal failed to handle this request; it has been logged. Try again, or tell the admins.",
        "fields": {},
    }


def test_the_500_page_renders_in_the_portals_look_on_a_phone(
    monkeypatch: pytest.MonkeyPatch, chromium: Any, live_portal: str, screenshot: Any
) -> None:
    """The crash's HTML from the test client, served by Chromium at the live portal's address (its stylesheet
    then comes from the portal, under the portal's content security policy)."""
    from frontend import context_processors

    monkeypatch.setattr(context_processors, "user_reach_with_unread", _crash)
    user = make_user("frank")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    crashed = client.get("/jobs/")
    policy = Client().get("/login/")["Content-Security-Policy"]

    context = chromium.new_context(base_url=live_portal, viewport=VIEWPORTS["phone"])
    try:
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": session_cookie_for(user), "url": live_portal}]
        )
        page = context.new_page()
        violations: list[str] = []
        page.on(
            "console",
            lambda message: violations.append(message.text) if "Content Security Policy" in message.text else None,
        )
        page.route(
            f"{live_portal}/jobs/",
            lambda route: route.fulfill(
                status=500,
                body=crashed.content,
                headers={"Content-Type": crashed["Content-Type"], "Content-Security-Policy": policy},
            ),
        )

        assert page.goto("/jobs/").status == 500
        _assert_portal_look(page, "Something failed")
        screenshot(page, "500-phone")
        assert violations == []
    finally:
        context.close()
