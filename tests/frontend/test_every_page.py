"""Every browser page of every role, on a phone and under axe-core.

The pages come from the isolation matrix (tests/tenants/test_isolation_matrix.py, with the page matrices of
tests/frontend/page_matrix.py merged in): each GET route a role may open (200), plus the portal's own error
pages that role meets (an unknown address, and a page its role may not use). A page added to a matrix is
checked here without further work.

- On a phone (390 x 844) nothing is wider than the screen, and the Menu button opens the navigation with every
  link in it reachable. A screenshot of each page goes to test-artifacts/screenshots/.
- axe-core (npm, copied to frontend/test-vendor/ by scripts/frontend.sh; never served to users) finds no serious
  or critical violation, on a laptop and on a phone with the menu open.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tenants import test_isolation_matrix as isolation
from tests.tenants.test_isolation_matrix import MATRIX, World

# The isolation matrix's world (a tenant, its project and one user per role, with a job, an invoice, ...), as
# a fixture of this module too.
world = isolation.world

pytestmark = [pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).resolve().parents[2] / "frontend" / "test-vendor" / "axe.min.js"
PHONE_WIDTH = 390
# Routes that are no page of the portal's own look: JSON, Swagger's UI, infrastructure, redirects.
NOT_PAGES = re.compile(r"^(api/|healthz|metrics|logout/|login/code/|oidc/)")
SIGNED_IN_ROLES = ("outsider", "tenant_member", "viewer", "member", "manager", "tenant_admin", "staff")
UNKNOWN_PAGE = "/no-such-page/"


def pages_for(role: str, world: World) -> Iterator[tuple[str, int]]:
    """(address, status) of every page `role` may open, then the error pages it meets."""
    denied = None
    for route, methods in MATRIX.items():
        if NOT_PAGES.match(route) or "GET" not in methods:
            continue
        status = methods["GET"].expected.get(role)
        if status == 200:
            yield isolation._url(route, world), 200
        elif status == 403 and denied is None:
            denied = isolation._url(route, world)
    if role != "anonymous":
        yield UNKNOWN_PAGE, 404
        if denied is not None:
            yield denied, 403


def _open(page: Any, url: str, status: int) -> None:
    response = page.goto(url)
    assert response is not None
    assert response.status == status, f"{url} answered {response.status}"
    # htmx fragments loaded on page load (hx-trigger="load") are part of the page.
    page.wait_for_load_state("networkidle")


# The outermost elements that reach past the right edge of the screen, as "tag#id.class" paths.
TOO_WIDE = """() => {
  const width = document.documentElement.clientWidth;
  const name = (element) => element.tagName.toLowerCase() + (element.id ? "#" + element.id : "")
    + [...element.classList].map((c) => "." + c).join("");
  return [...document.body.querySelectorAll("*")]
    .filter((element) => element.getBoundingClientRect().right > width + 0.5)
    .filter((element) => !element.parentElement || element.parentElement.getBoundingClientRect().right <= width + 0.5)
    .slice(0, 5)
    .map((element) => {
      const path = [];
      for (let at = element; at && at !== document.body; at = at.parentElement) path.unshift(name(at));
      return path.join(" > ") + " (" + Math.round(element.getBoundingClientRect().right) + " px)";
    });
}"""


def _assert_fits(page: Any, url: str) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > PHONE_WIDTH:
        culprits = "\n".join(page.evaluate(TOO_WIDE))
        pytest.fail(f"{url} is {width} px wide on a {PHONE_WIDTH} px phone; too wide:\n{culprits}")


def _axe_violations(page: Any) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, one readable line per element.

    Evaluated through the DevTools protocol rather than a <script> tag, which the content security policy
    would (rightly) refuse."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    results = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    lines = []
    for violation in results["violations"]:
        if violation["impact"] not in ("serious", "critical"):
            continue
        for node in violation["nodes"]:
            summary = node.get("failureSummary", "").replace("\n", " ")
            lines.append(
                f"{page.url} [{violation['impact']}] {violation['id']}: {violation['help']} "
                f"at {' '.join(node['target'])}: {summary}"
            )
    return lines


def _open_menu(page: Any) -> None:
    toggle = page.get_by_role("button", name="Menu")
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true"


@pytest.fixture(scope="module", autouse=True)
def axe_installed() -> None:
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run scripts/frontend.sh")


@pytest.mark.parametrize("role", ["anonymous", *SIGNED_IN_ROLES])
def test_every_page_fits_a_phone_reaches_every_link_and_passes_axe(
    world: World, open_page: Any, screenshot: Any, role: str
) -> None:
    page = open_page(world.users[role], viewport="phone")
    violations: list[str] = []
    for url, status in pages_for(role, world):
        _open(page, url, status)
        _assert_fits(page, url)
        screenshot(page, re.sub(r"\W+", "-", url.strip("/")) or "home")
        if role != "anonymous" and status == 200:
            # The navigation's links and the account's (notifications, tokens, log out) fold into the menu.
            navigation = page.locator("#site-menu a, #site-menu button")
            assert not navigation.first.is_visible(), f"{url}: the navigation should fold behind the menu"
            _open_menu(page)
            for link in navigation.all():
                assert link.is_visible(), f"{url}: {link.inner_text()} is not shown in the open menu"
                box = link.bounding_box()
                assert box["x"] >= 0, f"{url}: {link.inner_text()} is off the screen"
                assert box["x"] + box["width"] <= PHONE_WIDTH, f"{url}: {link.inner_text()} is off the screen"
            _assert_fits(page, url)
        # With the menu open, so that axe checks its links too.
        violations += _axe_violations(page)
    assert violations == [], "axe-core found serious or critical violations:\n" + "\n".join(violations)


@pytest.mark.parametrize("role", SIGNED_IN_ROLES)
def test_axe_finds_nothing_serious_on_any_page_on_a_laptop(world: World, open_page: Any, role: str) -> None:
    page = open_page(world.users[role])
    violations: list[str] = []
    for url, status in pages_for(role, world):
        _open(page, url, status)
        violations += _axe_violations(page)
    assert violations == [], "axe-core found serious or critical violations:\n" + "\n".join(violations)


def test_the_checks_report_what_they_are_for(world: World, open_page: Any) -> None:
    """The checks above can fail: an image without a text alternative and a too wide block are named."""
    page = open_page(world.users["member"], viewport="phone")
    _open(page, "/", 200)
    page.evaluate(
        """() => {
          const image = document.createElement("img");
          image.src = "/static/frontend/no-such-image.png";
          image.id = "unnamed-image";
          const block = document.createElement("div");
          block.style.width = "600px";
          block.id = "wide-block";
          block.textContent = "wider than a phone";
          document.querySelector("main").append(image, block);
        }"""
    )

    (violation,) = _axe_violations(page)
    assert "[critical] image-alt" in violation
    assert "#unnamed-image" in violation
    with pytest.raises(pytest.fail.Exception, match=r"main#main > div#wide-block \(6\d\d px\)"):
        _assert_fits(page, "/")


def test_low_priority_columns_fold_on_a_phone(world: World, open_page: Any) -> None:
    """`priority-2` columns (on the dashboard: the project of a job, a project's name and Slurm account) show on
    a laptop, not on a phone."""
    for viewport, shown in (("desktop", True), ("phone", False)):
        page = open_page(world.users["member"], viewport=viewport)
        _open(page, "/", 200)
        low_priority = page.locator("main .priority-2")
        assert low_priority.count() >= 4  # headings and cells
        assert [cell.is_visible() for cell in low_priority.all()] == [shown] * low_priority.count()
