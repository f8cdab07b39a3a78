"""Servers the tests start as processes of their own: a free port for each, and a sure way to stop them."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx


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
