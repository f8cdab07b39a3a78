"""Production is the default: without PORTAL_DEBUG the portal runs without debug pages, on a secret key of its
own, with HTTPS-only cookies, HSTS and a redirect to HTTPS, and Django's deployment checks find nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.env import DEVELOPMENT_SECRET_KEY, ConfigurationError, secret_key

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_KEY = "k3y-" + "0123456789abcdefghijklmnopqrstuvwxyz" * 2


def _portal(code: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh process with the portal's settings and only the given variables (no test defaults)."""
    clean = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "portal.settings", **environment}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False
    )


_SETTINGS = """
import json, django
from django.conf import settings
django.setup()
print(json.dumps({name: getattr(settings, name) for name in (
    "DEBUG", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS",
    "SECURE_PROXY_SSL_HEADER")}))
"""


def test_without_any_setting_the_portal_runs_as_production() -> None:
    ran = _portal(_SETTINGS, PORTAL_SECRET_KEY=PRODUCTION_KEY)

    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 365 * 24 * 3600,
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_behind_a_proxy_the_proxy_says_whether_the_request_was_https() -> None:
    ran = _portal(_SETTINGS, PORTAL_SECRET_KEY=PRODUCTION_KEY, PORTAL_NUM_PROXIES="1")

    assert json.loads(ran.stdout)["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_the_demo_over_plain_http_keeps_everything_else_of_production() -> None:
    ran = _portal(_SETTINGS, PORTAL_SECRET_KEY=PRODUCTION_KEY, PORTAL_HTTPS="false")

    assert json.loads(ran.stdout) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_djangos_deployment_checks_find_nothing_under_the_production_defaults() -> None:
    ran = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PORTAL_SECRET_KEY": PRODUCTION_KEY},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "System check identified no issues" in ran.stdout


def test_the_development_key_is_refused_without_debug() -> None:
    ran = _portal("import django; django.setup()", PORTAL_SECRET_KEY=DEVELOPMENT_SECRET_KEY)

    assert ran.returncode != 0
    assert "PORTAL_SECRET_KEY is not set (or is the development key)" in ran.stderr


@pytest.fixture
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PORTAL_SECRET_KEY", raising=False)
    monkeypatch.delenv("PORTAL_SECRET_KEY_FILE", raising=False)


@pytest.mark.usefixtures("no_key_in_environment")
def test_without_a_key_only_debug_starts(tmp_path: Path) -> None:
    missing = tmp_path / "secret_key"

    with pytest.raises(ConfigurationError, match="PORTAL_SECRET_KEY is not set"):
        secret_key(debug=False, generated=missing)
    assert secret_key(debug=True, generated=missing) == DEVELOPMENT_SECRET_KEY


@pytest.mark.usefixtures("no_key_in_environment")
def test_the_checkouts_generated_key_is_used_when_none_is_given(tmp_path: Path) -> None:
    generated = tmp_path / "secret_key"
    generated.write_text("generated-for-this-checkout\n")

    assert secret_key(debug=False, generated=generated) == "generated-for-this-checkout"
    assert secret_key(debug=True, generated=generated) == "generated-for-this-checkout"


def test_a_key_given_in_the_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generated = tmp_path / "secret_key"
    generated.write_text("generated-for-this-checkout\n")
    monkeypatch.setenv("PORTAL_SECRET_KEY", PRODUCTION_KEY)
    monkeypatch.delenv("PORTAL_SECRET_KEY_FILE", raising=False)

    assert secret_key(debug=False, generated=generated) == PRODUCTION_KEY
