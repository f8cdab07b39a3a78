"""Reading settings from environment variables, with `*_FILE` variants for secrets."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any


class ConfigurationError(RuntimeError):
    pass


def env_str(name: str, default: str) -> str:
    """The variable's value, or the contents of the file named by `<name>_FILE`, or the default.

    The `_FILE` form lets secrets come from a mounted file instead of the process environment.
    """
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ConfigurationError(f"{name}_FILE points at {file_path!r}, which cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ConfigurationError(f"{name}={raw!r} is not a boolean: use true or false")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name}={raw!r} is not an integer") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str, default: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """A comma-separated list of addresses or CIDR networks (`127.0.0.1/32,10.0.0.0/8,::1`)."""
    networks = []
    for item in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ConfigurationError(f"{name}: {item!r} is not an address or a network such as 10.0.0.0/8") from exc
    return networks


# Django's development key: only ever used with PORTAL_DEBUG on, and refused without it.
DEVELOPMENT_SECRET_KEY = "dev-only-insecure-secret-key-change-me"


def secret_key(*, debug: bool, generated: Path) -> str:
    """PORTAL_SECRET_KEY (or the file PORTAL_SECRET_KEY_FILE names); else the key generated for this checkout
    (`generated`, made by scripts/bootstrap.sh, so by `make demo` and `make test`); else, with PORTAL_DEBUG on
    only, the development key. Without debug the portal never starts on a key anyone could know."""
    key = env_str("PORTAL_SECRET_KEY", "")
    if not key and generated.is_file():
        key = generated.read_text().strip()
    if debug and not key:
        return DEVELOPMENT_SECRET_KEY
    if not key or key == DEVELOPMENT_SECRET_KEY:
        raise ConfigurationError(
            "PORTAL_SECRET_KEY is not set (or is the development key): set it, or PORTAL_SECRET_KEY_FILE to a file "
            "holding it, to a long random value, e.g. the output of "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(50))'`; `make venv` writes one to "
            f"{generated}. Only PORTAL_DEBUG=true runs without one."
        )
    return key


def database_from_url(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a `postgres://user:password@host:port/name` URL."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    pool_size = env_int("DATABASE_POOL_SIZE", 0)
    # psycopg prepares a statement at its first run (threshold 0) but only on a server-binding cursor, and the ORM's
    # cursors bind on the client: only the hot path's statements that portal/db.py runs are prepared. None: none.
    prepare_threshold = 0 if env_bool("DATABASE_PREPARED_STATEMENTS", True) else None
    options: dict[str, object] = {"prepare_threshold": prepare_threshold}
    if pool_size:
        options["pool"] = {"min_size": 1, "max_size": pool_size, "timeout": 10}
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ConfigurationError(f"DATABASE_URL must start with postgres://, got {parts.scheme!r}")
    return {
        "ENGINE": "portal.postgresql",  # Django's, reading timestamps faster: portal/postgresql/base.py
        "NAME": unquote(parts.path.lstrip("/")) or "gpuportal",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        # 0: closed at the end of each request. Under ASGI each request does its database work in a thread of
        # its own, and a connection kept for reuse outlives that thread: under load PostgreSQL soon refuses new
        # clients ("too many clients already"). Raise it only for a WSGI server or with a pooler in front.
        "CONN_MAX_AGE": 0 if pool_size else env_int("DATABASE_CONN_MAX_AGE", 0),
        "CONN_HEALTH_CHECKS": not pool_size,
        # DATABASE_POOL_SIZE > 0: a process-wide pool of at most that many connections (psycopg_pool), which a
        # closed connection returns to. For the ASGI server, whose handshakes would otherwise each open one.
        # A request that waits longer for a pooled connection gets 503 with Retry-After (portal/api_errors.py).
        "OPTIONS": options,
    }


# What a provider in PORTAL_OIDC_PROVIDERS may say; README, "Single sign-on".
_OIDC_REQUIRED = ("id", "name", "server_url", "client_id")
_OIDC_OPTIONAL = (
    "client_secret",
    "client_secret_file",
    "scopes",
    "connect_existing_users",
    "api_audience",
    "api_user_claim",
)
_OIDC_DEFAULT_SCOPES = ["openid", "profile", "email"]


def oidc_providers(raw: str) -> list[dict[str, Any]]:
    """The OpenID providers people may sign in with, from PORTAL_OIDC_PROVIDERS (a JSON list), as the `APPS` of
    django-allauth's `openid_connect` provider. Every sign-in uses PKCE (S256); the client secret may come from
    a file (`client_secret_file`), as other secrets do."""
    try:
        entries = json.loads(raw or "[]")
    except ValueError as exc:
        raise ConfigurationError(f"PORTAL_OIDC_PROVIDERS is not JSON: {exc}") from exc
    if not isinstance(entries, list):
        raise ConfigurationError('PORTAL_OIDC_PROVIDERS must be a JSON list of providers, e.g. [{"id": ...}]')
    apps: list[dict[str, Any]] = []
    for number, entry in enumerate(entries, start=1):
        where = f"PORTAL_OIDC_PROVIDERS, provider {number}"
        if not isinstance(entry, dict):
            raise ConfigurationError(f"{where} is not an object")
        missing = [key for key in _OIDC_REQUIRED if not entry.get(key)]
        unknown = sorted(set(entry) - set(_OIDC_REQUIRED) - set(_OIDC_OPTIONAL))
        if missing or unknown:
            raise ConfigurationError(
                f"{where}: "
                + "; ".join(
                    ([f"missing {', '.join(missing)}"] if missing else [])
                    + ([f"unknown {', '.join(unknown)}"] if unknown else [])
                )
                + f" (it takes {', '.join(_OIDC_REQUIRED + _OIDC_OPTIONAL)})"
            )
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(entry["id"])):
            raise ConfigurationError(f"{where}: id {entry['id']!r} must be lower-case letters, digits and hyphens")
        if entry["id"] in {app["provider_id"] for app in apps}:
            raise ConfigurationError(f"{where}: id {entry['id']!r} is given twice")
        secret = entry.get("client_secret", "")
        if entry.get("client_secret_file"):
            try:
                secret = Path(entry["client_secret_file"]).read_text().strip()
            except OSError as exc:
                raise ConfigurationError(f"{where}: client_secret_file cannot be read: {exc}") from exc
        apps.append(
            {
                "provider_id": entry["id"],
                "name": entry["name"],
                "client_id": entry["client_id"],
                "secret": secret,
                "settings": {
                    "server_url": str(entry["server_url"]).rstrip("/"),
                    "scope": list(entry.get("scopes") or _OIDC_DEFAULT_SCOPES),
                    "oauth_pkce_enabled": True,
                    "connect_existing_users": bool(entry.get("connect_existing_users", False)),
                    # The provider's access tokens for this audience are accepted by the REST API and WebSockets.
                    "api_audience": str(entry.get("api_audience") or ""),
                    "api_user_claim": str(entry.get("api_user_claim") or "sub"),
                },
            }
        )
    return apps


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of a URL (for the Content-Security-Policy)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
