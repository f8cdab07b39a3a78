"""Request ids and structured logs: the id a request is known by in every log line, in what it stores and in the
tasks it sends; lines as JSON objects (portal/request_ids.py, portal/logs.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client
from structlog.contextvars import bound_contextvars

from portal.celery import app as celery_app
from portal.logs import formatter, logging_config
from portal.queue import task_enqueue_on_commit
from tenants.models import AuditEvent
from tests.factories import make_tenant, make_user
from tests.log_lines import lines_logged
from tests.websockets import handshake

NEW_ID = re.compile(r"[0-9a-f]{32}")


# The middleware --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("given", ["test-1234", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "lb:abc_DEF.42", "a" * 64])
def test_a_well_formed_request_id_is_kept_and_returned(client: Client, given: str) -> None:
    response = client.get("/api/v1/nothing-here/", HTTP_X_REQUEST_ID=given)

    assert response.status_code == 404
    assert response["X-Request-ID"] == given


@pytest.mark.django_db
@pytest.mark.parametrize(
    "given",
    ["", "has space", "a" * 65, 'forged\n{"level": "error"}', "-leading-dash", "naïve", "semi;colon", 'quo"te'],
)
def test_a_malformed_request_id_is_replaced_by_a_new_one(client: Client, given: str) -> None:
    response = client.get("/api/v1/nothing-here/", HTTP_X_REQUEST_ID=given)

    assert NEW_ID.fullmatch(response["X-Request-ID"])


@pytest.mark.django_db
def test_djangos_own_line_about_an_answer_carries_the_requests_id(client: Client) -> None:
    """Django logs a 4xx or 5xx answer after every middleware has returned."""
    with lines_logged("django.request") as lines:
        client.get("/api/v1/nothing-here/", HTTP_X_REQUEST_ID="not-found-1")

    assert [(line["event"], line["request_id"], line["status_code"]) for line in lines] == [
        ("Not Found: /api/v1/nothing-here/", "not-found-1", 404)
    ]
    assert "request" not in lines[0]


@pytest.mark.django_db
def test_a_request_without_an_id_gets_a_new_one_each_time(client: Client) -> None:
    first = client.get("/healthz")["X-Request-ID"]
    second = client.get("/login/")["X-Request-ID"]

    assert NEW_ID.fullmatch(first)
    assert NEW_ID.fullmatch(second)
    assert first != second


@pytest.mark.django_db
def test_an_audit_event_keeps_the_id_of_the_request_that_made_the_change(client: Client) -> None:
    admin = make_user()
    make_tenant("acme", admin=admin)
    client.force_login(admin)

    response = client.post(
        "/api/v1/tenants/acme/projects/",
        {"slug": "vision", "name": "Vision"},
        content_type="application/json",
        HTTP_X_REQUEST_ID="audit-trace-1",
    )

    assert response.status_code == 201, response.json()
    event = AuditEvent.objects.get(action="project.created", target_label="acme/vision")
    assert event.request_id == "audit-trace-1"
    listed = client.get("/api/v1/audit-events/?action=project.created").json()["results"]
    assert [entry["request_id"] for entry in listed] == ["audit-trace-1"]
    # Written outside any request (the shell, a command): no id.
    assert AuditEvent.objects.get(action="tenant.created").request_id == ""


@pytest.mark.django_db
def test_a_task_sent_for_a_request_carries_its_id_in_the_message(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, **options: sent.append({"name": name, **options}))

    with bound_contextvars(request_id="sent-for-1"), django_capture_on_commit_callbacks(execute=True):
        task_enqueue_on_commit("jobs.tasks.job_submit", "a-job", fallback="the sweep")
    with django_capture_on_commit_callbacks(execute=True):
        task_enqueue_on_commit("jobs.tasks.job_submit", "b-job", fallback="the sweep")

    assert sent == [
        {"name": "jobs.tasks.job_submit", "args": ("a-job",), "headers": {"portal_request_id": "sent-for-1"}},
        {"name": "jobs.tasks.job_submit", "args": ("b-job",), "headers": None},
    ]


# WebSockets ------------------------------------------------------------------------------------------------


async def _open(headers: list[tuple[bytes, bytes]]) -> None:
    from portal.asgi import application

    origin = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    communicator = WebsocketCommunicator(application, "/ws/clusters/", headers=origin + headers)
    await handshake(communicator, timeout=5)
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
def test_a_websocket_is_logged_with_the_proxys_request_id_or_one_of_its_own() -> None:
    with lines_logged("portal.request_ids") as lines:
        async_to_sync(_open)([(b"x-request-id", b"ws-trace-1")])
        async_to_sync(_open)([(b"x-request-id", b"bad id")])

    assert [line["event"] for line in lines] == ["websocket connect /ws/clusters/"] * 2
    assert lines[0]["request_id"] == "ws-trace-1"
    assert NEW_ID.fullmatch(lines[1]["request_id"])


# The format ------------------------------------------------------------------------------------------------


def test_a_line_is_one_json_object_with_the_bound_ids_and_the_calls_own_fields() -> None:
    with lines_logged("tests.trace") as lines, bound_contextvars(request_id="r-1", job_id="", cluster="north"):
        logging.getLogger("tests.trace").info("job %s accepted", 7, extra={"job_id": "j-7", "gpus": 2})
        try:
            raise ValueError("the cause")
        except ValueError:
            logging.getLogger("tests.trace").exception("it failed")

    accepted, failed = lines
    assert list(accepted)[:4] == ["timestamp", "level", "logger", "event"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", accepted["timestamp"])
    assert {key: value for key, value in accepted.items() if key != "timestamp"} == {
        "level": "info",
        "logger": "tests.trace",
        "event": "job 7 accepted",
        "request_id": "r-1",
        "job_id": "j-7",  # the call's own field wins over the bound one
        "cluster": "north",
        "gpus": 2,
    }
    assert failed["level"] == "error"
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert failed["exception"].endswith("ValueError: the cause")


def test_plain_lines_carry_the_same_fields_for_people() -> None:
    record = logging.LogRecord("tests.trace", logging.WARNING, __file__, 1, "job delivery %s", ("retry",), None)
    with bound_contextvars(request_id="r-2"):
        line = formatter("plain").format(record)

    assert re.fullmatch(r"\S+Z \[warning *\] job delivery retry \[tests\.trace\] request_id=r-2", line)


def test_an_unknown_log_format_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="PORTAL_LOG_FORMAT must be one of json, plain, not 'xml'"):
        formatter("xml")


def test_the_servers_are_given_the_portals_logging_configuration() -> None:
    """scripts/portal.sh hands `python -m portal.logs`'s output to gunicorn and uvicorn."""
    environment = {**os.environ, "PORTAL_LOG_FORMAT": "plain", "PORTAL_LOG_LEVEL": "debug"}
    printed = subprocess.run(
        [sys.executable, "-m", "portal.logs"], env=environment, capture_output=True, text=True, check=True
    ).stdout

    assert json.loads(printed) == logging_config(log_format="plain", level="DEBUG")
