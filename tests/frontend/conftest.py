"""The real stack for browser journeys: the portal's ASGI server (uvicorn) and Celery beat as processes on the
test database, the session's Celery worker, and Debian's Chromium driven by Playwright.

Browser tests must be transactional (`django_db(transaction=True)`): the server only sees committed rows.
Screenshots go to test-artifacts/screenshots/<test name>/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import Client

from tests.oidc_provider import CLIENT_ID as OIDC_CLIENT_ID
from tests.oidc_provider import CLIENT_SECRET as OIDC_CLIENT_SECRET
from tests.oidc_provider import DemoProvider
from tests.processes import free_port, portal_environment, stop, wait_until_answers

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
]
# Phone, tablet and desktop viewports the pages are checked at.
VIEWPORTS = {
    "phone": {"width": 390, "height": 844},
    "tablet": {"width": 820, "height": 1180},
    "desktop": {"width": 1366, "height": 900},
}


def _test_environment() -> dict[str, str]:
    return portal_environment(PORTAL_DEBUG="false")


@contextmanager
def portal_server(log: Path, *, port: int | None = None, environment: dict[str, str] | None = None) -> Iterator[str]:
    """The portal's ASGI server on `port` (a free one if not given), serving the test database with the test
    settings and `environment` added; yields its base URL once it answers, and stops it afterwards."""
    port = port or free_port()
    command = [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    # Open WebSockets would hold a graceful shutdown (and the test database) for ever.
    command += ["--timeout-graceful-shutdown", "2"]
    with log.open("w") as output:
        server = subprocess.Popen(
            [*command, "--no-access-log"],
            env=_test_environment() | (environment or {}),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_answers(f"{base_url}/login/", server, log, what="the portal's ASGI server")
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield base_url
    finally:
        stop(server)


@pytest.fixture(scope="session")
def live_portal(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The portal's ASGI server on a free port, serving the test database; yields its base URL."""
    with portal_server(tmp_path_factory.mktemp("uvicorn") / "web.log") as base_url:
        yield base_url


@pytest.fixture
def celery_beat(celery_worker: str, tmp_path: Path) -> Iterator[None]:
    """Celery beat for one test: the periodic cluster sync, charges and usage import run as in production.

    Function-scoped, so it stops before the test's tables are emptied (and before quiet_celery_worker waits)."""
    log = tmp_path / "beat.log"
    command = [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel=INFO"]
    command += ["--schedule", str(tmp_path / "celerybeat-schedule")]
    # Shorter periods than in production, so a journey sees each step within seconds.
    periods = {
        "JOB_SYNC_INTERVAL_SECONDS": "2",
        "CLUSTER_SYNC_INTERVAL_SECONDS": "10",
        "BILLING_IMPORT_INTERVAL_SECONDS": "5",
    }
    with log.open("w") as output:
        beat = subprocess.Popen(command, env=_test_environment() | periods, stdout=output, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        stop(beat)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright, headless. Skips cleanly where scripts/browser.sh has not run.

    Per module, not per session: while Playwright runs, its event loop is the test thread's running loop, and
    `async_to_sync` (Channels pushes) refuses to run in later tests that have nothing to do with browsers."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed; `make browser` installs it")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the tests' ORM calls are still synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@dataclass
class PageWatch:
    """What went wrong on a page while the test used it: CSP violations, script errors, failed responses."""

    csp_violations: list[str] = field(default_factory=list)
    script_errors: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return self.csp_violations + self.script_errors + self.server_errors


@dataclass
class Screenshots:
    folder: Path
    count: int = 0

    def __call__(self, page: Any, name: str, *, full_page: bool = True) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Screenshots:
    """`screenshot(page, "name")` saves a numbered full-page PNG under test-artifacts/screenshots/<test>/."""
    folder = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    return Screenshots(folder)


def session_cookie_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def page_opener(chromium: Any, base_url: str) -> tuple[Callable[..., Any], Callable[[], None]]:
    """`open_page(user=None, viewport="desktop", timezone_id=None)` for the portal at `base_url` (the browser in
    `timezone_id`'s zone when given, else the machine's), and what to call at the end: it
    closes the pages' contexts and fails on any CSP violation, uncaught script error or 5xx they saw."""
    opened: list[tuple[Any, PageWatch]] = []

    def opener(user: Any = None, viewport: str = "desktop", timezone_id: str | None = None) -> Any:
        context = chromium.new_context(
            base_url=base_url, viewport=VIEWPORTS[viewport], accept_downloads=True, timezone_id=timezone_id
        )
        if user is not None:
            context.add_cookies(
                [{"name": settings.SESSION_COOKIE_NAME, "value": session_cookie_for(user), "url": base_url}]
            )
        page = context.new_page()
        page.set_default_timeout(15_000)
        watch = PageWatch()
        page.on(
            "console",
            lambda message: (
                # With the page and the script line, so a violation seen once can be traced.
                watch.csp_violations.append(f"{message.text} @ {page.url} {message.location}")
                if "Content Security Policy" in message.text
                else None
            ),
        )
        page.on("pageerror", lambda error: watch.script_errors.append(str(error)))
        page.on(
            "response",
            lambda response: (
                watch.server_errors.append(f"{response.status} {response.url}") if response.status >= 500 else None
            ),
        )
        opened.append((context, watch))
        page.watch = watch
        return page

    def finish() -> None:
        problems = [problem for _, watch in opened for problem in watch.problems()]
        for context, _ in opened:
            context.close()
        assert problems == [], f"the pages had problems: {problems}"

    return opener, finish


@pytest.fixture
def open_page(chromium: Any, live_portal: str) -> Iterator[Callable[..., Any]]:
    """`open_page(user=None, viewport="desktop")`: a new browser context (signed in as `user` if given) and
    its page, with base_url set. At the end, the page must have had no CSP violation, no uncaught script
    error and no 5xx response."""
    opener, finish = page_opener(chromium, live_portal)
    yield opener
    finish()


@pytest.fixture(scope="session")
def oidc_portal(
    django_db_setup: None,
    django_db_blocker: object,
    oidc_provider: DemoProvider,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """A second ASGI server of the portal, signing people in through the demo's OpenID provider, at the address
    the provider knows as the portal's (`oidc_provider.portal_url`); yields its base URL."""
    providers = [
        {
            "id": "demo",
            "name": "Demo identity provider",
            "server_url": oidc_provider.issuer,
            "client_id": OIDC_CLIENT_ID,
            "client_secret": OIDC_CLIENT_SECRET,
            "scopes": ["openid", "profile", "email", "groups"],
            "connect_existing_users": True,
        }
    ]
    port = urlsplit(oidc_provider.portal_url).port
    log = tmp_path_factory.mktemp("uvicorn-oidc") / "web.log"
    with portal_server(log, port=port, environment={"PORTAL_OIDC_PROVIDERS": json.dumps(providers)}) as base_url:
        yield base_url


@pytest.fixture
def open_oidc_page(chromium: Any, oidc_portal: str) -> Iterator[Callable[..., Any]]:
    """`open_page`, for the portal that signs people in through the demo's OpenID provider (`oidc_portal`)."""
    opener, finish = page_opener(chromium, oidc_portal)
    yield opener
    finish()
