"""Sign-in limits count wrong passwords only: a whole organisation behind one address signs in, a stranger
cannot lock a known user out, and guessing one account from one address slows down more with every try."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from tenants import throttles
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def production_rates(settings: Any) -> None:
    """The production defaults (portal/settings.py), not the tests' relaxed ones."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"login": "30/min", "token_guess": "30/min"},
    }
    settings.LOGIN_ACCOUNT_FREE_FAILURES = 5


def _address() -> str:
    """An address no other test has used: the cache outlives tests."""
    part = uuid.uuid4().hex
    return f"2001:db8:{part[:4]}:{part[4:8]}:{part[8:12]}::2"


def _token(address: str, username: str, password: str) -> Any:
    body = {"name": "ci", "username": username, "password": password}
    return Client(REMOTE_ADDR=address).post("/api/v1/tokens/", body, content_type="application/json")


def _form(address: str, username: str, password: str) -> Any:
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password})


def test_two_hundred_people_behind_one_address_all_sign_in_within_a_minute() -> None:
    campus = _address()
    people = [make_user() for _ in range(200)]
    typos = [_token(campus, person.username, "typo").status_code for person in people[:10]]

    answers = [
        (_token if index % 2 else _form)(campus, person.username, PASSWORD).status_code
        for index, person in enumerate(people)
    ]

    assert typos == [401] * 10
    assert answers == [302 if index % 2 == 0 else 201 for index in range(200)]


def test_a_stranger_guessing_elsewhere_cannot_lock_the_owner_out() -> None:
    bob = make_user()
    stranger, bobs_laptop = _address(), _address()

    guesses = [_token(stranger, bob.username, f"guess{attempt}").status_code for attempt in range(20)]
    right_from_stranger = _token(stranger, bob.username, PASSWORD)

    # Five wrong passwords, then the pair waits: the password is not even checked.
    assert guesses == [401] * 5 + [429] * 15
    assert right_from_stranger.status_code == 429
    assert right_from_stranger.json()["code"] == "throttled"
    assert right_from_stranger.json()["message"].startswith("Too many wrong passwords came from your address")
    assert 28 <= int(right_from_stranger["Retry-After"]) <= 30
    assert _token(bobs_laptop, bob.username, PASSWORD).status_code == 201
    assert _form(bobs_laptop, bob.username, PASSWORD).status_code == 302


def test_each_further_wrong_password_doubles_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    user, address = make_user(), _address()
    now = [1_000_000.0]
    monkeypatch.setattr(throttles, "time", SimpleNamespace(time=lambda: now[0]))

    def fail_after(seconds: float) -> int:
        now[0] += seconds
        return int(_form(address, user.username, "wrong").status_code)

    first_five = [fail_after(1) for _ in range(5)]
    waits = []
    for _ in range(6):
        wait = throttles.password_attempt_wait(address=address, username=user.username)
        assert wait is not None
        waits.append(wait)
        assert fail_after(wait - 1) == 429  # a second too early: refused, and not counted
        assert fail_after(1) == 200  # on time: checked, and wrong again

    assert first_five == [200] * 5
    assert waits == [30, 60, 120, 240, 480, 900]
    assert throttles.password_attempt_wait(address=address, username=user.username) == 900
    now[0] += 3600  # an hour without a wrong password forgets them
    assert _form(address, user.username, PASSWORD).status_code == 302
