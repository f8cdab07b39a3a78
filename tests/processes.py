"""Servers the tests start as processes of their own: a free port for each, and a sure way to stop them."""

from __future__ import annotations

import socket
import subprocess


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
