"""Isolation matrix entries for the browser pages of the projects area (see tests/frontend/page_matrix.py)."""

from __future__ import annotations

from tests.isolation_rules import Case, page_everyone, page_only  # noqa: F401

PAGES: dict[str, dict[str, Case]] = {}
