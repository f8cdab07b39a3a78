"""Servers the tests start as processes of their own: a free port for each, and a sure way to stop them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ends a server process: politely, then for sure, so none outlives the test database."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def wait_until_answers(url: str, process: subprocess.Popen[bytes], log: Path, *, what: str) -> None:
    """Returns once `url` answers 200; raises with the process's log if it exits or a minute passes first."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start; its log:\n{log.read_text()}")
        time.sleep(0.2)


def portal_environment(**overrides: str) -> dict[str, str]:
    """The environment of a portal process a test starts (gunicorn, a Celery worker): the test settings and the
    test database, which the test's own connection is on."""
    from django.db import connection

    database = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
        **overrides,
    }


@contextmanager
def gunicorn_running(*options: str, environment: dict[str, str], log: Path) -> Iterator[str]:
    """gunicorn serving the portal with these options on a free port, its output in `log`; yields its base URL
    once it answers, and stops it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "portal.wsgi:application", f"--bind=127.0.0.1:{port}", *options]
    with log.open("w") as output:
        server = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_answers(f"{base_url}/login/", server, log, what="gunicorn")
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield base_url
    finally:
        stop(server)


PROMETHEUS = Path("/usr/bin/prometheus")
DCGM_REPLAY = Path(__file__).resolve().parent.parent / "scripts" / "dcgm_replay.py"


@contextmanager
def dcgm_replay_running(*arguments: str, log: Path) -> Iterator[str]:
    """scripts/dcgm_replay.py on a free port with these arguments (--node, --assign); yields its host:port."""
    port = free_port()
    command = [sys.executable, str(DCGM_REPLAY), f"--listen=127.0.0.1:{port}", *arguments]
    with log.open("w") as output:
        exporter = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_answers(f"http://127.0.0.1:{port}/metrics", exporter, log, what="the DCGM replay exporter")
        yield f"127.0.0.1:{port}"
    finally:
        stop(exporter)


@contextmanager
def prometheus_running(*targets: str, directory: Path, scrape_seconds: int = 1) -> Iterator[str]:
    """Debian's Prometheus (`bash scripts/prometheus.sh install`) on a free port, scraping `targets` every
    `scrape_seconds`, its data and log in `directory`; yields its base URL once it is ready."""
    if not PROMETHEUS.exists():
        pytest.fail("no /usr/bin/prometheus: install it with `bash scripts/prometheus.sh install`")
    port = free_port()
    config = directory / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {scrape_seconds}s\n  evaluation_interval: {scrape_seconds}s\n"
        "scrape_configs:\n  - job_name: dcgm\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(target) for target in targets)}]\n"
    )
    log = directory / "prometheus.log"
    command = [
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with log.open("w") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(f"{base_url}/-/ready", server, log, what="Prometheus")
        yield base_url
    finally:
        stop(server)
