"""Hostile input to the portal: path traversal through the log routes, WebSockets from other sites, CSRF on
every form and unsafe API method, guessing limits on passwords and tokens, and removed members losing access
at once. (Shell metacharacters in jobs, on the live cluster: tests/jobs/test_hostile_jobs.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from portal.routing import websocket_urlpatterns
from tenants.models import ApiToken, AuditEvent, ProjectMembership, TenantMembership
from tenants.services import project_member_remove, tenant_member_change_role, tenant_member_remove, token_create
from tests.factories import PASSWORD, add_project_member, add_tenant_member, make_user
from tests.isolation_rules import ROLES, Case
from tests.jobs.test_log_socket import SAME_ORIGIN, LogJob, download, log_job, session_cookie
from tests.tenants.test_isolation_matrix import MATRIX, _url, database_fingerprint, world
from tests.websockets import handshake

__all__ = ["log_job", "world"]  # fixtures, imported to be used here

# WebSocket tests are transactional: their consumers read the database from threads of their own.
pytestmark = pytest.mark.django_db

ERROR_KEYS = {"code", "message", "fields"}
EVIL_ORIGIN = (b"origin", b"http://evil.example")


def _is_error_shape(response: Any) -> bool:
    return response["Content-Type"] == "application/json" and set(response.json()) == ERROR_KEYS


# Path traversal through the log routes ---------------------------------------------------------------------

VISIBLE_OUTPUT = b"the job's own output\n"
SECRET = b"root:secret-of-the-host\n"


@pytest.fixture
def secret_outside(tmp_path: Path) -> Path:
    """A file the portal can read that no job may show: outside every log root."""
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


@pytest.mark.parametrize(
    "address",
    [
        "/api/v1/jobs/../../../../etc/passwd/log/",
        "/api/v1/jobs/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd/log/",
        "/api/v1/jobs/{job}/..%2f..%2f..%2f..%2fetc%2fpasswd/log/",
        "/api/v1/jobs/{job}/log/..%2f..%2f..%2fetc%2fpasswd",
        "/api/v1/jobs/{job}/log/../../../../etc/passwd",
        "/api/v1/jobs//etc/passwd/log/",
        "/api/v1/jobs/%2fetc%2fpasswd/log/",
    ],
)
def test_a_traversing_job_address_finds_no_log(log_job: LogJob, address: str) -> None:
    log_job.append(VISIBLE_OUTPUT)
    client = Client()
    client.force_login(log_job.viewer)

    response = client.get(address.format(job=log_job.job.pk))

    assert response.status_code == 404
    assert _is_error_shape(response)
    assert b"root:" not in response.content
    assert VISIBLE_OUTPUT not in response.content


@pytest.mark.parametrize(
    "address", ["/api/v1/jobs/{job}%00/log/", "/api/v1/jobs/{job}/log/?stream=stdout%00../../../etc/passwd"]
)
def test_a_nul_byte_in_a_log_address_is_refused_with_400(log_job: LogJob, address: str) -> None:
    log_job.append(VISIBLE_OUTPUT)
    client = Client()
    client.force_login(log_job.viewer)

    response = client.get(address.format(job=log_job.job.pk))

    assert response.status_code == 400
    assert _is_error_shape(response)
    assert b"root:" not in response.content
    assert VISIBLE_OUTPUT not in response.content


@pytest.mark.parametrize(
    "stream",
    [
        "../../../../etc/passwd",
        "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "%252e%252e%252fetc%252fpasswd",
        "/etc/passwd",
        "stdout/../../../../etc/passwd",
        "stdout.log",
        "../stdout.log",
    ],
)
def test_a_traversing_stream_is_refused_with_400(log_job: LogJob, stream: str) -> None:
    log_job.append(VISIBLE_OUTPUT)

    response = download(log_job, log_job.viewer, query=f"?stream={stream}")

    assert response.status_code == 400
    assert _is_error_shape(response)
    assert list(response.json()["fields"]) == ["stream"]
    assert b"root:" not in response.content
    assert VISIBLE_OUTPUT not in response.content


@pytest.mark.django_db(transaction=True)
def test_a_symlink_the_job_put_over_its_output_is_not_followed(log_job: LogJob, secret_outside: Path) -> None:
    """The job's user owns its directory and can replace its output with a link to anything the portal reads.

    The answer is 403 rather than 404: the viewer may see the job, and the message says why its file is not
    served. Neither the download nor the live log carries a byte of the target.
    """
    log_job.stdout.parent.mkdir(parents=True)
    log_job.stdout.symlink_to(secret_outside)
    log_job.stderr.symlink_to("/etc/shadow")

    for stream in ("stdout", "stderr"):
        response = download(log_job, log_job.viewer, query=f"?stream={stream}")
        assert response.status_code == 403
        assert _is_error_shape(response)
        assert SECRET not in response.content
        assert b"root:" not in response.content

    headers = [*SAME_ORIGIN, (b"cookie", session_cookie(log_job.viewer))]

    async def live_messages() -> list[dict[str, Any]]:
        from portal.asgi import application

        socket = WebsocketCommunicator(application, f"/ws/jobs/{log_job.job.pk}/log/", headers=headers)
        connected, _ = await handshake(socket, timeout=5)
        assert connected
        messages = [await socket.receive_json_from(timeout=5) for _ in range(2)]
        await socket.disconnect()
        return messages

    messages = async_to_sync(live_messages)()
    assert sorted((message["type"], message["stream"]) for message in messages) == [
        ("log.error", "stderr"),
        ("log.error", "stdout"),
    ]
    assert "symbolic link" in messages[0]["message"]


def test_a_job_directory_swapped_for_a_link_out_of_the_log_root_is_not_followed(
    log_job: LogJob, secret_outside: Path
) -> None:
    (secret_outside.parent / "stdout.log").write_bytes(SECRET)
    log_job.stdout.parent.parent.mkdir(parents=True)
    log_job.stdout.parent.symlink_to(secret_outside.parent, target_is_directory=True)

    response = download(log_job, log_job.viewer)

    assert response.status_code == 403
    assert _is_error_shape(response)
    assert SECRET not in response.content


@pytest.mark.parametrize(
    "path",
    [
        "/ws/jobs/../../../../etc/passwd/log/",
        "/ws/jobs/%2e%2e%2f%2e%2e%2fetc%2fpasswd/log/",
        "/ws/jobs/{job}/log/../../../../etc/passwd",
        "/ws/jobs/{job}%00/log/",
    ],
)
@pytest.mark.django_db(transaction=True)
def test_a_traversing_log_socket_address_is_refused(log_job: LogJob, path: str) -> None:
    log_job.append(VISIBLE_OUTPUT)

    headers = [*SAME_ORIGIN, (b"cookie", session_cookie(log_job.viewer))]

    async def connects() -> bool:
        from portal.asgi import application

        socket = WebsocketCommunicator(application, path.format(job=log_job.job.pk), headers=headers)
        connected, _ = await handshake(socket, timeout=5)
        await socket.disconnect()
        return bool(connected)

    assert async_to_sync(connects)() is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["stdout_offset=../../etc/passwd", "stdout_offset=-1", "stderr_offset=1%00"])
def test_a_log_socket_offset_that_is_not_a_number_is_refused_with_4400(log_job: LogJob, query: str) -> None:
    headers = [*SAME_ORIGIN, (b"cookie", session_cookie(log_job.viewer))]

    async def close_code() -> int | None:
        from portal.asgi import application

        socket = WebsocketCommunicator(application, f"/ws/jobs/{log_job.job.pk}/log/?{query}", headers=headers)
        connected, code = await handshake(socket, timeout=5)
        assert not connected
        return code

    assert async_to_sync(close_code)() == 4400


# WebSockets from other sites ---------------------------------------------------------------------------------

WEBSOCKET_ROUTES = [str(entry.pattern) for entry in websocket_urlpatterns]


def _websocket_path(route: str, log_job: LogJob) -> str:
    project = log_job.job.project
    values = {"tenant": project.tenant.slug, "project": project.slug, "job_id": str(log_job.job.pk)}
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda match: values[str(match.group(1))], route)


async def _opens(path: str, headers: list[tuple[bytes, bytes]], *, address: str = "127.0.0.1") -> bool:
    from portal.asgi import application

    socket = WebsocketCommunicator(application, path, headers=[(b"host", b"127.0.0.1:8000"), *headers])
    socket.scope["client"] = [address, 50000]
    connected, _ = await handshake(socket, timeout=5)
    await socket.disconnect()
    return bool(connected)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", WEBSOCKET_ROUTES)
def test_websockets_open_from_the_portals_pages_or_with_a_token_and_from_nowhere_else(
    log_job: LogJob, route: str
) -> None:
    """Who may open each WebSocket, by origin and credentials.

    A browser sends its session cookie to the portal whatever page opens the socket, and always sends that
    page's `Origin`: a session counts only with the portal's own origin, and never without one (no browser
    omits it, so a handshake without it is a script replaying a cookie). A script authenticates with a
    bearer token, which browsers cannot attach to a WebSocket, and usually sends no `Origin`: that is
    accepted. A bearer token does not make a foreign origin acceptable, and a wrong token is not rescued
    by a session cookie.
    """
    path = _websocket_path(route, log_job)
    cookie = (b"cookie", session_cookie(log_job.viewer))
    _, secret = token_create(user=log_job.viewer, name="socket")
    bearer = (b"authorization", f"Bearer {secret}".encode())
    wrong_bearer = (b"authorization", b"Bearer gpp_wrong")
    same_origin = (b"origin", b"http://127.0.0.1:8000")
    cases = {
        "session, same origin": ([same_origin, cookie], True),
        "session, foreign origin": ([EVIL_ORIGIN, cookie], False),
        "session, origin null": ([(b"origin", b"null"), cookie], False),
        "session, look-alike origin": ([(b"origin", b"http://127.0.0.1.evil.example"), cookie], False),
        "session, no origin": ([cookie], False),
        "token, no origin": ([bearer], True),
        "token, same origin": ([same_origin, bearer], True),
        "token, foreign origin": ([EVIL_ORIGIN, bearer], False),
        "wrong token and session, no origin": ([wrong_bearer, cookie], False),
        "wrong token and session, same origin": ([same_origin, wrong_bearer, cookie], False),
    }

    answers = {case: async_to_sync(_opens)(path, headers) for case, (headers, _) in cases.items()}

    assert answers == {case: expected for case, (_, expected) in cases.items()}


# CSRF on every form and every unsafe API method ----------------------------------------------------------------

FORM = "application/x-www-form-urlencoded"
# Any 32 letters are a valid CSRF secret: the cookie and the form (or header) must simply carry the same one.
CSRF_SECRET = "hostileHostileHostileHostile0123"


def _acting_role(case: Case) -> str:
    """The first signed-in role that the route lets through; portal staff where it lets nobody through."""
    allowed = [role for role in ROLES if role != "anonymous" and case.expected.get(role, 999) < 400]
    return allowed[0] if allowed else "staff"


def _csrf_client(user: User | None) -> Client:
    browser = Client(enforce_csrf_checks=True)
    if user is not None:
        browser.force_login(user)
    return browser


FORM_CASES = [
    pytest.param(route, method, id=f"{method} /{route}")
    for route, methods in MATRIX.items()
    for method, case in methods.items()
    if case.form
]
API_CASES = [
    pytest.param(route, method, id=f"{method} /{route}")
    for route, methods in MATRIX.items()
    for method in methods
    if route.startswith("api/") and method not in {"GET", "HEAD", "OPTIONS"}
]


def test_the_cases_cover_the_forms_and_unsafe_api_methods() -> None:
    assert len(FORM_CASES) >= 20
    assert len(API_CASES) >= 30


@pytest.mark.parametrize(("route", "method"), FORM_CASES)
def test_a_form_post_without_the_csrf_token_is_refused_and_changes_nothing(world: Any, route: str, method: str) -> None:
    case = MATRIX[route][method]
    role = _acting_role(case)
    browser = _csrf_client(world.users[role])
    url, body = _url(route, world), case.body(world) if case.body else {}
    before = database_fingerprint()

    refused = browser.generic(method, url, data=urlencode(body, doseq=True), content_type=FORM)

    assert refused.status_code == 403
    assert database_fingerprint() == before
    browser.cookies[django_settings.CSRF_COOKIE_NAME] = CSRF_SECRET
    with_token = {**body, "csrfmiddlewaretoken": CSRF_SECRET}
    accepted = browser.generic(method, url, data=urlencode(with_token, doseq=True), content_type=FORM)
    assert accepted.status_code == case.expected[role]


def test_logging_out_needs_the_csrf_token() -> None:
    user = make_user()
    browser = _csrf_client(user)

    assert browser.post("/logout/").status_code == 403
    assert browser.session.get("_auth_user_id") == str(user.pk)
    browser.cookies[django_settings.CSRF_COOKIE_NAME] = CSRF_SECRET
    assert browser.post("/logout/", {"csrfmiddlewaretoken": CSRF_SECRET}).status_code == 302
    assert browser.session.get("_auth_user_id") is None


@pytest.mark.parametrize(("route", "method"), API_CASES)
def test_an_api_write_with_a_session_and_no_csrf_header_is_refused_and_changes_nothing(
    world: Any, route: str, method: str
) -> None:
    case = MATRIX[route][method]
    role = _acting_role(case)
    browser = _csrf_client(world.users[role])
    url = _url(route, world)
    body = _json(case.body(world) if case.body else None)
    before = database_fingerprint()

    refused = browser.generic(method, url, data=body, content_type="application/json")

    assert refused.status_code == 403
    assert _is_error_shape(refused)
    assert refused.json()["message"].startswith("CSRF Failed")
    assert database_fingerprint() == before
    browser.cookies[django_settings.CSRF_COOKIE_NAME] = CSRF_SECRET
    accepted = browser.generic(
        method, url, data=body, content_type="application/json", headers={"X-CSRFToken": CSRF_SECRET}
    )
    assert accepted.status_code == case.expected[role]


def _json(body: dict[str, Any] | None) -> str:
    import json

    return json.dumps(body) if body is not None else ""


# Guessing limits ---------------------------------------------------------------------------------------------


def _limits(settings: Any, *, login: str = "5/min", token_guess: str = "5/min") -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"login": login, "token_guess": token_guess},
    }


def _address() -> str:
    """A client address no other test (or earlier run within the window) has used: the cache outlives tests."""
    part = uuid.uuid4().hex
    return f"2001:db8:{part[:4]}:{part[4:8]}:{part[8:12]}::1"


def _login(address: str, password: str, username: str = "guessed") -> Any:
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password})


def test_the_login_form_refuses_a_guesser_with_429_and_lets_others_in(settings: Any) -> None:
    _limits(settings)
    make_user("guessed")
    guesser, colleague = _address(), _address()

    wrong = [_login(guesser, f"guess{attempt}").status_code for attempt in range(5)]
    throttled = _login(guesser, "guess5")
    right_but_throttled = Client(REMOTE_ADDR=guesser)
    answer = right_but_throttled.post("/login/", {"username": "guessed", "password": PASSWORD})

    assert wrong == [200] * 5
    assert throttled.status_code == 429
    assert 1 <= int(throttled["Retry-After"]) <= 60
    page = " ".join(throttled.content.decode().split())
    assert "Too many failed log-in attempts came from your address, or for this account from it. Wait" in page
    assert 'name="password"' in page  # the form is there to try again later
    assert answer.status_code == 429
    assert right_but_throttled.session.get("_auth_user_id") is None
    assert _login(colleague, PASSWORD).status_code == 302


def test_successful_logins_do_not_count_against_the_form(settings: Any) -> None:
    _limits(settings)
    make_user("guessed")
    address = _address()

    assert [_login(address, PASSWORD).status_code for _ in range(7)] == [302] * 7


def test_the_login_form_and_the_token_endpoint_share_one_window(settings: Any) -> None:
    _limits(settings)
    make_user("guessed")
    address = _address()
    api = Client(REMOTE_ADDR=address)

    form = [_login(address, "wrong").status_code for _ in range(3)]
    tokens = [
        api.post("/api/v1/tokens/", {"name": "x", "username": "guessed", "password": "wrong"}, "application/json")
        for _ in range(3)
    ]

    assert form == [200] * 3
    assert [response.status_code for response in tokens] == [401, 401, 429]
    assert _is_error_shape(tokens[-1])
    assert tokens[-1].json()["code"] == "throttled"
    assert "Retry-After" in tokens[-1]
    assert _login(address, PASSWORD).status_code == 429


def test_token_guessing_is_throttled_per_address_without_locking_out_a_right_token_elsewhere(
    settings: Any,
) -> None:
    _limits(settings)
    owner = make_user()
    _, secret = token_create(user=owner, name="real")
    guesser, elsewhere = Client(REMOTE_ADDR=_address()), Client(REMOTE_ADDR=_address())

    def me(client: Client, token: str, **headers: str) -> Any:
        return client.get("/api/v1/me/", headers={"Authorization": f"Bearer {token}", **headers})

    guesses = [me(guesser, f"gpp_guess{attempt}").status_code for attempt in range(5)]
    throttled = me(guesser, "gpp_guess5")
    right_from_guesser = me(guesser, secret)
    forged = me(guesser, secret, **{"X-Forwarded-For": "198.51.100.7"})

    assert guesses == [401] * 5
    assert throttled.status_code == 429
    assert _is_error_shape(throttled)
    assert throttled.json()["code"] == "throttled"
    assert throttled.json()["message"].startswith("Too many requests with unknown, expired or revoked tokens")
    assert 1 <= int(throttled["Retry-After"]) <= 60
    assert (right_from_guesser.status_code, forged.status_code) == (429, 429)
    assert me(elsewhere, secret).status_code == 200
    # Sessions and right tokens do not count: only failures fill the window.
    assert [me(elsewhere, secret).status_code for _ in range(6)] == [200] * 6


@pytest.mark.django_db(transaction=True)
def test_token_guessing_over_websockets_counts_and_is_refused_too(settings: Any) -> None:
    _limits(settings)
    owner = make_user()
    _, secret = token_create(user=owner, name="real")
    guesser, elsewhere = _address(), _address()

    def opens(token: str, address: str) -> bool:
        headers = [(b"authorization", f"Bearer {token}".encode())]
        return async_to_sync(_opens)("/ws/clusters/", headers, address=address)

    assert [opens(f"gpp_guess{attempt}", guesser) for attempt in range(5)] == [False] * 5
    assert opens(secret, guesser) is False
    assert opens(secret, elsewhere) is True
    rest = Client(REMOTE_ADDR=guesser).get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"})
    assert rest.status_code == 429


# Removed members lose access at once -------------------------------------------------------------------------


class OpenSockets:
    """The member's sockets on the project, the job and the job's log, by token and by session."""

    def __init__(self, log_job: LogJob, secret: str) -> None:
        from portal.asgi import application

        project = log_job.job.project
        bearer = [*SAME_ORIGIN, (b"authorization", f"Bearer {secret}".encode())]
        session = [*SAME_ORIGIN, (b"cookie", session_cookie(log_job.viewer))]
        paths = {
            "project by token": (f"/ws/projects/{project.tenant.slug}/{project.slug}/jobs/", bearer),
            "job by token": (f"/ws/jobs/{log_job.job.pk}/", bearer),
            "log by token": (f"/ws/jobs/{log_job.job.pk}/log/", bearer),
            "project by session": (f"/ws/projects/{project.tenant.slug}/{project.slug}/jobs/", session),
            "log by session": (f"/ws/jobs/{log_job.job.pk}/log/", session),
        }
        self.sockets = {
            name: WebsocketCommunicator(application, path, headers=headers) for name, (path, headers) in paths.items()
        }

    async def open(self) -> None:
        for name, socket in self.sockets.items():
            connected, code = await handshake(socket, timeout=5)
            assert connected, (name, code)

    async def close_codes(self, *, wait_seconds: float = 5) -> dict[str, int | None]:
        """How each socket was closed by the portal; None if it is still open after `wait_seconds`."""
        codes: dict[str, int | None] = {}
        for name, socket in self.sockets.items():
            codes[name] = None
            try:
                while True:
                    output = await socket.receive_output(timeout=wait_seconds)
                    if output["type"] == "websocket.close":
                        codes[name] = output.get("code", 1000)
                        break
            except TimeoutError:
                pass
        return codes

    async def disconnect(self) -> None:
        for socket in self.sockets.values():
            # A socket the portal kept open was cancelled by the test client's timeout in `close_codes`.
            with contextlib.suppress(asyncio.CancelledError):
                await socket.disconnect()


@pytest.mark.django_db(transaction=True)
def test_a_member_removed_from_the_project_loses_rest_sockets_and_pages_at_once(log_job: LogJob) -> None:
    """Still in the tenant, they are answered as a tenant member who was never in the project: 403 (4403)."""
    member = log_job.viewer
    project = log_job.job.project
    admin = make_user()
    add_tenant_member(project.tenant, admin, "admin")
    _, secret = token_create(user=member, name="scripts")
    sockets = OpenSockets(log_job, secret)
    browser = Client()
    browser.force_login(member)
    job_url, page_url = f"/api/v1/jobs/{log_job.job.pk}/", f"/projects/{project.tenant.slug}/{project.slug}/"
    assert browser.get(page_url).status_code == 200

    async def remove_while_watching() -> dict[str, int | None]:
        await sockets.open()
        membership = await ProjectMembership.objects.aget(project=project, user=member)
        await _in_thread(lambda: project_member_remove(actor=admin, membership=membership))
        codes = await sockets.close_codes()
        await sockets.disconnect()
        return codes

    codes = async_to_sync(remove_while_watching)()

    assert codes == dict.fromkeys(sockets.sockets, 4403)
    token_answer = Client().get(job_url, headers={"Authorization": f"Bearer {secret}"})
    never_in_the_project = make_user()
    add_tenant_member(project.tenant, never_in_the_project)
    assert token_answer.status_code == 403
    assert (token_answer.status_code, token_answer.content) == _answer_to(never_in_the_project, job_url)
    assert browser.get(page_url).status_code == _answer_to(never_in_the_project, page_url)[0] == 403
    # Still in the tenant: the token itself stays valid for what the member may still do.
    assert Client().get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"}).status_code == 200


def _answer_to(user: User, url: str) -> tuple[int, bytes]:
    client = Client()
    client.force_login(user)
    response = client.get(url)
    return response.status_code, response.content


async def _in_thread(work: Any) -> None:
    """Runs a service as a request would: off the event loop, in a transaction that commits."""

    def atomic() -> None:
        with transaction.atomic():
            work()

    await database_sync_to_async(atomic)()


@pytest.mark.django_db(transaction=True)
def test_a_member_removed_from_their_last_tenant_loses_their_tokens(log_job: LogJob) -> None:
    """Removed from their last tenant, a user's tokens are revoked: they were made to act in tenants, and a
    leaked one must not come back to life if the user is added to a tenant again later. Portal staff keep
    theirs (they work without tenant membership)."""
    member = log_job.viewer
    tenant = log_job.job.project.tenant
    admin = make_user()
    add_tenant_member(tenant, admin, "admin")
    membership = TenantMembership.objects.get(tenant=tenant, user=member)
    staff = make_user(is_staff=True)
    staff_membership = add_tenant_member(tenant, staff)
    _, secret = token_create(user=member, name="scripts")
    _, staff_secret = token_create(user=staff, name="ops")
    sockets = OpenSockets(log_job, secret)
    browser = Client()
    browser.force_login(member)
    job_url = f"/api/v1/jobs/{log_job.job.pk}/"

    async def remove_while_watching() -> dict[str, int | None]:
        await sockets.open()
        await _in_thread(lambda: tenant_member_remove(actor=admin, membership=membership))
        codes = await sockets.close_codes()
        await sockets.disconnect()
        return codes

    codes = async_to_sync(remove_while_watching)()
    tenant_member_remove(actor=admin, membership=staff_membership)

    assert codes == dict.fromkeys(sockets.sockets, 4404)
    assert not TenantMembership.objects.filter(user=member).exists()
    assert Client().get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    assert not ApiToken.objects.filter(user=member, revoked_at__isnull=True).exists()
    # Like an outsider: the session that is still logged in finds nothing of the tenant.
    assert (browser.get(job_url).status_code, browser.get(job_url).content) == _answer_to(make_user(), job_url)
    assert browser.get(job_url).status_code == 404
    assert AuditEvent.objects.filter(action="token.revoked", actor=admin).count() == 1
    assert Client().get("/api/v1/me/", headers={"Authorization": f"Bearer {staff_secret}"}).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_member_still_allowed_keeps_their_sockets_when_someone_else_is_removed(log_job: LogJob) -> None:
    member = log_job.viewer
    project = log_job.job.project
    admin, other = make_user(), make_user()
    add_tenant_member(project.tenant, admin, "admin")
    add_project_member(project, other, "viewer")
    _, secret = token_create(user=member, name="scripts")
    sockets = OpenSockets(log_job, secret)

    async def remove_other() -> dict[str, int | None]:
        await sockets.open()
        membership = await ProjectMembership.objects.aget(project=project, user=other)
        await _in_thread(lambda: project_member_remove(actor=admin, membership=membership))
        codes = await sockets.close_codes(wait_seconds=1)
        await sockets.disconnect()
        return codes

    codes = async_to_sync(remove_other)()

    assert codes == dict.fromkeys(sockets.sockets, None)


@pytest.mark.django_db(transaction=True)
def test_a_tenant_admin_demoted_to_member_stops_watching_projects_they_are_not_in(log_job: LogJob) -> None:
    project = log_job.job.project
    admin, demoted = make_user(), make_user()
    add_tenant_member(project.tenant, admin, "admin")
    membership = add_tenant_member(project.tenant, demoted, "admin")
    _, secret = token_create(user=demoted, name="scripts")

    async def demote_while_watching() -> int | None:
        from portal.asgi import application

        headers = [(b"authorization", f"Bearer {secret}".encode())]
        path = f"/ws/projects/{project.tenant.slug}/{project.slug}/jobs/"
        socket = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await handshake(socket, timeout=5)
        assert connected
        await _in_thread(lambda: tenant_member_change_role(actor=admin, membership=membership, role="member"))
        while (output := await socket.receive_output(timeout=5))["type"] != "websocket.close":
            pass
        return output.get("code")  # type: ignore[no-any-return]

    assert async_to_sync(demote_while_watching)() == 4403
