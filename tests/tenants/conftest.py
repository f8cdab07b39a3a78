"""Fixtures of the tenant tests: the portal signing in through the demo's OpenID provider."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.oidc_provider import DemoProvider


@pytest.fixture
def configure(settings: Any, oidc_provider: DemoProvider) -> Iterator[Callable[..., list[dict[str, Any]]]]:
    """`configure(*entries)`: the portal signs in through these providers (PORTAL_OIDC_PROVIDERS entries, each
    defaulting to the demo provider and the portal's client)."""

    def apply(*entries: dict[str, Any]) -> list[dict[str, Any]]:
        apps = oidc_provider.providers(*entries)
        settings.SOCIALACCOUNT_PROVIDERS = {
            "openid_connect": {**settings.SOCIALACCOUNT_PROVIDERS["openid_connect"], "APPS": apps}
        }
        return apps

    apply({"connect_existing_users": True})
    yield apply
    oidc_provider.reset_claims()
