"""The demo's OpenID provider for the sign-in tests: scripts/oidc/provider.mjs (the certified `oidc-provider`
package from npm) as a process, a person signing in on its pages, and a relay in front of its token endpoint
that alters what it answers (a tampered, foreign, expired or replayed ID token, all issued by the provider).

The `oidc_provider` session fixture (tests/conftest.py) starts one provider for the whole run. It knows the
portal as three clients: `gpuportal` (the portal's), `gpuportal-short` (ID tokens that live one second) and
`another-app` (someone else's application, for tokens with the wrong audience); and two machine identities
(client credentials): `ci-pipeline` and `ci-short` (access tokens that live one second). It issues JWT access
tokens for two APIs: the portal's (API_AUDIENCE) and someone else's (OTHER_API_AUDIENCE). People's claims can be
changed while it runs (`DemoProvider.change_claims`: their groups, a claim taken away).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
from django.contrib.auth import get_user_model
from django.test import Client

from portal.env import oidc_providers
from tests.processes import free_port, stop, wait_until_answers

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "oidc" / "provider.mjs"
PASSWORD = "demo-password-for-tests"
CLIENT_ID, CLIENT_SECRET = "gpuportal", "tests-client-secret"
SHORT_CLIENT_ID = "gpuportal-short"
OTHER_CLIENT_ID, OTHER_REDIRECT = "another-app", "http://127.0.0.1:9/another-app/callback"
CI_CLIENT_ID, CI_SHORT_CLIENT_ID = "ci-pipeline", "ci-short"
API_AUDIENCE, OTHER_API_AUDIENCE = "http://testserver/api", "http://other-api.example/api"
# The portal's provider ids the tests configure; each has its callback registered at the provider.
PROVIDER_IDS = ("demo", "short", "relayed", "university", "company")


@dataclass
class DemoProvider:
    issuer: str
    # Where the browser tests' portal (tests/frontend, `oidc_portal`) listens: its callbacks are registered.
    portal_url: str
    # Claims that replace people's built-in ones (provider.mjs reads it at each sign-in).
    identities_file: Path

    def change_claims(self, username: str, **claims: Any) -> None:
        """From the next sign-in on, `username` has these claims instead of the built-in ones (None: none)."""
        changed = json.loads(self.identities_file.read_text()) if self.identities_file.exists() else {}
        changed[username] = changed.get(username, {}) | claims
        self.identities_file.write_text(json.dumps(changed))

    def reset_claims(self) -> None:
        self.identities_file.unlink(missing_ok=True)

    def access_token(self, *, client_id: str = CI_CLIENT_ID, resource: str = API_AUDIENCE) -> str:
        """A JWT access token for `resource` that the provider issues to a machine identity (client credentials)."""
        answer = httpx.post(
            self.configuration()["token_endpoint"],
            data={
                "grant_type": "client_credentials",
                "scope": "api",
                "resource": resource,
                "client_id": client_id,
                "client_secret": CLIENT_SECRET,
            },
            timeout=10,
        )
        answer.raise_for_status()
        return str(answer.json()["access_token"])

    def providers(self, *entries: dict[str, Any]) -> list[dict[str, Any]]:
        """allauth's APPS for these PORTAL_OIDC_PROVIDERS entries, each defaulting to this provider and the
        portal's client, read through the portal's own parser."""
        defaults = {
            "id": "demo",
            "name": "Demo identity provider",
            "server_url": self.issuer,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "scopes": ["openid", "profile", "email", "groups"],
        }
        return oidc_providers(json.dumps([defaults | entry for entry in entries or ({},)]))

    def configuration(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=10).json())


def _clients(portal_bases: list[str]) -> list[dict[str, Any]]:
    callbacks = [f"{base}/oidc/{provider_id}/login/callback/" for base in portal_bases for provider_id in PROVIDER_IDS]
    after_logout = [f"{base}/login/" for base in portal_bases]
    portal = {"redirect_uris": callbacks, "post_logout_redirect_uris": after_logout}
    machine = {"client_secret": CLIENT_SECRET, "redirect_uris": [], "grant_types": ["client_credentials"]}
    return [
        {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, **portal},
        {"client_id": SHORT_CLIENT_ID, "client_secret": CLIENT_SECRET, "id_token_ttl_seconds": 1, **portal},
        {"client_id": OTHER_CLIENT_ID, "client_secret": CLIENT_SECRET, "redirect_uris": [OTHER_REDIRECT]},
        {**machine, "client_id": CI_CLIENT_ID},
        {**machine, "client_id": CI_SHORT_CLIENT_ID, "access_token_ttl_seconds": 1},
    ]


@contextmanager
def provider_process(log: Path) -> Iterator[DemoProvider]:
    """The provider on a free port, with the test client's callbacks and those of a portal on another free port."""
    port, portal_url = free_port(), f"http://127.0.0.1:{free_port()}"
    environment = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "OIDC_PROVIDER_HOST": "127.0.0.1",
        "OIDC_PROVIDER_PORT": str(port),
        "OIDC_CLIENTS": json.dumps(_clients(["http://testserver", portal_url])),
        "OIDC_API_RESOURCES": json.dumps([API_AUDIENCE, OTHER_API_AUDIENCE]),
        "OIDC_IDENTITIES_FILE": str(log.parent / "identities.json"),
        "DEMO_PASSWORD": PASSWORD,
    }
    with log.open("w") as output:
        process = subprocess.Popen(
            ["node", str(SCRIPT)], env=environment, stdout=output, stderr=subprocess.STDOUT, cwd=SCRIPT.parent
        )
    issuer = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(f"{issuer}/.well-known/openid-configuration", process, log, what="the OpenID provider")
        yield DemoProvider(issuer=issuer, portal_url=portal_url, identities_file=log.parent / "identities.json")
    finally:
        stop(process)


