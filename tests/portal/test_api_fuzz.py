"""Fuzz every operation of the OpenAPI schema with schemathesis: no answer is a 5xx, every answer matches the
schema (status code, content type, body), and every 4xx carries the one error shape of portal/api_errors.py.

The schema is the one the portal serves at /api/schema/, loaded in-process through WSGI. Each operation is
tried as a project member and as a portal admin (Bearer tokens) in a world with objects of every kind
(tests/portal/fuzz_world.py). Valid and invalid input are both generated (schemathesis "positive" and
"negative" modes, in its coverage phase of boundary values and its random fuzzing phase); a case that names
things (a tenant, a job id, a project in the body) is sent as generated and again naming objects of the
world, so the fuzz gets past "not found" into the services. Every request runs in a savepoint that is rolled
back, so each starts from the same world and nothing commits: no Celery task is delivered, and the world's
cluster points at a closed port, so the real Slurm cluster is never called.

Defaults keep the file to a few minutes; a longer run by hand:

    FUZZ_EXAMPLES=200 .venv/bin/python -m pytest tests/portal/test_api_fuzz.py -p no:cacheprovider

(FUZZ_SEED=<n> draws other cases; a failure prints the request as a curl command.)
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import got_request_exception, request_finished, request_started
from django.db import close_old_connections, transaction
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.portal.fuzz_world import IDENTITIES, FuzzWorld, fuzz_world_build

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "15"))
SEED = int(os.environ.get("FUZZ_SEED", "20261121"))

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "generation": {"mode": "all", "max-examples": EXAMPLES, "deterministic": True},
        # The examples phase has nothing to use (the schema has no examples); coverage and fuzzing do the work.
        "phases": {"examples": {"enabled": False}, "coverage": {"enabled": True}, "stateful": {"enabled": False}},
    }
)

schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler(), config=CONFIG)


def error_shape_problems(body: Any) -> list[str]:
    """What keeps `body` from being `{"code": str, "message": str, "fields": {str: [str, ...]}}`, if anything."""
    if not isinstance(body, dict) or set(body) != {"code", "message", "fields"}:
        return ["it is not an object with exactly 'code', 'message' and 'fields'"]
    problems = [f"'{key}' is not a non-empty string" for key in ("code", "message") if not _is_text(body[key])]
    if not isinstance(body["fields"], dict):
        return [*problems, "'fields' is not an object"]
    for name, messages in body["fields"].items():
        if not isinstance(messages, list) or not messages or not all(_is_text(text) for text in messages):
            problems.append(f"'fields.{name}' is not a non-empty list of messages")
    return problems


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def error_shape(ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case[Any]) -> bool:
    """Every 4xx and 5xx answer has the one error shape of portal/api_errors.py."""
    if response.status_code < 400:
        return True
    try:
        problems = error_shape_problems(response.json())
    except ValueError:
        problems = [f"the body is not JSON: {response.text[:200]!r}"]
    assert not problems, f"{response.status_code} is not in the error shape: {'; '.join(problems)}"
    return True


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def fuzz_world(db: None, tmp_path: Path, settings: Any) -> Iterator[FuzzWorld]:
    """The world, with Django's per-request connection handling off, as in Django's own test client.

    Django closes the database connection at the start and end of every request; inside the test's
    transaction that would lose the world. The cache is a local one, so the fuzz's requests never fill
    the shared Redis cache (or its throttles) that other test runs read.
    """
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield fuzz_world_build(tmp_path)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def crashes() -> Iterator[list[str]]:
    """The tracebacks of the exceptions the views raised, so a 500 comes with its cause."""
    found: list[str] = []

    def record(sender: Any, request: Any = None, **kwargs: Any) -> None:
        found.append(traceback.format_exc())

    got_request_exception.connect(record)
    yield found
    got_request_exception.disconnect(record)


def _aimed_at_world(case: schemathesis.Case[Any], world: FuzzWorld, identity: str) -> schemathesis.Case[Any] | None:
    """The case again with the names in its path, query and body naming objects of the world; None if it has none.

    Random names only ever reach "not found"; named objects take the fuzz into the services.
    """
    path_values = {**world.path_values, "token_id": world.identities[identity].token_id}
    path = _known(case.path_parameters, path_values)
    query = _known(case.query, world.field_values)
    body = _known(case.body, world.field_values)
    if not (path or query or body):
        return None
    aimed = case.derive()
    aimed.path_parameters.update(path)
    aimed.query.update(query)
    if isinstance(case.body, dict) and body:
        aimed.body = {**case.body, **body}
    return aimed


def _known(given: Any, values: dict[str, str]) -> dict[str, str]:
    return {name: values[name] for name in given if name in values} if isinstance(given, dict) else {}


@pytest.mark.parametrize("identity", IDENTITIES)
@schema.parametrize()
# The world fixture is shared by an operation's examples on purpose: each example rolls back its own changes.
@hypothesis.settings(
    deadline=None,
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
        # A slug's pattern bounds its length with a lookahead, so many generated slugs are thrown away.
        hypothesis.HealthCheck.filter_too_much,
    ],
)
def test_api(case: schemathesis.Case[Any], identity: str, fuzz_world: FuzzWorld, crashes: list[str]) -> None:
    headers = {"Authorization": f"Bearer {fuzz_world.identities[identity].token}"}
    aimed = _aimed_at_world(case, fuzz_world, identity)
    for sent in (case,) if aimed is None else (case, aimed):
        crashes.clear()
        with transaction.atomic():
            response = sent.call(headers=headers)
            transaction.set_rollback(True)
        assert not crashes, f"{sent.method} {sent.formatted_path} raised:\n{crashes[-1]}"
        sent.validate_response(response, checks=CHECKS, additional_checks=[error_shape], headers=headers)


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        ({"code": "not_found", "message": "No such job.", "fields": {}}, []),
        ({"code": "invalid", "message": "gpus: too many", "fields": {"gpus": ["too many"]}}, []),
        ({"detail": "Not found."}, ["it is not an object with exactly 'code', 'message' and 'fields'"]),
        ({"code": "", "message": "x", "fields": {}}, ["'code' is not a non-empty string"]),
        (
            {"code": "invalid", "message": "x", "fields": {"gpus": "too many"}},
            ["'fields.gpus' is not a non-empty list of messages"],
        ),
        ([{"code": "invalid"}], ["it is not an object with exactly 'code', 'message' and 'fields'"]),
    ],
)
def test_the_error_shape_check_tells_what_is_wrong(body: Any, problems: list[str]) -> None:
    assert error_shape_problems(body) == problems
