"""gunicorn's hooks (`gunicorn -c python:portal.gunicorn_conf`); everything else is on its command line.

A worker that exits takes its live gauges with it (prometheus_client's multiprocess mode keeps one file per
process): its counters stay, as they still count, but what it had open is open no more.
"""

from __future__ import annotations

import os
from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