class WrongPassword(Exception):
    pass


def sign_in_at_provider(authorize_url: str, *, username: str, password: str = PASSWORD) -> str:
    """What a person does on the provider's pages: open the sign-in, type username and password. Returns the
    address the provider sends the browser back to (the client's callback with `code` and `state`)."""
    issuer = "{0.scheme}://{0.netloc}".format(urlsplit(authorize_url))
    with httpx.Client(timeout=10) as browser:
        url = authorize_url
        for _ in range(10):
            response = browser.get(url)
            if response.is_redirect:
                url = urljoin(url, response.headers["location"])
                if not url.startswith(issuer):
                    return url
                continue
            form = re.search(r'<form method="post" action="([^"]+)"', response.text)
            assert response.status_code == 200, response.text
            assert form is not None, response.text
            response = browser.post(urljoin(url, form.group(1)), data={"username": username, "password": password})
            if response.status_code == 401:
                raise WrongPassword(username)
            assert response.is_redirect, response.text
            url = urljoin(url, response.headers["location"])
    raise AssertionError(f"the provider never sent the browser back: {url}")


def id_token_for(provider: DemoProvider, *, client_id: str, redirect_uri: str, username: str) -> str:
    """An ID token the provider issues to `client_id` after `username` signs in (a whole code flow with PKCE)."""
    return str(tokens_for(provider, client_id=client_id, redirect_uri=redirect_uri, username=username)["id_token"])


def tokens_for(
    provider: DemoProvider, *, client_id: str, redirect_uri: str, username: str, resource: str | None = None
) -> dict[str, Any]:
    """The token endpoint's answer to `client_id` after `username` signs in (a whole code flow with PKCE); with
    `resource`, its access token is a JWT for that API."""
    import base64
    import hashlib
    import secrets

    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    configuration = provider.configuration()
    for_api = {"resource": resource} if resource else {}
    query = {
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "response_type": "code",
        "scope": "openid profile email" + (" api" if resource else ""),
        "state": "s",
        "nonce": "n-" + secrets.token_urlsafe(8),
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        **for_api,
    }
    back = sign_in_at_provider(f"{configuration['authorization_endpoint']}?{urlencode(query)}", username=username)
    code = parse_qs(urlsplit(back).query)["code"][0]
    tokens = httpx.post(
        configuration["token_endpoint"],
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "client_id": client_id,
            "client_secret": CLIENT_SECRET,
            "code_verifier": verifier,
            **for_api,
        },
        timeout=10,
    )
    tokens.raise_for_status()
    return dict(tokens.json())


class TokenRelay:
    """A relay in front of the provider's token endpoint: the portal's token requests go through it to the real
    provider, and `alter` changes the answer (its JSON) on the way back, after waiting `delay_seconds`."""

    def __init__(self, token_endpoint: str) -> None:
        self.token_endpoint = token_endpoint
        self.alter: Callable[[dict[str, Any]], dict[str, Any]] = lambda answer: answer
        self.delay_seconds = 0.0
        self.answers: list[dict[str, Any]] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k: v for k, v in self.headers.items() if k.lower() in {"content-type", "authorization"}}
                real = httpx.post(relay.token_endpoint, content=body, headers=headers, timeout=10)
                answer = real.json()
                relay.answers.append(dict(answer))
                time.sleep(relay.delay_seconds)
                altered = json.dumps(relay.alter(answer) if real.status_code == 200 else answer).encode()
                self.send_response(real.status_code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(altered)))
                self.end_headers()
                self.wfile.write(altered)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> TokenRelay:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# The portal's side, in Django's test client ----------------------------------------------------------------

REFUSED_HEADING = '<h1 id="refused-heading">Sign-in refused</h1>'


def start(browser: Client, provider_id: str = "demo", **data: str) -> str:
    """Presses 'Sign in with ...' on the login page; returns where the portal sends the browser (the provider)."""
    response = browser.post(f"/oidc/{provider_id}/login/", data)
    assert response.status_code == 302, response.content
    return str(response["Location"])


def come_back(browser: Client, callback_url: str) -> Any:
    """The browser arriving back at the portal from the provider."""
    parts = urlsplit(callback_url)
    assert parts.netloc == "testserver", callback_url
    return browser.get(f"{parts.path}?{parts.query}")


def sign_in(browser: Client, username: str, provider_id: str = "demo") -> Any:
    return come_back(browser, sign_in_at_provider(start(browser, provider_id), username=username))


def refusal(response: Any) -> str:
    page = " ".join(response.content.decode().split())
    assert REFUSED_HEADING in page, page
    return str(response.context["message"])


def signed_in_username(browser: Client) -> str | None:
    user_id = browser.session.get("_auth_user_id")
    return get_user_model().objects.get(pk=user_id).username if user_id else None
