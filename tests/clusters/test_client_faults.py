"""How the client fails: typed errors for auth, outages, timeouts and Slurm's refusals."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from clusters.slurm import SlurmAuthError, SlurmClient, SlurmRejected, SlurmServerError, SlurmTimeout, SlurmUnavailable
from clusters.slurm.tokens import TokenMinter

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def v38_reply(status: int, errors: list[dict[str, object]], **body: object) -> httpx.Response:
    return httpx.Response(status, json={"meta": {}, "errors": errors, **body})


def client_with(handler: httpx.MockTransport, key_file: Path) -> SlurmClient:
    return SlurmClient(base_url="http://slurm.test", key_file=key_file, api_version="0.0.38", transport=handler)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt.key"
    path.write_bytes(b"k" * 32)
    return path


# Faults that cannot be caused on demand in a healthy cluster: replayed with MockTransport.


@pytest.mark.parametrize(
    ("status", "errors", "expected"),
    [
        (500, [{"error_code": 1007, "error": "Protocol authentication error"}], SlurmAuthError),
        (500, [{"error_code": 2002, "error": "Access/permission denied"}], SlurmAuthError),
        (500, [{"error_code": 2014, "error": "Requested node configuration is not available"}], SlurmRejected),
        (
            500,
            [{"error_code": 1800, "error": "Unable to contact slurm controller (connect failure)"}],
            SlurmServerError,
        ),
        (500, [{"error_number": 7000, "error": "Unable to connect to database"}], SlurmServerError),
        (502, [], SlurmServerError),
        (400, [{"description": "Unknown key", "error_number": 9001}], SlurmRejected),
    ],
)
def test_replies_become_typed_errors_carrying_slurms_message(
    status: int, errors: list[dict[str, object]], expected: type[Exception], key_file: Path
) -> None:
    client = client_with(httpx.MockTransport(lambda request: v38_reply(status, errors)), key_file)

    with pytest.raises(expected) as raised:
        client.nodes()

    for error in errors:
        assert str(error.get("error") or error.get("description")) in str(raised.value)


def test_a_listing_while_slurmctld_is_down_names_the_outage_not_only_the_token(key_file: Path) -> None:
    # What 22.05 answered GET /jobs with while the slurmctld drill had the controller stopped; an expired
    # token gets the same answer (test_an_expired_token_is_an_auth_error), so the message names both.
    down = [
        {
            "description": "Failed while looking for jobs",
            "error_number": -1,
            "error": "Unspecified error",
            "source": "slurm_load_jobs",
        }
    ]
    client = client_with(httpx.MockTransport(lambda request: v38_reply(500, down)), key_file)

    with pytest.raises(SlurmAuthError) as raised:
        client.list_jobs()

    assert str(raised.value).startswith(
        "slurmctld did not answer, or refused the token: slurmrestd reports both the same way. "
        "Check that slurmctld is running, then the cluster's JWT key and the clocks: "
        "Unspecified error: Failed while looking for jobs"
    )


def test_retryable_and_terminal_errors_say_which_they_are(key_file: Path) -> None:
    outage = client_with(httpx.MockTransport(lambda request: v38_reply(503, [])), key_file)
    refusal = client_with(
        httpx.MockTransport(lambda request: v38_reply(500, [{"error_code": 2014, "error": "no"}])), key_file
    )

    with pytest.raises(SlurmServerError) as retryable:
        outage.nodes()
    with pytest.raises(SlurmRejected) as terminal:
        refusal.nodes()

    assert (retryable.value.retryable, terminal.value.retryable) == (True, False)


def test_a_held_submission_with_a_job_id_is_a_success_despite_errors(key_file: Path) -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["job"]["hold"] is True
        return v38_reply(
            200, [{"error_code": 2042, "error": "Job is in held state, pending scheduler release"}], job_id=7
        )

    from clusters.slurm.types import JobSubmission

    client = client_with(httpx.MockTransport(reply), key_file)
    submission = JobSubmission(
        name="n",
        account="a",
        partition="p",
        script="#!/bin/sh\n",
        time_limit_minutes=1,
        working_directory="/tmp",
        standard_output="/tmp/o",
        standard_error="/tmp/e",
        hold=True,
    )

    result = client.submit_job(user="alice", submission=submission)

    assert result.job_id == 7
    assert [str(w) for w in result.warnings] == ["Job is in held state, pending scheduler release (Slurm error 2042)"]


def test_every_request_carries_the_users_own_short_lived_token(key_file: Path) -> None:
    seen: list[httpx.Request] = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return v38_reply(200, [])

    client = SlurmClient(
        base_url="http://slurm.test", key_file=key_file, api_version="0.0.38", transport=httpx.MockTransport(reply)
    )
    client.cancel_job(user="alice", job_id=5)

    import jwt

    claims = jwt.decode(seen[0].headers["X-SLURM-USER-TOKEN"], b"k" * 32, algorithms=["HS256"])
    assert seen[0].headers["X-SLURM-USER-NAME"] == "alice"
    assert claims["sun"] == "alice"
    assert claims["exp"] - claims["iat"] == 300


def test_an_unreadable_key_file_is_an_auth_error(tmp_path: Path) -> None:
    with pytest.raises(SlurmAuthError) as raised:
        TokenMinter(key_file=tmp_path / "missing.key").mint("alice")
    assert "missing.key" in str(raised.value)


# Real faults, caused for real.


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers: a hung slurmrestd."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


def test_a_server_that_never_answers_times_out_within_the_timeout(silent_server: str, key_file: Path) -> None:
    client = SlurmClient(base_url=silent_server, key_file=key_file, api_version="0.0.38", timeout_seconds=0.5)

    started = time.monotonic()
    with pytest.raises(SlurmTimeout) as raised:
        client.ping()

    assert time.monotonic() - started < 3
    assert raised.value.retryable is True


class ExpiredTokens(TokenMinter):
    """Signs with the real key, but every token expired an hour ago."""

    def token_for(self, username: str) -> str:
        return self.mint(username, lifespan_seconds=60, issued_at=int(time.time()) - 3600)


@pytest.mark.cluster
def test_an_expired_token_is_an_auth_error(slurm_client: SlurmClient) -> None:
    client = SlurmClient(
        base_url=settings.LOCAL_CLUSTER_URL, key_file=settings.LOCAL_CLUSTER_KEY_FILE, api_version="0.0.38"
    )
    client.tokens = ExpiredTokens(key_file=settings.LOCAL_CLUSTER_KEY_FILE)

    with pytest.raises(SlurmAuthError) as raised:
        client.ping()

    assert raised.value.retryable is False


@pytest.mark.cluster
@pytest.mark.disrupts_clusters
def test_with_slurmrestd_stopped_calls_fail_as_retryable_within_the_timeout(slurm_client: SlurmClient) -> None:
    subprocess.run(["bash", str(PROJECT_ROOT / "scripts/cluster.sh"), "stop", "slurmrestd"], check=True)
    try:
        client = SlurmClient(
            base_url=settings.LOCAL_CLUSTER_URL,
            key_file=settings.LOCAL_CLUSTER_KEY_FILE,
            api_version="0.0.38",
            timeout_seconds=2,
        )
        started = time.monotonic()
        with pytest.raises(SlurmUnavailable) as raised:
            client.ping()
        assert time.monotonic() - started < 2.5
        assert raised.value.retryable is True
        assert "127.0.0.1:6820" in str(raised.value)
    finally:
        subprocess.run(["bash", str(PROJECT_ROOT / "scripts/cluster.sh"), "up"], check=True, capture_output=True)
    assert slurm_client.ping().responding is True


def test_warnings_on_any_reply_are_logged(key_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    warning = {"description": 'Ignoring unknown field "gres"', "source": "_parse"}
    client = client_with(httpx.MockTransport(lambda request: v38_reply(200, [], warnings=[warning])), key_file)

    with caplog.at_level("WARNING", logger="clusters.slurm.client"):
        client.nodes()

    assert 'Ignoring unknown field "gres"' in caplog.text
    assert "/slurm/v0.0.38/nodes/" in caplog.text


@pytest.mark.parametrize(("code", "refused"), [(2021, False), (2002, True)])
def test_a_cancel_refused_in_the_per_job_status_is_an_error_unless_the_job_is_already_ending(
    code: int, refused: bool, key_file: Path
) -> None:
    # v0.0.40+ answer a cancel with HTTP 200 and empty errors[]: whether it worked is only in status[].
    status = [{"job_id": {"set": True, "infinite": False, "number": 7}, "error": {"code": code, "string": "no"}}]
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"errors": [], "status": status}))
    client = SlurmClient(base_url="http://slurm.test", key_file=key_file, api_version="0.0.42", transport=transport)

    if refused:
        with pytest.raises(SlurmAuthError, match="job 7: no"):
            client.cancel_job(user="bob", job_id=7)
    else:
        client.cancel_job(user="bob", job_id=7)  # already completing: nothing to cancel, no error


def test_a_read_on_a_connection_slurmrestd_had_closed_is_asked_again_once_and_a_write_never(key_file: Path) -> None:
    calls: list[str] = []

    def reset_once(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            raise httpx.ReadError("[Errno 104] Connection reset by peer", request=request)
        return v38_reply(200, [], jobs=[])

    reader = client_with(httpx.MockTransport(reset_once), key_file)
    assert reader.list_jobs() is not None
    assert calls == ["GET", "GET"]

    def always_reset(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        raise httpx.ReadError("[Errno 104] Connection reset by peer", request=request)

    calls.clear()
    with pytest.raises(SlurmUnavailable):
        client_with(httpx.MockTransport(always_reset), key_file).list_jobs()
    assert calls == ["GET", "GET"]  # once again, not more
    calls.clear()
    with pytest.raises(SlurmUnavailable):
        client_with(httpx.MockTransport(always_reset), key_file).cancel_job(user="alice", job_id=7)
    assert calls == ["DELETE"]
