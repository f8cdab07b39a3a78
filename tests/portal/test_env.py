"""Settings from environment variables, with secrets from `*_FILE`."""

from __future__ import annotations

from pathlib import Path

import pytest

from portal.env import ConfigurationError, database_from_url, env_bool, env_int, env_list, env_str


def test_a_secret_comes_from_the_file_named_by_its_file_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("PORTAL_SECRET_KEY", "from-env")
    monkeypatch.setenv("PORTAL_SECRET_KEY_FILE", str(secret))

    assert env_str("PORTAL_SECRET_KEY", "default") == "s3cret"


def test_an_unreadable_secret_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTAL_SECRET_KEY_FILE", str(tmp_path / "missing"))

    with pytest.raises(ConfigurationError, match="PORTAL_SECRET_KEY_FILE points at"):
        env_str("PORTAL_SECRET_KEY", "default")


def test_typed_values_and_their_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAG", "off")
    monkeypatch.setenv("COUNT", "12")
    monkeypatch.setenv("HOSTS", "a.example, b.example,")
    monkeypatch.setenv("BAD_COUNT", "twelve")

    assert env_bool("FLAG", True) is False
    assert env_int("COUNT", 1) == 12
    assert env_list("HOSTS", []) == ["a.example", "b.example"]
    assert env_int("UNSET_COUNT", 7) == 7
    with pytest.raises(ConfigurationError, match="BAD_COUNT='twelve' is not an integer"):
        env_int("BAD_COUNT", 1)


def test_database_urls() -> None:
    database = database_from_url("postgres://portal:p%40ss@db.internal:6432/portal_prod")

    assert (database["USER"], database["PASSWORD"], database["HOST"], database["PORT"], database["NAME"]) == (
        "portal",
        "p@ss",
        "db.internal",
        "6432",
        "portal_prod",
    )
    with pytest.raises(ConfigurationError, match="must start with postgres://"):
        database_from_url("mysql://x@y/z")
