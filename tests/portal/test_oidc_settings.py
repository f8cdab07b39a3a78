"""PORTAL_OIDC_PROVIDERS: the providers people sign in with, read into django-allauth's settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portal.env import ConfigurationError, oidc_providers

UNIVERSITY = {
    "id": "university",
    "name": "Example University",
    "server_url": "https://login.uni.example/realms/main/",
    "client_id": "gpu-portal",
    "client_secret": "s3cret",
}


def test_each_provider_becomes_an_allauth_app_that_uses_pkce() -> None:
    company: dict[str, object] = {"id": "company", "name": "Example Corp", "client_id": "p"}
    company |= {"server_url": "https://sso.corp.example", "scopes": ["openid", "email", "groups"]}
    company |= {"connect_existing_users": True, "api_audience": "https://gpu.example/api"}
    company |= {"api_user_claim": "preferred_username"}

    apps = oidc_providers(json.dumps([UNIVERSITY, company]))

    assert apps == [
        {
            "provider_id": "university",
            "name": "Example University",
            "client_id": "gpu-portal",
            "secret": "s3cret",
            "settings": {
                "server_url": "https://login.uni.example/realms/main",
                "scope": ["openid", "profile", "email"],
                "oauth_pkce_enabled": True,
                "connect_existing_users": False,
                "api_audience": "",
                "api_user_claim": "sub",
            },
        },
        {
            "provider_id": "company",
            "name": "Example Corp",
            "client_id": "p",
            "secret": "",
            "settings": {
                "server_url": "https://sso.corp.example",
                "scope": ["openid", "email", "groups"],
                "oauth_pkce_enabled": True,
                "connect_existing_users": True,
                "api_audience": "https://gpu.example/api",
                "api_user_claim": "preferred_username",
            },
        },
    ]
    assert oidc_providers("") == []


def test_the_client_secret_can_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    entry = {key: value for key, value in UNIVERSITY.items() if key != "client_secret"}

    [app] = oidc_providers(json.dumps([entry | {"client_secret_file": str(secret)}]))

    assert app["secret"] == "from-a-file"
    with pytest.raises(ConfigurationError, match="provider 1: client_secret_file cannot be read"):
        oidc_providers(json.dumps([entry | {"client_secret_file": str(tmp_path / "missing")}]))


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("{not json", "PORTAL_OIDC_PROVIDERS is not JSON"),
        (json.dumps(UNIVERSITY), "must be a JSON list of providers"),
        (json.dumps([{"id": "x"}]), "provider 1: missing name, server_url, client_id (it takes id, name, "),
        (json.dumps([UNIVERSITY | {"issuer": "x"}]), "provider 1: unknown issuer"),
        (json.dumps([UNIVERSITY | {"id": "Uni Versity"}]), "id 'Uni Versity' must be lower-case letters"),
        (json.dumps([UNIVERSITY, UNIVERSITY]), "provider 2: id 'university' is given twice"),
    ],
)
def test_a_wrong_setting_says_what_is_wrong(raw: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says.replace("(", r"\(")):
        oidc_providers(raw)
