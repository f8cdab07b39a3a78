"""One request to slurmdbd at a time across every test process on the machine.

scripts/test.sh runs several pytest processes at once. With three of them, Slurm 22.05's slurmdbd crashed (SIGSEGV in
`as_mysql_get_assocs`, reading an association while others were being written) where one suite, making one request
at a time, never did. So each test process, and every Celery worker and web server the tests start (they load
tests/settings.py too), holds a machine-wide lock file around each request to slurmrestd's `/slurmdb/` endpoints
and each `sacctmgr` a test runs: between processes the accounting sees what one suite made it see. The portal
itself takes no such lock; this is a property of the tests running side by side, not of a site."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK_FILE = Path(tempfile.gettempdir()) / "gpuportal-tests-slurmdbd.lock"


@contextmanager
def slurmdbd_turn() -> Iterator[None]:
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def install() -> None:
    """Make SlurmClient take the lock around its accounting requests (once per process)."""
    from clusters.slurm.client import SlurmClient

    if getattr(SlurmClient._request, "slurmdbd_turn", False):
        return
    request = SlurmClient._request

    def request_in_turn(self: SlurmClient, method: str, path: str, **kwargs: Any) -> Any:
        if "slurmdb/" not in path:
            return request(self, method, path, **kwargs)
        with slurmdbd_turn():
            return request(self, method, path, **kwargs)

    request_in_turn.slurmdbd_turn = True  # type: ignore[attr-defined]
    SlurmClient._request = request_in_turn  # type: ignore[method-assign]
