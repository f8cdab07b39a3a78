"""Local passwords as production stores them (portal/hashers.py; the tests elsewhere use a fast hasher): Argon2id
at the OWASP minimum, a PBKDF2 hash of an older install still signs its owner in and is stored again with
Argon2id, a raised cost takes over at the next sign-in, and a cost below the minimum is refused at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.test import Client

import portal.settings
from tests.factories import make_user

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "a long enough passphrase"


@pytest.fixture(autouse=True)
def production_hashers(settings: Any) -> None:
    settings.PASSWORD_HASHERS = portal.settings.PASSWORD_HASHERS


def _stored(user: User) -> str:
    user.refresh_from_db()
    return user.password


def _signs_in(user: User, password: str) -> bool:
    page = Client().post("/login/", {"username": user.username, "password": password})
    return page.status_code == 302


def test_a_new_password_is_stored_with_argon2id_at_the_owasp_minimum() -> None:
    person = make_user()
    person.set_password(PASSWORD)
    person.save()

    assert _stored(person).startswith("argon2$argon2id$v=19$m=19456,t=2,p=1$")
    assert _signs_in(person, PASSWORD)
    assert not _signs_in(person, PASSWORD + "!")


def test_a_pbkdf2_password_signs_in_and_is_stored_again_with_argon2id() -> None:
    person = make_user()
    User.objects.filter(pk=person.pk).update(password=make_password(PASSWORD, hasher="pbkdf2_sha256"))
    assert _stored(person).startswith("pbkdf2_sha256$")

    assert _signs_in(person, PASSWORD)

    assert _stored(person).startswith("argon2$argon2id$")
    assert authenticate(username=person.username, password=PASSWORD) == person


def test_a_raised_cost_takes_over_at_the_next_sign_in(settings: Any) -> None:
    person = make_user()
    person.set_password(PASSWORD)
    person.save()
    settings.PORTAL_ARGON2_MEMORY_KIB, settings.PORTAL_ARGON2_TIME_COST = 32768, 3

    assert _signs_in(person, PASSWORD)

    assert "$m=32768,t=3,p=1$" in _stored(person)


@pytest.mark.parametrize("variable", ["PORTAL_ARGON2_MEMORY_KIB=8192", "PORTAL_ARGON2_TIME_COST=1"])
def test_a_cost_below_the_minimum_is_refused_at_start(variable: str) -> None:
    name, value = variable.split("=")
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", name: value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode != 0
    assert "may not be set below 19456 and 2" in result.stderr
