"""Fixtures for billing tests: the live-cluster project of the job tests (alice, bob, 1,000 GPU-hours)."""

from __future__ import annotations

from tests.jobs.conftest import live_project

__all__ = ["live_project"]
