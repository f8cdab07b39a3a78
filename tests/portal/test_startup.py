"""A server process loads every view as it starts (portal/startup.py), not in its first request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOADED = (
    "import sys, {module}; from django.urls import get_resolver; "
    "print('jobs.job_apis' in sys.modules, 'frontend.job_views' in sys.modules, get_resolver()._populated)"
)


@pytest.mark.parametrize("module", ["portal.wsgi", "portal.asgi"])
def test_a_server_process_has_every_view_loaded_before_its_first_request(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", LOADED.format(module=module)],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]
